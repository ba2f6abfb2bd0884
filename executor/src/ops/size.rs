//! What an op is about to allocate, worked out from its inputs' shapes (and the small integer
//! tensors that give shapes, repeats, pads or sizes) before it runs. Constant folding and the
//! memory budget of a run refuse a node on this number instead of finding out by allocating:
//! a few hundred bytes of `ConstantOfShape`, `Tile` or `Resize` may ask for gigabytes.
//!
//! Only the ops whose outputs can be far larger than their inputs have an estimate; every other
//! op allocates at most a small multiple of what it reads, which is already counted.

use super::index::{IndexOp, gather_nd_shape, one_hot_depth, one_hot_shape};
use super::quant::QuantOp;
use super::shape::{
    ShapeOp, expand_shape, gather_shape, pad_shape, range_len, slice_of, window_len,
};
use super::{Op, input};
use crate::error::{OpError, OpResult, shape_err};
use crate::ops::elementwise::broadcast_shape;
use crate::tensor::{DType, Tensor, checked_numel};

/// Bytes per element of the index vectors the gather-based ops build beside their output.
const INDEX: usize = std::mem::size_of::<usize>();

/// Bytes `op` allocates on `inputs` (outputs and working buffers together), or `None` when it
/// allocates no more than a small multiple of its inputs. An error is the error the op itself
/// would give for these shapes (too large, or inconsistent).
pub fn allocation(op: &Op, inputs: &[Option<&Tensor>]) -> OpResult<Option<usize>> {
    let x = || input(inputs, 0);
    let bytes = match op {
        Op::Shape(s) => return shape_op(s, inputs),
        Op::Binary(_) => {
            let out = broadcast_shape(&x()?.shape, &input(inputs, 1)?.shape)?;
            elements(&out, dsize(x()?))?
        }
        Op::LegacyBroadcast(_, axis) => {
            let (a, b) = (x()?, input(inputs, 1)?);
            let mut aligned = b.shape.clone();
            if let Some(axis) = axis {
                let axis = crate::tensor::norm_axis(*axis, a.rank())?;
                if axis + b.rank() > a.rank() {
                    return shape_err("legacy broadcast past the first operand's axes");
                }
                aligned = vec![1; axis];
                aligned.extend(&b.shape);
                aligned.resize(a.rank(), 1);
            }
            elements(&broadcast_shape(&a.shape, &aligned)?, dsize(a))?
        }
        // Operands are joined pairwise, each partial result a new tensor of the broadcast shape.
        Op::Variadic(..) => {
            let mut out = x()?.shape.clone();
            for t in inputs.iter().skip(1).flatten() {
                out = broadcast_shape(&out, &t.shape)?;
            }
            times(elements(&out, dsize(x()?))?, 2)?
        }
        // Where gathers through three index vectors and an iota.
        Op::Where => {
            let (c, a, b) = (x()?, input(inputs, 1)?, input(inputs, 2)?);
            let out = broadcast_shape(&broadcast_shape(&c.shape, &a.shape)?, &b.shape)?;
            elements(&out, dsize(a) + 4 * INDEX)?
        }
        Op::MatMul {
            packed: Some(f), ..
        } => {
            let [n, k, ..] = f.shape();
            matmul(&x()?.shape, &[k, n])?
        }
        Op::MatMul { .. } => matmul(&x()?.shape, &input(inputs, 1)?.shape)?,
        Op::Gemm(g) => {
            let (a, b) = (x()?, input(inputs, 1)?);
            if a.rank() != 2 || b.rank() != 2 {
                return shape_err("Gemm needs 2-D operands");
            }
            let m = if g.trans_a { a.shape[1] } else { a.shape[0] };
            let n = if g.trans_b { b.shape[0] } else { b.shape[1] };
            // The output and a broadcast copy of C.
            elements(&[m, n], 2 * 4)?
        }
        // Past two spatial axes: the output and one group's im2col columns.
        Op::Conv(c) if x()?.rank() > 4 => {
            let g = super::conv_nd::conv_nd_geometry(c, &x()?.shape, &input(inputs, 1)?.shape)?;
            plus(elements(&g.shape, 4)?, times(g.columns()?, 4)?)?
        }
        // Past two spatial axes: the output and one group's columns before they are summed.
        Op::ConvTranspose(c) if x()?.rank() > 4 => {
            let g = super::conv_nd::conv_transpose_nd_geometry(
                c,
                &x()?.shape,
                &input(inputs, 1)?.shape,
            )?;
            let columns = elements(&[g.m / g.groups, g.window.taps(), g.window.positions()], 4)?;
            plus(elements(&g.shape, 4)?, columns)?
        }
        // NHWC: the output alone (no im2col).
        Op::Conv(c) if c.nhwc => {
            let w = super::conv_nhwc::nhwc_weight_shape(c, inputs, 1)?;
            elements(&super::conv_nhwc::nhwc_geometry(c, &x()?.shape, &w)?.1, 4)?
        }
        Op::Conv(c) => {
            let w = input(inputs, 1)?;
            let (p, out) = super::conv::conv_geometry(c, &x()?.shape, &w.shape)?;
            plus(elements(&out, 4)?, im2col(&p)?)?
        }
        // The GEMM's columns before col2im: kernel taps times output channels per input pixel.
        Op::ConvTranspose(c) => {
            let w = input(inputs, 1)?;
            let (p, out) = super::conv::conv_transpose_geometry(c, &x()?.shape, &w.shape)?;
            let columns = elements(&[p.m / p.groups, p.kh, p.kw, p.h, p.w], 4)?;
            plus(elements(&out, 4)?, columns)?
        }
        // The image in f64 and the output cast from it.
        Op::Col2Im(c) => {
            let g =
                super::conv::col2im_geometry(c, &x()?.shape, input(inputs, 1)?, input(inputs, 2)?)?;
            elements(&g.out, 8 + dsize(x()?))?
        }
        // NHWC: the output alone (the bands live in per-thread scratch).
        Op::PointwiseDepthwise(f) if f.pointwise.nhwc => {
            let geometry = super::conv_nhwc::nhwc_geometry;
            let shape = super::conv_nhwc::nhwc_weight_shape;
            let (_, mid) = geometry(&f.pointwise, &x()?.shape, &shape(&f.pointwise, inputs, 1)?)?;
            let (_, mut out) = geometry(&f.depthwise, &mid, &shape(&f.depthwise, inputs, 3)?)?;
            if let Some(pr) = &f.project {
                out = geometry(pr, &out, &shape(pr, inputs, 5)?)?.1;
            }
            elements(&out, 4)?
        }
        Op::PointwiseDepthwise(f) => {
            let conv = super::conv::conv_geometry;
            let (p1, mid) = conv(&f.pointwise, &x()?.shape, &input(inputs, 1)?.shape)?;
            let (p2, out) = conv(&f.depthwise, &mid, &input(inputs, 3)?.shape)?;
            let mut total = plus(elements(&mid, 4)?, elements(&out, 4)?)?;
            total = plus(total, im2col(&p1)?.max(im2col(&p2)?))?;
            if let Some(pr) = &f.project {
                let (p3, last) = conv(pr, &out, &input(inputs, 5)?.shape)?;
                total = plus(total, elements(&last, 4)?)?;
                total = plus(total, im2col(&p3)?)?;
            }
            total
        }
        // The output, and past two spatial axes or with Indices, the f64 input, output and
        // per-window state the window-by-window path keeps, and the indices.
        Op::Pool(p) if p.nhwc => elements(
            &super::pool::nhwc_pool_geometry(p, &x()?.shape)?.1,
            dsize(x()?),
        )?,
        Op::Pool(p) if p.indices || x()?.rank() > 4 || x()?.dtype() == DType::F64 => {
            let (_, out) = super::pool_nd::pool_nd_geometry(p, &x()?.shape)?;
            let window = 8 + 3 * INDEX + 8;
            plus(elements(&out, dsize(x()?) + window)?, times(x()?.len(), 8)?)?
        }
        Op::Pool(p) => {
            let (_, out) = super::pool::pool2d_geometry(p, &x()?.shape)?;
            elements(&out, 4)?
        }
        // The unpooled tensor and the output holding it, each gathered through an index per
        // element.
        Op::MaxUnpool(u) => {
            let (_, out) =
                super::pool::max_unpool_shape(u, &x()?.shape, super::opt_input(inputs, 2))?;
            elements(&out, 2 * (dsize(x()?) + 3 * INDEX))?
        }
        // Computed in f64: the windows' results, and the output cast from them.
        Op::LpPool { pool, .. } => {
            let (_, out) = super::pool_nd::pool_nd_geometry(pool, &x()?.shape)?;
            let window = 8 + 3 * INDEX + 8;
            plus(elements(&out, dsize(x()?) + window)?, times(x()?.len(), 8)?)?
        }
        // The resampled tensor and one intermediate of at most its size, plus the taps.
        // The resampled tensor and one intermediate of at most its size, plus the taps; by
        // filter taps, also the f64 intermediates and every tap's weight.
        Op::Resize(r) => {
            let (out, scales) = super::resize::resize_shape(r, inputs)?;
            let taps = out.iter().try_fold(0usize, |a, &d| plus(a, d))?;
            let two = plus(elements(&out, 2 * 4)?, times(taps, 3 * INDEX)?)?;
            if r.filtered(r.legacy || inputs.len() == 2) {
                let filter = super::resize_filter::work_bytes(r, &x()?.shape, &out, &scales)?;
                plus(two, filter)?
            } else {
                two
            }
        }
        // Worked in f64, then the output.
        Op::GridSample(_) => {
            let out = super::grid::grid_sample_shape(&x()?.shape, &input(inputs, 1)?.shape)?;
            elements(&out, 8 + dsize(x()?))?
        }
        Op::AffineGrid { .. } => {
            let out = super::grid::affine_grid_shape(input(inputs, 1)?)?;
            elements(&out, 8 + dsize(x()?))?
        }
        // Y in f64 and as the output, and the states.
        Op::Rnn(r) => {
            let s = super::rnn::rnn_shape(r, inputs)?;
            let y = elements(&s.y(r.batch_first), 8 + dsize(x()?))?;
            plus(y, elements(&s.state(r.batch_first), 3 * (8 + dsize(x()?)))?)?
        }
        Op::Cast { to, .. } => elements(&x()?.shape, to.size())?,
        // The bias, the scores and the fourth output, each one f32 per score at most.
        Op::Attention(a) => times(super::attention::score_elements(a, inputs)?, 3 * 4)?,
        Op::GroupQuery(a) => super::group_query::allocation(a, inputs)?,
        // The mask as f32, and the mask input read as i64.
        Op::MaskIndex(_) => {
            let shape = super::mask_index::mask_shape(
                input(inputs, 1)?,
                super::opt_input(inputs, 2),
                super::opt_input(inputs, 3),
            )?;
            plus(elements(&shape, 4)?, times(x().map_or(0, |m| m.len()), 8)?)?
        }
        Op::CastLike(_) => elements(&x()?.shape, dsize(input(inputs, 1)?))?,
        Op::Index(i) => return index_op(i, inputs),
        Op::Quant(q) => return quant_op(q, inputs),
        // Every intermediate product and its reordered copy.
        Op::Einsum(e) => {
            let shapes: Vec<&[usize]> = inputs
                .iter()
                .flatten()
                .map(|t| t.shape.as_slice())
                .collect();
            times(e.elements(&shapes)?, 2 * dsize(x()?) + INDEX)?
        }
        // At most every box of every class kept, three int64 per row; a sort key per box.
        Op::NonMaxSuppression { .. } => {
            let rows = super::nms::max_selected(inputs)?;
            let boxes = x()?.shape.get(1).copied().unwrap_or(0);
            plus(times(rows, 3 * 8)?, times(boxes, 8 + 2 * INDEX)?)?
        }
        // Worked in f64, then the output; the twiddle table, a line's samples and the FFT's
        // complex buffers (its input, output and the sub-transforms along one recursion), or
        // the float32 transform's five complex arrays of up to 4n (`fft_f32`).
        Op::Dft(a) => {
            let (axis, n, out) = super::dft::dft_shape(a, inputs)?;
            let line = plus(n, x()?.shape[axis])?;
            plus(elements(&out, 8 + dsize(x()?))?, times(line, 16 * 10)?)?
        }
        Op::Stft { onesided } => {
            let (_, frame, window, out) = super::dft::stft_shape(*onesided, inputs)?;
            let frame = plus(frame, window.len())?;
            plus(elements(&out, 8 + dsize(x()?))?, times(frame, 16 * 10)?)?
        }
        Op::MelWeightMatrix { to } => {
            let out = super::mel::mel_shape(inputs)?;
            elements(&out, 8 + to.size())?
        }
        // The output in f64 and cast, the input in f64, and one bin's samples.
        Op::RoiAlign(a) => {
            let out = super::roi_align::roi_align_shape(a, inputs)?;
            let samples = times(super::roi_align::MAX_SAMPLES, 64)?;
            let work = plus(times(x()?.len(), 8)?, samples)?;
            plus(elements(&out, 8 + dsize(x()?))?, work)?
        }
        // The output in f64 and cast, the inputs in f64, and one image's columns.
        Op::DeformConv(a) => {
            let g = super::deform_conv::deform_geometry(a, inputs)?;
            let read = inputs
                .iter()
                .flatten()
                .try_fold(0usize, |s, t| plus(s, t.len()))?;
            let work = plus(times(read, 8)?, times(g.columns()?, 8)?)?;
            plus(elements(&g.shape(), 8 + dsize(x()?))?, work)?
        }
        // The output (each query head of a group reads its key/value head's state) and the
        // state (`dk` by `dv` per key/value head, neither bounded by the inputs' sizes), in f64
        // and as the outputs.
        Op::LinearAttention(a) => {
            let (q, v) = (x()?, input(inputs, 2)?);
            let (&[b, t, qd], &[_, _, vd]) = (q.shape.as_slice(), v.shape.as_slice()) else {
                return shape_err("LinearAttention needs [B, T, H*D] operands");
            };
            let (dk, dv) = (qd / a.q_heads, vd / a.kv_heads);
            let out = elements(&[b, t, a.q_heads, dv], 8 + dsize(q))?;
            plus(out, elements(&[b, a.kv_heads, dk, dv], 8 + dsize(q))?)?
        }
        _ => return Ok(None),
    };
    Ok(Some(bytes))
}

