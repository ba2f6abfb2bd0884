//! Recognises RMS normalisation written out and replaces it by one RMSNormalization. PyTorch
//! exports before opset 23 write T5's, LLaMA's and most decoders' norms as
//! `x · 1/√(mean(x², last axis) + ε)`, then `· γ`: Pow (or x·x), ReduceMean, Add, Sqrt, then
//! Reciprocal or 1/…, and Mul (or one Div of x by the root) — six or seven passes over the
//! activations where the fused op makes one. onnxruntime's optimizer makes the same fusion
//! (its SimplifiedLayerNormalization).
//!
//! Only float32 patterns fuse (ε's type is the activations'): the kernel computes in f32.

use super::{other, scalar, sole_reader};
use crate::graph::{Graph, Node};
use crate::ops::Op;
use crate::ops::elementwise::{Binary, Unary};
use crate::ops::reduce::ReduceKind;
use crate::tensor::{DType, Tensor};
use std::sync::Arc;

pub fn fuse_rms_norm(g: &mut Graph) {
    for i in 0..g.nodes.len() {
        let Some(m) = matches_at(g, i) else {
            continue;
        };
        // A γ that is a constant of at most one axis scales the fused op; otherwise the op
        // scales by one and the Mul stays.
        let uses = g.use_counts();
        let scaled = g.nodes[i].outputs[0];
        let gamma = sole_reader(g, &uses, scaled).and_then(|j| {
            let n = &g.nodes[j];
            let c = other(n, scaled).flatten()?;
            let t = g.constants.get(&c)?;
            let fits = n.op == Op::Binary(Binary::Mul) && t.dtype() == DType::F32 && t.rank() <= 1;
            (fits && n.outputs.len() == 1).then_some((j, c))
        });
        let (last, gamma) = match gamma {
            Some(found) => found,
            None => {
                let one = g.add_value(format!("{}_rms_scale", g.nodes[i].name));
                let t = Tensor::f32(vec![1], vec![1.0]).expect("one element");
                g.constants.insert(one, Arc::new(t));
                (i, one)
            }
        };
        // The last node becomes the norm; the rest of the pattern is dead and removed later.
        g.nodes[last] = Node {
            name: format!("{}_rms_norm", g.nodes[i].name),
            op: Op::RmsNorm {
                axis: -1,
                eps: m.eps,
            },
            inputs: vec![Some(m.x), Some(gamma)],
            outputs: vec![g.nodes[last].outputs[0]],
        };
    }
}

struct Found {
    x: usize,
    eps: f32,
}

/// If node `i` is the last step of `x / √(mean(x²) + ε)`: `x` and `ε`.
fn matches_at(g: &Graph, i: usize) -> Option<Found> {
    let n = &g.nodes[i];
    let last_step = matches!(n.op, Op::Binary(Binary::Div | Binary::Mul));
    if !last_step || n.outputs.len() != 1 {
        return None;
    }
    let (producers, uses) = (g.producers(), g.use_counts());
    // The value `v` computed by a node read by nothing else.
    let sole = |v: usize| -> Option<&Node> {
        let p = producers[v]?;
        (uses[v] == 1 && g.nodes[p].outputs.len() == 1).then(|| &g.nodes[p])
    };
    // x / root, or x · 1/root (either order), the inverse as Reciprocal or a Div of one.
    let (x, root) = match (&n.op, n.inputs.as_slice()) {
        (Op::Binary(Binary::Div), [Some(x), Some(root)]) => (*x, *root),
        (Op::Binary(Binary::Mul), [Some(a), Some(b)]) => {
            [(*a, *b), (*b, *a)].into_iter().find_map(|(x, inv)| {
                let inv = sole(inv)?;
                match (&inv.op, inv.inputs.as_slice()) {
                    (Op::Unary(Unary::Reciprocal), [Some(root)]) => Some((x, *root)),
                    (Op::Binary(Binary::Div), [one, Some(root)])
                        if scalar(g, *one) == Some(1.0) =>
                    {
                        Some((x, *root))
                    }
                    _ => None,
                }
            })?
        }
        _ => return None,
    };
    let sqrt = sole(root)?;
    let (Op::Unary(Unary::Sqrt), [Some(sum)]) = (&sqrt.op, sqrt.inputs.as_slice()) else {
        return None;
    };
    let add = sole(*sum)?;
    if add.op != Op::Binary(Binary::Add) {
        return None;
    }
    let (mean, eps) = add.inputs.iter().flatten().find_map(|&mean| {
        let c = other(add, mean).flatten()?;
        let t = g.constants.get(&c)?;
        let eps = scalar(g, Some(c)).filter(|e| *e >= 0.0)?;
        (t.dtype() == DType::F32).then_some((mean, eps))
    })?;
    let reduce = sole(mean)?;
    let Op::Reduce(r) = &reduce.op else {
        return None;
    };
    let last_axis = match (&r.axes, reduce.inputs.get(1).copied().flatten()) {
        (Some(axes), None) => axes == &[-1],
        (None, Some(axes)) => g
            .constants
            .get(&axes)
            .is_some_and(|t| t.to_i64_vec().ok() == Some(vec![-1])),
        _ => false,
    };
    if r.kind != ReduceKind::ReduceMean || !r.keepdims || !last_axis {
        return None;
    }
    let square = sole(reduce.inputs.first().copied().flatten()?)?;
    let squares_x = match (&square.op, square.inputs.as_slice()) {
        (Op::Binary(Binary::Pow), [Some(base), e]) => *base == x && scalar(g, *e) == Some(2.0),
        (Op::Binary(Binary::Mul), [Some(a), Some(b)]) => *a == x && *b == x,
        _ => false,
    };
    squares_x.then_some(Found { x, eps })
}

