//! Integer products by constant weights as dynamic quantization writes them, rewritten to run
//! on the packed 8-bit kernel (`cotenant_kernels::qgemm`) with the weights packed once here,
//! and what dynamic quantization puts after them fused in when it is there:
//!
//! * MatMulInteger by int8/uint8 weights `[k, n]` (zero point absent, one, or one per column):
//!   a Cast to float, a Mul by a single scale (a constant, or the product of
//!   DynamicQuantizeLinear's scale and a constant), and an Add of a constant bias over the
//!   columns ([`PackedMatMul`]).
//!
//! * ConvInteger by int8/uint8 weights (zero point absent, one, or one per output channel; any
//!   group count): an Add of an int32 bias per output channel (onnxruntime's `quantize_dynamic`
//!   divides the float bias by the scale at run time and reshapes it along the channels), a
//!   Cast to float and a Mul by a single scale ([`PackedConv`]); then, where the bias stayed in
//!   float, an Add of a constant per output channel, and an activation.
//!
//! The sums are exact, so the fused ops give the separate ops' results bit for bit.

use super::fuse::activation_of;
use super::{add_reading, producer, sole_reader};
use crate::graph::Graph;
use crate::ops::Op;
use crate::ops::elementwise::Binary;
use crate::ops::quant::{IntegerFilter, PackedConv, PackedMatMul, QuantOp, pack_weights};
use crate::ops::shape::ShapeOp;
use crate::tensor::{DType, Data, Tensor};
use cotenant_kernels::qdepthwise::centred_filter;
use cotenant_kernels::qgemm::PackedA;
use std::sync::Arc;

/// Whether `v` is certainly a single float32 value of rank at most 1: a constant, the scale
/// DynamicQuantizeLinear produces, or the product of two such.
fn single_scale(g: &Graph, v: usize, depth: usize) -> bool {
    if let Some(t) = g.constants.get(&v) {
        return t.len() == 1 && t.rank() <= 1 && t.dtype() == DType::F32;
    }
    let Some(n) = g.nodes.iter().find(|n| n.outputs.contains(&v)) else {
        return false;
    };
    match &n.op {
        Op::Quant(QuantOp::DynamicQuantize) => n.outputs.get(1) == Some(&v),
        Op::Binary(Binary::Mul) if depth > 0 && n.inputs.len() == 2 => n
            .inputs
            .iter()
            .all(|i| i.is_some_and(|i| single_scale(g, i, depth - 1))),
        _ => false,
    }
}

/// Integer product `i`'s first operand, its weights (input 1) and their zero point (input 3,
/// when there), where the weights and zero point are constants.
fn constant_weights(g: &Graph, i: usize) -> Option<(usize, Arc<Tensor>, Option<Arc<Tensor>>)> {
    let input = |k: usize| g.nodes[i].inputs.get(k).copied().flatten();
    let w = g.constants.get(&input(1)?)?.clone();
    let zero = match input(3) {
        Some(z) => Some(g.constants.get(&z)?.clone()),
        None => None,
    };
    Some((input(0)?, w, zero))
}

/// Packs MatMulInteger `i`'s weights and fuses the scaling after it; whether it did.
pub(super) fn pack_matmul(g: &mut Graph, i: usize) -> bool {
    let n = &g.nodes[i];
    let Some((a, w, zp)) = constant_weights(g, i) else {
        return false;
    };
    let input = |k: usize| n.inputs.get(k).copied().flatten();
    let Some(packed) = pack_weights(&w, zp.as_deref()) else {
        return false;
    };
    let shape = [w.shape[0], w.shape[1]];
    let a_zp = input(2);
    let mut op = PackedMatMul {
        shape,
        b: packed,
        scaled: false,
        bias: None,
    };
    let mut inputs = vec![Some(a), a_zp];
    let mut out = n.outputs[0];
    let mut remove = vec![];
    let uses = g.use_counts();
    if let Some((scale, cast, mul)) = cast_and_scale(g, &uses, out) {
        op.scaled = true;
        inputs.push(Some(scale));
        out = g.nodes[mul].outputs[0];
        remove.extend([cast, mul]);
        // Then Add of a constant bias over the columns.
        if let Some(ad) = sole_reader(g, &uses, out)
            && g.nodes[ad].op == Op::Binary(Binary::Add)
            && g.nodes[ad].inputs.len() == 2
        {
            let add = &g.nodes[ad];
            let other = if add.inputs[0] == Some(out) {
                add.inputs[1]
            } else {
                add.inputs[0]
            };
            let bias = other.filter(|&b| Some(b) != Some(out)).and_then(|b| {
                g.constants
                    .get(&b)
                    .filter(|t| t.rank() == 1 && t.len() == shape[1])
                    .and_then(|t| t.as_f32().ok().map(<[f32]>::to_vec))
            });
            if let Some(bias) = bias {
                op.bias = Some(bias);
                out = add.outputs[0];
                remove.push(ad);
            }
        }
    }
    let op = Op::Quant(QuantOp::PackedMatMul(Arc::new(op)));
    replace_chain(g, i, remove, op, inputs, out);
    true
}

