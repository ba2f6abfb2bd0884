//! Fuses a 1x1 Conv into the depthwise Conv reading its output (MobileNet's expansion →
//! depthwise pair), so the expanded activation stays in cache (`kernels::fused`).

use super::sole_reader;
use crate::graph::{Graph, Node};
use crate::ops::Op;
use crate::ops::conv::PointwiseDepthwise;
use crate::tensor::Tensor;

pub fn fuse_pointwise_depthwise(g: &mut Graph) {
    let mut i = 0;
    while i < g.nodes.len() {
        if !try_fuse(g, i) {
            i += 1;
        }
    }
}

/// The constant weight of a plain Conv node (no residual, at most a bias besides).
fn conv_weight<'g>(g: &'g Graph, n: &Node) -> Option<&'g Tensor> {
    match &n.op {
        Op::Conv(c) if !c.residual && n.inputs.len() <= 3 && n.outputs.len() == 1 => {}
        _ => return None,
    }
    let w = g.constants.get(&n.inputs.get(1).copied().flatten()?)?;
    (w.rank() == 4).then_some(&**w)
}

fn try_fuse(g: &mut Graph, i: usize) -> bool {
    let n = &g.nodes[i];
    let (Some(w1), Op::Conv(pw)) = (conv_weight(g, n), &n.op) else {
        return false;
    };
    let ones = |v: &Option<Vec<usize>>, one| v.iter().flatten().all(|&s| s == one);
    let pointwise = w1.shape[2..] == [1, 1]
        && pw.group == 1
        && ones(&pw.strides, 1)
        && ones(&pw.pads, 0)
        && matches!(pw.auto_pad.as_str(), "NOTSET" | "" | "VALID");
    if !pointwise {
        return false;
    }
    let out = n.outputs[0];
    let uses = g.use_counts();
    let Some(j) = sole_reader(g, &uses, out) else {
        return false;
    };
    let d = &g.nodes[j];
    let (Some(w2), Op::Conv(dw)) = (conv_weight(g, d), &d.op) else {
        return false;
    };
    let channels = w1.shape[0];
    if d.inputs[0] != Some(out) || w2.shape[..2] != [channels, 1] || dw.group != channels {
        return false;
    }
    let op = Op::PointwiseDepthwise(Box::new(PointwiseDepthwise {
        pointwise: pw.clone(),
        depthwise: dw.clone(),
    }));
    let at = |n: &Node, k: usize| n.inputs.get(k).copied().flatten();
    let inputs = vec![n.inputs[0], at(n, 1), at(n, 2), at(d, 1), at(d, 2)];
    let fused = Node {
        name: d.name.clone(),
        op,
        inputs,
        outputs: d.outputs.clone(),
    };
    g.nodes[j] = fused;
    g.nodes.remove(i);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::CpuBackend;
    use crate::plan::Plan;
    use crate::proto::ModelProto;
    use crate::tensor::DType;
    use crate::zoo::builder::{Builder, attr_float, attr_int, attr_ints, value_info};
    use prost::Message;

    /// `y = relu6(dw(relu6(pw(x))))` (fusable) and `z = dw(pw_stride2(x))` (not: the 1x1 has a
    /// stride, so it is no plain matrix product).
    fn graph() -> Graph {
        let mut m = Builder::new(3, false);
        let relu6 = |m: &mut Builder, v: &str| {
            m.node(
                "Clip",
                &[v],
                vec![attr_float("min", 0.0), attr_float("max", 6.0)],
            )
        };
        let pw = |m: &mut Builder, stride: i64| {
            let w = m.normal("w", &[12, 4, 1, 1], 0.5);
            let b = m.normal("b", &[12], 0.5);
            m.node(
                "Conv",
                &["x", &w, &b],
                vec![attr_ints("strides", &[stride; 2])],
            )
        };
        let dw = |m: &mut Builder, v: &str| {
            let w = m.normal("w", &[12, 1, 3, 3], 0.5);
            let b = m.normal("b", &[12], 0.5);
            let attrs = vec![attr_int("group", 12), attr_ints("pads", &[1; 4])];
            m.node("Conv", &[v, &w, &b], attrs)
        };
        let e = pw(&mut m, 1);
        let e = relu6(&mut m, &e);
        let d = dw(&mut m, &e);
        let y = relu6(&mut m, &d);
        m.node_rename_last(&y, "y");
        let e = pw(&mut m, 2);
        let z = dw(&mut m, &e);
        m.node_rename_last(&z, "z");
        let proto: ModelProto = m.finish(
            "pwdw",
            13,
            vec![value_info(
                "x",
                DType::F32,
                &[None, Some(4), Some(9), Some(9)],
            )],
            vec![
                value_info("y", DType::F32, &[None, Some(12), Some(9), Some(9)]),
                value_info("z", DType::F32, &[None, Some(12), Some(5), Some(5)]),
            ],
        );
        crate::import::import(&proto.encode_to_vec(), None).expect("imports")
    }

    #[test]
    fn pointwise_then_depthwise_fuses_and_computes_the_same() {
        let raw = Plan::build(&graph()).expect("plan");
        let mut g = graph();
        crate::passes::optimize(&mut g);
        let names: Vec<String> = g.nodes.iter().map(|n| n.op.name()).collect();
        assert_eq!(
            names,
            [
                "Conv(1x1)+Clip(0.0, 6.0)+Conv(depthwise)+Clip(0.0, 6.0)",
                "Conv",
                "Conv(grouped)"
            ]
        );
        let fused = Plan::build(&g).expect("plan");
        for threads in [1, 2] {
            let be = CpuBackend::new(threads);
            for batch in [1, 3] {
                let x: Vec<f32> = (0..batch * 324)
                    .map(|i| (i % 11) as f32 * 0.3 - 1.5)
                    .collect();
                let input = || {
                    let t = Tensor::f32(vec![batch, 4, 9, 9], x.clone()).expect("x");
                    vec![("x".to_string(), t)]
                };
                let want = raw.run(&be, input()).expect("raw runs");
                let got = fused.run(&be, input()).expect("fused runs");
                for ((n, a), (_, b)) in want.iter().zip(&got) {
                    assert_eq!(a.shape, b.shape, "{n}");
                    let (a, b) = (a.as_f32().expect("f32"), b.as_f32().expect("f32"));
                    for (p, q) in a.iter().zip(b) {
                        assert!((p - q).abs() <= 1e-5 * (1.0 + p.abs()), "{n}: {p} vs {q}");
                    }
                }
            }
        }
    }
}
