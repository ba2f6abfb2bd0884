//! The QDQ format's quantized ops, rewritten to integer ops on the packed 8-bit kernels
//! (`cotenant_kernels::qgemm`, `qconv`) with the weights packed once here. The same sweep packs
//! dynamic quantization's integer products (`integer_products`).
//!
//! * Conv between DequantizeLinear and QuantizeLinear, as the QDQ format writes a quantized
//!   Conv: `Q(Conv(DQ(x), DQ(w), DQ(bias)))`, optionally with a Relu before the Q, where `x`
//!   has a single scale and zero point, `w` is a constant int8/uint8 tensor with one scale (and
//!   zero point) per output channel or one in all, the bias (optional) a constant, and the
//!   output a single scale and zero point: one integer op ([`QConv`]) from `x` to the output.
//!
//! * MatMul and Gemm by constant weights between DequantizeLinear and QuantizeLinear, as
//!   onnxruntime's `quantize_static` writes them (uint8 activations, symmetric int8 weights per
//!   column or per tensor): the same integer op as a 1x1 Conv, over the rows of `x`
//!   ([`QConv::matmul`]).
//!
//! * Add between DequantizeLinear of both sides and QuantizeLinear (a Relu between allowed),
//!   per tensor: one pass over the 8-bit inputs ([`QAdd`]) with the same f32 arithmetic.
//!
//! * MaxPool between a DequantizeLinear and a QuantizeLinear with the same single scale (positive)
//!   and zero point: MaxPool of the 8-bit values themselves. The maximum commutes with a
//!   monotone dequantization, and quantizing a dequantized value gives it back exactly.
//!
//! Anything else (non-constant weights, other zero point shapes, a scale that might not be a
//! single value) is left as it is, on the reference path.

use super::{integer_products, producer, sole_reader};
use crate::graph::Graph;
use crate::graph::Node;
use crate::ops::Op;
use crate::ops::conv::ConvAttrs;
use crate::ops::elementwise::Binary;
use crate::ops::elementwise::Unary;
use crate::ops::quant::{QAdd, QConv, QConvWeights, QuantOp, Quantized};
use crate::ops::shape::ShapeOp;
use crate::tensor::{DType, Data, Tensor};
use cotenant_kernels::{qconv, qgemm::PackedA};
use std::sync::Arc;

pub fn fuse_qdq(g: &mut Graph) {
    let mut i = 0;
    let mut rewrites = 0;
    while i < g.nodes.len() {
        // A rewrite moves the next node to `i` (or leaves one no rule matches).
        let rewritten = match g.nodes[i].op {
            Op::Quant(QuantOp::MatMulInteger) => integer_products::pack_matmul(g, i),
            Op::Quant(QuantOp::ConvInteger(_)) => integer_products::pack_conv(g, i),
            Op::Conv(_) => quantized_conv(g, i),
            Op::MatMul { .. } | Op::Gemm(_) => quantized_matmul(g, i),
            Op::Binary(Binary::Add) => quantized_add(g, i),
            Op::Pool(_) => quantized_max_pool(g, i),
            _ => false,
        };
        rewrites += usize::from(rewritten);
        if !rewritten {
            i += 1;
        }
    }
    if rewrites > 0 {
        // The weights' DequantizeLinear nodes, which nothing reads now.
        super::remove_dead(g);
    }
}

/// A constant's values as f32 when it is an f32 tensor of `len` values (or one, with
/// `one_ok`) of rank at most 1.
fn f32s(t: &Tensor, len: usize, one_ok: bool) -> Option<Vec<f32>> {
    let ok = t.rank() <= 1 && (t.len() == len || (one_ok && t.len() == 1));
    ok.then(|| t.as_f32().ok().map(<[f32]>::to_vec)).flatten()
}

/// What a DequantizeLinear reads: the quantized value, the scale, the zero point and the axis.
type Dequantizer = (usize, Arc<Tensor>, Option<Arc<Tensor>>, i64);

/// DequantizeLinear node `d`'s `(x, scale, zero point)` inputs, when it dequantizes to f32 per
/// tensor or per axis (`axis` of the input's rank) and its scale and zero point are constants.
fn dequantizer(g: &Graph, d: usize) -> Option<Dequantizer> {
    let n = &g.nodes[d];
    let Op::Quant(QuantOp::Dequantize(a)) = &n.op else {
        return None;
    };
    if a.layout.block_size != 0 || !matches!(a.output_dtype, None | Some(DType::F32)) {
        return None;
    }
    let input = |k: usize| n.inputs.get(k).copied().flatten();
    let scale = g.constants.get(&input(1)?)?.clone();
    let zero = match input(2) {
        Some(z) => Some(g.constants.get(&z)?.clone()),
        None => None,
    };
    Some((input(0)?, scale, zero, a.layout.axis))
}

/// A single zero point of an 8-bit type as `(type, raw byte)` (int8 values as their bytes).
fn zero_u8(z: &Tensor) -> Option<(DType, u8)> {
    match &z.data {
        Data::U8(v) if v.len() == 1 && z.rank() <= 1 => Some((DType::U8, v[0])),
        Data::I8(v) if v.len() == 1 && z.rank() <= 1 => Some((DType::I8, v[0] as u8)),
        _ => None,
    }
}

/// A per-tensor DequantizeLinear's scale and zero point (which must be there: it gives the
/// type), when `v` is produced by one: `(its input, parameters)`.
fn dequantized_input(g: &Graph, v: usize) -> Option<(usize, Quantized)> {
    let (x, s, z, _) = dequantizer(g, producer(g, v)?)?;
    let (scale, (dtype, _)) = (f32s(&s, 1, true)?, zero_u8(z.as_deref()?)?);
    let zero = z.as_deref()?.to_f64_vec()[0] as i32;
    Some((
        x,
        Quantized {
            scale: scale[0],
            zero,
            dtype,
        },
    ))
}

