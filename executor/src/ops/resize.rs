//! Resize and Upsample, nearest and (multi)linear, applied one axis at a time (both are separable).

use super::{input, opt_input};
use crate::error::{OpError, OpResult, shape_err};
use crate::ops::attrs::Attrs;
use crate::tensor::{Tensor, checked_numel};

#[derive(Clone, Debug, PartialEq)]
pub struct ResizeAttrs {
    pub linear: bool,
    pub coord: String,
    pub nearest_mode: String,
    /// Upsample (or Resize-10): scales only, asymmetric coordinates, floor rounding.
    pub legacy: bool,
    pub scales_attr: Option<Vec<f32>>,
    pub axes: Option<Vec<i64>>,
    pub exclude_outside: bool,
}

impl ResizeAttrs {
    pub fn parse(op: &str, a: &Attrs) -> Result<ResizeAttrs, String> {
        let mode = a.string_or("mode", "nearest")?;
        let linear = match mode.as_str() {
            "nearest" => false,
            "linear" | "bilinear" => true,
            other => return Err(format!("mode {other:?} is not supported (nearest, linear)")),
        };
        if a.int_or("antialias", 0)? != 0 {
            return Err("antialias is not supported".into());
        }
        let policy = a.string_or("keep_aspect_ratio_policy", "stretch")?;
        if policy != "stretch" {
            return Err(format!(
                "keep_aspect_ratio_policy {policy:?} is not supported"
            ));
        }
        Ok(ResizeAttrs {
            linear,
            coord: a.string_or("coordinate_transformation_mode", "half_pixel")?,
            nearest_mode: a.string_or("nearest_mode", "round_prefer_floor")?,
            legacy: op == "Upsample",
            scales_attr: a.floats("scales")?,
            axes: a.ints("axes")?,
            exclude_outside: a.int_or("exclude_outside", 0)? != 0,
        })
    }
}

/// The output shape of Resize/Upsample on `inputs`, and the scale of every axis.
pub(crate) fn resize_shape(
    r: &ResizeAttrs,
    inputs: &[Option<&Tensor>],
) -> OpResult<(Vec<usize>, Vec<f32>)> {
    let x = input(inputs, 0)?;
    let rank = x.rank();
    // Input layouts: Upsample-9 (X, scales), Resize-10 (X, scales), Resize-11+ (X, roi, scales, sizes).
    let (scales_t, sizes_t) = if r.legacy || inputs.len() == 2 {
        (opt_input(inputs, 1), None)
    } else {
        (opt_input(inputs, 2), opt_input(inputs, 3))
    };
    let axes: Vec<usize> = match &r.axes {
        Some(a) => a
            .iter()
            .map(|&v| crate::tensor::axis_in(v, rank))
            .collect::<OpResult<_>>()?,
        None => (0..rank).collect(),
    };
    let mut scales = vec![1.0f32; rank];
    let mut out = x.shape.clone();
    let sizes = sizes_t
        .filter(|t| !t.is_empty())
        .map(|t| t.to_i64_vec())
        .transpose()?;
    let sc = match (&r.scales_attr, scales_t.filter(|t| !t.is_empty())) {
        (Some(s), _) => Some(s.clone()),
        (None, Some(t)) => Some(t.to_f64_vec().iter().map(|&v| v as f32).collect()),
        _ => None,
    };
    match (sizes, sc) {
        (Some(sz), _) => {
            if sz.len() != axes.len() {
                return shape_err("Resize sizes do not match the axes");
            }
            for (&ax, &s) in axes.iter().zip(&sz) {
                out[ax] =
                    usize::try_from(s).map_err(|_| OpError::Shape(format!("negative size {s}")))?;
                scales[ax] = out[ax] as f32 / x.shape[ax].max(1) as f32;
            }
        }
        (None, Some(sc)) => {
            if sc.len() != axes.len() {
                return shape_err("Resize scales do not match the axes");
            }
            for (&ax, &s) in axes.iter().zip(&sc) {
                if !(s > 0.0 && s.is_finite()) {
                    return shape_err(format!("invalid scale {s}"));
                }
                scales[ax] = s;
                // A float-to-int cast saturates: an absurd scale becomes a size refused below.
                out[ax] = (x.shape[ax] as f32 * s).floor() as usize;
            }
        }
        (None, None) => return shape_err("Resize needs scales or sizes"),
    }
    checked_numel(&out)?;
    if (0..rank).any(|ax| x.shape[ax] == 0 && out[ax] > 0) {
        return shape_err(format!(
            "Resize of {:?} to {out:?}: an empty axis has nothing to sample",
            x.shape
        ));
    }
    Ok((out, scales))
}

