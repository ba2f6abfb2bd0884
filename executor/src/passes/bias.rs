//! Fuses `MatMul(x, W) + b` (b a constant vector over the last axis) into the MatMul, whose GEMM
//! then accumulates onto the pre-loaded bias instead of making a second pass over the output.

use super::sole_reader;
use crate::graph::Graph;
use crate::ops::{Op, elementwise::Binary};

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
    let out = n.outputs[0];
    let uses = g.use_counts();
    let Some(j) = sole_reader(g, &uses, out) else {
        return false;
    };
    let add = &g.nodes[j];
    if add.op != Op::Binary(Binary::Add) || add.inputs.len() != 2 {
        return false;
    }
    let other = if add.inputs[0] == Some(out) {
        add.inputs[1]
    } else {
        add.inputs[0]
    };
    let Some(bias) = other.filter(|b| {
        g.constants
            .get(b)
            .is_some_and(|t| t.rank() == 1 && t.len() == cols && t.as_f32().is_ok())
    }) else {
        return false;
    };
    let new_out = add.outputs[0];
    g.nodes[i].inputs.push(Some(bias));
    g.nodes[i].outputs[0] = new_out;
    g.nodes.remove(j);
    true
}
