//! Reductions over a set of axes (ReduceMean/Sum/Max/Min/Prod/L1/L2/SumSquare/LogSum/LogSumExp),
//! and CumSum and CumProd, the running sum and product along one axis.

use super::elementwise::Num;
use super::{input, opt_input};
use crate::error::{OpError, OpResult, shape_err};
use crate::ops::attrs::Attrs;
use crate::tensor::{DType, Data, Tensor, axis_in, strides};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ReduceKind {
    ReduceMean,
    ReduceSum,
    ReduceMax,
    ReduceMin,
    ReduceProd,
    ReduceL1,
    ReduceL2,
    ReduceSumSquare,
    ReduceLogSum,
    ReduceLogSumExp,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ReduceAttrs {
    pub kind: ReduceKind,
    pub axes: Option<Vec<i64>>,
    pub keepdims: bool,
    pub noop_with_empty_axes: bool,
}

impl ReduceAttrs {
    pub fn parse(op: &str, a: &Attrs, _opset: i64) -> Result<ReduceAttrs, String> {
        use ReduceKind::*;
        let kind = match op {
            "ReduceMean" => ReduceMean,
            "ReduceSum" => ReduceSum,
            "ReduceMax" => ReduceMax,
            "ReduceMin" => ReduceMin,
            "ReduceProd" => ReduceProd,
            "ReduceL1" => ReduceL1,
            "ReduceL2" => ReduceL2,
            "ReduceLogSum" => ReduceLogSum,
            "ReduceLogSumExp" => ReduceLogSumExp,
            _ => ReduceSumSquare,
        };
        Ok(ReduceAttrs {
            kind,
            axes: a.ints("axes")?,
            keepdims: a.int_or("keepdims", 1)? != 0,
            noop_with_empty_axes: a.int_or("noop_with_empty_axes", 0)? != 0,
        })
    }
}

pub fn reduce(r: &ReduceAttrs, inputs: &[Option<&Tensor>]) -> OpResult<Tensor> {
    let x = input(inputs, 0)?;
    let Some(red) = reduced_axes(r, x.rank(), opt_input(inputs, 1))? else {
        return Ok(x.clone());
    };
    let rank = x.rank();
    let out_full: Vec<usize> = x
        .shape
        .iter()
        .zip(&red)
        .map(|(&d, &r)| if r { 1 } else { d })
        .collect();
    let ostr = strides(&out_full);
    let n_out: usize = out_full.iter().product();
    let count: usize = x
        .shape
        .iter()
        .zip(&red)
        .filter(|(_, r)| **r)
        .map(|(d, _)| *d)
        .product();
    let init = match r.kind {
        ReduceKind::ReduceMax | ReduceKind::ReduceLogSumExp => f64::NEG_INFINITY,
        ReduceKind::ReduceMin => f64::INFINITY,
        ReduceKind::ReduceProd => 1.0,
        _ => 0.0,
    };
    let mut acc = vec![init; n_out];
    let step = |a: f64, v: f64| match r.kind {
        ReduceKind::ReduceMax => a.max(v),
        ReduceKind::ReduceMin => a.min(v),
        ReduceKind::ReduceProd => a * v,
        ReduceKind::ReduceL1 => a + v.abs(),
        ReduceKind::ReduceL2 | ReduceKind::ReduceSumSquare => a + v * v,
        ReduceKind::ReduceMean | ReduceKind::ReduceSum | ReduceKind::ReduceLogSum => a + v,
        ReduceKind::ReduceLogSumExp => log_add_exp(a, v),
    };
    let summing = matches!(r.kind, ReduceKind::ReduceMean | ReduceKind::ReduceSum);
    match (&x.data, adjacent(&x.shape, &red)) {
        (Data::F32(v), Some((outer, n, 1))) if summing => row_sums(&mut acc, v, outer, n),
        (Data::F32(v), Some(dims)) => fold_runs(&mut acc, v, dims, step),
        _ => {
            let mut idx = vec![0usize; rank];
            for v in x.to_f64_vec() {
                let o: usize = (0..rank)
                    .map(|i| if red[i] { 0 } else { idx[i] * ostr[i] })
                    .sum();
                acc[o] = step(acc[o], v);
                for i in (0..rank).rev() {
                    idx[i] += 1;
                    if idx[i] < x.shape[i] {
                        break;
                    }
                    idx[i] = 0;
                }
            }
        }
    }
    match r.kind {
        ReduceKind::ReduceMean => acc.iter_mut().for_each(|a| *a /= count.max(1) as f64),
        ReduceKind::ReduceL2 => acc.iter_mut().for_each(|a| *a = a.sqrt()),
        ReduceKind::ReduceLogSum => acc.iter_mut().for_each(|a| *a = a.ln()),
        _ => {}
    }
    let shape: Vec<usize> = if r.keepdims {
        out_full
    } else {
        x.shape
            .iter()
            .zip(&red)
            .filter(|(_, r)| !**r)
            .map(|(d, _)| *d)
            .collect()
    };
    let data = match x.dtype() {
        // Over no elements, the identity: false for ReduceMax, true for ReduceMin.
        DType::Bool if matches!(r.kind, ReduceKind::ReduceMax | ReduceKind::ReduceMin) => {
            Data::Bool(acc.iter().map(|&v| v > 0.0).collect())
        }
        DType::Bool => return Err(OpError::DType(format!("{:?} of bool", r.kind))),
        d if d.is_half() => return Err(super::half_here()),
        d => super::elementwise::cast(&Tensor::new(vec![acc.len()], Data::F64(acc))?, d).data,
    };
    Tensor::new(shape, data)
}

/// Which of a rank-`rank` input's axes `r` reduces, its axes given by the attribute or (since
/// opsets 13 for ReduceSum and 18 for the rest) the optional input `axes`; `None` when it
/// reduces nothing (empty axes with `noop_with_empty_axes`).
pub fn reduced_axes(
    r: &ReduceAttrs,
    rank: usize,
    axes: Option<&Tensor>,
) -> OpResult<Option<Vec<bool>>> {
    let axes = match (&r.axes, axes) {
        (Some(a), _) => a.clone(),
        (None, Some(t)) => t.to_i64_vec()?,
        (None, None) => vec![],
    };
    if axes.is_empty() && r.noop_with_empty_axes {
        return Ok(None);
    }
    let mut red = vec![axes.is_empty(); rank];
    for a in &axes {
        red[axis_in(*a, rank)?] = true;
    }
    Ok(Some(red))
}

/// `(outer, n, inner)` when the reduced axes `red` of `shape` are adjacent: the input is then
/// `[outer][n][inner]`, reduced over `n`.
fn adjacent(shape: &[usize], red: &[bool]) -> Option<(usize, usize, usize)> {
    let first = red.iter().position(|&r| r)?;
    let last = red.iter().rposition(|&r| r)?;
    if !red[first..=last].iter().all(|&r| r) {
        return None;
    }
    let size = |axes: &[usize]| axes.iter().product::<usize>();
    Some((
        size(&shape[..first]),
        size(&shape[first..=last]),
        size(&shape[last + 1..]),
    ))
}

/// `acc[o·inner + i] = step(..., v[(o·n + k)·inner + i])` for k in order: the reduction of
/// adjacent axes over contiguous rows, with the element walk's arithmetic and order.
fn fold_runs(
    acc: &mut [f64],
    v: &[f32],
    (outer, n, inner): (usize, usize, usize),
    step: impl Fn(f64, f64) -> f64,
) {
    for (o, acc) in acc.chunks_exact_mut(inner.max(1)).take(outer).enumerate() {
        for row in v[o * n * inner..][..n * inner].chunks_exact(inner.max(1)) {
            for (a, &x) in acc.iter_mut().zip(row) {
                *a = step(*a, x as f64);
            }
        }
    }
}

/// The sums of `outer` contiguous rows of `n`, in f64 over eight interleaved partial sums that
/// the compiler keeps in vector lanes (a last-axis ReduceMean is every decomposed layer norm's;
/// one chain of dependent adds was 3 ns an element). The partial sums of float32 values are
/// exact in f64 unless their magnitudes span more than 29 binary orders, so the order rarely
/// shows even in the last bit of the f64 sum, and not once rounded to float32.
fn row_sums(acc: &mut [f64], v: &[f32], outer: usize, n: usize) {
    for (a, row) in acc.iter_mut().zip(v.chunks_exact(n.max(1))).take(outer) {
        let mut lanes = [0f64; 8];
        let mut chunks = row.chunks_exact(8);
        for c in &mut chunks {
            for (l, &x) in lanes.iter_mut().zip(c) {
                *l += x as f64;
            }
        }
        let tail: f64 = chunks.remainder().iter().map(|&x| x as f64).sum();
        *a = lanes.iter().sum::<f64>() + tail;
    }
}

/// `ln(exp(a) + exp(b))` without overflow; equal infinities stay infinite.
fn log_add_exp(a: f64, b: f64) -> f64 {
    if a == b {
        return a + std::f64::consts::LN_2;
    }
    let (hi, lo) = if a > b { (a, b) } else { (b, a) };
    hi + (lo - hi).exp().ln_1p()
}

/// CumSum (or with `product` CumProd) along the axis that input 1 (one integer) names;
/// `exclusive` leaves each element out of its own sum, `reverse` runs from the end of the axis.
pub fn cumulative(
    inputs: &[Option<&Tensor>],
    product: bool,
    exclusive: bool,
    reverse: bool,
) -> OpResult<Tensor> {
    let name = if product { "CumProd" } else { "CumSum" };
    let x = input(inputs, 0)?;
    let axis = match input(inputs, 1)?.to_i64_vec()?.as_slice() {
        [a] => axis_in(*a, x.rank())?,
        v => return shape_err(format!("{name} axis must be one value, not {}", v.len())),
    };
    let outer: usize = x.shape[..axis].iter().product();
    let n = x.shape[axis];
    let inner: usize = x.shape[axis + 1..].iter().product();
    fn scan<T: Num + Default>(
        v: &[T],
        (outer, n, inner): (usize, usize, usize),
        product: bool,
        (exclusive, reverse): (bool, bool),
    ) -> Vec<T> {
        let (start, step): (T, fn(T, T) -> T) = match product {
            true => (T::from_f64(1.0), T::mul),
            false => (T::from_f64(0.0), T::add),
        };
        let mut out = vec![T::default(); v.len()];
        for o in 0..outer {
            for i in 0..inner {
                let mut acc = start;
                for k in 0..n {
                    let j = if reverse { n - 1 - k } else { k };
                    let at = (o * n + j) * inner + i;
                    if exclusive {
                        out[at] = acc;
                        acc = step(acc, v[at]);
                    } else {
                        acc = step(acc, v[at]);
                        out[at] = acc;
                    }
                }
            }
        }
        out
    }
    let dims = (outer, n, inner);
    let data = crate::map_numeric!(&x.data, v => scan(v, dims, product, (exclusive, reverse)), d => {
        return Err(match d.dtype() {
            DType::Bool => OpError::DType(format!("{name} of bool")),
            _ => super::half_here(),
        });
    });
    Tensor::new(x.shape.clone(), data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cum_sum_runs_every_way_along_the_axis() {
        let x = Tensor::i64(vec![2, 3], vec![1, 2, 3, 4, 5, 6]).unwrap();
        let axis = |a: i64| Tensor::i64(vec![], vec![a]).unwrap();
        let run = |a: i64, ex, rev| {
            let ax = axis(a);
            cumulative(&[Some(&x), Some(&ax)], false, ex, rev).map(|t| t.to_i64_vec().unwrap())
        };
        assert_eq!(run(1, false, false), Ok(vec![1, 3, 6, 4, 9, 15]));
        assert_eq!(run(-1, true, false), Ok(vec![0, 1, 3, 0, 4, 9]));
        assert_eq!(run(1, false, true), Ok(vec![6, 5, 3, 15, 11, 6]));
        assert_eq!(run(0, true, true), Ok(vec![4, 5, 6, 0, 0, 0]));
        assert!(run(2, false, false).is_err());
        let two = Tensor::i64(vec![2], vec![0, 1]).unwrap();
        assert!(cumulative(&[Some(&x), Some(&two)], false, false, false).is_err());
        let f = Tensor::scalar_f32(0.0);
        assert!(cumulative(&[Some(&x), Some(&f)], false, false, false).is_err());
        let ax = axis(1);
        let prod = cumulative(&[Some(&x), Some(&ax)], true, true, false).unwrap();
        assert_eq!(prod.to_i64_vec(), Ok(vec![1, 1, 2, 1, 4, 20]));
    }

    #[test]
    fn float32_rows_reduce_as_the_element_walk_does() {
        // float32 over adjacent axes takes the row loop; the same values in float64 take the
        // element walk, with the same arithmetic: equal once rounded to float32.
        let shape = vec![3, 4, 5, 6];
        let v: Vec<f32> = (0..360)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.173)
            .collect();
        let x32 = Tensor::new(shape.clone(), Data::F32(v.clone())).unwrap();
        let x64 = Tensor::new(shape, Data::F64(v.iter().map(|&x| x as f64).collect())).unwrap();
        use ReduceKind::*;
        let kinds = [
            ReduceMean,
            ReduceSum,
            ReduceMax,
            ReduceMin,
            ReduceProd,
            ReduceL1,
            ReduceL2,
            ReduceSumSquare,
            ReduceLogSumExp,
        ];
        let axes: [&[i64]; 6] = [&[3], &[1, 2], &[0], &[-1, -2, 0, 1], &[], &[0, 2]];
        for kind in kinds {
            for &a in &axes {
                let r = ReduceAttrs {
                    kind,
                    axes: Some(a.to_vec()),
                    keepdims: a.len() % 2 == 0,
                    noop_with_empty_axes: false,
                };
                let fast = reduce(&r, &[Some(&x32)]).unwrap();
                let walk = reduce(&r, &[Some(&x64)]).unwrap();
                assert_eq!(fast.shape, walk.shape, "{kind:?} {a:?}");
                let walk: Vec<f32> = walk.to_f64_vec().iter().map(|&x| x as f32).collect();
                assert_eq!(fast.as_f32().unwrap(), walk.as_slice(), "{kind:?} {a:?}");
            }
        }
    }

    #[test]
    fn last_axis_sums_of_rows_not_a_multiple_of_eight_match_the_walk() {
        let v: Vec<f32> = (0..3 * 37)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) * 1.37e3f32.powi(i % 3))
            .collect();
        let x32 = Tensor::new(vec![3, 37], Data::F32(v.clone())).unwrap();
        let x64 = Tensor::new(
            vec![3, 37],
            Data::F64(v.iter().map(|&x| x as f64).collect()),
        )
        .unwrap();
        for kind in [ReduceKind::ReduceMean, ReduceKind::ReduceSum] {
            let r = ReduceAttrs {
                kind,
                axes: Some(vec![-1]),
                keepdims: true,
                noop_with_empty_axes: false,
            };
            let fast = reduce(&r, &[Some(&x32)]).unwrap();
            let walk: Vec<f32> = reduce(&r, &[Some(&x64)])
                .unwrap()
                .to_f64_vec()
                .iter()
                .map(|&x| x as f32)
                .collect();
            assert_eq!(fast.shape, [3, 1]);
            assert_eq!(fast.as_f32().unwrap(), walk.as_slice(), "{kind:?}");
        }
    }

    #[test]
    fn log_sum_exp_neither_overflows_nor_loses_infinities() {
        let r = ReduceAttrs {
            kind: ReduceKind::ReduceLogSumExp,
            axes: None,
            keepdims: false,
            noop_with_empty_axes: false,
        };
        let x = Tensor::new(vec![2], Data::F64(vec![1000.0, 1000.0])).unwrap();
        let y = reduce(&r, &[Some(&x)]).unwrap().to_f64_vec()[0];
        assert!((y - (1000.0 + std::f64::consts::LN_2)).abs() < 1e-9);
        let inf = Tensor::new(vec![2], Data::F64(vec![f64::INFINITY; 2])).unwrap();
        assert_eq!(
            reduce(&r, &[Some(&inf)]).unwrap().to_f64_vec(),
            vec![f64::INFINITY]
        );
        let none = Tensor::new(vec![0], Data::Bool(vec![])).unwrap();
        let min = ReduceAttrs {
            kind: ReduceKind::ReduceMin,
            ..r
        };
        assert_eq!(
            reduce(&min, &[Some(&none)]).unwrap().data,
            Data::Bool(vec![true])
        );
    }
}