/// What dynamic quantization writes after an integer product `v`: a Cast to float that alone
/// reads it, then a Mul by a single scale that alone reads the Cast: `(the scale, the Cast, the
/// Mul)`.
fn cast_and_scale(g: &Graph, uses: &[usize], v: usize) -> Option<(usize, usize, usize)> {
    let c = sole_reader(g, uses, v)?;
    if !matches!(g.nodes[c].op, Op::Cast { to: DType::F32, .. }) {
        return None;
    }
    let cast_out = g.nodes[c].outputs[0];
    let m = sole_reader(g, uses, cast_out)?;
    let mul = &g.nodes[m];
    if mul.op != Op::Binary(Binary::Mul) || mul.inputs.len() != 2 {
        return None;
    }
    let scale = match (mul.inputs[0], mul.inputs[1]) {
        (Some(x), Some(s)) if x == cast_out && s != cast_out => s,
        (Some(s), Some(x)) if x == cast_out && s != cast_out => s,
        _ => return None,
    };
    single_scale(g, scale, 1).then_some((scale, c, m))
}

/// Replaces node `first` and the nodes `absorbed` after it by one node `op` of `inputs` to
/// `output`, named as `first`. It takes the place of the last node it absorbs, after the
/// producers of every input it takes from them.
fn replace_chain(
    g: &mut Graph,
    first: usize,
    mut absorbed: Vec<usize>,
    op: Op,
    inputs: Vec<Option<usize>>,
    output: usize,
) {
    absorbed.push(first);
    absorbed.sort_unstable();
    let last = absorbed.pop().unwrap_or(first);
    let name = std::mem::take(&mut g.nodes[first].name);
    let node = &mut g.nodes[last];
    node.name = name;
    node.op = op;
    node.inputs = inputs;
    node.outputs = vec![output];
    for r in absorbed.into_iter().rev() {
        g.nodes.remove(r);
    }
}

/// Packs ConvInteger `i`'s constant weights (zero point absent, one, or one per output channel)
/// and fuses what dynamic quantization writes after it: the Add of an int32 bias per channel
/// (a Reshape by a constant shape, or a constant, of `M` values along the channel axis), the
/// Cast to float and the Mul by a single scale. Whether it did.
pub(super) fn pack_conv(g: &mut Graph, i: usize) -> bool {
    let n = &g.nodes[i];
    let Op::Quant(QuantOp::ConvInteger(conv)) = &n.op else {
        return false;
    };
    let Some((x, w, zw)) = constant_weights(g, i) else {
        return false;
    };
    let input = |k: usize| n.inputs.get(k).copied().flatten();
    let Some(filter) = integer_filter(&w, zw.as_deref(), conv.group) else {
        return false;
    };
    let mut op = PackedConv {
        conv: conv.clone(),
        w_shape: w.shape.clone(),
        w: filter,
        scaled: false,
        bias: None,
        act: None,
    };
    let mut inputs = vec![Some(x), input(2)];
    let mut out = n.outputs[0];
    let mut remove = vec![];
    let uses = g.use_counts();
    // An int32 bias per channel first, fused only with the scaling after it.
    let bias = sole_reader(g, &uses, out).and_then(|ad| {
        let add = &g.nodes[ad];
        if add.op != Op::Binary(Binary::Add) || add.inputs.len() != 2 {
            return None;
        }
        let b = super::other(add, out)??;
        channel_values(g, b, w.shape[0], w.rank()).then_some((ad, b))
    });
    let sums = bias.map_or(out, |(ad, _)| g.nodes[ad].outputs[0]);
    if let Some((scale, cast, mul)) = cast_and_scale(g, &uses, sums) {
        op.scaled = true;
        inputs.push(Some(scale));
        if let Some((ad, b)) = bias {
            inputs.push(Some(b));
            remove.push(ad);
        }
        out = g.nodes[mul].outputs[0];
        remove.extend([cast, mul]);
        // Then a float bias per channel, then an activation.
        if let Some((ad, bias)) = float_channel_bias(g, out, w.shape[0], w.rank()) {
            op.bias = Some(bias);
            out = g.nodes[ad].outputs[0];
            remove.push(ad);
        }
        if let Some(j) = sole_reader(g, &uses, out)
            && g.nodes[j].inputs.first() == Some(&Some(out))
            && let Some(act) = activation_of(g, &g.nodes[j].op, &g.nodes[j].inputs)
        {
            op.act = Some(act);
            out = g.nodes[j].outputs[0];
            remove.push(j);
        }
    }
    let op = Op::Quant(QuantOp::PackedConv(Arc::new(op)));
    replace_chain(g, i, remove, op, inputs, out);
    true
}