/// The node reading `v` (through a Relu, when `relu_ok`) when it is a per-tensor
/// QuantizeLinear: `(its index, the Relu's, its parameters)`.
fn quantized_output(g: &Graph, v: usize) -> Option<(usize, Option<usize>, Quantized)> {
    let uses = g.use_counts();
    let mut q = sole_reader(g, &uses, v)?;
    let mut relu = None;
    if g.nodes[q].op == Op::Unary(Unary::Relu) {
        relu = Some(q);
        q = sole_reader(g, &uses, g.nodes[q].outputs[0])?;
    }
    let qn = &g.nodes[q];
    let Op::Quant(QuantOp::Quantize(qa)) = &qn.op else {
        return None;
    };
    if qa.layout.block_size != 0 || !matches!(qa.precision, None | Some(DType::F32)) {
        return None;
    }
    let qin = |k: usize| qn.inputs.get(k).copied().flatten();
    let sy = f32s(g.constants.get(&qin(1)?)?, 1, true)?;
    let zy = g.constants.get(&qin(2)?)?;
    let (dtype, _) = zero_u8(zy)?;
    if qa.output_dtype.is_some_and(|o| o != dtype) {
        return None;
    }
    let zero = zy.to_f64_vec()[0] as i32;
    Some((
        q,
        relu,
        Quantized {
            scale: sy[0],
            zero,
            dtype,
        },
    ))
}

/// Rewrites `Q(Relu?(DQ(a) + DQ(b)))` at Add `i` to one [`QAdd`]; whether it did.
fn quantized_add(g: &mut Graph, i: usize) -> bool {
    let n = &g.nodes[i];
    let (Some(Some(a)), Some(Some(b)), 1) = (n.inputs.first(), n.inputs.get(1), n.outputs.len())
    else {
        return false;
    };
    let (Some((a, qa)), Some((b, qb))) = (dequantized_input(g, *a), dequantized_input(g, *b))
    else {
        return false;
    };
    let Some((q, relu, qy)) = quantized_output(g, n.outputs[0]) else {
        return false;
    };
    let (name, out) = (n.name.clone(), g.nodes[q].outputs[0]);
    let node = &mut g.nodes[q];
    node.name = name;
    node.op = Op::Quant(QuantOp::QAdd(QAdd {
        a: qa,
        b: qb,
        y: qy,
        relu: relu.is_some(),
    }));
    node.inputs = vec![Some(a), Some(b)];
    node.outputs = vec![out];
    if let Some(r) = relu {
        g.nodes.remove(r);
    }
    g.nodes.remove(i);
    true
}

/// Rewrites `Q(MaxPool(DQ(x)))` at MaxPool `i` to `MaxPool(x)` where the Q undoes the DQ (one
/// positive scale, the same zero point and type); whether it did.
fn quantized_max_pool(g: &mut Graph, i: usize) -> bool {
    let n = &g.nodes[i];
    let (Op::Pool(p), Some(Some(v)), 1) = (&n.op, n.inputs.first(), n.outputs.len()) else {
        return false;
    };
    if !p.max || p.indices {
        return false;
    }
    let (Some((x, qx)), Some((q, None, qy))) =
        (dequantized_input(g, *v), quantized_output(g, n.outputs[0]))
    else {
        return false;
    };
    if qx != qy || !(qx.scale > 0.0 && qx.scale.is_finite()) {
        return false;
    }
    // The pool takes the Q's place (after everything it read), on the 8-bit values.
    let mut pool = g.nodes.remove(i);
    let q = if q > i { q - 1 } else { q };
    pool.inputs[0] = Some(x);
    pool.outputs = std::mem::take(&mut g.nodes[q].outputs);
    g.nodes[q] = pool;
    true
}

/// Rewrites Conv `i` and the quantization around it to one [`QConv`]; whether it did.
fn quantized_conv(g: &mut Graph, i: usize) -> bool {
    let n = &g.nodes[i];
    let Op::Conv(c) = &n.op else {
        return false;
    };
    if c.act.is_some() || c.residual || c.group != 1 || n.outputs.len() != 1 {
        return false;
    }
    let input = |k: usize| n.inputs.get(k).copied().flatten();
    // The input: DQ(x) with one scale and a zero point (which gives x's type).
    let Some((x, sx, Some(zx), _)) = input(0)
        .and_then(|v| producer(g, v))
        .and_then(|d| dequantizer(g, d))
    else {
        return false;
    };
    let (Some(sx), Some((x_dtype, x_zero))) = (f32s(&sx, 1, true), zero_u8(&zx)) else {
        return false;
    };
    // The weights: DQ of a constant, per output channel (axis 0) or per tensor.
    let Some((w, sw, zw, axis)) = input(1)
        .and_then(|v| producer(g, v))
        .and_then(|d| dequantizer(g, d))
    else {
        return false;
    };
    let Some(wt) = g.constants.get(&w) else {
        return false;
    };
    let w_shape = wt.shape.clone();
    if !(3..=4).contains(&w_shape.len()) {
        return false;
    }
    let m = w_shape[0];
    // Several scales must be along the output channels.
    let Some(sw) =
        f32s(&sw, m, true).filter(|s| s.len() == 1 || axis == 0 || axis == -(w_shape.len() as i64))
    else {
        return false;
    };
    if zw
        .as_ref()
        .is_some_and(|z| z.rank() > 1 || (z.len() != 1 && z.len() != m) || z.dtype() != wt.dtype())
    {
        return false;
    }
    let dw = c
        .dilations
        .as_ref()
        .map_or(1, |d| d.last().copied().unwrap_or(1));
    let w = match conv_weights(x_dtype, &w_shape, dw, &wt.data, zw.as_deref()) {
        Some(w) => w,
        None => return false,
    };
    let Some(bias) = constant_bias(g, input(2), m) else {
        return false;
    };
    // The output: an optional Relu, then Q with one scale and zero point.
    let Some((q, relu, yq)) = quantized_output(g, n.outputs[0]) else {
        return false;
    };
    let (mult, offset) = requantization(sx[0], &sw, &bias, yq.scale);
    let op = QConv {
        conv: c.clone(),
        w_shape,
        w,
        x_dtype,
        x_zero,
        mult,
        offset,
        y_dtype: yq.dtype,
        y_zero: yq.zero as f32,
        relu: relu.is_some(),
        matmul: false,
    };
    let out = g.nodes[q].outputs[0];
    let name = n.name.clone();
    let nhwc = matches!(op.w, QConvWeights::Taps(_));
    // The new node takes the Q's place (after everything the Conv read); the Conv and Relu go.
    let node = &mut g.nodes[q];
    node.name = name.clone();
    node.op = Op::Quant(QuantOp::QConv(Arc::new(op)));
    node.inputs = vec![Some(x)];
    node.outputs = vec![out];
    if nhwc {
        // NHWC inside, NCHW outside: transposes around it, which `transposes` cancels
        // between neighbours.
        let (xt, yt) = (
            g.add_value(format!("{name}/nhwc_input")),
            g.add_value(format!("{name}/nhwc_output")),
        );
        (g.nodes[q].inputs, g.nodes[q].outputs) = (vec![Some(xt)], vec![yt]);
        let to_nhwc = transpose(format!("{name}/to_nhwc"), NCHW_TO_NHWC, x, xt);
        let to_nchw = transpose(format!("{name}/to_nchw"), NHWC_TO_NCHW, yt, out);
        g.nodes.insert(q + 1, to_nchw);
        g.nodes.insert(q, to_nhwc);
    }
    if let Some(r) = relu {
        g.nodes.remove(r);
    }
    g.nodes.remove(i);
    true
}

