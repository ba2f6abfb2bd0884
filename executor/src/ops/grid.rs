//! Sampling grids: GridSample reads an input at the normalised coordinates of a grid (nearest,
//! linear or cubic, over any number of spatial axes), and AffineGrid makes such a grid from
//! affine matrices. Both follow the ONNX reference (which follows PyTorch): a grid's last axis
//! lists coordinates innermost axis first, `-1` and `1` are the outer edges of the first and
//! last pixels (their centres with `align_corners`), and coordinates are denormalised in f32.

use super::attrs::Attrs;
use crate::error::{OpError, OpResult, shape_err};
use crate::tensor::{DType, Data, Tensor, checked_numel};

/// Spatial axes GridSample takes at most: a point reads 4^axes input elements in cubic mode.
const MAX_AXES: usize = 6;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Interp {
    Nearest,
    Linear,
    Cubic,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Padding {
    /// Points outside the input read zeros.
    Zeros,
    /// Coordinates are clamped to the edge pixels.
    Border,
    /// Coordinates are reflected at the edges until inside.
    Reflection,
}

#[derive(Clone, Debug, PartialEq)]
pub struct GridSampleAttrs {
    pub mode: Interp,
    pub padding: Padding,
    pub align_corners: bool,
}

impl GridSampleAttrs {
    pub fn parse(a: &Attrs) -> Result<GridSampleAttrs, String> {
        // Opset 16 names the modes bilinear and bicubic; opset 20 linear and cubic.
        let mode = match a.string_or("mode", "linear")?.as_str() {
            "nearest" => Interp::Nearest,
            "linear" | "bilinear" => Interp::Linear,
            "cubic" | "bicubic" => Interp::Cubic,
            m => {
                return Err(format!(
                    "attribute \"mode\" is {m:?}, not linear, nearest or cubic"
                ));
            }
        };
        let padding = match a.string_or("padding_mode", "zeros")?.as_str() {
            "zeros" => Padding::Zeros,
            "border" => Padding::Border,
            "reflection" => Padding::Reflection,
            p => {
                return Err(format!(
                    "attribute \"padding_mode\" is {p:?}, not zeros, border or reflection"
                ));
            }
        };
        Ok(GridSampleAttrs {
            mode,
            padding,
            align_corners: a.flag("align_corners", false)?,
        })
    }
}

fn float_data(t: &Tensor, what: &str) -> OpResult<Vec<f64>> {
    match t.dtype() {
        DType::F32 | DType::F64 => Ok(t.to_f64_vec()),
        d => Err(OpError::DType(format!(
            "{what} of {d:?}: float32 or float64 is supported"
        ))),
    }
}

/// `v` (f64 values) as a tensor of float type `dtype`.
fn of_type(shape: Vec<usize>, v: Vec<f64>, dtype: DType) -> OpResult<Tensor> {
    match dtype {
        DType::F64 => Tensor::new(shape, Data::F64(v)),
        _ => Tensor::new(shape, Data::F32(v.into_iter().map(|e| e as f32).collect())),
    }
}

/// GridSample's output shape: `[N, C, grid's spatial sizes]`.
pub fn grid_sample_shape(x: &[usize], grid: &[usize]) -> OpResult<Vec<usize>> {
    let r = x.len().saturating_sub(2);
    if x.len() < 3 || grid.len() != r + 2 || grid[0] != x[0] || grid[r + 1] != r {
        return shape_err(format!(
            "GridSample of {x:?} with a grid of {grid:?}: the grid must be [N, spatial..., {r}] \
             for an input [N, C, {r} spatial axes]"
        ));
    }
    if r > MAX_AXES {
        return Err(OpError::Unsupported(format!(
            "GridSample over {r} spatial axes (at most {MAX_AXES})"
        )));
    }
    let mut out = vec![x[0], x[1]];
    out.extend(&grid[1..=r]);
    checked_numel(&out)?;
    Ok(out)
}

/// Reflects `x` at `lo` and `hi` until it lies between them.
fn reflect(x: f64, lo: f64, hi: f64) -> f64 {
    let span = hi - lo;
    if span <= 0.0 {
        return lo;
    }
    let (dx, from_low) = if x < lo {
        (lo - x, true)
    } else if x > hi {
        (x - hi, false)
    } else {
        return x;
    };
    let n = (dx / span).trunc();
    let r = dx - n * span;
    let even = n % 2.0 == 0.0;
    let v = if even == from_low { lo + r } else { hi - r };
    v.clamp(lo, hi)
}

/// Keys' cubic convolution weights (A = -0.75) of the four taps around a point `t` past the
/// second tap.
fn cubic_weights(t: f64) -> [f64; 4] {
    const A: f64 = -0.75;
    let far = |x: f64| ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A;
    let near = |x: f64| ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]
}

