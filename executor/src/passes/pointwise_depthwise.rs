//! Fuses a 1x1 Conv into the depthwise Conv reading its output (MobileNet's expansion →
//! depthwise pair), so the expanded activation stays in cache (`kernels::fused`); and then the
//! 1x1 Conv reading the pair's output (the projection, with its residual Add if one was fused
//! in), so the whole inverted residual block runs band by band (`kernels::inverted_residual`).
//! Convolutions the layout pass made NHWC fuse with each other alone (`kernels::nhwc_block`).

use super::sole_reader;
use crate::graph::{Graph, Node};
use crate::ops::Op;
use crate::ops::conv::{ConvAttrs, PointwiseDepthwise};
use crate::tensor::Tensor;

pub fn fuse_pointwise_depthwise(g: &mut Graph) {
    for fuse in [fuse_pair, fuse_projection] {
        let mut i = 0;
        while i < g.nodes.len() {
            if !fuse(g, i) {
                i += 1;
            }
        }
    }
}

/// The constant weight of a plain Conv node (at most a bias besides, and a residual where
/// `residual` allows one).
fn conv_weight<'g>(g: &'g Graph, n: &Node, residual: bool) -> Option<&'g Tensor> {
    match &n.op {
        Op::Conv(c)
            if n.outputs.len() == 1
                && (residual || !c.residual)
                && n.inputs.len() <= 3 + usize::from(c.residual) => {}
        _ => return None,
    }
    let w = g.constants.get(&n.inputs.get(1).copied().flatten()?)?;
    (w.rank() == 4).then_some(&**w)
}

/// A 1x1 convolution with stride 1, no padding and one group: a plain matrix product.
fn is_pointwise(c: &ConvAttrs, w: &Tensor) -> bool {
    let ones = |v: &Option<Vec<usize>>, one| v.iter().flatten().all(|&s| s == one);
    w.shape[2..] == [1, 1]
        && c.group == 1
        && ones(&c.strides, 1)
        && ones(&c.pads, 0)
        && matches!(c.auto_pad.as_str(), "NOTSET" | "" | "VALID")
}

/// The node reading node `i`'s only output, when it is the only reader.
fn reader(g: &Graph, i: usize) -> Option<usize> {
    sole_reader(g, &g.use_counts(), g.nodes[i].outputs[0])
}

fn at(n: &Node, k: usize) -> Option<usize> {
    n.inputs.get(k).copied().flatten()
}

fn fuse_pair(g: &mut Graph, i: usize) -> bool {
    let n = &g.nodes[i];
    let (Some(w1), Op::Conv(pw)) = (conv_weight(g, n, false), &n.op) else {
        return false;
    };
    if !is_pointwise(pw, w1) {
        return false;
    }
    let Some(j) = reader(g, i) else {
        return false;
    };
    let d = &g.nodes[j];
    let (Some(w2), Op::Conv(dw)) = (conv_weight(g, d, false), &d.op) else {
        return false;
    };
    let channels = w1.shape[0];
    if at(d, 0) != Some(n.outputs[0])
        || w2.shape[..2] != [channels, 1]
        || dw.group != channels
        || dw.nhwc != pw.nhwc
    {
        return false;
    }
    let op = Op::PointwiseDepthwise(Box::new(PointwiseDepthwise {
        pointwise: pw.clone(),
        depthwise: dw.clone(),
        project: None,
    }));
    let inputs = vec![n.inputs[0], at(n, 1), at(n, 2), at(d, 1), at(d, 2)];
    merge(g, i, j, op, inputs)
}

/// Node `j`, the reader of node `i`, becomes `op` over `inputs` (keeping its name and outputs),
/// and node `i` goes.
fn merge(g: &mut Graph, i: usize, j: usize, op: Op, inputs: Vec<Option<usize>>) -> bool {
    let reader = &g.nodes[j];
    g.nodes[j] = Node {
        name: reader.name.clone(),
        op,
        inputs,
        outputs: reader.outputs.clone(),
    };
    g.nodes.remove(i);
    true
}

