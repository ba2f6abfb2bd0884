//! Gemm and MatMul on cuBLAS, with bias and activation in one epilogue. Pieces are rows of the
//! product, or its columns when it has a single row (a fully connected layer at batch 1), or
//! members of a batched product.

use super::codes::{self, Act};
use super::elementwise::unary_range;
use super::{Cx, Decline, Lowered, Operand, decline, f32_in, numel, opt_f32_in};
use crate::gpu::api::{DevPtr, Kernel};
use crate::gpu::blas::RowMajor;
use crate::gpu::launch::{Builder, grid_1d};
use crate::ops::Activation;
use crate::ops::elementwise::broadcast_shape;
use crate::ops::matmul::GemmAttrs;
use crate::tensor::DType;
use cotenant_kernels::cuda::{ActCode, UnaryCode};

/// Piece `r` of a product's rows (`by_rows`) or of the columns of its single row: the rows and
/// columns of C it covers, and the product restricted to them.
fn part(
    p: &RowMajor,
    n: usize,
    r: std::ops::Range<usize>,
    by_rows: bool,
) -> (std::ops::Range<usize>, std::ops::Range<usize>, RowMajor) {
    if by_rows {
        (r.clone(), 0..n, p.rows(r.start, r.end))
    } else {
        (0..1, r.clone(), p.cols(r.start, r.end))
    }
}

/// A per-column or per-row bias added after the product.
#[derive(Clone, Copy)]
struct Bias {
    at: DevPtr,
    /// One value per column (channels = n, inner = 1) or per row (channels = m, inner = n).
    per_row: bool,
}

/// Bias and activation over rows `r` and columns `c` of an `m × n` result at `y`.
#[allow(clippy::too_many_arguments)]
fn epilogue(
    cx: &mut Cx<'_>,
    y: DevPtr,
    n: usize,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    bias: Option<Bias>,
    act: Act,
) -> Lowered<()> {
    let (act_code, al, be) = act.epilogue();
    // Whole rows, or part of a single row: either way one contiguous range.
    let (at, len) = (
        rows.start * n + cols.start,
        (rows.len() - 1) * n + cols.len(),
    );
    if len == 0 {
        return Ok(());
    }
    let (bias_at, channels, inner) = match bias {
        Some(Bias { at, per_row: false }) => (Some(at.at(cols.start, 4)), cols.len(), 1),
        Some(Bias { at, per_row: true }) => (Some(at.at(rows.start, 4)), rows.len(), n),
        None => (None, 1, 1),
    };
    let y = y.at(at, 4);
    if bias_at.is_some() || act_code != ActCode::None {
        cx.launch(
            Builder::new(Kernel::EpilogueBiasAct, grid_1d(len as u64))
                .ptr(y)
                .opt(bias_at)
                .epilogue(len, channels, inner, (act_code as i32, al, be))
                .finish(),
        )?;
    }
    if let Act::Unary(code, a, b) = act {
        unary_range(cx, y, y, len, code, a, b)?;
    }
    Ok(())
}

