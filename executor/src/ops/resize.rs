//! Resize and Upsample: nearest and (multi)linear on two taps, one axis at a time (both are
//! separable), or linear over the spatial axes at once in `resize_linear`; cubic, antialiased
//! and `tf_crop_and_resize` resampling by filter taps in `resize_filter`.

use super::resize_filter::{axis_taps, resample_axis as filter_axis};
use super::resize_linear::{self, Corners};
use super::{input, opt_input};
use crate::error::{OpError, OpResult, shape_err};
use crate::ops::attrs::Attrs;
use crate::tensor::{DType, Data, Tensor, checked_numel};

/// The interpolation.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Mode {
    #[default]
    Nearest,
    Linear,
    Cubic,
}

/// How output sizes given for several axes keep the input's aspect ratio.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum AspectPolicy {
    /// Each axis takes its own size.
    #[default]
    Stretch,
    /// One scale for all the axes, the smallest the sizes ask for.
    NotLarger,
    /// One scale for all the axes, the largest the sizes ask for.
    NotSmaller,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ResizeAttrs {
    pub mode: Mode,
    pub coord: String,
    pub nearest_mode: String,
    /// Upsample (or Resize-10): scales only, asymmetric coordinates, floor rounding.
    pub legacy: bool,
    pub scales_attr: Option<Vec<f32>>,
    pub axes: Option<Vec<i64>>,
    pub exclude_outside: bool,
    pub cubic_coeff_a: f32,
    pub antialias: bool,
    pub policy: AspectPolicy,
    /// The value of outputs whose source lies outside the region of interest.
    pub extrapolation_value: f32,
}

impl ResizeAttrs {
    pub fn parse(op: &str, a: &Attrs) -> Result<ResizeAttrs, String> {
        let mode = match a.string_or("mode", "nearest")?.as_str() {
            "nearest" => Mode::Nearest,
            "linear" | "bilinear" => Mode::Linear,
            "cubic" if op == "Resize" => Mode::Cubic,
            other => {
                return Err(format!(
                    "attribute \"mode\" is {other:?}, not nearest, linear or cubic"
                ));
            }
        };
        let antialias = a.flag("antialias", false)?;
        if antialias && mode == Mode::Nearest {
            return Err("attribute \"antialias\" applies to linear and cubic modes only".into());
        }
        let policy = match a.string_or("keep_aspect_ratio_policy", "stretch")?.as_str() {
            "stretch" => AspectPolicy::Stretch,
            "not_larger" => AspectPolicy::NotLarger,
            "not_smaller" => AspectPolicy::NotSmaller,
            other => {
                return Err(format!(
                    "attribute \"keep_aspect_ratio_policy\" is {other:?}, not stretch, \
                     not_larger or not_smaller"
                ));
            }
        };
        let coord = a.string_or("coordinate_transformation_mode", "half_pixel")?;
        if !matches!(
            coord.as_str(),
            "half_pixel"
                | "half_pixel_symmetric"
                | "pytorch_half_pixel"
                | "align_corners"
                | "asymmetric"
                | "tf_half_pixel_for_nn"
                | "tf_crop_and_resize"
        ) {
            return Err(format!(
                "attribute \"coordinate_transformation_mode\" {coord:?} is not an ONNX mode"
            ));
        }
        let nearest_mode = a.string_or("nearest_mode", "round_prefer_floor")?;
        if !matches!(
            nearest_mode.as_str(),
            "round_prefer_floor" | "round_prefer_ceil" | "floor" | "ceil"
        ) {
            return Err(format!(
                "attribute \"nearest_mode\" {nearest_mode:?} is not an ONNX rounding"
            ));
        }
        let cubic_coeff_a = a.float_or("cubic_coeff_a", -0.75)?;
        let extrapolation_value = a.float_or("extrapolation_value", 0.0)?;
        if !cubic_coeff_a.is_finite() {
            return Err(format!("attribute \"cubic_coeff_a\" is {cubic_coeff_a}"));
        }
        Ok(ResizeAttrs {
            mode,
            coord,
            nearest_mode,
            legacy: op == "Upsample",
            scales_attr: a.floats("scales")?,
            axes: a.ints("axes")?,
            exclude_outside: a.flag("exclude_outside", false)?,
            cubic_coeff_a,
            antialias,
            policy,
            extrapolation_value,
        })
    }

    /// Resampled by filter taps (`resize_filter`) rather than on two taps.
    pub(crate) fn filtered(&self, legacy: bool) -> bool {
        !legacy
            && (self.mode == Mode::Cubic || self.antialias || self.coord == "tf_crop_and_resize")
    }
}