fn index_op(op: &IndexOp, inputs: &[Option<&Tensor>]) -> OpResult<Option<usize>> {
    let x = || input(inputs, 0);
    let bytes = match op {
        // One slice of the data per index tuple, gathered through an index per element.
        IndexOp::GatherNd { batch_dims } => {
            let out = gather_nd_shape(&x()?.shape, &input(inputs, 1)?.shape, *batch_dims)?;
            elements(&out, dsize(x()?) + INDEX)?
        }
        // An int64 coordinate per axis of every element, at worst, and its position.
        IndexOp::NonZero => times(x()?.len(), 8 * x()?.rank() + INDEX)?,
        // The depth comes from data: one element and one pick per output element.
        IndexOp::OneHot { axis } => {
            let depth = one_hot_depth(input(inputs, 1)?)?;
            let out = one_hot_shape(&x()?.shape, depth, *axis)?;
            elements(&out, dsize(input(inputs, 2)?) + INDEX)?
        }
        _ => return Ok(None),
    };
    Ok(Some(bytes))
}

fn quant_op(op: &QuantOp, inputs: &[Option<&Tensor>]) -> OpResult<Option<usize>> {
    let x = input(inputs, 0)?;
    let bytes = match op {
        // The i32 products (an [M, 1] by [1, N] product is far larger than its operands) and
        // the per-product operand indices.
        QuantOp::MatMulInteger | QuantOp::QLinearMatMul => {
            let b = input(inputs, if *op == QuantOp::MatMulInteger { 1 } else { 3 })?;
            let s = super::matmul::MatMulShape::of(&x.shape, &b.shape)?;
            plus(elements(&s.out, 4 + 1)?, elements(&s.batch, 2 * INDEX)?)?
        }
        // The i32 sums and one group's i16 im2col columns.
        QuantOp::ConvInteger(c) | QuantOp::QLinearConv(c) => {
            let w = input(
                inputs,
                if matches!(op, QuantOp::ConvInteger(_)) {
                    1
                } else {
                    3
                },
            )?;
            let (p, out) = super::conv::conv_geometry(c, &x.shape, &w.shape)?;
            let columns = elements(&[p.c / p.groups.max(1), p.kh, p.kw, p.oh, p.ow], 2)?;
            plus(elements(&out, 4 + 1)?, columns)?
        }
        _ => return Ok(None),
    };
    Ok(Some(bytes))
}

