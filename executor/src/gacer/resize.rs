//! Spatial regulation — operator resizing: one operator run as `k` pieces along its first (batch,
//! or GEMM M) dimension, each piece a smaller launch that leaves room for other tenants' work.
//! The pieces' outputs are stacked back, so the step computes what the whole operator computes:
//! bit for bit, except that a matrix product (Gemm, MatMul) on fewer rows may take another
//! kernel path that sums in another order (the CPU gemm's single-row path), so there it agrees
//! within fp32 rounding.

use crate::backend::Backend;
use crate::error::OpError;
use crate::ops::Op;
use crate::tensor::{Data, Tensor, norm_axis};
use std::ops::Range;

/// How one input of a resized operator reaches each piece.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Cut {
    /// Rows `range` of the input (its first dimension is the one being split).
    Rows,
    /// The whole input, to every piece (weights, broadcast operands).
    Whole,
}

/// Rows an operator can be split along, and how each input is cut; `None` when this op on these
/// inputs cannot be resized without changing what it computes.
fn cuts(op: &Op, inputs: &[Option<&Tensor>]) -> Option<(usize, Vec<Cut>)> {
    let first = inputs.first().copied().flatten()?;
    let rows_of_first = |rest: Cut| -> Option<(usize, Vec<Cut>)> {
        if first.rank() < 2 {
            return None;
        }
        let mut c = vec![Cut::Rows];
        c.extend(inputs.iter().skip(1).map(|_| rest));
        Some((first.shape[0], c))
    };
    let found = match op {
        Op::Conv(_) | Op::ConvTranspose(_) | Op::PointwiseDepthwise(_) => {
            let (rows, mut c) = rows_of_first(Cut::Whole)?;
            // Weights and biases go whole; anything a later fusion adds (a residual) is cut like
            // a broadcast.
            let fused_from = if matches!(op, Op::PointwiseDepthwise(_)) {
                7
            } else {
                3
            };
            for (i, t) in inputs.iter().enumerate().skip(fused_from) {
                if let Some(t) = t {
                    c[i] = broadcast_cut(t, first.rank(), rows)?;
                }
            }
            Some((rows, c))
        }
        // MaxPool's Indices count from the first image: a piece's would restart at zero.
        Op::Pool(p) if p.indices => None,
        Op::BatchNorm { .. }
        | Op::Unary(_)
        | Op::Clip { .. }
        | Op::Cast { .. }
        | Op::GlobalPool { .. }
        | Op::Pool(_)
        | Op::Lrn { .. } => rows_of_first(Cut::Whole),
        Op::Softmax { axis, .. } => match norm_axis(*axis, first.rank()) {
            Ok(a) if a > 0 => rows_of_first(Cut::Whole),
            _ => None,
        },
        Op::Binary(_) | Op::Variadic(..) | Op::PRelu | Op::Where => broadcast_cuts(inputs),
        Op::Gemm(g) if !g.trans_a => {
            let (rows, mut c) = rows_of_first(Cut::Whole)?;
            if let Some(Some(bias)) = inputs.get(2) {
                c[2] = broadcast_cut(bias, 2, rows)?;
            }
            Some((rows, c))
        }
        Op::MatMul { .. } => {
            let b = inputs.get(1).copied().flatten()?;
            if b.rank() > first.rank() {
                return None;
            }
            let (rows, mut c) = rows_of_first(Cut::Whole)?;
            if b.rank() >= 3 && b.rank() == first.rank() {
                c[1] = match b.shape[0] {
                    r if r == rows => Cut::Rows,
                    1 => Cut::Whole,
                    _ => return None,
                };
            }
            if let Some(Some(bias)) = inputs.get(2) {
                c[2] = broadcast_cut(bias, first.rank(), rows)?;
            }
            Some((rows, c))
        }
        _ => None,
    }?;
    (found.0 >= 2).then_some(found)
}

/// Cuts for an elementwise op with broadcasting: operands of full rank carrying the rows are
/// split, the others (lower rank, or a first dimension of 1) go whole to every piece.
fn broadcast_cuts(inputs: &[Option<&Tensor>]) -> Option<(usize, Vec<Cut>)> {
    let rank = inputs.iter().flatten().map(|t| t.rank()).max()?;
    let rows = inputs
        .iter()
        .flatten()
        .filter(|t| t.rank() == rank)
        .map(|t| t.shape[0])
        .max()?;
    let c = inputs
        .iter()
        .map(|t| match t {
            Some(t) => broadcast_cut(t, rank, rows),
            None => Some(Cut::Whole),
        })
        .collect::<Option<Vec<_>>>()?;
    (rank >= 2 && c.contains(&Cut::Rows)).then_some((rows, c))
}

fn broadcast_cut(t: &Tensor, out_rank: usize, rows: usize) -> Option<Cut> {
    if t.rank() < out_rank || t.shape[0] == 1 {
        Some(Cut::Whole)
    } else if t.rank() == out_rank && t.shape[0] == rows {
        Some(Cut::Rows)
    } else {
        None
    }
}

/// Whether resizing `op` may change the order its sums are taken in (see the module doc).
pub fn reorders_sums(op: &Op) -> bool {
    matches!(op, Op::Gemm(_) | Op::MatMul { .. })
}