#[cfg(test)]
mod tests {
    use crate::graph::Graph;
    use crate::ops::Op;
    use crate::proto::ModelProto;
    use crate::tensor::{DType, Tensor};
    use crate::zoo::builder::{Builder, attr_int, value_info};
    use prost::Message;

    /// `norm(x)` in the ways exporters write it, one output each, then near misses (the mean
    /// over the first axis, x⁴).
    fn graph() -> Graph {
        let mut m = Builder::new(1, false);
        // √(mean(xᵖ, `axis`) + ε), the square as Pow or x·x.
        let root = |m: &mut Builder, power: f32, axis: i64| {
            let sq = match power {
                0.0 => m.node("Mul", &["x", "x"], vec![]),
                p => {
                    let p = m.const_f32("p", p);
                    m.node("Pow", &["x", &p], vec![])
                }
            };
            let axes = m.const_i64("axes", &[axis]);
            let mean = m.node("ReduceMean", &[&sq, &axes], vec![attr_int("keepdims", 1)]);
            let eps = m.const_f32("eps", 1e-6);
            let sum = m.node("Add", &[&mean, &eps], vec![]);
            m.node("Sqrt", &[&sum], vec![])
        };
        let gamma = m.weight("gamma", &[4], |r| r.normal());
        let mut outputs = Vec::new();
        // T5: 1 / root, x · that, γ · that.
        let r = root(&mut m, 2.0, -1);
        let one = m.const_f32("one", 1.0);
        let inv = m.node("Div", &[&one, &r], vec![]);
        let y = m.node("Mul", &["x", &inv], vec![]);
        outputs.push(m.node("Mul", &[&gamma, &y], vec![]));
        // LLaMA: Reciprocal, the square as x·x, no γ.
        let r = root(&mut m, 0.0, -1);
        let inv = m.node("Reciprocal", &[&r], vec![]);
        outputs.push(m.node("Mul", &[&inv, "x"], vec![]));
        // One Div, then γ.
        let r = root(&mut m, 2.0, -1);
        let y = m.node("Div", &["x", &r], vec![]);
        outputs.push(m.node("Mul", &[&y, &gamma], vec![]));
        for (power, axis) in [(2.0, 0), (4.0, -1)] {
            let r = root(&mut m, power, axis);
            outputs.push(m.node("Div", &["x", &r], vec![]));
        }
        let shape = [Some(3), Some(4)];
        let outputs = outputs
            .iter()
            .map(|o| value_info(o, DType::F32, &shape))
            .collect();
        let x = value_info("x", DType::F32, &shape);
        let proto: ModelProto = m.finish("rms_norm", 18, vec![x], outputs);
        crate::import::import(&proto.encode_to_vec(), None).expect("imports")
    }

    #[test]
    fn written_out_rms_norms_become_one_op_with_the_same_values() {
        let mut g = graph();
        super::fuse_rms_norm(&mut g);
        crate::passes::remove_dead(&mut g);
        let fused = |k: usize| {
            let out = g.outputs[k];
            g.nodes
                .iter()
                .any(|n| n.outputs == [out] && matches!(n.op, Op::RmsNorm { axis: -1, .. }))
        };
        let which: Vec<bool> = (0..5).map(fused).collect();
        assert_eq!(which, [true, true, true, false, false]);
        let x: Vec<f32> = (0..12).map(|i| i as f32 * 0.7 - 3.0).collect();
        let x = Tensor::f32(vec![3, 4], x).expect("x");
        crate::passes::assert_same_outputs(&graph(), &g, &[("x".into(), x)], 1e-6);
    }
}
