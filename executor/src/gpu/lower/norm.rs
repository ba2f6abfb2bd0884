//! Row-wise ops: Softmax and LogSoftmax, LayerNormalization, and the Reduce family over one
//! contiguous run of axes. Pieces are ranges of rows (of the outer extent for a reduction).

use super::codes;
use super::{Cx, Decline, Lowered, Operand, decline, f32_in, host_ints, opt_f32_in};
use crate::gpu::api::Kernel;
use crate::gpu::launch::{Builder, grid_1d, grid_rows};
use crate::ops::reduce::ReduceAttrs;
use crate::tensor::{DType, axis_in, norm_axis};

pub fn softmax(
    axis: i64,
    log: bool,
    legacy: bool,
    ins: &[Option<Operand<'_>>],
    cx: &mut Cx<'_>,
) -> Lowered<()> {
    let (x, px) = f32_in(ins, 0)?;
    let axis = axis_in(axis, x.rank()).map_err(|e| Decline(e.to_string()))?;
    let inner: usize = x.shape[axis + 1..].iter().product();
    // Opset 13 softmax over an inner axis would need a transpose; legacy flattens from axis.
    if !(legacy || inner == 1) {
        return decline("softmax over an axis that is not the last");
    }
    let cols: usize = x.shape[axis..].iter().product();
    if cols == 0 || x.is_empty() {
        return decline("softmax of an empty tensor");
    }
    let rows = x.len() / cols;
    let y = cx.output(0, DType::F32, x.shape.to_vec())?;
    let kernel = if log {
        Kernel::LogSoftmax
    } else {
        Kernel::Softmax
    };
    for r in cx.ranges(rows) {
        cx.piece();
        cx.launch(
            Builder::new(kernel, grid_rows(r.len() as u64))
                .ptr(px.at(r.start * cols, 4))
                .ptr(y.at(r.start * cols, 4))
                .long(r.len())
                .long(cols)
                .finish(),
        )?;
    }
    Ok(())
}

/// Only the normalised output: a step that also asks for the mean and inverse standard
/// deviation outputs declines.
pub fn layer_norm(
    axis: i64,
    eps: f32,
    ins: &[Option<Operand<'_>>],
    cx: &mut Cx<'_>,
) -> Lowered<()> {
    let (x, px) = f32_in(ins, 0)?;
    let axis = axis_in(axis, x.rank()).map_err(|e| Decline(e.to_string()))?;
    let cols: usize = x.shape[axis..].iter().product();
    let (gamma, pg) = f32_in(ins, 1)?;
    let beta = opt_f32_in(ins, 2)?;
    if cols == 0 || gamma.len() != cols || beta.is_some_and(|(b, _)| b.len() != cols) {
        return decline("LayerNormalization scale or bias does not match the normalised axes");
    }
    let rows = x.len() / cols;
    let y = cx.output(0, DType::F32, x.shape.to_vec())?;
    for r in cx.ranges(rows) {
        cx.piece();
        cx.launch(
            Builder::new(Kernel::LayerNorm, grid_rows(r.len() as u64))
                .ptr(px.at(r.start * cols, 4))
                .ptr(pg)
                .opt(beta.map(|(_, p)| p))
                .ptr(y.at(r.start * cols, 4))
                .long(r.len())
                .long(cols)
                .float(eps)
                .finish(),
        )?;
    }
    Ok(())
}

/// A reduction over contiguous axes as [outer, axis_len, inner] plus the output shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReducePlan {
    pub outer: usize,
    pub axis_len: usize,
    pub inner: usize,
    pub out_shape: Vec<usize>,
}

/// `axes` empty means all axes (the caller handles `noop_with_empty_axes`). None when the
/// axes are not one contiguous run or the reduced extent is empty.
pub fn reduce_plan(shape: &[usize], axes: &[i64], keepdims: bool) -> Option<ReducePlan> {
    let r = shape.len();
    let mut ax: Vec<usize> = if axes.is_empty() {
        (0..r).collect()
    } else {
        axes.iter()
            .map(|&a| norm_axis(a, r).ok())
            .collect::<Option<_>>()?
    };
    ax.sort_unstable();
    ax.dedup();
    if r == 0 || ax.is_empty() || ax.windows(2).any(|w| w[1] != w[0] + 1) {
        return None;
    }
    let (first, last) = (ax[0], ax[ax.len() - 1]);
    let axis_len: usize = shape[first..=last].iter().product();
    if axis_len == 0 {
        return None;
    }
    let out_shape = shape
        .iter()
        .enumerate()
        .filter_map(|(i, &d)| match (first..=last).contains(&i) {
            true => keepdims.then_some(1),
            false => Some(d),
        })
        .collect();
    Some(ReducePlan {
        outer: shape[..first].iter().product(),
        axis_len,
        inner: shape[last + 1..].iter().product(),
        out_shape,
    })
}

pub fn reduce(r: &ReduceAttrs, ins: &[Option<Operand<'_>>], cx: &mut Cx<'_>) -> Lowered<()> {
    let (x, px) = f32_in(ins, 0)?;
    let axes = match &r.axes {
        Some(a) => a.clone(),
        None => host_ints(ins, 1)?.unwrap_or_default(),
    };
    if axes.is_empty() && r.noop_with_empty_axes {
        return decline("a reduction over no axes");
    }
    let p = reduce_plan(x.shape, &axes, r.keepdims)
        .ok_or_else(|| Decline("axes that are not one contiguous run".into()))?;
    let y = cx.output(0, DType::F32, p.out_shape.clone())?;
    let Some(code) = codes::reduce(r.kind) else {
        return decline(format!("{:?} has no kernel", r.kind));
    };
    let code = code as i32;
    if p.outer * p.inner == 0 {
        cx.whole();
        return Ok(());
    }
    for rows in cx.ranges(p.outer) {
        cx.piece();
        let (x, y) = (
            px.at(rows.start * p.axis_len * p.inner, 4),
            y.at(rows.start * p.inner, 4),
        );
        let launch = if p.inner == 1 {
            Builder::new(Kernel::ReduceLastAxis, grid_rows(rows.len() as u64))
                .ptr(x)
                .ptr(y)
                .long(rows.len())
                .long(p.axis_len)
        } else {
            Builder::new(Kernel::ReduceAxis, grid_1d((rows.len() * p.inner) as u64))
                .ptr(x)
                .ptr(y)
                .long(rows.len())
                .long(p.axis_len)
                .long(p.inner)
        };
        cx.launch(launch.code(code).finish())?;
    }
    Ok(())
}
