//! Lowering: one plan step, given where its operands live and their shapes, becomes the device
//! work that computes it — kernel launches and SGEMMs over addresses in the instance's arena, the
//! shared weights and the step's scratch. Nothing runs here: the instance issues the work, and a
//! dry run (the memory plan) lowers with placeholder addresses to learn the sizes.
//!
//! A step may be resized into pieces (GACER's spatial regulation): each piece is a smaller launch
//! over a sub-range of the same buffers — along the batch, along output channels or columns of
//! a matrix product, or along rows — never a copy. Every family says how far it can split.
//!
//! A case a family does not cover declines ([`Decline`]); that step then runs on the host.
//!
//! | file | ops |
//! |---|---|
//! | `elementwise.rs` | Unary, Clip, Binary, BatchNorm |
//! | `conv.rs` | Conv, PointwiseDepthwise |
//! | `matmul.rs` | Gemm, MatMul |
//! | `pool.rs` | MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool |
//! | `norm.rs` | Softmax, LogSoftmax, LayerNormalization, Reduce* |
//! | `copy.rs` | Transpose, Concat, Slice, Gather, Pad |

mod codes;
mod conv;
mod copy;
mod elementwise;
mod matmul;
mod norm;
mod pool;

use super::api::{DevPtr, Gemm, Launch};
use crate::ops::Op;
use crate::tensor::{DType, Tensor};
use std::ops::Range;

/// One operand of a step.
#[derive(Clone, Copy, Debug)]
pub struct Operand<'a> {
    pub dtype: DType,
    pub shape: &'a [usize],
    /// Where its elements are on the device: a value in the arena, a resident weight, or a value
    /// computed from shapes alone and uploaded once.
    pub at: Option<DevPtr>,
    /// Its elements on the host, where known before the batch runs (constants, and values
    /// computed from shapes alone): what attributes and shape arguments are read from.
    pub host: Option<&'a Tensor>,
}

impl Operand<'_> {
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
}

/// Why a step does not run on the device; it then runs on the host between a download of its
/// inputs and an upload of its outputs.
#[derive(Clone, Debug, PartialEq)]
pub struct Decline(pub String);

pub type Lowered<T> = Result<T, Decline>;

fn decline<T>(why: impl Into<String>) -> Lowered<T> {
    Err(Decline(why.into()))
}

/// One piece of device work.
#[derive(Clone, Debug, PartialEq)]
pub enum Work {
    Launch(Launch),
    Gemm(Gemm),
}

/// Where a step's outputs and scratch go, and its constant-derived parameters.
pub trait Place {
    /// The address of output `k`, `bytes` long.
    fn output(&mut self, k: usize, bytes: u64) -> Lowered<DevPtr>;
    /// Scratch region `index` of this step, `bytes` long, for this step only.
    fn scratch(&mut self, index: usize, bytes: u64) -> Lowered<DevPtr>;
    /// Data derived from constants or shapes (a folded scale, a scaled bias) resident on the
    /// device: placed once per memory plan, the same bytes every batch.
    fn param(&mut self, data: &[u8]) -> Lowered<DevPtr>;
}

/// One output of a lowered step.
#[derive(Clone, Debug, PartialEq)]
pub struct Output {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub at: DevPtr,
}

/// A lowered step: its outputs and its work, as the pieces it was asked to run in.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Lowering {
    pub outputs: Vec<Output>,
    /// Work per piece, in issue order (one piece when the step runs whole).
    pub pieces: Vec<Vec<Work>>,
    /// Most pieces this step can be split into on these shapes (1: it cannot).
    pub max_pieces: usize,
}

/// What a family writes into while lowering one step.
pub struct Cx<'p> {
    place: &'p mut dyn Place,
    /// Pieces asked for.
    want: usize,
    out: Lowering,
}

