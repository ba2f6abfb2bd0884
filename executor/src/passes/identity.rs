//! Identity nodes go: their readers read the Identity's input. paddle2onnx writes one after
//! many ops (PP-OCR's Conv → Identity → Mul → Identity → Add), where it would keep the Mul and
//! Add from folding into the Conv and put an elementwise op for the transpose rewrites to move
//! between every NHWC convolution. An Identity that writes a graph output stays: the output
//! keeps its name.

use crate::graph::Graph;
use crate::ops::Op;
use crate::ops::elementwise::Unary;

pub fn remove_identities(g: &mut Graph) {
    // What each removed Identity's output copies.
    let mut source: Vec<usize> = (0..g.value_names.len()).collect();
    let mut removed = false;
    for n in &g.nodes {
        if let (Op::Unary(Unary::Identity), [Some(x)], [out]) =
            (&n.op, n.inputs.as_slice(), n.outputs.as_slice())
            && !g.outputs.contains(out)
        {
            source[*out] = *x;
            removed = true;
        }
    }
    if !removed {
        return;
    }
    for n in &mut g.nodes {
        for v in n.inputs.iter_mut().flatten() {
            // Through a chain of Identities (a graph has no cycles) to the value it copies.
            while source[*v] != *v {
                *v = source[*v];
            }
        }
    }
    super::remove_dead(g);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::CpuBackend;
    use crate::plan::Plan;
    use crate::proto::ModelProto;
    use crate::tensor::{DType, Tensor};
    use crate::zoo::builder::{Builder, attr_ints, value_info};
    use prost::Message;

    /// `y = Identity(Identity(Identity(x)) * 2 + Identity(x))`, and `z = Identity(x)`.
    fn chained() -> Graph {
        let mut b = Builder::new(1, false);
        let two = b.const_f32("two", 2.0);
        let i1 = b.node("Identity", &["x"], vec![]);
        let i2 = b.node("Identity", &[&i1], vec![]);
        let m = b.node("Mul", &[&i2, &two], vec![]);
        let a = b.node("Add", &[&m, &i1], vec![]);
        let y = b.node("Identity", &[&a], vec![]);
        b.node_rename_last(&y, "y");
        let z = b.node("Identity", &["x"], vec![]);
        b.node_rename_last(&z, "z");
        let dims = [Some(3)];
        let proto: ModelProto = b.finish(
            "identities",
            13,
            vec![value_info("x", DType::F32, &dims)],
            vec![
                value_info("y", DType::F32, &dims),
                value_info("z", DType::F32, &dims),
            ],
        );
        crate::import::import(&proto.encode_to_vec(), None).expect("imports")
    }

    #[test]
    fn identities_go_except_those_naming_an_output() {
        let g = chained();
        let raw = Plan::build(&g).expect("plan");
        let mut gone = g;
        remove_identities(&mut gone);
        let names: Vec<String> = gone.nodes.iter().map(|n| n.op.name()).collect();
        assert_eq!(names, ["Mul", "Add", "Identity", "Identity"]);
        let x = gone.inputs[0].value;
        assert_eq!(gone.nodes[0].inputs[0], Some(x), "the chain of two reads x");
        assert_eq!(gone.nodes[1].inputs[1], Some(x));
        let x = Tensor::f32(vec![3], vec![1.0, -2.0, 0.5]).unwrap();
        let be = CpuBackend::new(1);
        let want = raw.run(&be, vec![("x".into(), x.clone())]).unwrap();
        let got = Plan::build(&gone)
            .unwrap()
            .run(&be, vec![("x".into(), x)])
            .unwrap();
        assert_eq!(want, got);
        assert_eq!(got[0].1.as_f32().unwrap(), [3.0, -6.0, 1.5]);
    }

    /// paddle2onnx's learnable affine block, `Relu(Identity(Identity(Identity(Conv(x)) · s) +
    /// b))`, twice: with the Identities gone the scale and shift fold into each Conv.
    #[test]
    fn paddles_affine_blocks_fold_into_their_convolutions() {
        let mut b = Builder::new(5, false);
        let mut x = "x".to_string();
        for _ in 0..2 {
            let w = b.normal("w", &[32, 32, 3, 3], 0.1);
            let c = b.node("Conv", &[&x, &w], vec![attr_ints("pads", &[1, 1, 1, 1])]);
            let i = b.node("Identity", &[&c], vec![]);
            let s = b.weight("s", &[1], |_| 1.01);
            let m = b.node("Mul", &[&i, &s], vec![]);
            let i = b.node("Identity", &[&m], vec![]);
            let shift = b.weight("b", &[1], |_| 0.01);
            let a = b.node("Add", &[&i, &shift], vec![]);
            let i = b.node("Identity", &[&a], vec![]);
            x = b.node("Relu", &[&i], vec![]);
        }
        b.node_rename_last(&x, "y");
        let dims = [Some(1), Some(32), Some(8), Some(8)];
        let proto: ModelProto = b.finish(
            "affine",
            14,
            vec![value_info("x", DType::F32, &dims)],
            vec![value_info("y", DType::F32, &dims)],
        );
        let g = crate::import::import(&proto.encode_to_vec(), None).expect("imports");
        let raw = Plan::build(&g).expect("plan");
        let mut optimized = g;
        crate::passes::optimize_for_cpu(&mut optimized);
        let names: Vec<String> = optimized.nodes.iter().map(|n| n.op.name()).collect();
        assert!(
            names
                .iter()
                .all(|n| !["Identity", "Mul", "Add"].contains(&n.as_str())),
            "{names:?}"
        );
        let x = Tensor::f32(
            vec![1, 32, 8, 8],
            (0..2048).map(|i| (i as f32 * 0.1).sin()).collect(),
        )
        .unwrap();
        let be = CpuBackend::new(1);
        let want = raw.run(&be, vec![("x".into(), x.clone())]).unwrap();
        let got = Plan::build(&optimized)
            .unwrap()
            .run(&be, vec![("x".into(), x)])
            .unwrap();
        let (want, got) = (want[0].1.as_f32().unwrap(), got[0].1.as_f32().unwrap());
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let err = want
            .iter()
            .zip(got)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(err <= 1e-5 * scale, "max error {err} against {scale}");
    }
}