fn fuse_projection(g: &mut Graph, i: usize) -> bool {
    let n = &g.nodes[i];
    let Op::PointwiseDepthwise(pair) = &n.op else {
        return false;
    };
    let channels = match g.constants.get(&at(n, 3).unwrap_or(usize::MAX)) {
        Some(w2) if pair.project.is_none() => w2.shape[0],
        _ => return false,
    };
    let Some(j) = reader(g, i) else {
        return false;
    };
    let pr = &g.nodes[j];
    let (Some(w3), Op::Conv(c)) = (conv_weight(g, pr, true), &pr.op) else {
        return false;
    };
    if at(pr, 0) != Some(n.outputs[0])
        || !is_pointwise(c, w3)
        || w3.shape[1] != channels
        || c.nhwc != pair.pointwise.nhwc
    {
        return false;
    }
    let op = Op::PointwiseDepthwise(Box::new(PointwiseDepthwise {
        project: Some(c.clone()),
        ..(**pair).clone()
    }));
    let mut inputs = n.inputs.clone();
    inputs.resize(5, None);
    inputs.extend([at(pr, 1), at(pr, 2), at(pr, 3)]);
    merge(g, i, j, op, inputs)
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
        assert_same_outputs(&graph(), &g, 4);
    }

    /// The raw and the optimised graph give the same outputs on 1 and 2 threads, batch 1 and 3.
    fn assert_same_outputs(raw: &Graph, fused: &Graph, channels: usize) {
        let (raw, fused) = (
            Plan::build(raw).expect("plan"),
            Plan::build(fused).expect("plan"),
        );
        let per = channels * 81;
        for threads in [1, 2] {
            let be = CpuBackend::new(threads);
            for batch in [1, 3] {
                let x: Vec<f32> = (0..batch * per)
                    .map(|i| (i % 11) as f32 * 0.3 - 1.5)
                    .collect();
                let input = || {
                    let t = Tensor::f32(vec![batch, channels, 9, 9], x.clone()).expect("x");
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

    /// MobileNet's block: `y = x + project(relu6(dw(relu6(expand(x)))))`, all of it one node
    /// once fused; and `z`, a second block's projection without the residual (`z` is an output
    /// and also read by an Add, so the Add stays apart).
    fn block_graph() -> Graph {
        let mut m = Builder::new(5, false);
        let conv = |m: &mut Builder, x: &str, shape: [usize; 4], attrs| {
            let w = m.normal("w", &shape, 0.5);
            let b = m.normal("b", &shape[..1], 0.5);
            m.node("Conv", &[x, &w, &b], attrs)
        };
        let relu6 = |m: &mut Builder, v: &str| {
            m.node(
                "Clip",
                &[v],
                vec![attr_float("min", 0.0), attr_float("max", 6.0)],
            )
        };
        let block = |m: &mut Builder, x: &str| {
            let e = conv(m, x, [12, 4, 1, 1], vec![]);
            let e = relu6(m, &e);
            let dw = vec![attr_int("group", 12), attr_ints("pads", &[1; 4])];
            let d = conv(m, &e, [12, 1, 3, 3], dw);
            let d = relu6(m, &d);
            conv(m, &d, [4, 12, 1, 1], vec![])
        };
        let p = block(&mut m, "x");
        let y = m.node("Add", &[&p, "x"], vec![]);
        m.node_rename_last(&y, "y");
        let q = block(&mut m, "y");
        m.node_rename_last(&q, "z");
        let y2 = m.node("Add", &["z", "x"], vec![]);
        m.node_rename_last(&y2, "y2");
        let shape = [None, Some(4), Some(9), Some(9)];
        let proto: ModelProto = m.finish(
            "block",
            13,
            vec![value_info("x", DType::F32, &shape)],
            ["y", "z", "y2"]
                .iter()
                .map(|n| value_info(n, DType::F32, &shape))
                .collect(),
        );
        crate::import::import(&proto.encode_to_vec(), None).expect("imports")
    }

    #[test]
    fn the_projection_and_its_residual_fuse_and_compute_the_same() {
        let mut g = block_graph();
        crate::passes::optimize(&mut g);
        let names: Vec<String> = g.nodes.iter().map(|n| n.op.name()).collect();
        let pair = "Conv(1x1)+Clip(0.0, 6.0)+Conv(depthwise)+Clip(0.0, 6.0)";
        assert_eq!(
            names,
            [
                format!("{pair}+Conv(1x1)+Add"),
                format!("{pair}+Conv(1x1)"),
                "Add".to_string(),
            ]
        );
        assert_same_outputs(&block_graph(), &g, 4);
    }
}
