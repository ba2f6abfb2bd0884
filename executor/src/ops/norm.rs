//! Normalisations: BatchNormalization (inference), LRN, Softmax/LogSoftmax, LayerNormalization,
//! RMSNormalization, GroupNormalization, InstanceNormalization, LpNormalization and
//! MeanVarianceNormalization.

use super::elementwise::{Binary, binary, cast};
use super::elementwise::{broadcast_map, broadcast_shape};
use super::reduce::{ReduceAttrs, ReduceKind, reduce};
use super::{Cx, input, opt_input};
use crate::error::{OpError, OpResult, shape_err};
use crate::tensor::{DType, Data, Tensor, axis_in, checked_numel, norm_axis};
use cotenant_kernels::norm::{
    layer_norm_rows_into, mean_inv_std, rms_norm_rows, softmax_rows, softmax_rows_into,
};

/// The mean (or another reduction) of `x` over `axes`, keeping them as axes of size 1.
fn reduce_kept(kind: ReduceKind, x: &Tensor, axes: &[i64]) -> OpResult<Tensor> {
    let r = ReduceAttrs {
        kind,
        axes: Some(axes.to_vec()),
        keepdims: true,
        noop_with_empty_axes: false,
    };
    reduce(&r, &[Some(x)])
}

fn float_only(x: &Tensor, op: &str) -> OpResult<()> {
    match x.dtype() {
        DType::F32 | DType::F64 => Ok(()),
        d => Err(OpError::DType(format!("{op} of {d:?}"))),
    }
}

/// `x` divided by its L1 (`p` 1) or L2 (`p` 2) norm along `axis`; a zero norm gives zeros.
pub fn lp_norm(x: &Tensor, axis: i64, p: u8) -> OpResult<Tensor> {
    float_only(x, "LpNormalization")?;
    let kind = match p {
        1 => ReduceKind::ReduceL1,
        _ => ReduceKind::ReduceL2,
    };
    let axis = axis_in(axis, x.rank())?;
    let norm = reduce_kept(kind, x, &[axis as i64])?;
    let v = broadcast_map(
        &x.to_f64_vec(),
        &x.shape,
        &norm.to_f64_vec(),
        &norm.shape,
        &x.shape,
        |v, n| if n == 0.0 { 0.0 } else { v / n },
    );
    Ok(cast(
        &Tensor::new(x.shape.clone(), Data::F64(v))?,
        x.dtype(),
    ))
}

/// `(x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9)` with the expectations over `axes`, as ONNX's
/// function body defines MeanVarianceNormalization.
pub fn mean_variance_norm(x: &Tensor, axes: &[i64]) -> OpResult<Tensor> {
    float_only(x, "MeanVarianceNormalization")?;
    let mean = reduce_kept(ReduceKind::ReduceMean, x, axes)?;
    let mean_of_squares = reduce_kept(ReduceKind::ReduceMean, &binary(Binary::Mul, x, x)?, axes)?;
    let variance = binary(
        Binary::Sub,
        &mean_of_squares,
        &binary(Binary::Mul, &mean, &mean)?,
    )?;
    let std = variance
        .to_f64_vec()
        .iter()
        .map(|v| v.sqrt() + 1e-9)
        .collect();
    let std = cast(
        &Tensor::new(variance.shape.clone(), Data::F64(std))?,
        x.dtype(),
    );
    binary(Binary::Div, &binary(Binary::Sub, x, &mean)?, &std)
}

pub fn batch_norm(inputs: &[Option<&Tensor>], eps: f32) -> OpResult<Tensor> {
    let x = input(inputs, 0)?;
    let params: Vec<&[f32]> = (1..5)
        .map(|i| input(inputs, i)?.as_f32())
        .collect::<OpResult<_>>()?;
    if x.rank() < 2 {
        return shape_err(format!("BatchNormalization input {:?}", x.shape));
    }
    let c = x.shape[1];
    if params.iter().any(|p| p.len() != c) {
        return shape_err(format!(
            "BatchNormalization parameters must have {c} values"
        ));
    }
    let (scale, shift) = fold_params(params[0], params[1], params[2], params[3], eps);
    let plane: usize = x.shape[2..].iter().product();
    let mut out = x.as_f32()?.to_vec();
    if plane > 0 {
        for (i, chunk) in out.chunks_mut(plane).enumerate() {
            let (a, b) = (scale[i % c], shift[i % c]);
            chunk.iter_mut().for_each(|v| *v = *v * a + b);
        }
    }
    Tensor::f32(x.shape.clone(), out)
}

