//! Recognises GELU written out with Erf — `x·0.5·(1 + erf(x/√2))` in either multiplication order,
//! with `/√2` or `·(1/√2)` — and replaces it by one Gelu op (which can then fuse into a MatMul).

use super::{near, other, scalar, sole_reader};
use crate::graph::{Graph, Node};
use crate::ops::{
    Op,
    elementwise::{Binary, Unary},
};

pub fn fuse_gelu(g: &mut Graph) {
    let mut i = 0;
    while i < g.nodes.len() {
        if let Some((last, x)) = matches_at(g, i) {
            let out = g.nodes[last].outputs[0];
            let name = format!("{}_gelu", g.nodes[last].name);
            // The final node becomes the Gelu; the rest of the pattern is dead and removed later.
            g.nodes[last] = Node {
                name,
                op: Op::Unary(Unary::Gelu(false)),
                inputs: vec![Some(x)],
                outputs: vec![out],
            };
        }
        i += 1;
    }
}

/// If node `i` is the Erf of a GELU pattern, the index of the pattern's last node and `x`.
fn matches_at(g: &Graph, i: usize) -> Option<(usize, usize)> {
    let erf = &g.nodes[i];
    if erf.op != Op::Unary(Unary::Erf) {
        return None;
    }
    let producers = g.producers();
    let uses = g.use_counts();
    let scaled = erf.inputs.first().copied().flatten()?;
    let d = &g.nodes[producers[scaled]?];
    let x = d.inputs.first().copied().flatten()?;
    let ok = match d.op {
        Op::Binary(Binary::Div) => near(
            scalar(g, d.inputs.get(1).copied().flatten()),
            std::f32::consts::SQRT_2,
        ),
        Op::Binary(Binary::Mul) => near(scalar(g, other(d, x)?), std::f32::consts::FRAC_1_SQRT_2),
        _ => false,
    };
    if !ok || uses[scaled] != 1 {
        return None;
    }
    let add_i = sole_reader(g, &uses, erf.outputs[0])?;
    let add = &g.nodes[add_i];
    if add.op != Op::Binary(Binary::Add) || !near(scalar(g, other(add, erf.outputs[0])?), 1.0) {
        return None;
    }
    let m1_i = sole_reader(g, &uses, add.outputs[0])?;
    let m1 = &g.nodes[m1_i];
    if m1.op != Op::Binary(Binary::Mul) {
        return None;
    }
    let p = other(m1, add.outputs[0])??;
    if p == x {
        // x·(1+erf) then ·0.5
        let m2_i = sole_reader(g, &uses, m1.outputs[0])?;
        let m2 = &g.nodes[m2_i];
        (m2.op == Op::Binary(Binary::Mul) && near(scalar(g, other(m2, m1.outputs[0])?), 0.5))
            .then_some((m2_i, x))
    } else {
        // (x·0.5)·(1+erf)
        let h = &g.nodes[producers[p]?];
        (h.op == Op::Binary(Binary::Mul)
            && uses[p] == 1
            && other(h, x).is_some_and(|c| near(scalar(g, c), 0.5)))
        .then_some((m1_i, x))
    }
}
