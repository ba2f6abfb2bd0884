//! Constant bias Adds fused into the op before them. `MatMul(x, W) + b` (b a constant vector over
//! the last axis) becomes a MatMul whose GEMM accumulates onto the pre-loaded bias instead of
//! making a second pass over the output. `Conv(x, W, b) + c`, c a constant with one value per
//! output channel (how Paddle exports a convolution's bias, and a folded scale's shift), becomes
//! the Conv with bias `b + c`; the Conv then stays free for a residual Add or an NHWC chain.

use super::add_reading;
use crate::graph::Graph;
use crate::ops::Op;
use crate::tensor::Tensor;
use std::sync::Arc;

pub fn fuse_matmul_bias(g: &mut Graph) {
    let mut i = 0;
    while i < g.nodes.len() {
        if !try_fuse(g, i) {
            i += 1;
        }
    }
}

fn try_fuse(g: &mut Graph, i: usize) -> bool {
    let n = &g.nodes[i];
    if !matches!(
        n.op,
        Op::MatMul {
            act: None,
            packed: None
        }
    ) || n.inputs.len() != 2
    {
        return false;
    }
    // The column count must be known: the weight is a constant matrix.
    let Some(cols) = n.inputs[1]
        .and_then(|w| g.constants.get(&w))
        .filter(|w| w.rank() >= 2)
        .and_then(|w| w.shape.last().copied())
    else {
        return false;
    };
    let Some((j, other)) = add_reading(g, n.outputs[0]) else {
        return false;
    };
    let Some(bias) = other.filter(|b| {
        g.constants
            .get(b)
            .is_some_and(|t| t.rank() == 1 && t.len() == cols && t.as_f32().is_ok())
    }) else {
        return false;
    };
    let new_out = g.nodes[j].outputs[0];
    g.nodes[i].inputs.push(Some(bias));
    g.nodes[i].outputs[0] = new_out;
    g.nodes.remove(j);
    true
}

pub fn fold_conv_bias(g: &mut Graph) -> usize {
    let (mut i, mut folded) = (0, 0);
    while i < g.nodes.len() {
        if try_fold_conv(g, i) {
            folded += 1;
        } else {
            i += 1;
        }
    }
    folded
}

fn try_fold_conv(g: &mut Graph, i: usize) -> bool {
    let n = &g.nodes[i];
    let Op::Conv(c) = &n.op else {
        return false;
    };
    if c.act.is_some() || c.residual || n.outputs.len() != 1 || n.inputs.len() > 3 {
        return false;
    }
    let konst = |k: usize| {
        n.inputs
            .get(k)
            .copied()
            .flatten()
            .and_then(|v| g.constants.get(&v))
    };
    let Some(w) = konst(1).filter(|w| w.rank() >= 3 && w.as_f32().is_ok()) else {
        return false;
    };
    let (m, rank) = (w.shape[0], w.rank());
    let old: Vec<f32> = match (n.inputs.get(2).copied().flatten(), konst(2)) {
        (None, _) => vec![0.0; m],
        (Some(_), Some(b)) if b.len() == m && b.as_f32().is_ok() => b.as_f32().unwrap().to_vec(),
        _ => return false,
    };
    let Some((j, other)) = add_reading(g, n.outputs[0]) else {
        return false;
    };
    let shift = other
        .and_then(|v| g.constants.get(&v))
        .and_then(|t| per_channel(t, rank, m));
    let Some(shift) = shift else {
        return false;
    };
    let bias: Vec<f32> = old.iter().zip(&shift).map(|(b, c)| b + c).collect();
    let Ok(bias) = Tensor::f32(vec![m], bias) else {
        return false;
    };
    let bid = g.add_value(format!("{}_bias", g.nodes[i].name));
    g.constants.insert(bid, Arc::new(bias));
    let add_out = g.nodes[j].outputs[0];
    let conv = &mut g.nodes[i];
    conv.inputs.resize(3, None);
    conv.inputs[2] = Some(bid);
    conv.outputs[0] = add_out;
    g.nodes.remove(j);
    true
}

/// The `m` values that f32 constant `t` adds to each output channel of a rank-`rank` Conv
/// output, when it broadcasts along every other axis (and does not widen the output).
pub(super) fn per_channel(t: &Tensor, rank: usize, m: usize) -> Option<Vec<f32>> {
    let v = t.as_f32().ok()?;
    // A Conv output has its batch and channel axes at least (a malformed weight may say less).
    if t.rank() > rank || rank < 2 {
        return None;
    }
    let mut dims = vec![1; rank - t.rank()];
    dims.extend_from_slice(&t.shape);
    let others_one = dims.iter().enumerate().all(|(k, &d)| k == 1 || d == 1);
    match dims[1] {
        _ if !others_one => None,
        1 => Some(vec![v[0]; m]),
        d if d == m => Some(v.to_vec()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use crate::graph::Graph;
    use crate::proto::ModelProto;
    use crate::tensor::{DType, Tensor};
    use crate::zoo::builder::{Builder, value_info};
    use prost::Message;

    /// Constants added to 1x1 convolutions of `x`, in these shapes: one value per channel as
    /// `[1, 6, 1, 1]` (the Conv without a bias) and as `[6, 1, 1]` (with one), one element,
    /// one per column, and one that widens the batch.
    const SHIFTS: [&[usize]; 5] = [&[1, 6, 1, 1], &[6, 1, 1], &[], &[5], &[2, 6, 1, 1]];

    fn graph() -> Graph {
        let mut m = Builder::new(3, false);
        let mut outputs = Vec::new();
        for (k, shape) in SHIFTS.iter().enumerate() {
            let w = m.normal("w", &[6, 4, 1, 1], 0.5);
            let conv = match k {
                1 => {
                    let b = m.normal("b", &[6], 0.5);
                    m.node("Conv", &["x", &w, &b], vec![])
                }
                _ => m.node("Conv", &["x", &w], vec![]),
            };
            let shift = match shape.is_empty() {
                true => m.const_f32("s", 0.7),
                false => m.normal("s", shape, 1.0),
            };
            let y = m.node("Add", &[&shift, &conv], vec![]);
            let name = format!("y{k}");
            m.node_rename_last(&y, &name);
            let batch = if k == 4 { 2 } else { 1 };
            outputs.push(value_info(
                &name,
                DType::F32,
                &[Some(batch), Some(6), Some(5), Some(5)],
            ));
        }
        let x = value_info("x", DType::F32, &[Some(1), Some(4), Some(5), Some(5)]);
        let proto: ModelProto = m.finish("bias", 13, vec![x], outputs);
        crate::import::import(&proto.encode_to_vec(), None).expect("imports")
    }

    #[test]
    fn per_channel_constant_adds_fold_into_the_convolution_bias() {
        let mut g = graph();
        super::fold_conv_bias(&mut g);
        let names: Vec<String> = g.nodes.iter().map(|n| n.op.name()).collect();
        assert_eq!(
            names,
            ["Conv", "Conv", "Conv", "Conv", "Add", "Conv", "Add"],
            "{names:?}"
        );
        let x: Vec<f32> = (0..100).map(|i| (i % 9) as f32 / 4.0 - 1.0).collect();
        let x = Tensor::f32(vec![1, 4, 5, 5], x).expect("x");
        super::super::assert_same_outputs(&graph(), &g, &[("x".into(), x)], 1e-5);
    }
}