/// Per-channel `(a, b)` with `bn(x) = a*x + b`; also what the BatchNorm→Conv fold uses.
pub fn fold_params(
    gamma: &[f32],
    beta: &[f32],
    mean: &[f32],
    var: &[f32],
    eps: f32,
) -> (Vec<f32>, Vec<f32>) {
    let a: Vec<f32> = gamma
        .iter()
        .zip(var)
        .map(|(g, v)| g / (v + eps).sqrt())
        .collect();
    let b = a
        .iter()
        .zip(beta)
        .zip(mean)
        .map(|((a, b), m)| b - a * m)
        .collect();
    (a, b)
}

/// Windows up to this many channels are summed directly (as onnxruntime sums them, in f32);
/// wider ones from running sums in f64, so a window of a million channels over a million
/// channels costs a pass, not 10^12 steps.
const LRN_DIRECT_MAX: usize = 32;

pub fn lrn(x: &Tensor, size: usize, alpha: f32, beta: f32, bias: f32) -> OpResult<Tensor> {
    if x.rank() < 3 {
        return shape_err(format!("LRN input {:?}", x.shape));
    }
    let (n, c) = (x.shape[0], x.shape[1]);
    let plane: usize = x.shape[2..].iter().product();
    let v = x.as_f32()?;
    let size = size.max(1);
    let (lo, hi) = ((size - 1) / 2, (size - 1).div_ceil(2));
    let at = |ni: usize, ci: usize, p: usize| (ni * c + ci) * plane + p;
    let window = |ci: usize| (ci.saturating_sub(lo), (ci + hi).min(c - 1));
    // The sum of squares over each value's window of channels.
    let mut sums = vec![0.0f32; v.len()];
    if size <= LRN_DIRECT_MAX {
        for ni in 0..n {
            for ci in 0..c {
                let (a, b) = window(ci);
                for p in 0..plane {
                    let square = |cj| v[at(ni, cj, p)] * v[at(ni, cj, p)];
                    sums[at(ni, ci, p)] = (a..=b).fold(0.0f32, |s, cj| s + square(cj));
                }
            }
        }
    } else {
        // Per image and position, over the channels before each channel: the sum of the finite
        // values' squares, and how many were NaN and how many infinite (a difference of running
        // sums would spread one NaN or infinity to every later window).
        let mut before = vec![(0.0f64, 0usize, 0usize); c + 1];
        for ni in 0..n {
            for p in 0..plane {
                for ci in 0..c {
                    let t = v[at(ni, ci, p)];
                    let (sum, nans, infinities) = before[ci];
                    before[ci + 1] = match t {
                        t if t.is_nan() => (sum, nans + 1, infinities),
                        t if t.is_infinite() => (sum, nans, infinities + 1),
                        t => (sum + f64::from(t) * f64::from(t), nans, infinities),
                    };
                }
                for ci in 0..c {
                    let (a, b) = window(ci);
                    let (hi, lo) = (before[b + 1], before[a]);
                    sums[at(ni, ci, p)] = if hi.1 > lo.1 {
                        f32::NAN
                    } else if hi.2 > lo.2 {
                        f32::INFINITY
                    } else {
                        (hi.0 - lo.0) as f32
                    };
                }
            }
        }
    }
    let out = v
        .iter()
        .zip(&sums)
        .map(|(x, s)| x / (bias + alpha / size as f32 * s).powf(beta))
        .collect();
    Tensor::f32(x.shape.clone(), out)
}

