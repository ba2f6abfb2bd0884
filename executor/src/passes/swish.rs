//! Recognises SiLU written out, `x·Sigmoid(x)` (how PyTorch exports `nn.SiLU`, YOLO's
//! activation), and replaces it by one Swish op, which `fuse_activations` then folds into the
//! convolution before it: the sigmoid and the product run on the output tile while it is in
//! cache instead of as two passes over memory. CPU plans only: the device kernels have no SiLU
//! epilogue.

use super::other;
use crate::graph::{Graph, Node};
use crate::ops::{Op, elementwise::Binary, elementwise::Unary};

pub fn fuse_swish(g: &mut Graph) {
    for i in 0..g.nodes.len() {
        let Some(x) = gated_by_own_sigmoid(g, i) else {
            continue;
        };
        let n = &g.nodes[i];
        g.nodes[i] = Node {
            name: format!("{}_swish", n.name),
            op: Op::Unary(Unary::Swish(1.0)),
            inputs: vec![Some(x)],
            outputs: n.outputs.clone(),
        };
    }
}

/// If node `i` is `x·Sigmoid(x)`, the sigmoid read by nothing else: `x`.
fn gated_by_own_sigmoid(g: &Graph, i: usize) -> Option<usize> {
    let mul = &g.nodes[i];
    if mul.op != Op::Binary(Binary::Mul) || mul.outputs.len() != 1 {
        return None;
    }
    let (producers, uses) = (g.producers(), g.use_counts());
    mul.inputs.iter().flatten().copied().find(|&x| {
        let Some(gate) = other(mul, x).flatten().filter(|&v| v != x && uses[v] == 1) else {
            return false;
        };
        producers[gate].is_some_and(|p| {
            let s = &g.nodes[p];
            s.op == Op::Unary(Unary::Sigmoid) && s.inputs == [Some(x)]
        })
    })
}

#[cfg(test)]
mod tests {
    use crate::graph::Graph;
    use crate::proto::ModelProto;
    use crate::tensor::{DType, Tensor};
    use crate::zoo::builder::{Builder, attr_ints, value_info};
    use prost::Message;

    /// YOLO's convolution block twice, `conv → x·sigmoid(x)`, the product's operands in
    /// either order; then `y·sigmoid(x)`, which is no SiLU.
    fn graph() -> Graph {
        let mut m = Builder::new(4, false);
        let mut h = "x".to_string();
        for flip in [false, true] {
            let w = m.normal("w", &[8, 8, 3, 3], 0.3);
            let c = m.node("Conv", &[&h, &w], vec![attr_ints("pads", &[1; 4])]);
            let s = m.node("Sigmoid", &[&c], vec![]);
            let (a, b) = if flip { (&s, &c) } else { (&c, &s) };
            h = m.node("Mul", &[a, b], vec![]);
        }
        let s = m.node("Sigmoid", &["x"], vec![]);
        let y = m.node("Mul", &[&h, &s], vec![]);
        m.node_rename_last(&y, "y");
        let shape = [Some(1), Some(8), Some(6), Some(5)];
        let proto: ModelProto = m.finish(
            "silu",
            13,
            vec![value_info("x", DType::F32, &shape)],
            vec![value_info("y", DType::F32, &shape)],
        );
        crate::import::import(&proto.encode_to_vec(), None).expect("imports")
    }

    #[test]
    fn x_times_its_own_sigmoid_fuses_into_the_convolution() {
        let mut g = graph();
        super::fuse_swish(&mut g);
        crate::passes::remove_dead(&mut g);
        crate::passes::fuse_activations(&mut g);
        let names: Vec<String> = g.nodes.iter().map(|n| n.op.name()).collect();
        assert_eq!(
            names,
            ["Conv+Silu", "Conv+Silu", "Sigmoid", "Mul"],
            "{names:?}"
        );
        let x: Vec<f32> = (0..240).map(|i| (i % 19) as f32 / 3.0 - 3.0).collect();
        let x = Tensor::f32(vec![1, 8, 6, 5], x).expect("x");
        crate::passes::assert_same_outputs(&graph(), &g, &[("x".into(), x)], 1e-5);
    }
}