/// The input index a tap at integer position `i` of an axis of `d` reads, or `None` for a
/// zero; `lo..=hi` are the axis's bounds for reflection.
fn tap(i: i64, d: usize, padding: Padding, lo: f64, hi: f64) -> Option<usize> {
    let last = d as i64 - 1;
    match padding {
        Padding::Zeros => (0..=last).contains(&i).then_some(i as usize),
        Padding::Border => Some(i.clamp(0, last) as usize),
        Padding::Reflection => {
            Some((reflect(i as f64, lo, hi).trunc() as i64).clamp(0, last) as usize)
        }
    }
}

pub fn grid_sample(g: &GridSampleAttrs, x: &Tensor, grid: &Tensor) -> OpResult<Tensor> {
    let out_shape = grid_sample_shape(&x.shape, &grid.shape)?;
    let xv = float_data(x, "GridSample input")?;
    let gv = float_data(grid, "GridSample grid")?;
    let (n, c, dims) = (x.shape[0], x.shape[1], &x.shape[2..]);
    let r = dims.len();
    let points: usize = grid.shape[1..=r].iter().product();
    let mut out = vec![0.0; checked_numel(&out_shape)?];
    if out.is_empty() {
        return of_type(out_shape, out, x.dtype());
    }
    if dims.contains(&0) {
        return shape_err(format!("GridSample of an empty input {:?}", x.shape));
    }
    let plane: usize = dims.iter().product();
    let strides = crate::tensor::strides(dims);
    // Per axis: the bounds a coordinate is clamped or reflected to.
    let bounds: Vec<(f64, f64)> = dims
        .iter()
        .map(|&d| match g.align_corners {
            true => (0.0, d as f64 - 1.0),
            false => (-0.5, d as f64 - 0.5),
        })
        .collect();
    // Per axis of one point: the input offsets it reads (None: a zero) and their weights.
    let mut taps: Vec<Vec<(Option<usize>, f64)>> = vec![Vec::new(); r];
    for b in 0..n {
        for p in 0..points {
            let coords = &gv[(b * points + p) * r..(b * points + p + 1) * r];
            for (i, axis_taps) in taps.iter_mut().enumerate() {
                let (d, (lo, hi)) = (dims[i], bounds[i]);
                // The grid lists the innermost axis first.
                let norm = coords[r - 1 - i] as f32;
                let mut x = match g.align_corners {
                    true => (norm + 1.0) / 2.0 * (d as f32 - 1.0),
                    false => ((norm + 1.0) * d as f32 - 1.0) / 2.0,
                };
                if g.mode == Interp::Nearest {
                    x = x.round_ties_even();
                }
                if (x as f64) < lo || (x as f64) > hi {
                    match g.padding {
                        Padding::Border => x = x.clamp(0.0, d as f32 - 1.0),
                        Padding::Reflection => x = reflect(x as f64, lo, hi) as f32,
                        Padding::Zeros => {}
                    }
                }
                let stride = strides[i];
                let at = |k: i64| tap(k, d, g.padding, lo, hi).map(|k| k * stride);
                axis_taps.clear();
                match g.mode {
                    Interp::Nearest => axis_taps.push((at(x as i64), 1.0)),
                    Interp::Linear | Interp::Cubic => {
                        let x0 = x.floor();
                        let t = (x - x0) as f64;
                        let x0 = x0 as i64;
                        if g.mode == Interp::Linear {
                            axis_taps.push((at(x0), 1.0 - t));
                            axis_taps.push((at(x0.saturating_add(1)), t));
                        } else {
                            for (k, w) in cubic_weights(t).into_iter().enumerate() {
                                axis_taps.push((at(x0.saturating_add(k as i64 - 1)), w));
                            }
                        }
                    }
                }
            }
            for ch in 0..c {
                let src = &xv[(b * c + ch) * plane..(b * c + ch + 1) * plane];
                out[(b * c + ch) * points + p] = weighted_sum(src, &taps);
            }
        }
    }
    of_type(out_shape, out, x.dtype())
}