/// Softmax (or LogSoftmax) of `scale · x` (`scale` positive and finite; only f32 inputs are
/// ever scaled).
pub fn softmax(
    cx: &Cx,
    x: &Tensor,
    axis: i64,
    log: bool,
    legacy: bool,
    scale: f32,
) -> OpResult<Tensor> {
    if x.rank() == 0 {
        return shape_err("Softmax of a scalar");
    }
    let axis = norm_axis(axis, x.rank())?;
    if let Data::F64(v) = &x.data {
        if scale != 1.0 {
            return Err(OpError::Unsupported("a scaled float64 Softmax".into()));
        }
        return softmax_f64(x, v, axis, log, legacy);
    }
    let mut out = cx.take_f32(x.len());
    // No rows to normalise (and rows of length 0 would split nothing).
    if out.is_empty() {
        return Tensor::f32(x.shape.clone(), out);
    }
    let inner: usize = x.shape[axis + 1..].iter().product();
    if legacy || inner == 1 {
        // Before opset 13 the input is coerced to 2-D at `axis`; otherwise the axis is last.
        let len: usize = x.shape[axis..].iter().product();
        softmax_rows_into(cx.threads, x.as_f32()?, &mut out, len, log, scale);
    } else {
        for (o, &v) in out.iter_mut().zip(x.as_f32()?) {
            *o = v * scale;
        }
        let n = x.shape[axis];
        let mut row = vec![0.0f32; n];
        for block in out.chunks_mut(n * inner) {
            for i in 0..inner {
                for (j, r) in row.iter_mut().enumerate() {
                    *r = block[j * inner + i];
                }
                softmax_rows(1, &mut row, n, log);
                for (j, r) in row.iter().enumerate() {
                    block[j * inner + i] = *r;
                }
            }
        }
    }
    Tensor::f32(x.shape.clone(), out)
}

/// Softmax (or LogSoftmax) of a float64 tensor along `axis` (all axes from `axis` with
/// `legacy`), in f64.
fn softmax_f64(x: &Tensor, v: &[f64], axis: usize, log: bool, legacy: bool) -> OpResult<Tensor> {
    let (n, inner) = if legacy {
        (x.shape[axis..].iter().product::<usize>(), 1)
    } else {
        (x.shape[axis], x.shape[axis + 1..].iter().product::<usize>())
    };
    let mut out = v.to_vec();
    if n * inner > 0 {
        for block in out.chunks_mut(n * inner) {
            for i in 0..inner {
                let at = |j: usize| j * inner + i;
                let max = (0..n)
                    .map(|j| block[at(j)])
                    .fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = (0..n).map(|j| (block[at(j)] - max).exp()).sum();
                for j in 0..n {
                    let e = block[at(j)] - max;
                    block[at(j)] = if log { e - sum.ln() } else { e.exp() / sum };
                }
            }
        }
    }
    Tensor::new(x.shape.clone(), Data::F64(out))
}

pub fn layer_norm(
    cx: &Cx,
    inputs: &[Option<&Tensor>],
    axis: i64,
    eps: f32,
    stats: bool,
) -> OpResult<Vec<Tensor>> {
    let x = input(inputs, 0)?;
    let axis = norm_axis(axis, x.rank())?;
    let norm_shape = &x.shape[axis..];
    let len: usize = norm_shape.iter().product();
    let expand = |t: &Tensor| over(t, norm_shape, "LayerNormalization scale or bias");
    let gamma = expand(input(inputs, 1)?)?;
    let beta = opt_input(inputs, 2).map(expand).transpose()?;
    let src = x.as_f32()?;
    let mut out = cx.take_f32(src.len());
    layer_norm_rows_into(cx.threads, src, &mut out, len, &gamma, beta.as_deref(), eps);
    if !stats {
        return Ok(vec![Tensor::f32(x.shape.clone(), out)?]);
    }
    // Mean and inverse std-dev outputs, shaped like the input with the normalised axes as 1.
    let mut stat_shape = x.shape[..axis].to_vec();
    stat_shape.extend(std::iter::repeat_n(1, x.rank() - axis));
    let (means, inv): (Vec<f32>, Vec<f32>) = if len > 0 {
        src.chunks(len).map(|r| mean_inv_std(r, eps)).unzip()
    } else {
        (Vec::new(), Vec::new())
    };
    Ok(vec![
        Tensor::f32(x.shape.clone(), out)?,
        Tensor::f32(stat_shape.clone(), means)?,
        Tensor::f32(stat_shape, inv)?,
    ])
}