/// The Add that alone reads `v` of a float32 constant per channel (of `m`, in a rank-`rank`
/// NCHW tensor), or of such a constant reshaped along the channels: `(the Add, the bias)`.
fn float_channel_bias(g: &Graph, v: usize, m: usize, rank: usize) -> Option<(usize, Vec<f32>)> {
    let (ad, b) = add_reading(g, v)?;
    let b = b?;
    if !channel_values(g, b, m, rank) {
        return None;
    }
    let t = match g.constants.get(&b) {
        Some(t) => t,
        None => g.constants.get(&g.nodes[producer(g, b)?].inputs[0]?)?,
    };
    (t.len() == m).then(|| Some((ad, t.as_f32().ok()?.to_vec())))?
}

/// Constant ConvInteger weights `[M, C/G, ...]` (int8 or uint8, 1-D or 2-D, none empty) with
/// their zero points, for the depthwise kernel where each of several groups has one input
/// channel, else packed as rows, one pack per group of `M/G` output channels.
fn integer_filter(w: &Tensor, zw: Option<&Tensor>, group: usize) -> Option<IntegerFilter> {
    let m = *w.shape.first()?;
    if !matches!(w.rank(), 3 | 4) || w.is_empty() || group == 0 || !m.is_multiple_of(group) {
        return None;
    }
    let (rows, k) = (m / group, w.len() / m);
    let zn = zw.map_or(1, Tensor::len);
    if zw.is_some_and(|z| z.rank() > 1 || z.dtype() != w.dtype()) || (zn != 1 && zn != m) {
        return None;
    }
    if group > 1 && w.shape[1] == 1 {
        return Some(IntegerFilter::Depthwise(
            match (&w.data, zw.map(|z| &z.data)) {
                (Data::I8(v), None) => centred_filter(m, v, &[0]),
                (Data::I8(v), Some(Data::I8(z))) => centred_filter(m, v, z),
                (Data::U8(v), None) => centred_filter(m, v, &[0]),
                (Data::U8(v), Some(Data::U8(z))) => centred_filter(m, v, z),
                _ => return None,
            },
        ));
    }
    // Group `g`'s rows of the weights and its zero points (all of them when there is one).
    let part = |v: usize, g: usize| {
        if v == 1 {
            0..1
        } else {
            g * rows..(g + 1) * rows
        }
    };
    let packs = (0..group).map(|g| {
        let r = part(m, g);
        let (r, z) = (r.start * k..r.end * k, part(zn, g));
        Some(match (&w.data, zw.map(|z| &z.data)) {
            (Data::I8(v), None) => PackedA::weights(rows, k, &v[r], &[0]),
            (Data::I8(v), Some(Data::I8(zv))) => PackedA::weights(rows, k, &v[r], &zv[z]),
            (Data::U8(v), None) => PackedA::weights(rows, k, &v[r], &[0]),
            (Data::U8(v), Some(Data::U8(zv))) => PackedA::weights(rows, k, &v[r], &zv[z]),
            _ => return None,
        })
    });
    Some(IntegerFilter::Rows(packs.collect::<Option<_>>()?))
}