/// The sum over every combination of one tap per axis of the product of their weights times
/// the element they pick.
fn weighted_sum(src: &[f64], taps: &[Vec<(Option<usize>, f64)>]) -> f64 {
    let Some((first, rest)) = taps.split_first() else {
        return 0.0;
    };
    let mut sum = 0.0;
    let mut stack: Vec<(usize, Option<usize>, f64)> =
        first.iter().map(|&(off, w)| (0, off, w)).collect();
    while let Some((axis, off, w)) = stack.pop() {
        if axis == rest.len() {
            if let Some(o) = off {
                sum += w * src[o];
            }
            continue;
        }
        for &(o, v) in &rest[axis] {
            stack.push((axis + 1, off.zip(o).map(|(a, b)| a + b), w * v));
        }
    }
    sum
}

/// AffineGrid's output shape from `size` (`[N, C, H, W]` or `[N, C, D, H, W]`): the grid
/// `[N, H, W, 2]` or `[N, D, H, W, 3]`.
pub fn affine_grid_shape(size: &Tensor) -> OpResult<Vec<usize>> {
    let v = size.to_i64_vec()?;
    if !matches!(v.len(), 4 | 5) || v.iter().any(|&d| d < 0) {
        return shape_err(format!(
            "AffineGrid size {v:?}: [N, C, H, W] or [N, C, D, H, W], none negative"
        ));
    }
    let v: Vec<usize> = v.iter().map(|&d| d as usize).collect();
    let mut out = vec![v[0]];
    out.extend(&v[2..]);
    out.push(v.len() - 2);
    checked_numel(&out)?;
    Ok(out)
}

/// The normalised coordinate of pixel `k` of `s` along an axis.
fn base_coord(k: usize, s: usize, align_corners: bool) -> f64 {
    match align_corners {
        true if s > 1 => -1.0 + k as f64 * (2.0 / (s as f64 - 1.0)),
        true => -1.0,
        false => {
            let step = 2.0 / s as f64;
            -1.0 + step / 2.0 + k as f64 * step
        }
    }
}