fn shape_op(op: &ShapeOp, inputs: &[Option<&Tensor>]) -> OpResult<Option<usize>> {
    let x = || input(inputs, 0);
    let bytes = match op {
        ShapeOp::ConstantOfShape { value } => {
            let shape = super::shape::to_dims(&x()?.to_i64_vec()?)?;
            elements(&shape, value.dtype().size())?
        }
        // Expand and Tile gather through an index per output element.
        ShapeOp::Expand => {
            let out = expand_shape(&x()?.shape, input(inputs, 1)?)?;
            plus(
                elements(&out, dsize(x()?) + INDEX)?,
                times(x()?.len(), INDEX)?,
            )?
        }
        ShapeOp::Tile => {
            let out = super::shape::tile_shape(&x()?.shape, &input(inputs, 1)?.to_i64_vec()?)?;
            elements(&out, dsize(x()?) + INDEX)?
        }
        ShapeOp::Range => {
            let n = range_len(x()?, input(inputs, 1)?, input(inputs, 2)?)?;
            times(n, dsize(x()?))?
        }
        // Computed in f64, then cast.
        ShapeOp::Window { dtype, .. } => times(window_len(x()?)?, 8 + dtype.size())?,
        // Pad keeps an optional source index and a gather index per output element.
        ShapeOp::Pad { pads, .. } => {
            let (_, out) = pad_shape(&x()?.shape, inputs, pads.as_deref())?;
            elements(&out, dsize(x()?) + 3 * INDEX)?
        }
        ShapeOp::CenterCropPad { axes } => {
            let (out, _) = super::shape::center_crop_pad_shape(
                &x()?.shape,
                input(inputs, 1)?,
                axes.as_deref(),
            )?;
            elements(&out, dsize(x()?) + 3 * INDEX)?
        }
        // The inputs joined: a node may name the same value many times.
        ShapeOp::Concat { .. } => inputs
            .iter()
            .flatten()
            .try_fold(0usize, |a, t| plus(a, t.bytes()))?,
        ShapeOp::Gather { axis } => {
            let out = gather_shape(&x()?.shape, &input(inputs, 1)?.shape, *axis)?;
            elements(&out, dsize(x()?) + INDEX)?
        }
        ShapeOp::Slice { attrs } => {
            let x = x()?;
            let (out, _, _) = slice_of(&x.shape, inputs, attrs.as_ref())?;
            elements(&out, dsize(x) + INDEX)?
        }
        // The parts together are the input, each gathered through its own indices.
        ShapeOp::Split { .. } => times(x()?.len(), dsize(x()?) + INDEX)?,
        _ => return Ok(None),
    };
    Ok(Some(bytes))
}