/// Whether `v` certainly lies along the channel axis of a rank-`rank` NCHW tensor of `m`
/// channels: a constant of shape `[m, 1, ...]` or `[1, m, 1, ...]`, or a Reshape to a constant
/// shape of that form, whose channel dimension may also be -1 (its input's length, which the
/// fused op checks is `m` or 1).
fn channel_values(g: &Graph, v: usize, m: usize, rank: usize) -> bool {
    let along_channels = |s: &[i64], inferred: bool| {
        let s = s
            .strip_prefix(&[1])
            .filter(|_| s.len() == rank)
            .unwrap_or(s);
        let channels = s
            .first()
            .is_some_and(|&c| c == m as i64 || (inferred && c == -1));
        s.len() == rank - 1 && channels && s[1..].iter().all(|&d| d == 1)
    };
    if let Some(t) = g.constants.get(&v) {
        let shape: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
        return along_channels(&shape, false);
    }
    let Some(r) = producer(g, v) else {
        return false;
    };
    let n = &g.nodes[r];
    let target = n.inputs.get(1).copied().flatten();
    matches!(n.op, Op::Shape(ShapeOp::Reshape { .. }))
        && target
            .and_then(|t| g.constants.get(&t))
            .and_then(|t| t.to_i64_vec().ok())
            .is_some_and(|s| along_channels(&s, true))
}

#[cfg(test)]
mod tests {
    use super::super::test_graph::{G, attr_int, bytes, run_both, t};
    use super::*;
    use crate::graph::Graph;
    use crate::zoo::builder::attr_ints;

    /// Dynamic quantization of `x [batch, 3, 7] · W [7, 5] + bias` as quantize_dynamic writes it.
    fn dynamic_graph(weights_as_input: bool, bias: bool) -> Graph {
        let mut g = G::new();
        let x = g.input("x", DType::F32, &[1, 3, 7]);
        let q = g.node("DynamicQuantizeLinear", &[Some(x)], 3, vec![]);
        let w: Vec<i8> = bytes(35, 3).iter().map(|&b| b as i8).collect();
        let w = if weights_as_input {
            g.input("w", DType::I8, &[7, 5])
        } else {
            g.constant(t(&[7, 5], Data::I8(w)))
        };
        let zw = g.constant(t(&[], Data::I8(vec![-3])));
        let acc = g.node(
            "MatMulInteger",
            &[Some(q[0]), Some(w), Some(q[2]), Some(zw)],
            1,
            vec![],
        )[0];
        let cast = g.node("Cast", &[Some(acc)], 1, vec![attr_int("to", 1)])[0];
        let sw = g.constant(Tensor::scalar_f32(0.03));
        let s = g.node("Mul", &[Some(q[1]), Some(sw)], 1, vec![])[0];
        let mut y = g.node("Mul", &[Some(cast), Some(s)], 1, vec![])[0];
        if bias {
            let b = g.constant(t(&[5], Data::F32(vec![0.5, -1.0, 2.0, 0.0, 3.25])));
            y = g.node("Add", &[Some(b), Some(y)], 1, vec![])[0];
        }
        g.output(y)
    }

    fn dynamic_inputs(batch: usize, weights: bool) -> Vec<(String, Tensor)> {
        let x: Vec<f32> = bytes(batch * 21, 4)
            .iter()
            .map(|&b| b as f32 / 37.0 - 2.5)
            .collect();
        let mut v = vec![(
            "x".to_string(),
            Tensor::f32(vec![batch, 3, 7], x).expect("x"),
        )];
        if weights {
            let w: Vec<i8> = bytes(35, 3).iter().map(|&b| b as i8).collect();
            v.push(("w".into(), t(&[7, 5], Data::I8(w))));
        }
        v
    }

    #[test]
    fn dynamic_matmuls_run_packed_and_exactly() {
        for bias in [false, true] {
            for batch in [1, 4] {
                let (names, want, got) =
                    run_both(dynamic_graph(false, bias), &|| dynamic_inputs(batch, false));
                assert!(
                    names.contains(&"MatMulInteger(packed)+Scale".to_string()),
                    "{names:?}"
                );
                assert!(
                    !names.iter().any(|n| n == "Cast" || n == "Add"),
                    "{names:?}"
                );
                assert_eq!(want.shape, got.shape);
                assert_eq!(want.data, got.data, "bias {bias}, batch {batch}");
            }
        }
        // Weights that are not constant: the reference path.
        let (names, want, got) = run_both(dynamic_graph(true, true), &|| dynamic_inputs(2, true));
        assert!(names.contains(&"MatMulInteger".to_string()), "{names:?}");
        assert_eq!(want.data, got.data);
    }