/// The axis orders between NCHW and NHWC, as Transpose perms.
pub(super) const NCHW_TO_NHWC: [usize; 4] = [0, 2, 3, 1];
pub(super) const NHWC_TO_NCHW: [usize; 4] = [0, 3, 1, 2];

/// A Transpose node by `perm` from `x` to `y`.
pub(super) fn transpose(name: String, perm: [usize; 4], x: usize, y: usize) -> Node {
    Node {
        name,
        op: Op::Shape(ShapeOp::Transpose {
            perm: Some(perm.to_vec()),
        }),
        inputs: vec![Some(x)],
        outputs: vec![y],
    }
}

/// A quantized Conv's weights (`w_shape`, `[M, C, kh, kw]` or 1-D; dilation `dw` along x)
/// packed for its input: for NHWC where the kernel for that applies (uint8 input, int8
/// weights with zero zero points, 2-D, see `qconv::pack_filter`), else as rows for NCHW.
fn conv_weights(
    x_dtype: DType,
    w_shape: &[usize],
    dw: usize,
    w: &Data,
    zw: Option<&Tensor>,
) -> Option<QConvWeights> {
    let (m, k) = (w_shape[0], w_shape[1..].iter().product::<usize>());
    let zero = zw.is_none_or(|z| z.to_f64_vec().iter().all(|&v| v == 0.0));
    if let (DType::U8, Data::I8(v), true, &[_, c, kh, kw]) = (x_dtype, w, zero, w_shape)
        && let Some(packed) = qconv::pack_filter(m, c, (kh, kw), dw, v)
    {
        return Some(QConvWeights::Taps(packed));
    }
    // One row of k per output channel.
    Some(QConvWeights::Rows(match (w, zw.map(|z| &z.data)) {
        (Data::I8(v), None) => PackedA::weights(m, k, v, &[0]),
        (Data::I8(v), Some(Data::I8(z))) => PackedA::weights(m, k, v, z),
        (Data::U8(v), None) => PackedA::weights(m, k, v, &[0]),
        (Data::U8(v), Some(Data::U8(z))) => PackedA::weights(m, k, v, z),
        _ => return None,
    }))
}

/// The requantization of integer sums over `m` channels: the multiplier `x_scale · w_scale[c]
/// / y_scale` (`w_scale` one per channel or one in all) and the bias over `y_scale`, each
/// worked in f64 and rounded once.
fn requantization(sx: f32, sw: &[f32], bias: &[f32], sy: f32) -> (Vec<f32>, Vec<f32>) {
    let (sx, sy) = (sx as f64, sy as f64);
    let w_scale = |c: usize| sw[if sw.len() == 1 { 0 } else { c }] as f64;
    let mult = (0..bias.len())
        .map(|c| (sx * w_scale(c) / sy) as f32)
        .collect();
    let offset = bias.iter().map(|&b| (b as f64 / sy) as f32).collect();
    (mult, offset)
}

/// A bias of `m` values: absent (zeros), a constant, or DequantizeLinear of a constant.
fn constant_bias(g: &Graph, v: Option<usize>, m: usize) -> Option<Vec<f32>> {
    let Some(v) = v else {
        return Some(vec![0.0; m]);
    };
    if let Some(t) = g.constants.get(&v) {
        return f32s(t, m, false);
    }
    producer(g, v)
        .and_then(|d| dequantizer(g, d))
        .filter(|(_, sb, _, axis)| sb.len() == 1 || *axis == 0 || *axis == -1)
        .and_then(|(b, sb, zb, _)| dequantized_bias(g.constants.get(&b)?, &sb, zb.as_deref(), m))
}

/// Rewrites `Q(Relu?(MatMul(DQ(x), DQ(w))))`, or the same of a Gemm (alpha and beta 1, A not
/// transposed, the bias absent, a constant or DQ of one), to a [`QConv`] over `x`'s rows
/// ([`QConv::matmul`]); whether it did. `x` must be uint8 with one scale and zero point, `w` a
/// constant int8 matrix with zero zero points and one scale per output column or one in all,
/// and the output one scale and zero point: as onnxruntime's `quantize_static` writes them.
fn quantized_matmul(g: &mut Graph, i: usize) -> bool {
    let n = &g.nodes[i];
    let trans_b = match &n.op {
        Op::MatMul {
            act: None,
            packed: None,
        } => false,
        Op::Gemm(a) if a.alpha == 1.0 && a.beta == 1.0 && !a.trans_a && a.act.is_none() => {
            a.trans_b
        }
        _ => return false,
    };
    let input = |k: usize| n.inputs.get(k).copied().flatten();
    if n.outputs.len() != 1 {
        return false;
    }
    let Some((x, xq)) = input(0).and_then(|v| dequantized_input(g, v)) else {
        return false;
    };
    let Some((w, sw, zw, axis)) = input(1)
        .and_then(|v| producer(g, v))
        .and_then(|d| dequantizer(g, d))
    else {
        return false;
    };
    let Some(wt) = g.constants.get(&w) else {
        return false;
    };
    let (Data::I8(wv), &[rows, cols]) = (&wt.data, wt.shape.as_slice()) else {
        return false;
    };
    // Output columns along `out_axis` of the weights, the reduction along the other.
    let (k, m, out_axis) = if trans_b {
        (cols, rows, 0)
    } else {
        (rows, cols, 1)
    };
    let Some(sw) =
        f32s(&sw, m, true).filter(|s| s.len() == 1 || axis == out_axis || axis == out_axis - 2)
    else {
        return false;
    };
    if xq.dtype != DType::U8 || zw.is_some_and(|z| z.to_f64_vec().iter().any(|&v| v != 0.0)) {
        return false;
    }
    // `[M, K]`, as a 1x1 convolution's weights.
    let w_mk: Vec<i8> = if trans_b {
        wv.clone()
    } else {
        (0..m)
            .flat_map(|j| (0..k).map(move |r| wv[r * m + j]))
            .collect()
    };
    let Some(packed) = qconv::pack_filter(m, k, (1, 1), 1, &w_mk) else {
        return false;
    };
    let Some(bias) = constant_bias(g, input(2), m) else {
        return false;
    };
    let Some((q, relu, yq)) = quantized_output(g, n.outputs[0]) else {
        return false;
    };
    let (mult, offset) = requantization(xq.scale, &sw, &bias, yq.scale);
    let op = QConv {
        conv: ConvAttrs {
            kernel_shape: Some(vec![1, 1]),
            auto_pad: "NOTSET".to_string(),
            group: 1,
            ..ConvAttrs::default()
        },
        w_shape: vec![m, k, 1, 1],
        w: QConvWeights::Taps(packed),
        x_dtype: DType::U8,
        x_zero: xq.zero as u8,
        mult,
        offset,
        y_dtype: yq.dtype,
        y_zero: yq.zero as f32,
        relu: relu.is_some(),
        matmul: true,
    };
    // The new node takes the Q's place (after everything the product read); the product and
    // the Relu go.
    let name = std::mem::take(&mut g.nodes[i].name);
    let node = &mut g.nodes[q];
    node.name = name;
    node.op = Op::Quant(QuantOp::QConv(Arc::new(op)));
    node.inputs = vec![Some(x)];
    if let Some(r) = relu {
        g.nodes.remove(r);
    }
    g.nodes.remove(i);
    true
}