pub fn resize(r: &ResizeAttrs, inputs: &[Option<&Tensor>]) -> OpResult<Tensor> {
    let x = input(inputs, 0)?;
    let rank = x.rank();
    let legacy = r.legacy || inputs.len() == 2;
    let (out, scales) = resize_shape(r, inputs)?;
    let mut cur = x.as_f32()?.to_vec();
    let mut shape = x.shape.clone();
    for ax in 0..rank {
        if out[ax] == shape[ax] && scales[ax] == 1.0 {
            continue;
        }
        let taps: Vec<(usize, usize, f32)> = (0..out[ax])
            .map(|o| tap(r, legacy, o, shape[ax], out[ax], scales[ax]))
            .collect();
        cur = resample_axis(&cur, &shape, ax, &taps);
        shape[ax] = out[ax];
    }
    Tensor::f32(shape, cur)
}

/// Source indices and weight of the second one for output coordinate `o` along one axis.
fn tap(
    r: &ResizeAttrs,
    legacy: bool,
    o: usize,
    len: usize,
    out_len: usize,
    scale: f32,
) -> (usize, usize, f32) {
    if len == 0 {
        return (0, 0, 0.0);
    }
    let (o, l, n, s) = (o as f32, len as f32, out_len as f32, scale);
    let coord = if legacy {
        "asymmetric"
    } else {
        r.coord.as_str()
    };
    let x = match coord {
        "asymmetric" => o / s,
        // The reference uses the unrounded resized length (input length times scale).
        "align_corners" => {
            if l * s <= 1.0 {
                0.0
            } else {
                o * (l - 1.0) / (l * s - 1.0)
            }
        }
        "pytorch_half_pixel" => {
            if out_len > 1 {
                (o + 0.5) / s - 0.5
            } else {
                0.0
            }
        }
        "tf_half_pixel_for_nn" => (o + 0.5) / s,
        "half_pixel_symmetric" => {
            let adj = n / (s * l);
            let center = l / 2.0;
            center * (1.0 - adj) + (o + 0.5) / s - 0.5
        }
        _ => (o + 0.5) / s - 0.5,
    };
    let last = len - 1;
    if r.linear {
        let x = x.clamp(0.0, last as f32);
        let i0 = x.floor() as usize;
        let i1 = (i0 + 1).min(last);
        (i0, i1, x - i0 as f32)
    } else {
        let mode = if legacy {
            "floor"
        } else {
            r.nearest_mode.as_str()
        };
        let i = match mode {
            "floor" => x.floor(),
            "ceil" => x.ceil(),
            "round_prefer_ceil" => (x + 0.5).floor(),
            _ => {
                if x.fract() == 0.5 || x.fract() == -0.5 {
                    x.floor()
                } else {
                    x.round()
                }
            }
        };
        let i = (i.max(0.0) as usize).min(last);
        (i, i, 0.0)
    }
}

fn resample_axis(
    src: &[f32],
    shape: &[usize],
    ax: usize,
    taps: &[(usize, usize, f32)],
) -> Vec<f32> {
    let outer: usize = shape[..ax].iter().product();
    let inner: usize = shape[ax + 1..].iter().product();
    let len = shape[ax];
    let mut dst = Vec::with_capacity(outer * taps.len() * inner);
    for o in 0..outer {
        let block = &src[o * len * inner..(o + 1) * len * inner];
        for &(i0, i1, w) in taps {
            let (a, b) = (
                &block[i0 * inner..(i0 + 1) * inner],
                &block[i1 * inner..(i1 + 1) * inner],
            );
            if w == 0.0 {
                dst.extend_from_slice(a);
            } else {
                dst.extend(a.iter().zip(b).map(|(p, q)| p + (q - p) * w));
            }
        }
    }
    dst
}