    /// How a dynamically quantized Conv may vary; the default is what `quantize_dynamic` writes
    /// for a Conv with a bias.
    #[derive(Clone, Copy)]
    struct DynConv {
        groups: usize,
        bias: Bias,
        /// Cast and Mul by a single scale after the sums (else the int32 sums are the output).
        scaled: bool,
        /// The scale per output channel, `[M, 1, 1]` (not fused).
        per_channel_scale: bool,
        /// A zero point per output channel (else one).
        per_channel_zero: bool,
        int8_weights: bool,
        /// An int8 input with a constant zero point instead of DynamicQuantizeLinear's uint8.
        int8_x: bool,
        weights_as_input: bool,
        /// 1x1 unpadded (else 3x3, padded 1, with `stride`).
        pointwise: bool,
        stride: usize,
        /// After the scaling, a float bias per channel (a constant `[M]` reshaped to
        /// `[1, M, 1, 1]`, as `quantize_dynamic` writes a bias it keeps in float) and a Relu.
        float_bias: bool,
        relu: bool,
    }

    #[derive(Clone, Copy, PartialEq)]
    enum Bias {
        None,
        /// `Reshape(Cast(Floor(bias / scale)), [1, -1, 1, 1])`, as `quantize_dynamic` writes it.
        Dynamic,
        /// A constant `[1, M, 1, 1]`.
        Constant,
        /// A constant `[1, 1, 1, W]`: along the columns, not the channels (not fused).
        Columns,
    }

    const DYN_CONV: DynConv = DynConv {
        groups: 1,
        bias: Bias::Dynamic,
        scaled: true,
        per_channel_scale: false,
        per_channel_zero: false,
        int8_weights: false,
        int8_x: false,
        weights_as_input: false,
        pointwise: false,
        stride: 1,
        float_bias: false,
        relu: false,
    };

    impl DynConv {
        /// Output channels: 6 (8 in 4 groups).
        fn m(&self) -> usize {
            if self.groups == 4 { 8 } else { 6 }
        }
        fn k(&self) -> usize {
            if self.pointwise { 1 } else { 3 }
        }
        fn weights(&self) -> Tensor {
            let (m, k) = (self.m(), self.k());
            let shape = [m, 4 / self.groups, k, k];
            let v = bytes(shape.iter().product(), 11);
            match self.int8_weights {
                true => t(&shape, Data::I8(v.iter().map(|&b| b as i8).collect())),
                false => t(&shape, Data::U8(v)),
            }
        }
    }