pub fn affine_grid(align_corners: bool, theta: &Tensor, size: &Tensor) -> OpResult<Tensor> {
    let out_shape = affine_grid_shape(size)?;
    let r = out_shape.len() - 2;
    let n = out_shape[0];
    if theta.shape != [n, r, r + 1] {
        return shape_err(format!(
            "AffineGrid theta of shape {:?}: {r}-D grids for {n} images need [{n}, {r}, {}]",
            theta.shape,
            r + 1
        ));
    }
    let th = float_data(theta, "AffineGrid theta")?;
    let spatial = &out_shape[1..=r];
    let points: usize = spatial.iter().product();
    let strides = crate::tensor::strides(spatial);
    let mut out = vec![0.0; checked_numel(&out_shape)?];
    let mut homog = vec![1.0; r + 1];
    for p in 0..points {
        // Homogeneous coordinates, innermost axis first.
        for (i, (&s, &st)) in spatial.iter().zip(&strides).enumerate() {
            homog[r - 1 - i] = base_coord(p / st % s, s, align_corners);
        }
        for b in 0..n {
            let m = &th[b * r * (r + 1)..(b + 1) * r * (r + 1)];
            for j in 0..r {
                let row = &m[j * (r + 1)..(j + 1) * (r + 1)];
                out[(b * points + p) * r + j] = row.iter().zip(&homog).map(|(a, h)| a * h).sum();
            }
        }
    }
    of_type(out_shape, out, theta.dtype())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(mode: Interp, padding: Padding, align_corners: bool) -> GridSampleAttrs {
        GridSampleAttrs {
            mode,
            padding,
            align_corners,
        }
    }

    #[test]
    fn grid_sample_reads_corners_centres_and_outside() {
        // A 2x2 image; points at its corners' centres, its centre, and past its right edge.
        let x = Tensor::f32(vec![1, 1, 2, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
        let grid = Tensor::f32(vec![1, 1, 4, 2], vec![-1., -1., 1., 1., 0., 0., 3., 0.]).unwrap();
        let run = |m, p, a| {
            grid_sample(&attrs(m, p, a), &x, &grid)
                .unwrap()
                .into_f32()
                .unwrap()
        };
        assert_eq!(
            run(Interp::Linear, Padding::Zeros, true),
            vec![1.0, 4.0, 2.5, 0.0]
        );
        assert_eq!(
            run(Interp::Linear, Padding::Border, true),
            vec![1.0, 4.0, 2.5, 3.0]
        );
        // Without align_corners -1 is the outer edge: half of the corner pixel, half zero.
        assert_eq!(run(Interp::Linear, Padding::Zeros, false)[..2], [0.25, 1.0]);
        // Nearest rounds half to even (0.5 to 0); x = 2 (grid 3) reflects at 1 back to 0, or
        // clamps to 1.
        assert_eq!(
            run(Interp::Nearest, Padding::Reflection, true),
            vec![1.0, 4.0, 1.0, 1.0]
        );
        assert_eq!(
            run(Interp::Nearest, Padding::Border, true),
            vec![1.0, 4.0, 1.0, 2.0]
        );
        // Cubic through a constant image stays constant inside.
        let flat = Tensor::f32(vec![1, 1, 2, 2], vec![5.0; 4]).unwrap();
        let y = grid_sample(&attrs(Interp::Cubic, Padding::Border, false), &flat, &grid).unwrap();
        for v in y.into_f32().unwrap() {
            assert!((v - 5.0).abs() < 1e-5, "{v}");
        }
    }

    #[test]
    fn grid_shapes_are_checked() {
        let x = Tensor::f32(vec![1, 1, 2, 2], vec![0.0; 4]).unwrap();
        let bad = Tensor::f32(vec![1, 1, 4, 3], vec![0.0; 12]).unwrap();
        let a = attrs(Interp::Linear, Padding::Zeros, false);
        assert!(grid_sample(&a, &x, &bad).is_err());
        let size = Tensor::i64(vec![4], vec![1, 1, 2, 3]).unwrap();
        let theta = Tensor::f32(vec![1, 2, 3], vec![1., 0., 0., 0., 1., 0.]).unwrap();
        let g = affine_grid(true, &theta, &size).unwrap();
        assert_eq!(g.shape, vec![1, 2, 3, 2]);
        // The identity gives the base grid: x across the width, y down the height.
        assert_eq!(
            g.into_f32().unwrap(),
            vec![-1., -1., 0., -1., 1., -1., -1., 1., 0., 1., 1., 1.]
        );
        let wrong = Tensor::f32(vec![1, 3, 4], vec![0.0; 12]).unwrap();
        assert!(affine_grid(true, &wrong, &size).is_err());
        let negative = Tensor::i64(vec![4], vec![1, 1, -2, 3]).unwrap();
        assert!(affine_grid(true, &theta, &negative).is_err());
    }
}
