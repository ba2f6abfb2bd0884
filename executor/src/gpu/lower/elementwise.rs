//! Unary, Clip, Binary (f32 arithmetic) and BatchNormalization. Pieces are contiguous ranges of
//! the output (any element range works for a pointwise kernel), rows of the outermost axis for a
//! broadcast, and images or channels for BatchNormalization's per-channel epilogue.

use super::codes;
use super::{Cx, Lowered, Operand, decline, f32_in, host_scalar, numel};
use crate::gpu::api::{DevPtr, Dims6, Kernel};
use crate::gpu::launch::{Builder, grid_1d};
use crate::ops::Op;
use crate::ops::elementwise::broadcast_shape;
use crate::tensor::{DType, strides};
use cotenant_kernels::cuda::{ActCode, BinaryCode, UnaryCode};

/// Whether the op is a case this family has codes for.
pub fn covers(op: &Op) -> bool {
    match op {
        Op::Unary(u) => codes::unary(*u).is_some(),
        Op::Binary(b) => codes::binary(*b).is_some(),
        Op::Reduce(r) => codes::reduce(r.kind).is_some(),
        _ => true,
    }
}

pub fn lower(op: &Op, ins: &[Option<Operand<'_>>], cx: &mut Cx<'_>) -> Lowered<()> {
    match op {
        Op::Unary(u) => {
            let Some((code, a, b)) = codes::unary(*u) else {
                return decline(format!("{u:?} has no kernel"));
            };
            let (x, px) = f32_in(ins, 0)?;
            let y = cx.output(0, DType::F32, x.shape.to_vec())?;
            unary(cx, px, y, x.len(), code, a, b)
        }
        Op::Clip { min, max } => {
            let (x, px) = f32_in(ins, 0)?;
            let lo = host_scalar(ins, 1)?.map(|v| v as f32).or(*min);
            let hi = host_scalar(ins, 2)?.map(|v| v as f32).or(*max);
            let y = cx.output(0, DType::F32, x.shape.to_vec())?;
            let (lo, hi) = (lo.unwrap_or(f32::NEG_INFINITY), hi.unwrap_or(f32::INFINITY));
            unary(cx, px, y, x.len(), UnaryCode::Clip, lo, hi)
        }
        Op::Binary(b) => {
            let Some(code) = codes::binary(*b) else {
                return decline(format!("{b:?} has no kernel"));
            };
            binary(ins, code, cx)
        }
        Op::BatchNorm { eps } => batch_norm(ins, *eps, cx),
        _ => decline(format!("{} is not elementwise", op.name())),
    }
}

/// `y = op(x)` over `n` elements, in pieces of contiguous ranges; `x == y` is allowed.
pub(super) fn unary(
    cx: &mut Cx<'_>,
    x: DevPtr,
    y: DevPtr,
    n: usize,
    code: UnaryCode,
    a: f32,
    b: f32,
) -> Lowered<()> {
    for r in cx.ranges(n) {
        cx.piece();
        unary_range(cx, x.at(r.start, 4), y.at(r.start, 4), r.len(), code, a, b)?;
    }
    Ok(())
}

/// One ew_unary_f32 launch over `n` elements (none for an empty range).
pub(super) fn unary_range(
    cx: &mut Cx<'_>,
    x: DevPtr,
    y: DevPtr,
    n: usize,
    code: UnaryCode,
    a: f32,
    b: f32,
) -> Lowered<()> {
    if n == 0 {
        return Ok(());
    }
    cx.launch(
        Builder::new(Kernel::EwUnary, grid_1d(n as u64))
            .ptr(x)
            .ptr(y)
            .long(n)
            .code(code as i32)
            .float(a)
            .float(b)
            .finish(),
    )
}

fn binary(ins: &[Option<Operand<'_>>], code: BinaryCode, cx: &mut Cx<'_>) -> Lowered<()> {
    let (a, b) = (super::input(ins, 0)?, super::input(ins, 1)?);
    if a.dtype != DType::F32 || b.dtype != DType::F32 {
        return decline("Binary on non-f32 data");
    }
    let out = broadcast_shape(a.shape, b.shape).map_err(|e| super::Decline(e.to_string()))?;
    if out.len() > Dims6::RANK {
        return decline(format!("rank {} above 6", out.len()));
    }
    let n = numel(&out)?;
    // A scalar known on the host (a constant such as 0.5) rides in the launch itself.
    let scalar = |o: &Operand<'_>| {
        o.host
            .filter(|t| t.len() == 1)
            .and_then(|t| t.as_f32().ok())
            .map(|v| v[0])
    };
    let (pa, pb) = (a.at, b.at);
    let y = cx.output(0, DType::F32, out.clone())?;
    if n == 0 {
        cx.whole();
        return Ok(());
    }
    if let (Some(s), Some(pa)) = (scalar(&b), pa)
        && a.len() == n
    {
        return scalar_op(cx, pa, s, y, n, code, 0);
    }
    if let (Some(s), Some(pb)) = (scalar(&a), pb)
        && b.len() == n
    {
        return scalar_op(cx, pb, s, y, n, code, 1);
    }
    let (Some(pa), Some(pb)) = (pa, pb) else {
        return decline("an operand is not on the device");
    };
    if a.shape == b.shape {
        for r in cx.ranges(n) {
            cx.piece();
            cx.launch(
                Builder::new(Kernel::EwBinary, grid_1d(r.len() as u64))
                    .ptr(pa.at(r.start, 4))
                    .ptr(pb.at(r.start, 4))
                    .ptr(y.at(r.start, 4))
                    .long(r.len())
                    .code(code as i32)
                    .finish(),
            )?;
        }
        return Ok(());
    }
    // Broadcast: pieces are rows of the outermost axis, each operand advanced by its stride.
    let (sa, sb) = (
        broadcast_strides(a.shape, &out),
        broadcast_strides(b.shape, &out),
    );
    let inner: usize = out[1..].iter().product();
    for r in cx.ranges(out[0]) {
        cx.piece();
        let mut shape = out.clone();
        shape[0] = r.len();
        let off = |s: &[i64]| (r.start as i64 * s[0]) as usize;
        cx.launch(
            Builder::new(Kernel::EwBinaryBcast, grid_1d((r.len() * inner) as u64))
                .ptr(pa.at(off(&sa), 4))
                .ptr(pb.at(off(&sb), 4))
                .ptr(y.at(r.start * inner, 4))
                .long(r.len() * inner)
                .int(out.len())
                .dims(Dims6::from_usizes(&shape))
                .dims(Dims6::new(&sa))
                .dims(Dims6::new(&sb))
                .code(code as i32)
                .finish(),
        )?;
    }
    Ok(())
}

fn scalar_op(
    cx: &mut Cx<'_>,
    x: DevPtr,
    s: f32,
    y: DevPtr,
    n: usize,
    code: BinaryCode,
    swap: i32,
) -> Lowered<()> {
    for r in cx.ranges(n) {
        cx.piece();
        cx.launch(
            Builder::new(Kernel::EwScalar, grid_1d(r.len() as u64))
                .ptr(x.at(r.start, 4))
                .float(s)
                .ptr(y.at(r.start, 4))
                .long(r.len())
                .code(code as i32)
                .code(swap)
                .finish(),
        )?;
    }
    Ok(())
}

/// Element strides to read `shape` broadcast to `out` (0 on broadcast axes), out's rank.
pub(super) fn broadcast_strides(shape: &[usize], out: &[usize]) -> Vec<i64> {
    let s = strides(shape);
    let off = out.len() - shape.len();
    (0..out.len())
        .map(|i| match i.checked_sub(off) {
            Some(j) if shape[j] != 1 => s[j] as i64,
            _ => 0,
        })
        .collect()
}

/// Per-channel affine `y = x·scale[c] + shift[c]` from the four constant statistics, as the CPU
/// op computes it. Pieces are images, or channels of a single image.
fn batch_norm(ins: &[Option<Operand<'_>>], eps: f32, cx: &mut Cx<'_>) -> Lowered<()> {
    let (x, px) = f32_in(ins, 0)?;
    if x.rank() < 2 {
        return decline("BatchNormalization input of rank < 2");
    }
    let ch = x.shape[1];
    let mut stats = Vec::with_capacity(4);
    for i in 1..5 {
        let t = super::input(ins, i)?
            .host
            .filter(|t| t.len() == ch)
            .ok_or_else(|| super::Decline(format!("statistic {i} is not a constant of {ch}")))?;
        stats.push(
            t.as_f32()
                .map_err(|e| super::Decline(e.to_string()))?
                .to_vec(),
        );
    }
    let scale: Vec<f32> = (0..ch)
        .map(|c| stats[0][c] / (stats[3][c] + eps).sqrt())
        .collect();
    let shift: Vec<f32> = (0..ch)
        .map(|c| stats[1][c] - stats[2][c] * scale[c])
        .collect();
    let (psc, psh) = (cx.param_f32(&scale)?, cx.param_f32(&shift)?);
    let inner: usize = x.shape[2..].iter().product();
    let y = cx.output(0, DType::F32, x.shape.to_vec())?;
    let n = x.shape[0];
    // (first element, elements, first channel, channels) of each piece.
    let spans: Vec<(usize, usize, usize, usize)> = if n == 1 {
        cx.ranges(ch)
            .into_iter()
            .map(|r| (r.start * inner, r.len() * inner, r.start, r.len()))
            .collect()
    } else {
        cx.ranges(n)
            .into_iter()
            .map(|r| (r.start * ch * inner, r.len() * ch * inner, 0, ch))
            .collect()
    };
    for (at, len, c0, chans) in spans {
        cx.piece();
        if len == 0 {
            continue;
        }
        unary_range(
            cx,
            px.at(at, 4),
            y.at(at, 4),
            len,
            UnaryCode::Identity,
            0.0,
            0.0,
        )?;
        cx.launch(
            Builder::new(Kernel::EpilogueScaleShiftAct, grid_1d(len as u64))
                .ptr(y.at(at, 4))
                .ptr(psc.at(c0, 4))
                .ptr(psh.at(c0, 4))
                .epilogue(len, chans, inner.max(1), (ActCode::None as i32, 0.0, 0.0))
                .finish(),
        )?;
    }
    Ok(())
}