    /// ConvInteger over 4 channels of 5x6 images and what dynamic quantization writes around it.
    fn dyn_conv_graph(v: DynConv) -> Graph {
        let mut g = G::new();
        let m = v.m();
        let (xq, xs, xz) = if v.int8_x {
            let x = g.input("x", DType::I8, &[1, 4, 5, 6]);
            let s = g.constant(Tensor::scalar_f32(0.04));
            (x, s, g.constant(t(&[], Data::I8(vec![-9]))))
        } else {
            let x = g.input("x", DType::F32, &[1, 4, 5, 6]);
            let q = g.node("DynamicQuantizeLinear", &[Some(x)], 3, vec![]);
            (q[0], q[1], q[2])
        };
        let w = match v.weights_as_input {
            true => g.input("w", v.weights().dtype(), &v.weights().shape),
            false => g.constant(v.weights()),
        };
        let zeros = if v.per_channel_zero { m } else { 1 };
        let zw = match v.int8_weights {
            true => t(
                &[zeros],
                Data::I8((0..zeros).map(|c| c as i8 * 7 - 20).collect()),
            ),
            false => t(
                &[zeros],
                Data::U8((0..zeros).map(|c| c as u8 * 9 + 100).collect()),
            ),
        };
        let zw = g.constant(zw);
        let mut attrs = vec![attr_int("group", v.groups as i64)];
        if !v.pointwise {
            attrs.push(attr_ints("pads", &[1, 1, 1, 1]));
            attrs.push(attr_ints("strides", &[v.stride as i64; 2]));
        }
        let conv = [Some(xq), Some(w), Some(xz), Some(zw)];
        let mut y = g.node("ConvInteger", &conv, 1, attrs)[0];
        let sw = match v.per_channel_scale {
            true => t(
                &[m, 1, 1],
                Data::F32((0..m).map(|c| 0.01 + c as f32 / 500.0).collect()),
            ),
            false => Tensor::scalar_f32(0.021),
        };
        let sw = g.constant(sw);
        let scale = g.node("Mul", &[Some(xs), Some(sw)], 1, vec![])[0];
        let bias: Vec<i32> = (0..m as i32).map(|c| c * 977 - 2000).collect();
        let bias = match v.bias {
            Bias::None => None,
            Bias::Dynamic => {
                let f: Vec<f32> = bias.iter().map(|&b| b as f32 * 0.003).collect();
                let f = g.constant(t(&[m], Data::F32(f)));
                let d = g.node("Div", &[Some(f), Some(scale)], 1, vec![])[0];
                let d = g.node("Floor", &[Some(d)], 1, vec![])[0];
                let d = g.node("Cast", &[Some(d)], 1, vec![attr_int("to", 6)])[0];
                let shape = g.constant(t(&[4], Data::I64(vec![1, -1, 1, 1])));
                Some(g.node("Reshape", &[Some(d), Some(shape)], 1, vec![])[0])
            }
            Bias::Constant => Some(g.constant(t(&[1, m, 1, 1], Data::I32(bias)))),
            Bias::Columns => {
                let w = 6 / v.stride;
                Some(g.constant(t(&[1, 1, 1, w], Data::I32(bias[..w].to_vec()))))
            }
        };
        if let Some(b) = bias {
            y = g.node("Add", &[Some(y), Some(b)], 1, vec![])[0];
        }
        if v.scaled {
            y = g.node("Cast", &[Some(y)], 1, vec![attr_int("to", 1)])[0];
            y = g.node("Mul", &[Some(y), Some(scale)], 1, vec![])[0];
        }
        if v.float_bias {
            let f: Vec<f32> = (0..m).map(|c| c as f32 * 0.37 - 0.9).collect();
            let f = g.constant(t(&[m], Data::F32(f)));
            let shape = g.constant(t(&[4], Data::I64(vec![1, -1, 1, 1])));
            let f = g.node("Reshape", &[Some(f), Some(shape)], 1, vec![])[0];
            y = g.node("Add", &[Some(y), Some(f)], 1, vec![])[0];
        }
        if v.relu {
            y = g.node("Relu", &[Some(y)], 1, vec![])[0];
        }
        g.output(y)
    }

    fn dyn_conv_inputs(v: DynConv, batch: usize) -> Vec<(String, Tensor)> {
        let x = bytes(batch * 120, 13);
        let x = match v.int8_x {
            true => t(
                &[batch, 4, 5, 6],
                Data::I8(x.iter().map(|&b| b as i8).collect()),
            ),
            false => {
                let f = x.iter().map(|&b| b as f32 / 41.0 - 1.7).collect();
                t(&[batch, 4, 5, 6], Data::F32(f))
            }
        };
        let mut inputs = vec![("x".to_string(), x)];
        if v.weights_as_input {
            inputs.push(("w".into(), v.weights()));
        }
        inputs
    }

