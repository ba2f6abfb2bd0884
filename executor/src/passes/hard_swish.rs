//! Recognises hard-swish written out and replaces it by one HardSwish op, which
//! `fuse_activations` then folds into the convolution before it. Exporters write it as
//! `x·clip(x + 3, 0, 6)/6` (Paddle, tf2onnx; the `/6` as `·(1/6)` or on the gate), or as
//! `x·HardSigmoid(x)` with α = 1/6 and β = ½ (PyTorch before opset 14). The fused op computes
//! `x·clip(x/6 + ½, 0, 1)`, within an ulp or two of each.

use super::fuse::activation_of;
use super::{near, other, scalar, sole_reader};
use crate::graph::{Graph, Node};
use crate::ops::{
    Activation, Op,
    elementwise::{Binary, Unary},
};

pub fn fuse_hard_swish(g: &mut Graph) {
    for i in 0..g.nodes.len() {
        if let Some((last, x)) = matches_at(g, i) {
            let out = g.nodes[last].outputs[0];
            let name = format!("{}_hard_swish", g.nodes[last].name);
            // The last node becomes the HardSwish; the rest of the pattern is dead and removed
            // later.
            g.nodes[last] = Node {
                name,
                op: Op::Unary(Unary::HardSwish),
                inputs: vec![Some(x)],
                outputs: vec![out],
            };
        }
    }
}

/// If node `i` is the Mul of `x` by its gate in a hard-swish pattern: the pattern's last node
/// and `x`.
fn matches_at(g: &Graph, i: usize) -> Option<(usize, usize)> {
    let mul = &g.nodes[i];
    if mul.op != Op::Binary(Binary::Mul) || mul.outputs.len() != 1 {
        return None;
    }
    let (producers, uses) = (g.producers(), g.use_counts());
    // Either input may be x; the gate is the other.
    for x in mul.inputs.iter().flatten().copied() {
        let Some(gate) = other(mul, x).flatten().filter(|&v| v != x && uses[v] == 1) else {
            continue;
        };
        let Some(p) = producers[gate] else {
            continue;
        };
        let gn = &g.nodes[p];
        match &gn.op {
            // x·HardSigmoid(x)
            Op::Unary(Unary::HardSigmoid(a, b))
                if near(Some(*a), 1.0 / 6.0) && near(Some(*b), 0.5) =>
            {
                if gn.inputs.first() == Some(&Some(x)) {
                    return Some((i, x));
                }
            }
            // x·(clip(x + 3, 0, 6)/6)
            Op::Binary(Binary::Div | Binary::Mul) => {
                let Some(clipped) = sixth_of(g, gn) else {
                    continue;
                };
                if uses[clipped] == 1 && relu6_of_x_plus_3(g, &producers, &uses, clipped) == Some(x)
                {
                    return Some((i, x));
                }
            }
            // x·clip(x + 3, 0, 6), then /6
            _ => {
                if relu6_of_x_plus_3(g, &producers, &uses, gate) != Some(x) {
                    continue;
                }
                let last = sole_reader(g, &uses, mul.outputs[0])?;
                if sixth_of(g, &g.nodes[last]) == Some(mul.outputs[0]) {
                    return Some((last, x));
                }
            }
        }
    }
    None
}

/// If `n` divides a value by 6 or multiplies it by 1/6 (one output): that value.
fn sixth_of(g: &Graph, n: &Node) -> Option<usize> {
    if n.outputs.len() != 1 {
        return None;
    }
    match (&n.op, n.inputs.as_slice()) {
        (Op::Binary(Binary::Div), [Some(v), c]) if near(scalar(g, *c), 6.0) => Some(*v),
        (Op::Binary(Binary::Mul), [a, b]) => [(*a, *b), (*b, *a)]
            .into_iter()
            .find(|&(_, c)| near(scalar(g, c), 1.0 / 6.0))
            .and_then(|(v, _)| v),
        _ => None,
    }
}

/// If `v` is `clip(x + 3, 0, 6)` (a Clip with constant bounds of an Add read by nothing else):
/// `x`.
fn relu6_of_x_plus_3(
    g: &Graph,
    producers: &[Option<usize>],
    uses: &[usize],
    v: usize,
) -> Option<usize> {
    let clip = &g.nodes[producers[v]?];
    let bounds = activation_of(g, &clip.op, &clip.inputs);
    if !matches!(bounds, Some(Activation::Clip(lo, hi)) if lo == 0.0 && hi == 6.0) {
        return None;
    }
    let sum = clip.inputs.first().copied().flatten()?;
    let add = &g.nodes[producers[sum]?];
    if add.op != Op::Binary(Binary::Add) || uses[sum] != 1 {
        return None;
    }
    add.inputs
        .iter()
        .flatten()
        .copied()
        .find(|&x| near(other(add, x).and_then(|c| scalar(g, c)), 3.0))
}