/// The output shape of Resize/Upsample on `inputs`, and the scale of every axis.
pub(crate) fn resize_shape(
    r: &ResizeAttrs,
    inputs: &[Option<&Tensor>],
) -> OpResult<(Vec<usize>, Vec<f64>)> {
    let x = input(inputs, 0)?;
    let rank = x.rank();
    // Input layouts: Upsample-9 (X, scales), Resize-10 (X, scales), Resize-11+ (X, roi, scales, sizes).
    let (scales_t, sizes_t) = if r.legacy || inputs.len() == 2 {
        (opt_input(inputs, 1), None)
    } else {
        (opt_input(inputs, 2), opt_input(inputs, 3))
    };
    let axes = axes(r, rank)?;
    let mut scales = vec![1.0f64; rank];
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
                scales[ax] = out[ax] as f64 / x.shape[ax].max(1) as f64;
            }
            // One scale for every axis: the smallest or largest asked for, and the sizes it
            // gives (rounded half up).
            let one = match r.policy {
                AspectPolicy::Stretch => None,
                AspectPolicy::NotLarger => axes.iter().map(|&a| scales[a]).reduce(f64::min),
                AspectPolicy::NotSmaller => axes.iter().map(|&a| scales[a]).reduce(f64::max),
            };
            if let Some(scale) = one {
                for &ax in &axes {
                    scales[ax] = scale;
                    // A float-to-int cast saturates: an absurd size is refused below.
                    out[ax] = (scale * x.shape[ax] as f64 + 0.5) as usize;
                }
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
                scales[ax] = f64::from(s);
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

/// The axes the node resizes (attribute `axes`, every axis without it).
fn axes(r: &ResizeAttrs, rank: usize) -> OpResult<Vec<usize>> {
    let axes: Vec<usize> = match &r.axes {
        Some(a) => a
            .iter()
            .map(|&v| crate::tensor::axis_in(v, rank))
            .collect::<OpResult<_>>()?,
        None => (0..rank).collect(),
    };
    let mut seen = vec![false; rank];
    for &a in &axes {
        if std::mem::replace(&mut seen[a], true) {
            return shape_err(format!("attribute \"axes\" names axis {a} twice"));
        }
    }
    Ok(axes)
}

/// The region of interest of every axis (`tf_crop_and_resize`): input 1, the starts then the
/// ends of the resized axes as fractions of the input; `[0, 1]` elsewhere.
fn regions(r: &ResizeAttrs, inputs: &[Option<&Tensor>], rank: usize) -> OpResult<Vec<[f64; 2]>> {
    let mut roi = vec![[0.0, 1.0]; rank];
    if r.coord != "tf_crop_and_resize" {
        return Ok(roi);
    }
    let axes = axes(r, rank)?;
    let given = opt_input(inputs, 1)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| OpError::Shape("tf_crop_and_resize needs the roi input".into()))?;
    let v = given.to_f64_vec();
    if v.len() != 2 * axes.len() {
        return shape_err(format!(
            "roi has {} values for {} resized axes (a start and an end each)",
            v.len(),
            axes.len()
        ));
    }
    for (k, &ax) in axes.iter().enumerate() {
        let (a, b) = (v[k], v[k + axes.len()]);
        if !(a.is_finite() && b.is_finite() && a.abs() <= 1e6 && b.abs() <= 1e6) {
            return shape_err(format!("roi [{a}, {b}] of axis {ax}"));
        }
        roi[ax] = [a, b];
    }
    Ok(roi)
}

/// One output position along an axis: the two input positions it reads and the second's
/// weight (0 where it picks the first alone).
type Tap = (usize, usize, f32);