pub fn gemm(g: &GemmAttrs, ins: &[Option<Operand<'_>>], cx: &mut Cx<'_>) -> Lowered<()> {
    let ((a, pa), (b, pb)) = (f32_in(ins, 0)?, f32_in(ins, 1)?);
    let c = ins.get(2).copied().flatten().filter(|_| g.beta != 0.0);
    if a.rank() != 2 || b.rank() != 2 {
        return decline("Gemm operands of rank other than 2");
    }
    let (m, k) = if g.trans_a {
        (a.shape[1], a.shape[0])
    } else {
        (a.shape[0], a.shape[1])
    };
    let (kb, n) = if g.trans_b {
        (b.shape[1], b.shape[0])
    } else {
        (b.shape[0], b.shape[1])
    };
    if k != kb || k == 0 {
        return decline(format!("Gemm inner dimensions {k} and {kb}"));
    }
    // How C enters: a full [m, n] matrix (cuBLAS beta), or a bias per column or per row.
    let mut full = None;
    let mut bias = None;
    if let Some(c) = c {
        if c.dtype != DType::F32
            || broadcast_shape(c.shape, &[m, n]).ok().as_deref() != Some(&[m, n][..])
        {
            return decline("Gemm C does not broadcast to the output");
        }
        let rows_of_one = c.rank() == 2 && c.shape[1] == 1 && c.shape[0] == m && m != 1;
        if c.rank() == 2 && c.len() == m * n && m * n > 1 {
            full = Some(c.at.ok_or_else(|| Decline("Gemm C is not on the device".into()))?);
        } else {
            let per_row = rows_of_one;
            let want = if per_row { m } else { n };
            let at = match (c.host, c.at) {
                // Constant C: scaled by beta once, broadcast from a single value if need be.
                (Some(t), _) => {
                    let v = t.as_f32().map_err(|e| Decline(e.to_string()))?;
                    let scaled: Vec<f32> = match v.len() {
                        1 => vec![v[0] * g.beta; want],
                        l if l == want => v.iter().map(|x| x * g.beta).collect(),
                        _ => return decline("Gemm C of an unexpected length"),
                    };
                    cx.param_f32(&scaled)?
                }
                (None, Some(at)) if g.beta == 1.0 && c.len() == want => at,
                _ => return decline("Gemm C computed on the device and scaled or broadcast"),
            };
            bias = Some(Bias { at, per_row });
        }
    }
    let act = codes::act(g.act)?;
    let y = cx.output(0, DType::F32, vec![m, n])?;
    if m * n == 0 {
        cx.whole();
        return Ok(());
    }
    let mut p = RowMajor::dense(m, n, k, g.trans_a, g.trans_b, pa, pb, y);
    p.alpha = g.alpha;
    if full.is_some() {
        p.beta = g.beta;
    }
    // Rows of the product in pieces; a single row in pieces of columns.
    let by_rows = m > 1;
    let extent = if by_rows { m } else { n };
    for r in cx.ranges(extent) {
        cx.piece();
        let (rows, cols, piece) = part(&p, n, r, by_rows);
        if let Some(c) = full {
            // C into the output first; the product then adds to it (beta).
            let (at, len) = (
                rows.start * n + cols.start,
                (rows.len() - 1) * n + cols.len(),
            );
            unary_range(
                cx,
                c.at(at, 4),
                y.at(at, 4),
                len,
                UnaryCode::Identity,
                0.0,
                0.0,
            )?;
        }
        cx.gemm(piece.gemm());
        epilogue(cx, y, n, rows, cols, bias, act)?;
    }
    Ok(())
}

pub fn matmul(
    act: Option<Activation>,
    ins: &[Option<Operand<'_>>],
    cx: &mut Cx<'_>,
) -> Lowered<()> {
    let ((a, pa), (b, pb)) = (f32_in(ins, 0)?, f32_in(ins, 1)?);
    let bias = opt_f32_in(ins, 2)?;
    if a.rank() < 2 || b.rank() < 2 {
        return decline("MatMul of a vector");
    }
    let (m, k) = (a.shape[a.rank() - 2], a.shape[a.rank() - 1]);
    let (kb, n) = (b.shape[b.rank() - 2], b.shape[b.rank() - 1]);
    if k != kb || k == 0 || bias.is_some_and(|(t, _)| t.len() != n) {
        return decline("MatMul shapes");
    }
    let (abatch, bbatch) = (&a.shape[..a.rank() - 2], &b.shape[..b.rank() - 2]);
    let batch = broadcast_shape(abatch, bbatch).map_err(|e| Decline(e.to_string()))?;
    let nb: usize = batch.iter().product();
    let (na, nbb): (usize, usize) = (abatch.iter().product(), bbatch.iter().product());
    let mut shape = batch.clone();
    shape.extend([m, n]);
    let total = numel(&shape)?;
    let bias = bias.map(|(_, at)| Bias { at, per_row: false });
    let act = codes::act(act)?;
    let y = cx.output(0, DType::F32, shape)?;
    if total == 0 {
        cx.whole();
        return Ok(());
    }
    let dense = RowMajor::dense(m, n, k, false, false, pa, pb, y);
    // One tall product when B is shared: its rows are the pieces.
    if nbb == 1 && abatch == batch.as_slice() {
        let tall = RowMajor { m: nb * m, ..dense };
        let (extent, by_rows) = if nb * m > 1 {
            (nb * m, true)
        } else {
            (n, false)
        };
        for r in cx.ranges(extent) {
            cx.piece();
            let (rows, cols, piece) = part(&tall, n, r, by_rows);
            cx.gemm(piece.gemm());
            epilogue(cx, y, n, rows, cols, bias, act)?;
        }
        return Ok(());
    }
    // Strided batched: each side the whole batch or one matrix repeated (stride 0).
    let side = |dims: &[usize], prod: usize, stride: usize| -> Option<i64> {
        if prod == 1 {
            Some(0)
        } else if dims == batch.as_slice() {
            Some(stride as i64)
        } else {
            None
        }
    };
    let (Some(sa), Some(sb)) = (side(abatch, na, m * k), side(bbatch, nbb, k * n)) else {
        return decline("MatMul batch broadcast of a partial shape");
    };
    let batched = dense.batched(nb, sa, sb, (m * n) as i64);
    if nb > 1 {
        for r in cx.ranges(nb) {
            cx.piece();
            let part = RowMajor {
                a: pa.at(r.start * sa as usize, 4),
                b: pb.at(r.start * sb as usize, 4),
                c: y.at(r.start * m * n, 4),
                batch: r.len(),
                ..batched
            };
            cx.gemm(part.gemm());
            epilogue(cx, y, n, r.start * m..r.end * m, 0..n, bias, act)?;
        }
        return Ok(());
    }
    for r in cx.ranges(m) {
        cx.piece();
        cx.gemm(batched.rows(r.start, r.end).gemm());
        epilogue(cx, y, n, r.clone(), 0..n, bias, act)?;
    }
    Ok(())
}