/// A scale or bias broadcast over the normalised axes `norm_shape`, one value per position.
fn over(t: &Tensor, norm_shape: &[usize], what: &str) -> OpResult<Vec<f32>> {
    let v = t.as_f32()?;
    if broadcast_shape(&t.shape, norm_shape)? != norm_shape {
        return shape_err(format!(
            "{what} {:?} does not broadcast to {norm_shape:?}",
            t.shape
        ));
    }
    if v.len() == checked_numel(norm_shape)? {
        Ok(v.to_vec())
    } else {
        Ok(broadcast_map(
            v,
            &t.shape,
            &[0.0f32],
            &[1],
            norm_shape,
            |a, _| a,
        ))
    }
}

/// RMSNormalization: `x / sqrt(mean(x²) + eps) * scale` over the axes from `axis` on.
pub fn rms_norm(cx: &Cx, inputs: &[Option<&Tensor>], axis: i64, eps: f32) -> OpResult<Tensor> {
    let x = input(inputs, 0)?;
    let axis = norm_axis(axis, x.rank())?;
    let norm_shape = &x.shape[axis..];
    let scale = over(input(inputs, 1)?, norm_shape, "RMSNormalization scale")?;
    let mut out = x.as_f32()?.to_vec();
    // Rows of length 0 would split nothing; there is nothing to normalise.
    if !scale.is_empty() {
        rms_norm_rows(cx.threads, &mut out, scale.len(), &scale, eps);
    }
    Tensor::f32(x.shape.clone(), out)
}