pub fn resize(cx: &super::Cx, r: &ResizeAttrs, inputs: &[Option<&Tensor>]) -> OpResult<Tensor> {
    let x = input(inputs, 0)?;
    let rank = x.rank();
    let legacy = r.legacy || inputs.len() == 2;
    let (out, scales) = resize_shape(r, inputs)?;
    if r.filtered(legacy) {
        return resize_filtered(r, inputs, &out, &scales);
    }
    if r.mode == Mode::Linear
        && let Some(spatial) = resize_linear::spatial_axes(&scales)
    {
        // An unscaled axis keeps its positions (onnxruntime skips the coordinate transform).
        let corners: Vec<Vec<Corners>> = spatial
            .clone()
            .map(|ax| {
                let (len, scale) = (x.shape[ax], scales[ax] as f32);
                (0..out[ax])
                    .map(|o| {
                        let at = if scales[ax] == 1.0 {
                            o as f32
                        } else {
                            source(r, legacy, o, len, out[ax], scale)
                        };
                        Corners::around(at, len)
                    })
                    .collect()
            })
            .collect();
        let data = resize_linear::blend(cx, x.as_f32()?, &x.shape, spatial, &corners, &out);
        return Tensor::f32(out, data);
    }
    // The input is read in place by the first axis resampled, not copied.
    let mut cur = std::borrow::Cow::Borrowed(x.as_f32()?);
    let mut shape = x.shape.clone();
    let axes: Vec<(usize, Vec<Tap>)> = (0..rank)
        .filter(|&ax| out[ax] != shape[ax] || scales[ax] != 1.0)
        .map(|ax| {
            let taps = (0..out[ax])
                .map(|o| tap(r, legacy, o, shape[ax], out[ax], scales[ax] as f32))
                .collect();
            (ax, taps)
        })
        .collect();
    // Where every tap picks one element (nearest, or whole-number positions) the axes may go
    // in any order: the last first, so that its element-by-element gather runs on the
    // smaller tensor and the other axes copy whole rows of its output.
    let picks = axes
        .iter()
        .all(|(_, t)| t.iter().all(|&(_, _, w)| w == 0.0));
    let mut order: Vec<_> = axes.iter().collect();
    if picks {
        order.reverse();
    }
    for (ax, taps) in order {
        cur = std::borrow::Cow::Owned(resample_axis(&cur, &shape, *ax, taps));
        shape[*ax] = out[*ax];
    }
    Tensor::f32(shape, cur.into_owned())
}

/// Resize by filter taps (cubic, antialiased, crop-and-resize), in f64.
fn resize_filtered(
    r: &ResizeAttrs,
    inputs: &[Option<&Tensor>],
    out: &[usize],
    scales: &[f64],
) -> OpResult<Tensor> {
    let x = input(inputs, 0)?;
    if !matches!(x.dtype(), DType::F32 | DType::F64) {
        return Err(OpError::DType(format!("Resize of {:?}", x.dtype())));
    }
    let roi = regions(r, inputs, x.rank())?;
    let mut cur = x.to_f64_vec();
    let mut shape = x.shape.clone();
    for ax in 0..x.rank() {
        let near = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs());
        let whole = near(roi[ax][0], 0.0) && near(roi[ax][1], 1.0);
        if out[ax] == shape[ax] && near(scales[ax], 1.0) && whole {
            continue;
        }
        let taps = axis_taps(r, shape[ax], out[ax], scales[ax], roi[ax])?;
        cur = filter_axis(&cur, &shape, ax, &taps, f64::from(r.extrapolation_value));
        shape[ax] = out[ax];
    }
    Ok(super::elementwise::cast(
        &Tensor::new(shape, Data::F64(cur))?,
        x.dtype(),
    ))
}

/// Source indices and weight of the second one for output coordinate `o` along one axis.
fn tap(r: &ResizeAttrs, legacy: bool, o: usize, len: usize, out_len: usize, scale: f32) -> Tap {
    if len == 0 {
        return (0, 0, 0.0);
    }
    let x = source(r, legacy, o, len, out_len, scale);
    let last = len - 1;
    if r.mode == Mode::Linear {
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

/// The input coordinate that output position `o` along an axis samples.
fn source(r: &ResizeAttrs, legacy: bool, o: usize, len: usize, out_len: usize, scale: f32) -> f32 {
    let (o, l, n, s) = (o as f32, len as f32, out_len as f32, scale);
    let coord = if legacy {
        "asymmetric"
    } else {
        r.coord.as_str()
    };
    match coord {
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
    }
}

fn resample_axis(src: &[f32], shape: &[usize], ax: usize, taps: &[Tap]) -> Vec<f32> {
    let outer: usize = shape[..ax].iter().product();
    let inner: usize = shape[ax + 1..].iter().product();
    let len = shape[ax];
    let mut dst = Vec::with_capacity(outer * taps.len() * inner);
    let lerp = |p: f32, q: f32, w: f32| if w == 0.0 { p } else { p + (q - p) * w };
    for o in 0..outer {
        let block = &src[o * len * inner..(o + 1) * len * inner];
        if inner == 1 {
            // The last axis: element by element, where a run of one cost a copy call each.
            dst.extend(
                taps.iter()
                    .map(|&(i0, i1, w)| lerp(block[i0], block[i1], w)),
            );
            continue;
        }
        for &(i0, i1, w) in taps {
            let (a, b) = (
                &block[i0 * inner..(i0 + 1) * inner],
                &block[i1 * inner..(i1 + 1) * inner],
            );
            if w == 0.0 {
                dst.extend_from_slice(a);
            } else {
                dst.extend(a.iter().zip(b).map(|(&p, &q)| lerp(p, q, w)));
            }
        }
    }
    dst
}