impl Cx<'_> {
    fn output(&mut self, k: usize, dtype: DType, shape: Vec<usize>) -> Lowered<DevPtr> {
        let n: usize = shape.iter().product();
        let at = self.place.output(k, (n * dtype.size()) as u64)?;
        self.out.outputs.push(Output { dtype, shape, at });
        Ok(at)
    }
    fn scratch(&mut self, index: usize, bytes: u64) -> Lowered<DevPtr> {
        self.place.scratch(index, bytes)
    }
    fn param_f32(&mut self, v: &[f32]) -> Lowered<DevPtr> {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.place.param(&bytes)
    }
    /// Ranges of `extent` units to split into: as many pieces as asked, at most `extent`.
    fn ranges(&mut self, extent: usize) -> Vec<Range<usize>> {
        self.out.max_pieces = self.out.max_pieces.max(extent.max(1));
        crate::gacer::resize::piece_ranges(extent, self.want)
    }
    fn whole(&mut self) {
        self.out.max_pieces = self.out.max_pieces.max(1);
    }
    /// Starts the next piece.
    fn piece(&mut self) {
        self.out.pieces.push(Vec::new());
    }
    fn launch(&mut self, l: Option<Launch>) -> Lowered<()> {
        let l = l.ok_or_else(|| Decline("a size exceeds the kernel's int".into()))?;
        self.push(Work::Launch(l));
        Ok(())
    }
    fn gemm(&mut self, g: Gemm) {
        if g.m > 0 && g.n > 0 && g.batch > 0 {
            self.push(Work::Gemm(g));
        }
    }
    fn push(&mut self, w: Work) {
        if self.out.pieces.is_empty() {
            self.out.pieces.push(Vec::new());
        }
        if let Some(p) = self.out.pieces.last_mut() {
            p.push(w);
        }
    }
}

/// Whether `op` has a device path at all (a particular case may still decline).
pub fn has_device_path(op: &Op) -> bool {
    use crate::ops::shape::ShapeOp;
    matches!(
        op,
        Op::Unary(_)
            | Op::Clip { .. }
            | Op::Binary(_)
            | Op::BatchNorm { .. }
            | Op::Conv(_)
            | Op::PointwiseDepthwise(_)
            | Op::Gemm(_)
            | Op::MatMul { .. }
            | Op::Pool(_)
            | Op::GlobalPool { .. }
            | Op::Softmax { .. }
            | Op::LayerNorm { stats: false, .. }
            | Op::Reduce(_)
            | Op::Shape(
                ShapeOp::Transpose { .. }
                    | ShapeOp::Concat { .. }
                    | ShapeOp::Slice { .. }
                    | ShapeOp::Gather { .. }
                    | ShapeOp::Pad { .. }
            )
    ) && elementwise::covers(op)
}