/// GroupNormalization, and InstanceNormalization as its case of one group per channel (`groups`
/// none): `x` [N, C, ...] normalised over each group of `C / groups` channels with all their
/// positions, then scaled and shifted per channel, or per group when `per_group` (the form of
/// GroupNormalization before opset 21).
pub fn group_norm(
    inputs: &[Option<&Tensor>],
    groups: Option<usize>,
    eps: f32,
    per_group: bool,
) -> OpResult<Tensor> {
    let x = input(inputs, 0)?;
    let (scale, bias) = (input(inputs, 1)?.as_f32()?, input(inputs, 2)?.as_f32()?);
    if x.rank() < 2 {
        return shape_err(format!("normalisation of {:?}: no channel axis", x.shape));
    }
    let c = x.shape[1];
    let g = groups.unwrap_or(c);
    if g == 0 && c > 0 || g > 0 && !c.is_multiple_of(g) {
        return shape_err(format!("{c} channels do not split into {g} groups"));
    }
    let params = if per_group { g } else { c };
    if scale.len() != params || bias.len() != params {
        return shape_err(format!(
            "scale and bias have {} and {} values where {params} are needed",
            scale.len(),
            bias.len()
        ));
    }
    let mut out = x.as_f32()?.to_vec();
    let plane: usize = x.shape[2..].iter().product();
    let per = c.checked_div(g).unwrap_or(0);
    let group_len = per * plane;
    if group_len > 0 {
        for (row, block) in out.chunks_mut(group_len).enumerate() {
            let gi = row % g;
            let (mean, inv) = mean_inv_std(block, eps);
            for (k, ch) in block.chunks_mut(plane).enumerate() {
                let p = if per_group { gi } else { gi * per + k };
                let (a, b) = (inv * scale[p], bias[p]);
                ch.iter_mut().for_each(|v| *v = (*v - mean) * a + b);
            }
        }
    }
    Tensor::f32(x.shape.clone(), out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Narrow windows summed directly and wide ones from running sums both give the window's
    /// sum of squares (against f64 brute force), and a window past every channel covers them all.
    #[test]
    fn lrn_windows_narrow_and_wide_sum_their_channels() {
        let (c, plane) = (150, 3);
        let v: Vec<f32> = (0..c * plane)
            .map(|i| ((i * 37) % 23) as f32 * 0.1 - 1.1)
            .collect();
        let x = Tensor::f32(vec![1, c, plane], v.clone()).unwrap();
        for size in [1, 4, 5, 32, 33, 101, 1_000_000] {
            let got = lrn(&x, size, 0.5, 0.75, 2.0).unwrap();
            // A NaN and an infinity reach only the windows that hold them.
            let mut odd = v.clone();
            (odd[10 * plane], odd[100 * plane + 1]) = (f32::NAN, f32::INFINITY);
            let odd = lrn(
                &Tensor::f32(vec![1, c, plane], odd).unwrap(),
                size,
                0.5,
                0.75,
                2.0,
            );
            for (i, (g, o)) in got
                .as_f32()
                .unwrap()
                .iter()
                .zip(odd.unwrap().as_f32().unwrap())
                .enumerate()
            {
                let (ci, p) = (i / plane, i % plane);
                let holds =
                    |at: usize| ci + (size - 1).div_ceil(2) >= at && at + (size - 1) / 2 >= ci;
                match p {
                    0 if holds(10) => assert!(o.is_nan(), "size {size} at {i}"),
                    1 if holds(100) => assert!(*o == 0.0 || o.is_nan(), "size {size} at {i}: {o}"),
                    _ => assert_eq!(g, o, "size {size} at {i}"),
                }
            }
            let (lo, hi) = ((size - 1) / 2, (size - 1).div_ceil(2));
            for (i, g) in got.as_f32().unwrap().iter().enumerate() {
                let (ci, p) = (i / plane, i % plane);
                let s: f64 = (ci.saturating_sub(lo)..=(ci + hi).min(c - 1))
                    .map(|cj| f64::from(v[cj * plane + p]).powi(2))
                    .sum();
                let want = f64::from(v[i]) / (2.0 + 0.5 / size as f64 * s).powf(0.75);
                assert!((f64::from(*g) - want).abs() < 1e-6, "size {size} at {i}");
            }
        }
    }

    #[test]
    fn group_norm_normalises_each_group_and_checks_parameters() {
        let x = Tensor::f32(vec![1, 4, 2], vec![1., 3., 5., 7., 0., 0., 2., 2.]).unwrap();
        let ones = Tensor::f32(vec![4], vec![1.; 4]).unwrap();
        let shift = Tensor::f32(vec![4], vec![0., 0., 10., 10.]).unwrap();
        let ins = [Some(&x), Some(&ones), Some(&shift)];
        let y = group_norm(&ins, Some(2), 0.0, false).unwrap();
        let inv = 1.0 / 5f32.sqrt();
        let want = [-3. * inv, -inv, inv, 3. * inv, 9., 9., 11., 11.];
        for (a, b) in y.as_f32().unwrap().iter().zip(want) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
        // Instance normalisation: one group per channel.
        let y = group_norm(&ins, None, 0.0, false).unwrap();
        assert_eq!(&y.as_f32().unwrap()[..2], &[-1., 1.]);
        // Opset 18: one scale and bias per group.
        let two = Tensor::f32(vec![2], vec![2., 2.]).unwrap();
        let y = group_norm(&[Some(&x), Some(&two), Some(&two)], Some(2), 0.0, true).unwrap();
        assert!((y.as_f32().unwrap()[0] - (2. - 6. * inv)).abs() < 1e-5);
        // Groups that do not divide the channels, parameters of the wrong length, no channels.
        assert!(group_norm(&ins, Some(3), 0.0, false).is_err());
        assert!(group_norm(&ins, Some(0), 0.0, false).is_err());
        assert!(group_norm(&ins, Some(2), 0.0, true).is_err());
        let v = Tensor::f32(vec![4], vec![0.; 4]).unwrap();
        assert!(group_norm(&[Some(&v), Some(&ones), Some(&ones)], None, 0.0, false).is_err());
        // Empty spatial axes are nothing to normalise.
        let e = Tensor::f32(vec![1, 4, 0], vec![]).unwrap();
        assert_eq!(
            group_norm(&[Some(&e), Some(&ones), Some(&ones)], Some(2), 0.0, false)
                .unwrap()
                .shape,
            vec![1, 4, 0]
        );
    }
}
