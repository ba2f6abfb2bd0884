//! Resize by filter taps, one axis at a time in f64, as the ONNX reference computes it: every
//! output coordinate is a weighted sum of the `n` input elements nearest its source
//! coordinate (edge elements repeated past the ends). This covers what the two-tap path in
//! `resize` does not: cubic interpolation (`cubic_coeff_a`, `exclude_outside`), antialiasing
//! (the filter stretched by the downscale), and `tf_crop_and_resize` (a region of interest and
//! an extrapolation value outside it).

use super::resize::{Mode, ResizeAttrs};
use crate::error::{OpError, OpResult, shape_err};
use crate::tensor::checked_numel;

/// The taps of one axis: for each output coordinate, the first of its `n` neighbours (it may
/// lie before the input; indices are clamped to it when read), their weights, and whether
/// the coordinate lies outside the region of interest (it then takes the extrapolation value).
pub(crate) struct AxisTaps {
    pub n: usize,
    pub start: Vec<isize>,
    pub weights: Vec<f64>,
    pub outside: Vec<bool>,
}

/// Most taps one output coordinate may read: an antialiasing filter widens with the
/// downscale, and a downscale past this would weigh thousands of inputs per output.
const MAX_TAPS: usize = 1 << 12;

/// The filter's weights for a source coordinate whose fractional part is `ratio` (in
/// `(0, 1]`), along an axis scaled by `scale`.
fn coefficients(r: &ResizeAttrs, ratio: f64, scale: f64) -> Vec<f64> {
    let a = f64::from(r.cubic_coeff_a);
    match (r.mode, r.antialias) {
        (Mode::Nearest, _) => {
            if ratio == 1.0 {
                return vec![0.0, 1.0];
            }
            let right = match r.nearest_mode.as_str() {
                "round_prefer_ceil" => ratio >= 0.5,
                "floor" => false,
                "ceil" => true,
                _ => ratio > 0.5,
            };
            if right {
                vec![0.0, 1.0]
            } else {
                vec![1.0, 0.0]
            }
        }
        (Mode::Linear, false) => vec![1.0 - ratio, ratio],
        (Mode::Linear, true) => {
            let scale = scale.min(1.0);
            let start = (-1.0 / scale).floor() as i64 + 1;
            let footprint = 2 - 2 * start;
            let c: Vec<f64> = (start..start + footprint)
                .map(|i| (1.0 - ((i as f64 - ratio) * scale).abs()).clamp(0.0, 1.0))
                .collect();
            normalized(c)
        }
        (Mode::Cubic, false) => {
            let (x1, x2) = (ratio + 1.0, 2.0 - ratio);
            let s = 1.0 - ratio;
            vec![
                ((a * x1 - 5.0 * a) * x1 + 8.0 * a) * x1 - 4.0 * a,
                ((a + 2.0) * ratio - (a + 3.0)) * ratio * ratio + 1.0,
                ((a + 2.0) * s - (a + 3.0)) * s * s + 1.0,
                ((a * x2 - 5.0 * a) * x2 + 8.0 * a) * x2 - 4.0 * a,
            ]
        }
        (Mode::Cubic, true) => {
            let scale = scale.min(1.0);
            let cubic = |x: f64| {
                let x = x.abs();
                let (x2, x3) = (x * x, x * x * x);
                if x <= 1.0 {
                    (a + 2.0) * x3 - (a + 3.0) * x2 + 1.0
                } else if x < 2.0 {
                    a * x3 - 5.0 * a * x2 + 8.0 * a * x - 4.0 * a
                } else {
                    0.0
                }
            };
            let start = (-2.0 / scale).floor() as i64 + 1;
            let c = (start..2 - start)
                .map(|i| cubic(scale * (i as f64 - ratio)))
                .collect();
            normalized(c)
        }
    }
}

fn normalized(mut c: Vec<f64>) -> Vec<f64> {
    let sum: f64 = c.iter().sum();
    c.iter_mut().for_each(|v| *v /= sum);
    c
}

/// Taps a filter of this mode reads at `scale` (antialiasing widens it when downscaling).
fn width(r: &ResizeAttrs, scale: f64) -> OpResult<usize> {
    let s = scale.min(1.0);
    let n = match (r.mode, r.antialias) {
        (Mode::Nearest, _) | (Mode::Linear, false) => 2.0,
        (Mode::Cubic, false) => 4.0,
        (Mode::Linear, true) => 2.0 * (1.0 - ((-1.0 / s).floor() + 1.0)),
        (Mode::Cubic, true) => 2.0 * (2.0 - ((-2.0 / s).floor() + 1.0)) - 2.0,
    };
    if !(n.is_finite() && n <= MAX_TAPS as f64) {
        return Err(OpError::Unsupported(format!(
            "antialiased Resize at scale {scale}: a filter of more than {MAX_TAPS} taps"
        )));
    }
    Ok(n as usize)
}

/// The source coordinate of output `y` along an axis of `len` inputs resized by `scale` to
/// `out` outputs; `roi` is the axis's region of interest (`tf_crop_and_resize`).
fn source(r: &ResizeAttrs, y: f64, len: usize, scale: f64, out: usize, roi: [f64; 2]) -> f64 {
    let l = len as f64;
    let width = scale * l;
    match r.coord.as_str() {
        "align_corners" if width == 1.0 => 0.0,
        "align_corners" => y * (l - 1.0) / (width - 1.0),
        "asymmetric" => y / scale,
        "tf_crop_and_resize" => {
            let x = if width == 1.0 {
                (roi[1] - roi[0]) * (l - 1.0) / 2.0
            } else {
                y * (roi[1] - roi[0]) * (l - 1.0) / (width - 1.0)
            };
            x + roi[0] * (l - 1.0)
        }
        "pytorch_half_pixel" if width == 1.0 => -0.5,
        "half_pixel_symmetric" => {
            let adjustment = out as f64 / width;
            let offset = l / 2.0 * (1.0 - adjustment);
            offset + (y + 0.5) / scale - 0.5
        }
        // half_pixel and pytorch_half_pixel (the attribute is checked at import).
        _ => (y + 0.5) / scale - 0.5,
    }
}