/// Rows along which `op` can be resized for these inputs (`None`: it cannot).
pub fn split_rows(op: &Op, inputs: &[Option<&Tensor>]) -> Option<usize> {
    cuts(op, inputs).map(|(rows, _)| rows)
}

/// `rows` cut into `k` contiguous ranges whose lengths differ by at most one.
pub fn piece_ranges(rows: usize, k: usize) -> Vec<Range<usize>> {
    let k = k.clamp(1, rows.max(1));
    let (base, extra) = (rows / k, rows % k);
    let mut start = 0;
    (0..k)
        .map(|i| {
            let len = base + usize::from(i < extra);
            let r = start..start + len;
            start += len;
            r
        })
        .collect()
}

/// Rows `r` of `t` (its first dimension).
pub fn slice_rows(t: &Tensor, r: Range<usize>) -> Result<Tensor, OpError> {
    let rows = t.shape.first().copied().unwrap_or(0);
    if r.end > rows || r.start > r.end {
        return Err(OpError::Shape(format!(
            "rows {r:?} of a tensor of shape {:?}",
            t.shape
        )));
    }
    let per_row = t.len() / rows.max(1);
    let mut data = Data::with_capacity(t.dtype(), r.len() * per_row);
    data.extend_from(&t.data, r.start * per_row..r.end * per_row);
    let mut shape = t.shape.clone();
    shape[0] = r.len();
    Tensor::new(shape, data)
}

/// Stacks tensors that agree on every dimension but the first.
pub fn concat_rows(parts: Vec<Tensor>) -> Result<Tensor, OpError> {
    let mut it = parts.into_iter();
    let mut acc = it
        .next()
        .ok_or_else(|| OpError::Shape("stacking no pieces".into()))?;
    for p in it {
        if p.rank() != acc.rank() || p.rank() == 0 || p.shape[1..] != acc.shape[1..] {
            return Err(OpError::Shape(format!(
                "pieces of shapes {:?} and {:?} do not stack",
                acc.shape, p.shape
            )));
        }
        if !acc.data.extend_from(&p.data, 0..p.len()) {
            return Err(OpError::DType("pieces of different element types".into()));
        }
        acc.shape[0] += p.shape[0];
    }
    Ok(acc)
}

/// Runs `op` as `k` pieces along its rows and stacks the pieces' outputs: the same outputs as
/// one `backend.execute(op, inputs)`. `k = 1`, or an op that cannot be resized here, runs whole.
pub fn execute_in_pieces(
    backend: &dyn Backend,
    op: &Op,
    inputs: &[Option<&Tensor>],
    k: usize,
) -> Result<Vec<Tensor>, OpError> {
    let Some((rows, cut)) = (k > 1).then(|| cuts(op, inputs)).flatten() else {
        return backend.execute(op, inputs);
    };
    let mut outputs: Vec<Vec<Tensor>> = Vec::new();
    for r in piece_ranges(rows, k) {
        let sliced: Vec<Option<Tensor>> = inputs
            .iter()
            .zip(&cut)
            .map(|(t, c)| match (t, c) {
                (Some(t), Cut::Rows) => slice_rows(t, r.clone()).map(Some),
                _ => Ok(None),
            })
            .collect::<Result<_, _>>()?;
        let refs: Vec<Option<&Tensor>> = inputs
            .iter()
            .zip(&sliced)
            .map(|(whole, piece)| piece.as_ref().or(*whole))
            .collect();
        let outs = backend.execute(op, &refs)?;
        // MaxPool's optional indices count positions across the whole batch: not resizable.
        if outs.len() != 1 {
            return Err(OpError::Unsupported(format!(
                "{} with {} outputs cannot run in pieces",
                op.name(),
                outs.len()
            )));
        }
        outputs.push(outs);
    }
    let pieces = outputs.into_iter().flatten().collect();
    Ok(vec![concat_rows(pieces)?])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_rows_evenly() {
        assert_eq!(piece_ranges(5, 2), vec![0..3, 3..5]);
        assert_eq!(piece_ranges(4, 4), vec![0..1, 1..2, 2..3, 3..4]);
        assert_eq!(piece_ranges(2, 8), vec![0..1, 1..2]);
    }

    #[test]
    fn slice_then_concat_is_identity() {
        let t = Tensor::f32(vec![3, 2], vec![1., 2., 3., 4., 5., 6.]).unwrap();
        let parts = piece_ranges(3, 2)
            .into_iter()
            .map(|r| slice_rows(&t, r).unwrap())
            .collect();
        assert_eq!(concat_rows(parts).unwrap(), t);
    }

    #[test]
    fn weights_are_never_cut() {
        let x = Tensor::zeros(crate::DType::F32, vec![4, 4]).unwrap();
        let w = Tensor::zeros(crate::DType::F32, vec![4, 4]).unwrap();
        let (rows, c) = cuts(
            &Op::MatMul {
                act: None,
                packed: None,
            },
            &[Some(&x), Some(&w)],
        )
        .unwrap();
        assert_eq!((rows, c), (4, vec![Cut::Rows, Cut::Whole]));
    }
}