/// Lowers `op` on `inputs` into a step with `outputs` outputs, split into `pieces` where it can
/// be.
pub fn lower(
    op: &Op,
    inputs: &[Option<Operand<'_>>],
    outputs: usize,
    pieces: usize,
    place: &mut dyn Place,
) -> Lowered<Lowering> {
    let mut cx = Cx {
        place,
        want: pieces.max(1),
        out: Lowering::default(),
    };
    dispatch(op, inputs, &mut cx)?;
    if cx.out.outputs.len() < outputs {
        // MaxPool's indices, for one: outputs this path does not compute.
        return decline(format!(
            "{} with {outputs} outputs (the device computes {})",
            op.name(),
            cx.out.outputs.len()
        ));
    }
    if cx.out.pieces.is_empty() {
        // No work (an empty tensor): one empty piece.
        cx.out.pieces.push(Vec::new());
    }
    cx.out.max_pieces = cx.out.max_pieces.max(1);
    Ok(cx.out)
}

fn dispatch(op: &Op, ins: &[Option<Operand<'_>>], cx: &mut Cx<'_>) -> Lowered<()> {
    use crate::ops::shape::ShapeOp;
    match op {
        Op::Unary(_) | Op::Clip { .. } | Op::Binary(_) | Op::BatchNorm { .. } => {
            elementwise::lower(op, ins, cx)
        }
        Op::Conv(c) => conv::conv(c, ins, cx),
        Op::PointwiseDepthwise(f) => conv::pointwise_depthwise(f, ins, cx),
        Op::Gemm(g) => matmul::gemm(g, ins, cx),
        Op::MatMul {
            packed: Some(_), ..
        } => decline("a MatMul by weights packed for the CPU"),
        Op::MatMul { act, packed: None } => matmul::matmul(*act, ins, cx),
        Op::Pool(p) => pool::pool(p, ins, cx),
        Op::GlobalPool { max, nhwc: false } => pool::global(*max, ins, cx),
        Op::GlobalPool { nhwc: true, .. } => decline("an NHWC global pool"),
        Op::Softmax {
            axis,
            log,
            legacy,
            scale,
        } if *scale == 1.0 => norm::softmax(*axis, *log, *legacy, ins, cx),
        Op::Softmax { .. } => decline("a Softmax of a scaled input"),
        Op::LayerNorm {
            axis,
            eps,
            stats: false,
        } => norm::layer_norm(*axis, *eps, ins, cx),
        Op::Reduce(r) => norm::reduce(r, ins, cx),
        Op::Shape(ShapeOp::Transpose { perm }) => copy::transpose(perm.as_deref(), ins, cx),
        Op::Shape(ShapeOp::Concat { axis }) => copy::concat(*axis, ins, cx),
        Op::Shape(ShapeOp::Slice { attrs }) => copy::slice(attrs.as_ref(), ins, cx),
        Op::Shape(ShapeOp::Gather { axis }) => copy::gather(*axis, ins, cx),
        Op::Shape(ShapeOp::Pad { mode, pads, value }) => {
            copy::pad(mode, pads.as_deref(), *value, ins, cx)
        }
        _ => decline(format!("{} has no device path", op.name())),
    }
}

/// Input `i`, required.
fn input<'a>(ins: &[Option<Operand<'a>>], i: usize) -> Lowered<Operand<'a>> {
    ins.get(i)
        .copied()
        .flatten()
        .ok_or_else(|| Decline(format!("input {i} is missing")))
}

/// Input `i`, required, f32 and on the device.
fn f32_in<'a>(ins: &[Option<Operand<'a>>], i: usize) -> Lowered<(Operand<'a>, DevPtr)> {
    let o = input(ins, i)?;
    match (o.dtype, o.at) {
        (DType::F32, Some(at)) => Ok((o, at)),
        (DType::F32, None) => decline(format!("input {i} is not on the device")),
        (t, _) => decline(format!("input {i} is {t:?}, not f32")),
    }
}

/// Input `i` when present: f32 on the device, or a decline.
fn opt_f32_in<'a>(ins: &[Option<Operand<'a>>], i: usize) -> Lowered<Option<(Operand<'a>, DevPtr)>> {
    match ins.get(i).copied().flatten() {
        None => Ok(None),
        Some(_) => f32_in(ins, i).map(Some),
    }
}

/// An integer-valued input's elements on the host (axes, pads, starts ...).
fn host_ints(ins: &[Option<Operand<'_>>], i: usize) -> Lowered<Option<Vec<i64>>> {
    match ins.get(i).copied().flatten() {
        None => Ok(None),
        Some(o) => match o.host {
            Some(t) => t
                .to_i64_vec()
                .map(Some)
                .map_err(|e| Decline(format!("input {i}: {e}"))),
            None => decline(format!(
                "input {i} is computed on the device; needed on the host"
            )),
        },
    }
}

/// A scalar input's value on the host.
fn host_scalar(ins: &[Option<Operand<'_>>], i: usize) -> Lowered<Option<f64>> {
    match ins.get(i).copied().flatten() {
        None => Ok(None),
        Some(o) => match o.host {
            Some(t) if t.len() == 1 => Ok(t.to_f64_vec().first().copied()),
            Some(_) => decline(format!("input {i} is not a scalar")),
            None => decline(format!(
                "input {i} is computed on the device; needed on the host"
            )),
        },
    }
}

fn numel(shape: &[usize]) -> Lowered<usize> {
    crate::tensor::checked_numel(shape).map_err(|e| Decline(e.to_string()))
}

#[cfg(test)]
mod tests;