/// The taps of an axis of `len` inputs resized by `scale` to `out` outputs.
pub(crate) fn axis_taps(
    r: &ResizeAttrs,
    len: usize,
    out: usize,
    scale: f64,
    roi: [f64; 2],
) -> OpResult<AxisTaps> {
    let n = width(r, scale)?;
    checked_numel(&[out, n])?;
    let mut t = AxisTaps {
        n,
        start: Vec::with_capacity(out),
        weights: Vec::with_capacity(out * n),
        outside: Vec::with_capacity(out),
    };
    let pad = n.div_ceil(2) as f64;
    for y in 0..out {
        let x = source(r, y as f64, len, scale, out, roi);
        if !x.is_finite() {
            return shape_err(format!("Resize maps output {y} to source coordinate {x}"));
        }
        let ratio = if x == x.floor() { 1.0 } else { x - x.floor() };
        let mut c = coefficients(r, ratio, scale);
        // The `n` nearest neighbours, ties going to the smaller index.
        let padded = x + pad;
        let (p, frac) = (padded.floor(), padded - padded.floor());
        let half = (n / 2) as f64;
        let offset = if n % 2 == 0 {
            if frac == 0.0 { -half } else { -half + 1.0 }
        } else {
            let base = -(((n - 1) / 2) as f64);
            if frac <= 0.5 { base } else { base + 1.0 }
        };
        // |x| is bounded by the shape and the region of interest, far inside `isize`.
        let start = (p + offset - pad) as isize;
        if r.exclude_outside {
            for (j, w) in c.iter_mut().enumerate() {
                let i = start + j as isize;
                if i < 0 || i >= len as isize {
                    *w = 0.0;
                }
            }
            let sum: f64 = c.iter().sum();
            if sum != 0.0 {
                c.iter_mut().for_each(|w| *w /= sum);
            }
        }
        let outside = r.coord == "tf_crop_and_resize" && (x < 0.0 || x > len as f64 - 1.0);
        t.start.push(start);
        t.weights.extend(c);
        t.outside.push(outside);
    }
    Ok(t)
}

/// Bytes a filtered resize of `shape` to `out` at `scales` works in: two f64 intermediates
/// (each at most the larger extent of every axis) and every axis's taps.
pub(crate) fn work_bytes(
    r: &ResizeAttrs,
    shape: &[usize],
    out: &[usize],
    scales: &[f64],
) -> OpResult<usize> {
    let larger: Vec<usize> = shape.iter().zip(out).map(|(&a, &b)| a.max(b)).collect();
    let too_large = || OpError::TooLarge(usize::MAX);
    let mut bytes = checked_numel(&larger)?
        .checked_mul(2 * 8)
        .ok_or_else(too_large)?;
    for (&o, &s) in out.iter().zip(scales) {
        let taps = checked_numel(&[o, width(r, s)?])?;
        let axis = taps * 8 + o * (std::mem::size_of::<isize>() + 1);
        bytes = bytes.checked_add(axis).ok_or_else(too_large)?;
    }
    Ok(bytes)
}

/// `src` (of `shape`) resampled along `ax` by `taps`, `fill` where a coordinate is outside.
pub(crate) fn resample_axis(
    src: &[f64],
    shape: &[usize],
    ax: usize,
    taps: &AxisTaps,
    fill: f64,
) -> Vec<f64> {
    let outer: usize = shape[..ax].iter().product();
    let inner: usize = shape[ax + 1..].iter().product();
    let len = shape[ax];
    let out = taps.start.len();
    let mut dst = vec![0.0; outer * out * inner];
    for o in 0..outer {
        let block = &src[o * len * inner..][..len * inner];
        for y in 0..out {
            let row = &mut dst[(o * out + y) * inner..][..inner];
            if taps.outside[y] {
                row.fill(fill);
                continue;
            }
            for (j, &w) in taps.weights[y * taps.n..][..taps.n].iter().enumerate() {
                let i = (taps.start[y] + j as isize).clamp(0, len as isize - 1) as usize;
                for (d, &s) in row.iter_mut().zip(&block[i * inner..][..inner]) {
                    *d += w * s;
                }
            }
        }
    }
    dst
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(mode: Mode, antialias: bool) -> ResizeAttrs {
        ResizeAttrs {
            mode,
            antialias,
            ..ResizeAttrs::default()
        }
    }

    #[test]
    fn filters_sum_to_one_and_widen_when_antialiasing() {
        for (mode, aa) in [
            (Mode::Linear, false),
            (Mode::Linear, true),
            (Mode::Cubic, false),
            (Mode::Cubic, true),
        ] {
            let r = attrs(mode, aa);
            let t = axis_taps(&r, 8, 3, 3.0 / 8.0, [0.0, 1.0]).unwrap();
            for w in t.weights.chunks(t.n) {
                assert!((w.iter().sum::<f64>() - 1.0).abs() < 1e-9, "{mode:?} {aa}");
            }
            assert_eq!(
                t.n,
                match (mode, aa) {
                    (Mode::Cubic, false) => 4,
                    (Mode::Cubic, true) => 12,
                    (_, false) => 2,
                    _ => 6,
                }
            );
        }
        // A downscale by a million asks for millions of taps per output: refused.
        let r = attrs(Mode::Cubic, true);
        assert!(axis_taps(&r, 8, 1, 1e-6, [0.0, 1.0]).is_err());
    }
}
