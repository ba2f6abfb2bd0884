//! Data movement: Transpose, Concat, Slice, Gather, Pad, through copy.cu's strided copy, tiled
//! transpose, gather and pad kernels. These run whole (they are short and bandwidth-bound).

use super::{Cx, Decline, Lowered, Operand, decline, f32_in, host_ints, host_scalar, input, numel};
use crate::gpu::api::{Dims6, Kernel};
use crate::gpu::launch::{Builder, grid_1d, grid_transpose};
use crate::ops::shape::{SliceAttrs, slice_plan};
use crate::tensor::{DType, axis_in, norm_axis, strides};
use cotenant_kernels::cuda::PadMode;

fn contiguous(shape: &[usize]) -> Vec<i64> {
    strides(shape).iter().map(|&s| s as i64).collect()
}

fn rank_ok(rank: usize) -> Lowered<()> {
    if rank > Dims6::RANK {
        return decline(format!("rank {rank} above 6"));
    }
    Ok(())
}

/// A permutation of `rank` axes (none: reversed), checked.
fn permutation(rank: usize, perm: Option<&[usize]>) -> Option<Vec<usize>> {
    let perm: Vec<usize> = perm.map_or_else(|| (0..rank).rev().collect(), <[usize]>::to_vec);
    let mut seen = vec![false; rank];
    if perm.len() != rank {
        return None;
    }
    for &p in &perm {
        if p >= rank || std::mem::replace(&mut seen[p], true) {
            return None;
        }
    }
    Some(perm)
}