#[cfg(test)]
mod tests {
    use crate::graph::Graph;
    use crate::ops::{Op, elementwise::Unary};
    use crate::proto::ModelProto;
    use crate::tensor::{DType, Tensor};
    use crate::zoo::builder::{Builder, attr_float, value_info};
    use prost::Message;

    /// Seven gates on `x`, one per output: the four ways exporters write hard-swish, then
    /// near misses (`/5`, `x + 2`, and the sum `x + 3` also a graph output).
    fn graph() -> Graph {
        let mut m = Builder::new(1, false);
        let c = |m: &mut Builder, v: f32| m.const_f32("c", v);
        // clip(x + shift, 0, 6), the sum renamed `sum` when `shared`.
        let relu6 = |m: &mut Builder, shift: f32, shared: bool| {
            let s = c(m, shift);
            let mut sum = m.node("Add", &["x", &s], vec![]);
            if shared {
                m.node_rename_last(&sum, "sum");
                sum = "sum".into();
            }
            let (lo, hi) = (c(m, 0.0), c(m, 6.0));
            m.node("Clip", &[&sum, &lo, &hi], vec![])
        };
        let output =
            |m: &mut Builder, v: String, k: usize| m.node_rename_last(&v, &format!("y{k}"));
        // x·clip(x + 3, 0, 6)/6
        let r = relu6(&mut m, 3.0, false);
        let p = m.node("Mul", &["x", &r], vec![]);
        let six = c(&mut m, 6.0);
        let y = m.node("Div", &[&p, &six], vec![]);
        output(&mut m, y, 0);
        // x·HardSigmoid(x), α = 1/6
        let attrs = vec![attr_float("alpha", 1.0 / 6.0), attr_float("beta", 0.5)];
        let h = m.node("HardSigmoid", &["x"], attrs);
        let y = m.node("Mul", &[&h, "x"], vec![]);
        output(&mut m, y, 1);
        // x·(clip(x + 3, 0, 6)·(1/6))
        let r = relu6(&mut m, 3.0, false);
        let sixth = c(&mut m, 1.0 / 6.0);
        let gate = m.node("Mul", &[&sixth, &r], vec![]);
        let y = m.node("Mul", &["x", &gate], vec![]);
        output(&mut m, y, 2);
        // (clip(x + 3, 0, 6)·x)·(1/6)
        let r = relu6(&mut m, 3.0, false);
        let p = m.node("Mul", &[&r, "x"], vec![]);
        let sixth = c(&mut m, 1.0 / 6.0);
        let y = m.node("Mul", &[&p, &sixth], vec![]);
        output(&mut m, y, 3);
        // Near misses.
        for (k, (shift, divisor, shared)) in
            [(3.0, 5.0, false), (2.0, 6.0, false), (3.0, 6.0, true)]
                .into_iter()
                .enumerate()
        {
            let r = relu6(&mut m, shift, shared);
            let p = m.node("Mul", &["x", &r], vec![]);
            let d = c(&mut m, divisor);
            let y = m.node("Div", &[&p, &d], vec![]);
            output(&mut m, y, 4 + k);
        }
        let shape = [Some(2), Some(50)];
        let mut outputs: Vec<_> = (0..7)
            .map(|k| value_info(&format!("y{k}"), DType::F32, &shape))
            .collect();
        outputs.push(value_info("sum", DType::F32, &shape));
        let x = value_info("x", DType::F32, &shape);
        let proto: ModelProto = m.finish("hard_swish", 13, vec![x], outputs);
        crate::import::import(&proto.encode_to_vec(), None).expect("imports")
    }

    #[test]
    fn written_out_hard_swish_becomes_one_op_with_the_same_values() {
        let mut g = graph();
        super::fuse_hard_swish(&mut g);
        crate::passes::remove_dead(&mut g);
        let fused = |k: usize| {
            let out = g.outputs[k];
            g.nodes
                .iter()
                .any(|n| n.outputs == [out] && n.op == Op::Unary(Unary::HardSwish))
        };
        let which: Vec<bool> = (0..7).map(fused).collect();
        assert_eq!(which, [true, true, true, true, false, false, false]);
        // Either side of every kink, and past both ends.
        let x: Vec<f32> = (0..100).map(|i| (i as f32 - 50.0) / 6.0).collect();
        let x = Tensor::f32(vec![2, 50], x).expect("x");
        crate::passes::assert_same_outputs(&graph(), &g, &[("x".into(), x)], 1e-6);
    }
}