/// A bias dequantized from int32 as DequantizeLinear does it, `m` values.
fn dequantized_bias(b: &Tensor, sb: &Tensor, zb: Option<&Tensor>, m: usize) -> Option<Vec<f32>> {
    let (Data::I32(bv), Some(sb)) = (&b.data, f32s(sb, m, true)) else {
        return None;
    };
    let zero = match zb.map(|z| &z.data) {
        None => vec![0],
        Some(Data::I32(z)) if z.len() == 1 || z.len() == m => z.clone(),
        _ => return None,
    };
    if b.rank() != 1 || bv.len() != m {
        return None;
    }
    let pick = |v: &[f32], c: usize| v[if v.len() == 1 { 0 } else { c }];
    Some(
        (0..m)
            .map(|c| {
                let z = zero[if zero.len() == 1 { 0 } else { c }];
                (bv[c] as i64 - z as i64) as f32 * pick(&sb, c)
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::super::test_graph::{G, attr_int, bytes, names, run_both, t};
    use super::*;
    use crate::backend::CpuBackend;
    use crate::plan::Plan;
    use crate::zoo::builder::attr_ints;

    /// How the quantized Conv's parts may vary; the default is the pattern QDQ writes.
    #[derive(Clone, Copy, Default)]
    struct Variant {
        per_tensor: bool,
        weights_as_input: bool,
        no_x_zero_point: bool,
        weight_axis_1: bool,
        no_relu: bool,
        int8_x: bool,
        /// 1x1, stride 1, unpadded (read straight from the image) instead of 3x3 padded.
        pointwise: bool,
        /// Stride 2 and padding only at the bottom and right.
        strided: bool,
        /// Per-channel weights with zero zero points (NHWC with a uint8 input).
        symmetric: bool,
    }

    impl Variant {
        /// Whether the QDQ pass runs this Conv NHWC.
        fn nhwc(&self) -> bool {
            !self.int8_x && (self.per_tensor || self.symmetric)
        }
    }

    /// `Q(Relu(Conv(DQ(x), DQ(w), DQ(bias))))`, 4 → 6 channels, 3x3, padded, on 5x6 images.
    fn conv_graph(v: Variant) -> Graph {
        let mut g = G::new();
        let xt = if v.int8_x { DType::I8 } else { DType::U8 };
        let x = g.input("x", xt, &[1, 4, 5, 6]);
        let sx = g.constant(Tensor::scalar_f32(0.05));
        let zx = g.constant(match xt {
            DType::I8 => t(&[], Data::I8(vec![-7])),
            _ => t(&[], Data::U8(vec![128])),
        });
        let zx = if v.no_x_zero_point { None } else { Some(zx) };
        let xf = g.node("DequantizeLinear", &[Some(x), Some(sx), zx], 1, vec![])[0];
        let kk = if v.pointwise { 1 } else { 3 };
        let wv: Vec<i8> = bytes(6 * 4 * kk * kk, 5).iter().map(|&b| b as i8).collect();
        let w = if v.weights_as_input {
            g.input("w", DType::I8, &[6, 4, kk, kk])
        } else {
            g.constant(t(&[6, 4, kk, kk], Data::I8(wv)))
        };
        let sw: Vec<f32> = (0..6).map(|c| 0.01 * (c + 1) as f32).collect();
        let (sw, zw, axis) = if v.per_tensor {
            (t(&[], Data::F32(vec![0.02])), t(&[], Data::I8(vec![0])), 0)
        } else if v.weight_axis_1 {
            (
                t(&[4], Data::F32(sw[..4].to_vec())),
                t(&[4], Data::I8(vec![0; 4])),
                1,
            )
        } else {
            let zero = if v.symmetric {
                vec![0; 6]
            } else {
                vec![0, 3, -128, 127, 0, 1]
            };
            (t(&[6], Data::F32(sw)), t(&[6], Data::I8(zero)), 0)
        };
        let (sw, zw) = (g.constant(sw), g.constant(zw));
        let wf = g.node(
            "DequantizeLinear",
            &[Some(w), Some(sw), Some(zw)],
            1,
            vec![attr_int("axis", axis)],
        )[0];
        let b = g.constant(t(&[6], Data::I32(vec![-300, 0, 1000, 7, -5, 20])));
        let sb = g.constant(t(
            &[6],
            Data::F32((0..6).map(|c| 0.0005 * (c + 1) as f32).collect()),
        ));
        let bf = g.node(
            "DequantizeLinear",
            &[Some(b), Some(sb)],
            1,
            vec![attr_int("axis", 0)],
        )[0];
        let attrs = match (v.pointwise, v.strided) {
            (true, _) => vec![],
            (false, true) => vec![
                attr_ints("pads", &[0, 0, 1, 1]),
                attr_ints("strides", &[2, 2]),
            ],
            (false, false) => vec![attr_ints("pads", &[1, 1, 1, 1])],
        };
        let mut y = g.node("Conv", &[Some(xf), Some(wf), Some(bf)], 1, attrs)[0];
        if !v.no_relu {
            y = g.node("Relu", &[Some(y)], 1, vec![])[0];
        }
        let sy = g.constant(Tensor::scalar_f32(0.1));
        let zy = g.constant(t(&[], Data::U8(vec![3])));
        let q = g.node("QuantizeLinear", &[Some(y), Some(sy), Some(zy)], 1, vec![])[0];
        g.output(q)
    }

    fn conv_inputs(batch: usize, int8_x: bool, weights: bool) -> Vec<(String, Tensor)> {
        let x = bytes(batch * 4 * 30, 9);
        let x = match int8_x {
            true => t(
                &[batch, 4, 5, 6],
                Data::I8(x.iter().map(|&b| b as i8).collect()),
            ),
            false => t(&[batch, 4, 5, 6], Data::U8(x)),
        };
        let mut v = vec![("x".to_string(), x)];
        if weights {
            let w: Vec<i8> = bytes(6 * 4 * 9, 5).iter().map(|&b| b as i8).collect();
            v.push(("w".into(), t(&[6, 4, 3, 3], Data::I8(w))));
        }
        v
    }

    #[test]
    fn quantized_convs_become_one_integer_op_within_a_step_of_the_float_path() {
        for variant in [
            Variant::default(),
            Variant {
                per_tensor: true,
                ..Variant::default()
            },
            Variant {
                no_relu: true,
                ..Variant::default()
            },
            Variant {
                int8_x: true,
                ..Variant::default()
            },
            Variant {
                pointwise: true,
                ..Variant::default()
            },
            Variant {
                strided: true,
                ..Variant::default()
            },
            Variant {
                symmetric: true,
                ..Variant::default()
            },
            Variant {
                symmetric: true,
                pointwise: true,
                ..Variant::default()
            },
            Variant {
                symmetric: true,
                strided: true,
                no_relu: true,
                ..Variant::default()
            },
            Variant {
                symmetric: true,
                int8_x: true,
                ..Variant::default()
            },
        ] {
            // 50 images of 30 positions: more than one product's columns.
            for batch in [1, 3, 50] {
                let (names, want, got) = run_both(conv_graph(variant), &|| {
                    conv_inputs(batch, variant.int8_x, false)
                });
                let fused = if variant.no_relu {
                    "QConv"
                } else {
                    "QConv+Relu"
                };
                match variant.nhwc() {
                    true => assert_eq!(names, ["Transpose", fused, "Transpose"]),
                    false => assert_eq!(names, [fused], "batch {batch}"),
                }
                let (Data::U8(want), Data::U8(got)) = (&want.data, &got.data) else {
                    panic!("u8 outputs");
                };
                assert_eq!(want.len(), got.len());
                // Integer sums requantized once differ from the float path's by at most one
                // step, where the float path's rounding lands on the other side of a tie.
                let off = want.iter().zip(got).filter(|(a, b)| a != b).count();
                assert!(want.iter().zip(got).all(|(a, b)| a.abs_diff(*b) <= 1));
                assert!(off * 50 <= want.len(), "{off} of {} differ", want.len());
                assert!(want.iter().any(|&v| v > 10), "a non-trivial output");
            }
        }
    }

    #[test]
    fn convs_outside_the_pattern_keep_the_reference_path() {
        for (variant, weights) in [
            (
                Variant {
                    weights_as_input: true,
                    ..Variant::default()
                },
                true,
            ),
            (
                Variant {
                    no_x_zero_point: true,
                    ..Variant::default()
                },
                false,
            ),
            (
                Variant {
                    weight_axis_1: true,
                    ..Variant::default()
                },
                false,
            ),
        ] {
            let g = conv_graph(variant);
            let mut opt = g.clone();
            crate::passes::optimize(&mut opt);
            assert!(
                !names(&opt).iter().any(|n| n.starts_with("QConv")),
                "{:?}",
                names(&opt)
            );
            // And it still runs (a per-input-channel weight scale is no Conv DQ can feed).
            if !variant.weight_axis_1 {
                let mut x = conv_inputs(2, false, weights);
                if variant.no_x_zero_point {
                    x.truncate(1);
                }
                let raw = Plan::build(&g).expect("plan");
                let fused = Plan::build(&opt).expect("plan");
                let be = CpuBackend::new(2);
                let want = raw.run(&be, x.clone()).expect("runs");
                let got = fused.run(&be, x).expect("runs");
                assert_eq!(want[0].1.data, got[0].1.data);
            }
        }
    }

    /// How a QDQ MatMul or Gemm varies; the default is a MatMul as `quantize_static` writes it.
    #[derive(Clone, Copy, Default)]
    struct Product {
        /// Gemm with B transposed and an int32 bias dequantized per column.
        gemm: bool,
        /// Gemm with B as it is and a float bias.
        gemm_float_bias: bool,
        relu: bool,
        /// 7-bit weights (the pairs AVX2's `vpmaddubsw` sums exactly) instead of full range.
        seven_bit: bool,
        int8_output: bool,
        // Outside the pattern:
        int8_x: bool,
        weight_zero_point: bool,
        /// One scale per reduction row instead of per output column.
        scale_per_row: bool,
    }

    const K: usize = 20;
    const M: usize = 18;

    /// `Q(Relu?(MatMul(DQ(x), DQ(w))))` from `x` `[batch, 3, 20]` (or a Gemm's `[batch, 20]`)
    /// to 18 columns.
    fn product_graph(v: Product) -> Graph {
        let mut g = G::new();
        let gemm = v.gemm || v.gemm_float_bias;
        let xt = if v.int8_x { DType::I8 } else { DType::U8 };
        let x = g.input("x", xt, if gemm { &[1, K] } else { &[1, 3, K] });
        let sx = g.constant(Tensor::scalar_f32(0.05));
        let zx = g.constant(match xt {
            DType::I8 => t(&[], Data::I8(vec![-7])),
            _ => t(&[], Data::U8(vec![120])),
        });
        let xf = g.node(
            "DequantizeLinear",
            &[Some(x), Some(sx), Some(zx)],
            1,
            vec![],
        )[0];
        let wv: Vec<i8> = bytes(K * M, 5)
            .iter()
            .map(|&b| if v.seven_bit { b as i8 / 2 } else { b as i8 })
            .collect();
        let shape = if v.gemm { [M, K] } else { [K, M] };
        let w = g.constant(t(&shape, Data::I8(wv)));
        let (scales, axis) = match (v.scale_per_row, v.gemm) {
            (true, _) => (K, 0),
            (false, true) => (M, 0),
            (false, false) => (M, -1),
        };
        let sw = g.constant(t(
            &[scales],
            Data::F32((0..scales).map(|c| 0.002 * (c + 1) as f32).collect()),
        ));
        let zw = g.constant(t(
            &[scales],
            Data::I8(
                (0..scales)
                    .map(|c| i8::from(v.weight_zero_point && c == 2))
                    .collect(),
            ),
        ));
        let axis = vec![attr_int("axis", axis)];
        let wf = g.node("DequantizeLinear", &[Some(w), Some(sw), Some(zw)], 1, axis)[0];
        let mut y = if v.gemm {
            let b = g.constant(t(
                &[M],
                Data::I32((0..M as i32).map(|c| 40 * c - 300).collect()),
            ));
            let sb = g.constant(t(
                &[M],
                Data::F32((0..M).map(|c| 0.0001 * (c + 1) as f32).collect()),
            ));
            let axis = vec![attr_int("axis", 0)];
            let bf = g.node("DequantizeLinear", &[Some(b), Some(sb)], 1, axis)[0];
            let attrs = vec![attr_int("transB", 1)];
            g.node("Gemm", &[Some(xf), Some(wf), Some(bf)], 1, attrs)[0]
        } else if v.gemm_float_bias {
            let b = g.constant(t(
                &[M],
                Data::F32((0..M).map(|c| c as f32 * 0.3 - 2.0).collect()),
            ));
            g.node("Gemm", &[Some(xf), Some(wf), Some(b)], 1, vec![])[0]
        } else {
            g.node("MatMul", &[Some(xf), Some(wf)], 1, vec![])[0]
        };
        if v.relu {
            y = g.node("Relu", &[Some(y)], 1, vec![])[0];
        }
        let sy = g.constant(Tensor::scalar_f32(0.08));
        let zy = g.constant(match v.int8_output {
            true => t(&[], Data::I8(vec![-5])),
            false => t(&[], Data::U8(vec![130])),
        });
        let q = g.node("QuantizeLinear", &[Some(y), Some(sy), Some(zy)], 1, vec![])[0];
        g.output(q)
    }

    fn product_inputs(v: Product, batch: usize) -> Vec<(String, Tensor)> {
        let gemm = v.gemm || v.gemm_float_bias;
        let shape: &[usize] = if gemm { &[batch, K] } else { &[batch, 3, K] };
        let x = bytes(shape.iter().product(), 9);
        let x = match v.int8_x {
            true => Data::I8(x.iter().map(|&b| b as i8).collect()),
            false => Data::U8(x),
        };
        vec![("x".to_string(), t(shape, x))]
    }

    #[test]
    fn quantized_matmuls_and_gemms_become_one_integer_op_within_a_step_of_the_float_path() {
        let d = Product::default();
        for v in [
            d,
            Product { relu: true, ..d },
            Product {
                seven_bit: true,
                ..d
            },
            Product {
                int8_output: true,
                ..d
            },
            Product { gemm: true, ..d },
            Product {
                gemm: true,
                relu: true,
                seven_bit: true,
                ..d
            },
            Product {
                gemm_float_bias: true,
                ..d
            },
        ] {
            // 70 rows of 3: several row tiles and a partial one.
            for batch in [1, 2, 70] {
                let (names, want, got) = run_both(product_graph(v), &|| product_inputs(v, batch));
                let fused = if v.relu { "QMatMul+Relu" } else { "QMatMul" };
                assert_eq!(names, [fused], "batch {batch}");
                assert_eq!(want.shape, got.shape);
                let (want, got): (Vec<i32>, Vec<i32>) = match (&want.data, &got.data) {
                    (Data::U8(a), Data::U8(b)) => (
                        a.iter().map(|&v| v as i32).collect(),
                        b.iter().map(|&v| v as i32).collect(),
                    ),
                    (Data::I8(a), Data::I8(b)) => (
                        a.iter().map(|&v| v as i32).collect(),
                        b.iter().map(|&v| v as i32).collect(),
                    ),
                    (a, b) => panic!("8-bit outputs of one type: {:?} {:?}", a.dtype(), b.dtype()),
                };
                // As for Conv: at most one step apart, where the float path's rounding lands on
                // the other side of a tie.
                let off = want.iter().zip(&got).filter(|(a, b)| a != b).count();
                assert!(want.iter().zip(&got).all(|(a, b)| a.abs_diff(*b) <= 1));
                assert!(off * 50 <= want.len(), "{off} of {} differ", want.len());
                let (lo, hi) = (want.iter().min(), want.iter().max());
                assert!(
                    hi.zip(lo).is_some_and(|(h, l)| h - l > 20),
                    "a non-trivial output"
                );
            }
        }
    }

    #[test]
    fn products_outside_the_pattern_keep_the_reference_path() {
        let d = Product::default();
        for v in [
            Product { int8_x: true, ..d },
            Product {
                weight_zero_point: true,
                ..d
            },
            Product {
                scale_per_row: true,
                ..d
            },
        ] {
            let g = product_graph(v);
            let mut opt = g.clone();
            crate::passes::optimize(&mut opt);
            assert!(
                !names(&opt).iter().any(|n| n.starts_with("QMatMul")),
                "{:?}",
                names(&opt)
            );
            if !v.scale_per_row {
                let raw = Plan::build(&g).expect("plan");
                let fused = Plan::build(&opt).expect("plan");
                let be = CpuBackend::new(2);
                let want = raw.run(&be, product_inputs(v, 2)).expect("runs");
                let got = fused.run(&be, product_inputs(v, 2)).expect("runs");
                assert_eq!(want[0].1.data, got[0].1.data);
            }
        }
    }

    /// A QDQ Conv from `x` (uint8 `[n, c, 5, 6]` dequantized with scale 0.05, zero 128) to
    /// `m` channels, 3x3 padded, symmetric per-channel weights, quantized to scale `sy`, zero 3.
    fn qdq_conv(g: &mut G, x: usize, c: usize, m: usize, sy: f32, seed: u32) -> usize {
        let (sx, zx) = (
            g.constant(Tensor::scalar_f32(0.05)),
            g.constant(t(&[], Data::U8(vec![128]))),
        );
        let xf = g.node(
            "DequantizeLinear",
            &[Some(x), Some(sx), Some(zx)],
            1,
            vec![],
        )[0];
        let wv: Vec<i8> = bytes(m * c * 9, seed)
            .iter()
            .map(|&b| b as i8 / 4)
            .collect();
        let w = g.constant(t(&[m, c, 3, 3], Data::I8(wv)));
        let sw = g.constant(t(&[m], Data::F32(vec![0.01; m])));
        let zw = g.constant(t(&[m], Data::I8(vec![0; m])));
        let axis = vec![attr_int("axis", 0)];
        let wf = g.node("DequantizeLinear", &[Some(w), Some(sw), Some(zw)], 1, axis)[0];
        let pads = vec![attr_ints("pads", &[1, 1, 1, 1])];
        let y = g.node("Conv", &[Some(xf), Some(wf)], 1, pads)[0];
        let (sy, zy) = (
            g.constant(Tensor::scalar_f32(sy)),
            g.constant(t(&[], Data::U8(vec![3]))),
        );
        g.node("QuantizeLinear", &[Some(y), Some(sy), Some(zy)], 1, vec![])[0]
    }

    #[test]
    fn a_chain_of_nhwc_convolutions_and_adds_transposes_only_at_its_ends() {
        // x -> conv a -> conv b, x -> conv a2; Q(DQ(b) + DQ(a2)) -> conv c -> out.
        let mut g = G::new();
        let x = g.input("x", DType::U8, &[2, 4, 5, 6]);
        let a = qdq_conv(&mut g, x, 4, 8, 0.2, 1);
        let b = qdq_conv(&mut g, a, 8, 8, 0.2, 2);
        let a = qdq_conv(&mut g, x, 4, 8, 0.2, 4);
        let (s, z) = (
            g.constant(Tensor::scalar_f32(0.05)),
            g.constant(t(&[], Data::U8(vec![3]))),
        );
        let da = g.node("DequantizeLinear", &[Some(a), Some(s), Some(z)], 1, vec![])[0];
        let db = g.node("DequantizeLinear", &[Some(b), Some(s), Some(z)], 1, vec![])[0];
        let sum = g.node("Add", &[Some(da), Some(db)], 1, vec![])[0];
        let (sq, zq) = (
            g.constant(Tensor::scalar_f32(0.05)),
            g.constant(t(&[], Data::U8(vec![128]))),
        );
        let q = g.node(
            "QuantizeLinear",
            &[Some(sum), Some(sq), Some(zq)],
            1,
            vec![],
        )[0];
        let out = qdq_conv(&mut g, q, 8, 4, 0.1, 3);
        let (names, want, got) = run_both(g.output(out), &|| {
            vec![("x".into(), t(&[2, 4, 5, 6], Data::U8(bytes(2 * 4 * 30, 9))))]
        });
        // x is transposed once for both convolutions that read it.
        let expected = [
            "Transpose",
            "QConv",
            "QConv",
            "QConv",
            "QAdd",
            "QConv",
            "Transpose",
        ];
        assert_eq!(names, expected);
        assert_eq!(want.shape, [2, 4, 5, 6]);
        let (Data::U8(want), Data::U8(got)) = (&want.data, &got.data) else {
            panic!("u8 outputs");
        };
        // Each requantization may land one step off at a tie; three in a row, a few steps.
        assert!(want.iter().zip(got).all(|(a, b)| a.abs_diff(*b) <= 3));
        assert!(
            want.iter().any(|&v| v > 10 && v < 245),
            "a non-trivial output"
        );
    }

    #[test]
    fn an_rgb_stem_and_its_max_pool_join_the_nhwc_chain() {
        // x (3 channels) -> conv -> Q(MaxPool(DQ)) -> conv -> out.
        let mut g = G::new();
        let x = g.input("x", DType::U8, &[2, 3, 9, 8]);
        let stem = qdq_conv(&mut g, x, 3, 8, 0.2, 1);
        let (s, z) = (
            g.constant(Tensor::scalar_f32(0.2)),
            g.constant(t(&[], Data::U8(vec![3]))),
        );
        let d = g.node(
            "DequantizeLinear",
            &[Some(stem), Some(s), Some(z)],
            1,
            vec![],
        )[0];
        let attrs = vec![
            attr_ints("kernel_shape", &[3, 3]),
            attr_ints("strides", &[2, 2]),
            attr_ints("pads", &[1, 1, 1, 1]),
        ];
        let pooled = g.node("MaxPool", &[Some(d)], 1, attrs)[0];
        let q = g.node(
            "QuantizeLinear",
            &[Some(pooled), Some(s), Some(z)],
            1,
            vec![],
        )[0];
        let out = qdq_conv(&mut g, q, 8, 4, 0.1, 3);
        let (names, want, got) = run_both(g.output(out), &|| {
            vec![("x".into(), t(&[2, 3, 9, 8], Data::U8(bytes(2 * 3 * 72, 9))))]
        });
        let expected = ["Transpose", "QConv", "MaxPool(NHWC)", "QConv", "Transpose"];
        assert_eq!(names, expected);
        assert_eq!(want.shape, [2, 4, 5, 4]);
        let (Data::U8(want), Data::U8(got)) = (&want.data, &got.data) else {
            panic!("u8 outputs");
        };
        // Two requantizations, each of which may land one step off at a tie.
        assert!(want.iter().zip(got).all(|(a, b)| a.abs_diff(*b) <= 2));
        assert!(
            want.iter().any(|&v| v > 10 && v < 245),
            "a non-trivial output"
        );
    }

    /// A model's own NHWC-to-NCHW Transpose before a MaxPool is no NHWC kernel's output: the
    /// pool keeps its layout (and so any element type the NCHW pool takes).
    #[test]
    fn a_max_pool_of_a_models_own_transpose_keeps_its_layout() {
        for dtype in [DType::F32, DType::F64] {
            let mut g = G::new();
            let x = g.input("x", dtype, &[1, 5, 6, 3]);
            let perm = vec![attr_ints("perm", &[0, 3, 1, 2])];
            let t = g.node("Transpose", &[Some(x)], 1, perm)[0];
            let attrs = vec![attr_ints("kernel_shape", &[2, 2])];
            let y = g.node("MaxPool", &[Some(t)], 1, attrs)[0];
            let (names, want, got) = run_both(g.output(y), &|| {
                let v: Vec<f32> = (0..90).map(|i| ((i * 7) % 11) as f32).collect();
                let x = Tensor::f32(vec![1, 5, 6, 3], v).expect("x");
                vec![("x".into(), crate::ops::elementwise::cast(&x, dtype))]
            });
            assert_eq!(names, ["Transpose", "MaxPool"], "{dtype:?}");
            assert_eq!(want, got, "{dtype:?}");
        }
    }

    /// `Q(MaxPool(DQ(x)))`, 3x3 stride 2 padded, x `[2, 3, 9, 8]` of `xt` dequantized with
    /// scale 0.05 and zero point 5, quantized with `out_scale` and zero point 5.
    fn pool_graph(xt: DType, out_scale: f32) -> Graph {
        let mut g = G::new();
        let x = g.input("x", xt, &[2, 3, 9, 8]);
        let zero = match xt {
            DType::I8 => t(&[], Data::I8(vec![5])),
            _ => t(&[], Data::U8(vec![5])),
        };
        let (sx, zx) = (
            g.constant(Tensor::scalar_f32(0.05)),
            g.constant(zero.clone()),
        );
        let xf = g.node(
            "DequantizeLinear",
            &[Some(x), Some(sx), Some(zx)],
            1,
            vec![],
        )[0];
        let attrs = vec![
            attr_ints("kernel_shape", &[3, 3]),
            attr_ints("strides", &[2, 2]),
            attr_ints("pads", &[1, 1, 1, 1]),
        ];
        let y = g.node("MaxPool", &[Some(xf)], 1, attrs)[0];
        let (sy, zy) = (g.constant(Tensor::scalar_f32(out_scale)), g.constant(zero));
        let q = g.node("QuantizeLinear", &[Some(y), Some(sy), Some(zy)], 1, vec![])[0];
        g.output(q)
    }

    #[test]
    fn a_max_pool_between_matching_quantizations_pools_the_8_bit_values() {
        for (xt, out_scale, fused) in [
            (DType::U8, 0.05, true),
            (DType::I8, 0.05, true),
            // Another output scale: the Q does not undo the DQ.
            (DType::U8, 0.1, false),
        ] {
            let (names, want, got) = run_both(pool_graph(xt, out_scale), &|| {
                let x = bytes(2 * 3 * 9 * 8, 11);
                let x = match xt {
                    DType::I8 => Data::I8(x.iter().map(|&b| b as i8).collect()),
                    _ => Data::U8(x),
                };
                vec![("x".to_string(), t(&[2, 3, 9, 8], x))]
            });
            let expected: &[&str] = match fused {
                true => &["MaxPool"],
                false => &["DequantizeLinear", "MaxPool", "QuantizeLinear"],
            };
            assert_eq!(names, expected, "{xt:?} to scale {out_scale}");
            assert_eq!(want.shape, [2, 3, 5, 4]);
            assert_eq!(want, got, "{xt:?} to scale {out_scale}");
        }
    }

    /// `Q(Relu(DQ(x) + DQ(x2)))`, x `[batch, 3, 4, 5]` and x2 of `shape2`.
    fn add_graph(shape2: &[usize], x2_type: DType) -> Graph {
        let mut g = G::new();
        let x = g.input("x", DType::U8, &[1, 3, 4, 5]);
        let x2 = g.input("x2", x2_type, shape2);
        let z2 = match x2_type {
            DType::U8 => Data::U8(vec![250]),
            _ => Data::I8(vec![-5]),
        };
        let (s1, z1) = (
            g.constant(Tensor::scalar_f32(0.07)),
            g.constant(t(&[], Data::U8(vec![100]))),
        );
        let (s2, z2) = (g.constant(Tensor::scalar_f32(0.03)), g.constant(t(&[], z2)));
        let a = g.node(
            "DequantizeLinear",
            &[Some(x), Some(s1), Some(z1)],
            1,
            vec![],
        )[0];
        let b = g.node(
            "DequantizeLinear",
            &[Some(x2), Some(s2), Some(z2)],
            1,
            vec![],
        )[0];
        let sum = g.node("Add", &[Some(a), Some(b)], 1, vec![])[0];
        let r = g.node("Relu", &[Some(sum)], 1, vec![])[0];
        let (sy, zy) = (
            g.constant(Tensor::scalar_f32(0.05)),
            g.constant(t(&[], Data::U8(vec![7]))),
        );
        let q = g.node("QuantizeLinear", &[Some(r), Some(sy), Some(zy)], 1, vec![])[0];
        g.output(q)
    }

    #[test]
    fn quantized_adds_are_one_pass_and_exact() {
        // uint8 by uint8 runs the kernels' vector loop (32 bytes at a time, then the rest).
        let cases = [
            (vec![1, 3, 4, 5], 1, DType::I8),
            (vec![1, 3, 1, 1], 2, DType::I8),
            (vec![1, 3, 4, 5], 1, DType::U8),
        ];
        for (shape2, batch, x2_type) in cases {
            let n2: usize = shape2.iter().product();
            let x2 = bytes(n2, 2);
            let inputs = || {
                vec![
                    (
                        "x".to_string(),
                        t(&[batch, 3, 4, 5], Data::U8(bytes(batch * 60, 1))),
                    ),
                    (
                        "x2".to_string(),
                        t(
                            &shape2,
                            match x2_type {
                                DType::U8 => Data::U8(x2.clone()),
                                _ => Data::I8(x2.iter().map(|&b| b as i8).collect()),
                            },
                        ),
                    ),
                ]
            };
            let (names, want, got) = run_both(add_graph(&shape2, x2_type), &inputs);
            assert_eq!(names, ["QAdd+Relu"]);
            assert_eq!(want.shape, got.shape);
            assert_eq!(want.data, got.data, "x2 of {shape2:?}, {x2_type:?}");
        }
    }
}
