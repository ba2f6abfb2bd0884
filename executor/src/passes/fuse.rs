//! Fuses a pointwise activation into the Conv/ConvTranspose/Gemm/MatMul producing its input, so
//! the activation runs on data still in cache instead of as a separate pass over memory.

use super::sole_reader;
use crate::graph::Graph;
use crate::ops::{Activation, Op};

pub fn fuse_activations(g: &mut Graph) {
    let mut i = 0;
    while i < g.nodes.len() {
        if !try_fuse(g, i) {
            i += 1;
        }
    }
}

pub(crate) fn activation_of(g: &Graph, op: &Op, inputs: &[Option<usize>]) -> Option<Activation> {
    match op {
        Op::Unary(u) => u.as_activation(),
        Op::Clip { min, max } => {
            let bound = |k: usize, attr: Option<f32>, default: f32| -> Option<f32> {
                match inputs.get(k).copied().flatten() {
                    Some(v) => g.constants.get(&v)?.to_f64_vec().first().map(|&x| x as f32),
                    None => Some(attr.unwrap_or(default)),
                }
            };
            Some(Activation::Clip(
                bound(1, *min, f32::NEG_INFINITY)?,
                bound(2, *max, f32::INFINITY)?,
            ))
        }
        _ => None,
    }
}

fn try_fuse(g: &mut Graph, i: usize) -> bool {
    let fusable = match &g.nodes[i].op {
        Op::Conv(c) | Op::ConvTranspose(c) => c.act.is_none(),
        Op::Gemm(a) => a.act.is_none(),
        Op::MatMul { act, .. } => act.is_none(),
        _ => false,
    };
    if !fusable || g.nodes[i].outputs.len() != 1 {
        return false;
    }
    let uses = g.use_counts();
    let out = g.nodes[i].outputs[0];
    let Some(j) = sole_reader(g, &uses, out) else {
        return false;
    };
    if g.nodes[j].inputs.first() != Some(&Some(out)) || g.nodes[j].outputs.len() != 1 {
        return false;
    }
    let Some(act) = activation_of(g, &g.nodes[j].op, &g.nodes[j].inputs) else {
        return false;
    };
    let new_out = g.nodes[j].outputs[0];
    match &mut g.nodes[i].op {
        Op::Conv(c) | Op::ConvTranspose(c) => c.act = Some(act),
        Op::Gemm(a) => a.act = Some(act),
        Op::MatMul { act: a, .. } => *a = Some(act),
        _ => return false,
    }
    g.nodes[i].outputs[0] = new_out;
    g.nodes.remove(j);
    true
}