    #[test]
    fn dynamic_convs_run_packed_and_exactly() {
        let fused = |v: DynConv| {
            let scaled = v.scaled && v.bias != Bias::Columns && !v.per_channel_scale;
            match scaled {
                true => "ConvInteger(packed)+Scale",
                false => "ConvInteger(packed)",
            }
        };
        let d = DYN_CONV;
        let variants = [
            d,
            DynConv {
                bias: Bias::None,
                ..d
            },
            DynConv {
                bias: Bias::Constant,
                ..d
            },
            DynConv {
                scaled: false,
                bias: Bias::None,
                ..d
            },
            DynConv {
                groups: 2,
                per_channel_zero: true,
                ..d
            },
            DynConv {
                groups: 4,
                stride: 2,
                ..d
            },
            DynConv {
                groups: 4,
                per_channel_zero: true,
                int8_weights: true,
                ..d
            },
            DynConv {
                int8_weights: true,
                per_channel_zero: true,
                ..d
            },
            DynConv {
                int8_x: true,
                int8_weights: true,
                ..d
            },
            DynConv {
                pointwise: true,
                ..d
            },
            DynConv { stride: 2, ..d },
            DynConv {
                bias: Bias::None,
                float_bias: true,
                relu: true,
                ..d
            },
            DynConv { relu: true, ..d },
            DynConv {
                groups: 4,
                float_bias: true,
                ..d
            },
            // Outside the fused pattern: packed, with the ops after it left as they are.
            DynConv {
                bias: Bias::Columns,
                ..d
            },
            DynConv {
                per_channel_scale: true,
                bias: Bias::Constant,
                ..d
            },
        ];
        for v in variants {
            for batch in [1, 3] {
                let (names, want, got) = run_both(dyn_conv_graph(v), &|| dyn_conv_inputs(v, batch));
                assert!(names.contains(&fused(v).to_string()), "{names:?}");
                assert!(!names.iter().any(|n| n == "ConvInteger"), "{names:?}");
                if fused(v).ends_with("+Scale") {
                    assert!(
                        !names.iter().any(|n| n == "Add" || n == "Relu"),
                        "{names:?}"
                    );
                }
                assert_eq!(want.shape, got.shape);
                assert_eq!(want.data, got.data, "{names:?}, batch {batch}");
            }
        }
        // Weights that are not constant: the reference path.
        let v = DynConv {
            weights_as_input: true,
            ..d
        };
        let (names, want, got) = run_both(dyn_conv_graph(v), &|| dyn_conv_inputs(v, 2));
        assert!(names.contains(&"ConvInteger".to_string()), "{names:?}");
        assert_eq!(want.data, got.data);
    }

    #[test]
    fn bad_run_time_operands_of_a_packed_conv_are_errors_naming_them() {
        // A zero point of two values, and a bias of 5 values for 6 channels, both fed at run
        // time: the reference path refuses them, and so does the packed op.
        let mut g = G::new();
        let x = g.input("x", DType::U8, &[1, 4, 5, 6]);
        let xz = g.input("xz", DType::U8, &[2]);
        let b = g.input("b", DType::I32, &[5]);
        for i in &mut g.0.inputs[1..] {
            i.dims = None;
        }
        let w = g.constant(DYN_CONV.weights());
        let sums = g.node("ConvInteger", &[Some(x), Some(w), Some(xz)], 1, vec![])[0];
        let shape = g.constant(t(&[4], Data::I64(vec![1, -1, 1, 1])));
        let b = g.node("Reshape", &[Some(b), Some(shape)], 1, vec![])[0];
        let y = g.node("Add", &[Some(sums), Some(b)], 1, vec![])[0];
        let y = g.node("Cast", &[Some(y)], 1, vec![attr_int("to", 1)])[0];
        let s = g.constant(Tensor::scalar_f32(0.5));
        let y = g.node("Mul", &[Some(y), Some(s)], 1, vec![])[0];
        let mut g = g.output(y);
        crate::passes::optimize(&mut g);
        let plan = crate::plan::Plan::build(&g).expect("plan");
        assert!(crate::passes::test_graph::names(&g).contains(&"ConvInteger(packed)+Scale".into()));
        let be = crate::backend::CpuBackend::new(1);
        let run = |xz: Vec<u8>, b: Vec<i32>| {
            let (nz, nb) = (xz.len(), b.len());
            let inputs = vec![
                ("x".to_string(), t(&[1, 4, 5, 6], Data::U8(bytes(120, 3)))),
                ("xz".to_string(), t(&[nz], Data::U8(xz))),
                ("b".to_string(), t(&[nb], Data::I32(b))),
            ];
            plan.run(&be, inputs).map(|_| ()).map_err(|e| e.to_string())
        };
        let e = run(vec![1, 2], vec![0; 6]).expect_err("two zero points");
        assert!(e.contains("zero point has 2 values"), "{e}");
        let e = run(vec![1], vec![0; 5]).expect_err("5 bias values");
        assert!(e.contains("bias of I32 [1, 5, 1, 1]"), "{e}");
        run(vec![1], vec![0; 6]).expect("6 bias values");
        run(vec![1], vec![7]).expect("1 bias value, broadcast");
    }
}