pub fn transpose(
    perm: Option<&[usize]>,
    ins: &[Option<Operand<'_>>],
    cx: &mut Cx<'_>,
) -> Lowered<()> {
    let (x, px) = f32_in(ins, 0)?;
    rank_ok(x.rank())?;
    let perm = permutation(x.rank(), perm).ok_or_else(|| Decline("not a permutation".into()))?;
    let out: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    let n = x.len();
    let y = cx.output(0, DType::F32, out.clone())?;
    cx.whole();
    if n == 0 {
        return Ok(());
    }
    let r = x.rank();
    let swaps_last_two = r >= 2
        && perm[r - 2] == r - 1
        && perm[r - 1] == r - 2
        && perm[..r - 2].iter().enumerate().all(|(i, &p)| i == p);
    if swaps_last_two {
        let (batch, rows, cols) = (
            x.shape[..r - 2].iter().product::<usize>(),
            x.shape[r - 2],
            x.shape[r - 1],
        );
        if let Some(shape) = grid_transpose(batch as u64, rows as u64, cols as u64) {
            return cx.launch(
                Builder::new(Kernel::Transpose2d, shape)
                    .ptr(px)
                    .ptr(y)
                    .long(batch)
                    .int(rows)
                    .int(cols)
                    .finish(),
            );
        }
    }
    let ins_strides = strides(x.shape);
    let src: Vec<i64> = perm.iter().map(|&p| ins_strides[p] as i64).collect();
    cx.launch(
        Builder::new(Kernel::StridedCopy, grid_1d(n as u64))
            .ptr(px)
            .ptr(y)
            .long(n)
            .int(out.len())
            .dims(Dims6::from_usizes(&out))
            .dims(Dims6::new(&src))
            .signed(0)
            .dims(Dims6::new(&contiguous(&out)))
            .signed(0)
            .finish(),
    )
}

pub fn concat(axis: i64, ins: &[Option<Operand<'_>>], cx: &mut Cx<'_>) -> Lowered<()> {
    let parts: Vec<Operand<'_>> = ins.iter().flatten().copied().collect();
    let first = *parts
        .first()
        .ok_or_else(|| Decline("Concat of nothing".into()))?;
    let r = first.rank();
    rank_ok(r)?;
    if r == 0 || parts.iter().any(|t| t.dtype != DType::F32 || t.rank() != r) {
        return decline("Concat of non-f32 or mixed-rank inputs");
    }
    let axis = norm_axis(axis, r).map_err(|e| Decline(e.to_string()))?;
    let mut out = first.shape.to_vec();
    out[axis] = 0;
    for t in &parts {
        if (0..r).any(|i| i != axis && t.shape[i] != first.shape[i]) {
            return decline("Concat inputs disagree off the axis");
        }
        out[axis] += t.shape[axis];
    }
    numel(&out)?;
    let os = contiguous(&out);
    let y = cx.output(0, DType::F32, out)?;
    cx.whole();
    let mut at = 0usize;
    for t in parts {
        if !t.is_empty() {
            let pt =
                t.at.ok_or_else(|| Decline("a Concat input is not on the device".into()))?;
            cx.launch(
                Builder::new(Kernel::StridedCopy, grid_1d(t.len() as u64))
                    .ptr(pt)
                    .ptr(y)
                    .long(t.len())
                    .int(r)
                    .dims(Dims6::from_usizes(t.shape))
                    .dims(Dims6::new(&contiguous(t.shape)))
                    .signed(0)
                    .dims(Dims6::new(&os))
                    .signed(at as i64 * os[axis])
                    .finish(),
            )?;
        }
        at += t.shape[axis];
    }
    Ok(())
}

pub fn slice(
    attrs: Option<&SliceAttrs>,
    ins: &[Option<Operand<'_>>],
    cx: &mut Cx<'_>,
) -> Lowered<()> {
    let (x, px) = f32_in(ins, 0)?;
    let (starts, ends, axes, steps) = match attrs {
        Some((s, e, a)) => (s.clone(), e.clone(), a.clone(), None),
        None => (
            host_ints(ins, 1)?.ok_or_else(|| Decline("Slice without starts".into()))?,
            host_ints(ins, 2)?.ok_or_else(|| Decline("Slice without ends".into()))?,
            host_ints(ins, 3)?,
            host_ints(ins, 4)?,
        ),
    };
    if x.rank() == 0 {
        return decline("Slice of a scalar");
    }
    rank_ok(x.rank())?;
    let (out, start, step) =
        slice_plan(x.shape, &starts, &ends, axes, steps).map_err(|e| Decline(e.to_string()))?;
    let n = numel(&out)?;
    let xs = contiguous(x.shape);
    let offset: i64 = start.iter().zip(&xs).map(|(a, b)| a * b).sum();
    let src: Vec<i64> = step.iter().zip(&xs).map(|(a, b)| a * b).collect();
    let y = cx.output(0, DType::F32, out.clone())?;
    cx.whole();
    if n == 0 {
        return Ok(());
    }
    cx.launch(
        Builder::new(Kernel::StridedCopy, grid_1d(n as u64))
            .ptr(px)
            .ptr(y)
            .long(n)
            .int(out.len())
            .dims(Dims6::from_usizes(&out))
            .dims(Dims6::new(&src))
            .signed(offset)
            .dims(Dims6::new(&contiguous(&out)))
            .signed(0)
            .finish(),
    )
}

pub fn gather(axis: i64, ins: &[Option<Operand<'_>>], cx: &mut Cx<'_>) -> Lowered<()> {
    let (x, px) = f32_in(ins, 0)?;
    let ind = input(ins, 1)?;
    let axis = axis_in(axis, x.rank()).map_err(|e| Decline(e.to_string()))?;
    let len = x.shape[axis];
    let kernel = match ind.dtype {
        DType::I64 => Kernel::GatherI64,
        DType::I32 => Kernel::GatherI32,
        t => return decline(format!("Gather indices of {t:?}")),
    };
    // Indices known here are checked here (the kernel cannot raise; the host op reports the
    // error in its words). Indices from the request are checked when the batch is staged.
    if let Some(t) = ind.host {
        let ids = t.to_i64_vec().map_err(|e| Decline(e.to_string()))?;
        if ids.iter().any(|&i| i < -(len as i64) || i >= len as i64) {
            return decline("Gather indices out of range");
        }
    }
    let pi = ind
        .at
        .ok_or_else(|| Decline("Gather indices are not on the device".into()))?;
    let outer: usize = x.shape[..axis].iter().product();
    let inner: usize = x.shape[axis + 1..].iter().product();
    let mut out = x.shape[..axis].to_vec();
    out.extend(ind.shape);
    out.extend(&x.shape[axis + 1..]);
    let n = numel(&out)?;
    let y = cx.output(0, DType::F32, out)?;
    cx.whole();
    if n == 0 {
        return Ok(());
    }
    cx.launch(
        Builder::new(kernel, grid_1d(n as u64))
            .ptr(px)
            .ptr(pi)
            .ptr(y)
            .long(outer)
            .long(len)
            .long(ind.len())
            .long(inner)
            .finish(),
    )
}

pub fn pad(
    mode: &str,
    pads_attr: Option<&[i64]>,
    value_attr: f32,
    ins: &[Option<Operand<'_>>],
    cx: &mut Cx<'_>,
) -> Lowered<()> {
    let (x, px) = f32_in(ins, 0)?;
    let r = x.rank();
    if r == 0 || ins.get(3).copied().flatten().is_some() {
        return decline("Pad of a scalar, or with axes");
    }
    rank_ok(r)?;
    let pads = match pads_attr {
        Some(p) => p.to_vec(),
        None => host_ints(ins, 1)?.ok_or_else(|| Decline("Pad without pads".into()))?,
    };
    if pads.len() != 2 * r {
        return decline("pads of the wrong length");
    }
    let value = match ins.get(2).copied().flatten() {
        Some(o) if !o.is_empty() => host_scalar(ins, 2)?.map_or(value_attr, |v| v as f32),
        _ => value_attr,
    };
    let mode = match mode {
        "constant" => PadMode::Constant,
        "reflect" => PadMode::Reflect,
        "edge" => PadMode::Edge,
        "wrap" => PadMode::Wrap,
        other => return decline(format!("pad mode {other:?}")),
    };
    let mut out = Vec::with_capacity(r);
    for a in 0..r {
        let o = (x.shape[a] as i64)
            .checked_add(pads[a])
            .and_then(|v| v.checked_add(pads[a + r]))
            .filter(|&o| o >= 0)
            .ok_or_else(|| Decline("padding overflows or crops past the input".into()))?;
        out.push(o as usize);
    }
    let n = numel(&out)?;
    let y = cx.output(0, DType::F32, out.clone())?;
    cx.whole();
    if n == 0 {
        return Ok(());
    }
    cx.launch(
        Builder::new(Kernel::Pad, grid_1d(n as u64))
            .ptr(px)
            .ptr(y)
            .long(n)
            .int(r)
            .dims(Dims6::from_usizes(&out))
            .dims(Dims6::from_usizes(x.shape))
            .dims(Dims6::new(&contiguous(x.shape)))
            .dims(Dims6::new(&pads[..r]))
            .code(mode as i32)
            .float(value)
            .finish(),
    )
}
