//! Folds attention's scaling of the scores into the Softmax after it: `Softmax(x·s)` (and
//! `Softmax(x / c)` for a power of two `c`, where `x·(1/c)` is the same number) becomes one
//! Softmax that multiplies as it reads, one pass over the scores instead of two. The results
//! are the same to the bit (`cotenant_kernels::norm::softmax_rows_into`). CPU plans only: the
//! device kernels have no scaled Softmax.
//!
//! The factor must be a positive, finite float32 scalar (rank 0, so the product has the shape
//! of `x`), read by the Softmax alone.

use super::sole_reader;
use crate::graph::Graph;
use crate::ops::{Op, elementwise::Binary};
use crate::tensor::DType;

pub fn fuse_scaled_softmax(g: &mut Graph) {
    let producers = g.producers();
    for j in 0..g.nodes.len() {
        let Op::Softmax { scale: 1.0, .. } = g.nodes[j].op else {
            continue;
        };
        let Some(v) = g.nodes[j].inputs.first().copied().flatten() else {
            continue;
        };
        let Some(i) = producers[v] else {
            continue;
        };
        if sole_reader(g, &g.use_counts(), v) != Some(j) {
            continue;
        }
        let Some((x, s)) = scaled(g, i) else {
            continue;
        };
        g.nodes[j].inputs[0] = Some(x);
        if let Op::Softmax { scale, .. } = &mut g.nodes[j].op {
            *scale = s;
        }
        // Dead now; `remove_dead` takes it out.
        g.nodes[i].outputs.clear();
        g.nodes[i].inputs.clear();
    }
}

/// If node `i` is `x·s` or `x / c` by a scalar that scales exactly as a positive factor:
/// `(x, the factor)`.
fn scaled(g: &Graph, i: usize) -> Option<(usize, f32)> {
    let n = &g.nodes[i];
    let factor = |v: Option<usize>| {
        let t = g.constants.get(&v?)?;
        (t.dtype() == DType::F32 && t.rank() == 0).then(|| t.as_f32().ok()?.first().copied())?
    };
    let usable = |s: f32| s > 0.0 && s.is_finite();
    match (&n.op, n.inputs.as_slice(), n.outputs.len()) {
        (Op::Binary(Binary::Mul), &[a, b], 1) => match (factor(a), factor(b)) {
            (None, Some(s)) if usable(s) => Some((a?, s)),
            (Some(s), None) if usable(s) => Some((b?, s)),
            _ => None,
        },
        (Op::Binary(Binary::Div), &[a, b], 1) => {
            let c = factor(b)?;
            let s = 1.0 / c;
            // A power of two whose reciprocal is exact: dividing by it and multiplying by the
            // reciprocal round the same real number.
            let exact = c.to_bits() & 0x7f_ffff == 0 && usable(s) && s * c == 1.0;
            (usable(c) && exact && factor(a).is_none()).then_some((a?, s))
        }
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

    /// Attention's scores four ways: `Mul(x, 0.125)`, `Mul(0.3, x)` and `Div(x, 8)`, which
    /// fold, then `Div(x, 3)`, `Mul(x, -1)` and a product read twice, which do not.
    fn graph() -> Graph {
        let mut m = Builder::new(4, false);
        let shape = [Some(2), Some(3), Some(5)];
        let mut outs = Vec::new();
        for (k, (op, c, flip)) in [
            ("Mul", 0.125, false),
            ("Mul", 0.3, true),
            ("Div", 8.0, false),
            ("Div", 3.0, false),
            ("Mul", -1.0, false),
        ]
        .into_iter()
        .enumerate()
        {
            let c = m.const_f32(&format!("c{k}"), c);
            let (a, b) = if flip {
                (c.as_str(), "x")
            } else {
                ("x", c.as_str())
            };
            let p = m.node(op, &[a, b], vec![]);
            outs.push(m.node("Softmax", &[&p], vec![]));
        }
        let c = m.const_f32("c_shared", 0.5);
        let p = m.node("Mul", &["x", &c], vec![]);
        let s = m.node("Softmax", &[&p], vec![]);
        outs.push(m.node("Add", &[&s, &p], vec![]));
        for (k, o) in outs.iter().enumerate() {
            m.node_rename_last(o, &format!("y{k}"));
        }
        let outputs = (0..outs.len())
            .map(|k| value_info(&format!("y{k}"), DType::F32, &shape))
            .collect();
        let proto: ModelProto = m.finish(
            "scaled_softmax",
            13,
            vec![value_info("x", DType::F32, &shape)],
            outputs,
        );
        crate::import::import(&proto.encode_to_vec(), None).expect("imports")
    }

    #[test]
    fn exact_positive_scalings_fold_into_the_softmax_bit_for_bit() {
        let mut g = graph();
        super::fuse_scaled_softmax(&mut g);
        crate::passes::remove_dead(&mut g);
        let names: Vec<String> = g.nodes.iter().map(|n| n.op.name()).collect();
        assert_eq!(
            names,
            [
                "Softmax(scaled)",
                "Softmax(scaled)",
                "Softmax(scaled)",
                "Div",
                "Softmax",
                "Mul",
                "Softmax",
                "Mul",
                "Softmax",
                "Add"
            ],
            "{names:?}"
        );
        let x: Vec<f32> = (0..30).map(|i| (i % 11) as f32 * 7.3 - 30.0).collect();
        let x = Tensor::f32(vec![2, 3, 5], x).expect("x");
        crate::passes::assert_same_outputs(&graph(), &g, &[("x".into(), x)], 0.0);
    }
}
