//! Fuses a residual `Add` into the convolution producing one of its operands: the convolution
//! adds the other operand on its way out, while its output block is in cache, so the Add (and,
//! once `fuse_activations` has run, the activation after it) is no separate pass over memory.

use super::add_reading;
use crate::graph::Graph;
use crate::ops::Op;

pub fn fuse_residual_add(g: &mut Graph) {
    let mut i = 0;
    while i < g.nodes.len() {
        if !try_fuse(g, i) {
            i += 1;
        }
    }
}

fn try_fuse(g: &mut Graph, i: usize) -> bool {
    let n = &g.nodes[i];
    let Op::Conv(c) = &n.op else {
        return false;
    };
    // An activation already fused would have to run before the Add.
    if c.act.is_some() || c.residual || n.outputs.len() != 1 || n.inputs.len() > 3 {
        return false;
    }
    let out = n.outputs[0];
    let Some((j, Some(other))) = add_reading(g, out) else {
        return false;
    };
    if other == out {
        return false;
    }
    let add_out = g.nodes[j].outputs[0];
    // The other operand may be computed after the convolution (a shortcut branch), so the fused
    // node takes the Add's place, where both operands are ready.
    let mut conv = g.nodes.remove(i);
    if let Op::Conv(c) = &mut conv.op {
        c.residual = true;
    }
    conv.inputs.resize(3, None);
    conv.inputs.push(Some(other));
    conv.outputs[0] = add_out;
    g.nodes[j - 1] = conv;
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::CpuBackend;
    use crate::plan::Plan;
    use crate::proto::ModelProto;
    use crate::tensor::{DType, Tensor};
    use crate::zoo::builder::{Builder, value_info};
    use prost::Message;

    /// `relu(conv_a(x) + conv_b(x))` with the shortcut conv_b after conv_a in node order, and
    /// `conv_c(x) + s` with `s = conv_d(x)` summed over its channels (a broadcast Add).
    fn graph() -> Graph {
        let mut m = Builder::new(7, false);
        let conv = |m: &mut Builder, k: usize| {
            let w = m.normal("w", &[6, 4, k, k], 0.5);
            let pads = crate::zoo::builder::attr_ints("pads", &[(k / 2) as i64; 4]);
            m.node("Conv", &["x", &w], vec![pads])
        };
        let a = conv(&mut m, 3);
        let b = conv(&mut m, 1);
        let s = m.node("Add", &[&a, &b], vec![]);
        let y = m.node("Relu", &[&s], vec![]);
        m.node_rename_last(&y, "y");
        let c = conv(&mut m, 1);
        let d = conv(&mut m, 1);
        let axes = m.const_i64("axes", &[1]);
        let s = m.node("ReduceSum", &[&d, &axes], vec![]);
        let z = m.node("Add", &[&s, &c], vec![]);
        m.node_rename_last(&z, "z");
        let proto: ModelProto = m.finish(
            "residual",
            13,
            vec![value_info(
                "x",
                DType::F32,
                &[None, Some(4), Some(5), Some(5)],
            )],
            vec![
                value_info("y", DType::F32, &[None, Some(6), Some(5), Some(5)]),
                value_info("z", DType::F32, &[None, Some(6), Some(5), Some(5)]),
            ],
        );
        crate::import::import(&proto.encode_to_vec(), None).expect("imports")
    }

    #[test]
    fn residual_adds_fuse_and_compute_the_same() {
        let raw = Plan::build(&graph()).expect("plan");
        let mut g = graph();
        crate::passes::optimize(&mut g);
        let names: Vec<String> = g.nodes.iter().map(|n| n.op.name()).collect();
        assert_eq!(
            names,
            ["Conv", "Conv+Add+Relu", "Conv", "ReduceSum", "Conv+Add"]
        );
        let fused = Plan::build(&g).expect("plan");
        let be = CpuBackend::new(2);
        for batch in [1, 3] {
            let x: Vec<f32> = (0..batch * 100).map(|i| (i % 7) as f32 - 3.0).collect();
            let input = || {
                vec![(
                    "x".to_string(),
                    Tensor::f32(vec![batch, 4, 5, 5], x.clone()).expect("x"),
                )]
            };
            let want = raw.run(&be, input()).expect("raw runs");
            let got = fused.run(&be, input()).expect("fused runs");
            for ((n, a), (_, b)) in want.iter().zip(&got) {
                assert_eq!(a.shape, b.shape, "{n}");
                for (p, q) in a
                    .as_f32()
                    .expect("f32")
                    .iter()
                    .zip(b.as_f32().expect("f32"))
                {
                    assert!((p - q).abs() <= 1e-5 * (1.0 + p.abs()), "{n}: {p} vs {q}");
                }
            }
        }
    }
}