/// MatMul's output (batch axes broadcast), and the per-product operand indices.
fn matmul(a: &[usize], b: &[usize]) -> OpResult<usize> {
    let s = super::matmul::MatMulShape::of(a, b)?;
    plus(elements(&s.out, 4)?, elements(&s.batch, 2 * INDEX)?)
}

/// Bytes of a convolution's im2col scratch (`Conv2d::scratch_len`, with every product checked).
fn im2col(p: &cotenant_kernels::conv::Conv2d) -> OpResult<usize> {
    if p.is_pointwise() || p.is_depthwise() {
        return Ok(0);
    }
    elements(&[p.c / p.groups.max(1), p.kh, p.kw, p.oh, p.ow], 4)
}

fn dsize(t: &Tensor) -> usize {
    t.dtype().size()
}

/// Bytes of `shape` at `per_element` bytes each; a shape past the executor's limit is an error.
fn elements(shape: &[usize], per_element: usize) -> OpResult<usize> {
    times(checked_numel(shape)?, per_element)
}

fn times(n: usize, k: usize) -> OpResult<usize> {
    n.checked_mul(k).ok_or(OpError::TooLarge(usize::MAX))
}

fn plus(a: usize, b: usize) -> OpResult<usize> {
    a.checked_add(b).ok_or(OpError::TooLarge(usize::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::Cx;
    use crate::tensor::{DType, Data};

    fn ints(v: &[i64]) -> Tensor {
        Tensor::i64(vec![v.len()], v.to_vec()).expect("ints")
    }

    fn f32s(shape: &[usize]) -> Tensor {
        Tensor::zeros(DType::F32, shape.to_vec()).expect("zeros")
    }

    /// A few hundred bytes of input that ask for gigabytes are priced before anything is
    /// allocated.
    #[test]
    fn amplifying_ops_are_priced_from_their_inputs() {
        let giga = 1usize << 30;
        let of_shape = Op::Shape(ShapeOp::ConstantOfShape {
            value: Tensor::scalar_f32(1.0),
        });
        let shape = ints(&[1 << 15, 1 << 14]);
        assert_eq!(allocation(&of_shape, &[Some(&shape)]), Ok(Some(2 * giga)));
        let tile = Op::Shape(ShapeOp::Tile);
        let (x, reps) = (f32s(&[4]), ints(&[1 << 27]));
        let bytes = allocation(&tile, &[Some(&x), Some(&reps)])
            .unwrap()
            .unwrap();
        assert!(bytes >= 2 * giga, "{bytes}");
        let expand = Op::Shape(ShapeOp::Expand);
        let target = ints(&[1 << 20, 1 << 10]);
        let (x, one) = (f32s(&[1, 1]), Some(&target));
        assert!(allocation(&expand, &[Some(&x), one]).unwrap().unwrap() >= 4 * giga);
        let range = Op::Shape(ShapeOp::Range);
        let (s, l, d) = (
            Tensor::scalar_f32(0.0),
            Tensor::scalar_f32(1e9),
            Tensor::scalar_f32(1.0),
        );
        assert_eq!(
            allocation(&range, &[Some(&s), Some(&l), Some(&d)]),
            Ok(Some(4_000_000_000))
        );
        // Past the executor's per-tensor limit, or overflowing, is the op's own error.
        let huge = ints(&[1 << 40, 1 << 40]);
        assert!(matches!(
            allocation(&of_shape, &[Some(&huge)]),
            Err(OpError::TooLarge(_))
        ));
        let inf = Tensor::scalar_f32(f32::INFINITY);
        assert!(matches!(
            allocation(&range, &[Some(&s), Some(&inf), Some(&d)]),
            Err(OpError::TooLarge(_))
        ));
        // Broadcasting [N, 1] against [1, N]: N^2 from 2N.
        let (a, b) = (f32s(&[1 << 15, 1]), f32s(&[1, 1 << 15]));
        let add = Op::Binary(crate::ops::elementwise::Binary::Add);
        assert_eq!(allocation(&add, &[Some(&a), Some(&b)]), Ok(Some(4 * giga)));
        // One value named many times by a Concat.
        let concat = Op::Shape(ShapeOp::Concat { axis: 0 });
        let x = f32s(&[1 << 10]);
        let many: Vec<Option<&Tensor>> = vec![Some(&x); 1 << 12];
        assert_eq!(allocation(&concat, &many), Ok(Some(16 << 20)));
        // OneHot's depth, GatherND's slices, Einsum's outer products.
        let one_hot = Op::Index(IndexOp::OneHot { axis: -1 });
        let (ind, depth, values) = (f32s(&[1 << 10]), ints(&[1 << 20]), f32s(&[2]));
        let bytes = allocation(&one_hot, &[Some(&ind), Some(&depth), Some(&values)]);
        assert!(bytes.unwrap().unwrap() >= 4 * giga);
        let nd = Op::Index(IndexOp::GatherNd { batch_dims: 0 });
        let (data, ind) = (
            f32s(&[1, 1 << 20]),
            ints(&[0; 1 << 10]).reshaped(vec![1 << 10, 1]).unwrap(),
        );
        assert!(
            allocation(&nd, &[Some(&data), Some(&ind)])
                .unwrap()
                .unwrap()
                >= 4 * giga
        );
        let outer = Op::Einsum(crate::ops::einsum::Einsum::parse("i,j->ij").unwrap());
        let v = f32s(&[1 << 15]);
        assert!(allocation(&outer, &[Some(&v), Some(&v)]).unwrap().unwrap() >= 4 * giga);
        let v = f32s(&[1 << 16]);
        assert!(matches!(
            allocation(&outer, &[Some(&v), Some(&v)]),
            Err(OpError::TooLarge(_))
        ));
        // Ops that read as much as they write have no estimate.
        let relu = Op::Unary(crate::ops::elementwise::Unary::Relu);
        assert_eq!(allocation(&relu, &[Some(&x)]), Ok(None));
    }

    /// Where an op has an estimate, it covers what the op returns.
    #[test]
    fn estimates_cover_what_the_ops_return() {
        let cx = Cx::new(1);
        let x = Tensor::new(vec![2, 3], Data::F32((0..6).map(|v| v as f32).collect())).unwrap();
        let cases: Vec<(Op, Vec<Tensor>)> = vec![
            (Op::Shape(ShapeOp::Tile), vec![x.clone(), ints(&[3, 2])]),
            (
                Op::Shape(ShapeOp::Expand),
                vec![x.clone(), ints(&[4, 2, 3])],
            ),
            (
                Op::Shape(ShapeOp::Pad {
                    mode: "reflect".into(),
                    pads: Some(vec![1, 2, 1, 2]),
                    value: 0.0,
                }),
                vec![x.clone()],
            ),
            (
                Op::Shape(ShapeOp::Gather { axis: 1 }),
                vec![x.clone(), ints(&[0, 2, 2, 1])],
            ),
            (
                Op::Shape(ShapeOp::Concat { axis: 1 }),
                vec![x.clone(), x.clone(), x.clone()],
            ),
            (
                Op::MatMul {
                    act: None,
                    packed: None,
                },
                vec![f32s(&[5, 1, 2, 3]), f32s(&[4, 3, 7])],
            ),
            (
                Op::Index(IndexOp::GatherNd { batch_dims: 1 }),
                vec![
                    x.clone(),
                    Tensor::i64(vec![2, 2, 1], vec![0, 1, 2, 0]).unwrap(),
                ],
            ),
            (
                Op::Index(IndexOp::OneHot { axis: 0 }),
                vec![x.clone(), ints(&[4]), f32s(&[2])],
            ),
            (Op::Index(IndexOp::NonZero), vec![x.clone()]),
            (
                Op::Einsum(crate::ops::einsum::Einsum::parse("ij,kj->ikj").unwrap()),
                vec![x.clone(), x.clone()],
            ),
            (
                Op::NonMaxSuppression {
                    center_point_box: false,
                },
                vec![f32s(&[2, 3, 4]), f32s(&[2, 2, 3]), ints(&[9])],
            ),
        ];
        for (op, ins) in cases {
            let refs: Vec<Option<&Tensor>> = ins.iter().map(Some).collect();
            let estimate = allocation(&op, &refs).unwrap().unwrap();
            let out: usize = op.eval(&cx, &refs).unwrap().iter().map(Tensor::bytes).sum();
            assert!(estimate >= out, "{}: {estimate} < {out}", op.name());
        }
    }
}
