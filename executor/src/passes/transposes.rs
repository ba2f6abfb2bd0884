//! Transposes that undo each other cancel, one of another becomes one transpose, elementwise
//! ops (8-bit adds among them) move behind transposes of all their inputs (constants of one
//! element aside), and a 2-D MaxPool of an NHWC value transposed to NCHW pools it in NHWC
//! before the transpose. The QDQ pass wraps each NHWC quantized convolution in a transpose
//! from NCHW and one back; with these rewrites a chain of them (residual adds and max pools
//! included) keeps its activations NHWC from its first convolution to its last. A transpose
//! repeated on the same value (one for each convolution reading it) is done once.

use super::qdq::NHWC_TO_NCHW;
use super::{elementwise, remove_dead};
use crate::graph::{Graph, Node};
use crate::ops::Op;
use crate::ops::pool::PoolAttrs;
use crate::ops::quant::QuantOp;
use crate::ops::shape::ShapeOp;

pub fn cancel_transposes(g: &mut Graph) {
    let mut changed = false;
    // Cancelling first: an elementwise op between two transposes that cancel would otherwise
    // move behind the first, to the side of the layout its neighbours do not use.
    while merge_repeat(g)
        || cancel_pair(g)
        || compose_pair(g)
        || hoist_elementwise(g)
        || hoist_max_pool(g)
    {
        changed = true;
    }
    if changed {
        remove_dead(g);
    }
}

/// A Transpose node's perm, when it has one.
fn perm(n: &Node) -> Option<&[usize]> {
    match &n.op {
        Op::Shape(ShapeOp::Transpose { perm: Some(p) }) => Some(p),
        _ => None,
    }
}

/// The Transpose producing `v`: `(its input, its perm)`.
fn transposed(
    g: &Graph,
    producers: &[Option<usize>],
    v: Option<usize>,
) -> Option<(usize, Vec<usize>)> {
    let n = &g.nodes[producers[v?]?];
    Some(((*n.inputs.first()?)?, perm(n)?.to_vec()))
}

/// Rewires the readers of one Transpose of a Transpose that undoes it to the first one's
/// input; whether it found one.
fn cancel_pair(g: &mut Graph) -> bool {
    let (producers, uses) = (g.producers(), g.use_counts());
    for n in &g.nodes {
        let (Some(p2), Some(&out)) = (perm(n), n.outputs.first()) else {
            continue;
        };
        let Some((src, p1)) = transposed(g, &producers, n.inputs.first().copied().flatten()) else {
            continue;
        };
        let undoes =
            p1.len() == p2.len() && (0..p2.len()).all(|b| p2[b] < p1.len() && p1[p2[b]] == b);
        if !undoes || uses[out] == 0 || g.outputs.contains(&out) {
            continue;
        }
        rewire(g, out, src);
        return true;
    }
    false
}

/// Makes one Transpose of a Transpose (that does not undo it) a single transpose of the first
/// one's input, by the composed perm; whether it found one. The first is then dead unless
/// something else reads it.
fn compose_pair(g: &mut Graph) -> bool {
    let producers = g.producers();
    for i in 0..g.nodes.len() {
        let n = &g.nodes[i];
        let Some(p2) = perm(n) else {
            continue;
        };
        let Some((src, p1)) = transposed(g, &producers, n.inputs.first().copied().flatten()) else {
            continue;
        };
        if p1.len() != p2.len() || p2.iter().any(|&a| a >= p1.len()) {
            continue;
        }
        let composed: Vec<usize> = p2.iter().map(|&a| p1[a]).collect();
        g.nodes[i].op = Op::Shape(ShapeOp::Transpose {
            perm: Some(composed),
        });
        g.nodes[i].inputs[0] = Some(src);
        return true;
    }
    false
}

/// Makes every node that reads `from` read `to` instead.
fn rewire(g: &mut Graph, from: usize, to: usize) {
    for node in &mut g.nodes {
        for input in node.inputs.iter_mut().filter(|i| **i == Some(from)) {
            *input = Some(to);
        }
    }
}

/// Rewires the readers of a Transpose that repeats an earlier one (the same input and perm)
/// to the earlier one's output; whether it found one.
fn merge_repeat(g: &mut Graph) -> bool {
    let uses = g.use_counts();
    for (i, later) in g.nodes.iter().enumerate() {
        let (Some(p), Some(&out)) = (perm(later), later.outputs.first()) else {
            continue;
        };
        if uses[out] == 0 || g.outputs.contains(&out) {
            continue;
        }
        let earlier = g.nodes[..i]
            .iter()
            .find(|n| perm(n) == Some(p) && n.inputs == later.inputs);
        let Some(&first) = earlier.and_then(|n| n.outputs.first()) else {
            continue;
        };
        rewire(g, out, first);
        return true;
    }
    false
}

/// Moves one elementwise op (a QAdd, or any [`elementwise`] one) whose inputs are all
/// transposed by the same perm (or constants of one element) behind that transpose; whether it
/// found one. An elementwise op commutes with transposing all its inputs alike (inputs of one
/// rank broadcast alike); the transposes it read must be read by nothing else, so that the
/// count never grows.
fn hoist_elementwise(g: &mut Graph) -> bool {
    let (producers, uses) = (g.producers(), g.use_counts());
    for i in 0..g.nodes.len() {
        let n = &g.nodes[i];
        let moves = matches!(n.op, Op::Quant(QuantOp::QAdd(_))) || elementwise(n);
        if !moves || n.outputs.len() != 1 || n.inputs.is_empty() || n.inputs.contains(&None) {
            continue;
        }
        // Each input: transposed (its source and perm), or a constant of one element, which
        // broadcasts the same either way.
        let one = |v: usize| g.constants.get(&v).is_some_and(|t| t.len() == 1);
        let sources: Option<Vec<(usize, Option<Vec<usize>>)>> = n
            .inputs
            .iter()
            .flatten()
            .map(|&v| match transposed(g, &producers, Some(v)) {
                Some((x, p)) => Some((x, Some(p))),
                None => one(v).then_some((v, None)),
            })
            .collect();
        let Some(sources) = sources else {
            continue;
        };
        let Some(perm) = sources.iter().find_map(|(_, p)| p.clone()) else {
            continue;
        };
        // A value read several times by this node counts once per read.
        let own = |v: usize| n.inputs.iter().filter(|&&x| x == Some(v)).count();
        let transposes_alone = n
            .inputs
            .iter()
            .flatten()
            .all(|&v| one(v) || uses[v] == own(v));
        let same = sources.iter().all(|(x, p)| match p {
            Some(p) => *p == perm,
            None => g.constants[x].rank() <= perm.len(),
        });
        if !transposes_alone || !same {
            continue;
        }
        let inputs = sources.into_iter().map(|(x, _)| Some(x)).collect();
        move_behind(g, i, inputs, perm);
        return true;
    }
    false
}

/// Makes node `i` (one output) read `inputs` and adds a Transpose by `perm` of what it now
/// computes, which its output's readers read.
fn move_behind(g: &mut Graph, i: usize, inputs: Vec<Option<usize>>, perm: Vec<usize>) {
    let out = g.nodes[i].outputs[0];
    let inner = g.add_value(format!("{}/untransposed", g.value_names[out]));
    let name = format!("{}/transpose", g.nodes[i].name);
    let node = &mut g.nodes[i];
    (node.inputs, node.outputs) = (inputs, vec![inner]);
    g.nodes.insert(
        i + 1,
        Node {
            name,
            op: Op::Shape(ShapeOp::Transpose { perm: Some(perm) }),
            inputs: vec![Some(inner)],
            outputs: vec![out],
        },
    );
}

/// Moves one 2-D MaxPool (no Indices) of an NHWC-to-NCHW transpose of an NHWC kernel's output
/// behind the transpose, pooling the NHWC value; whether it found one.
fn hoist_max_pool(g: &mut Graph) -> bool {
    let producers = g.producers();
    for i in 0..g.nodes.len() {
        let n = &g.nodes[i];
        let Op::Pool(p) = &n.op else {
            continue;
        };
        if !p.max || p.indices || p.nhwc || p.kernel_shape.len() != 2 || n.outputs.len() != 1 {
            continue;
        }
        let Some((x, perm)) = transposed(g, &producers, n.inputs.first().copied().flatten()) else {
            continue;
        };
        // Only values the NHWC kernels wrote, whose types (8-bit, f32) the NHWC pool takes.
        let nhwc_kernel = producers[x].is_some_and(|k| match &g.nodes[k].op {
            Op::Quant(QuantOp::QConv(_) | QuantOp::QAdd(_)) => true,
            Op::Conv(c) => c.nhwc,
            Op::PointwiseDepthwise(f) => f.pointwise.nhwc,
            Op::Pool(p) => p.nhwc,
            _ => false,
        });
        if perm != NHWC_TO_NCHW || !nhwc_kernel {
            continue;
        }
        g.nodes[i].op = Op::Pool(PoolAttrs {
            nhwc: true,
            ..p.clone()
        });
        move_behind(g, i, vec![Some(x)], perm);
        return true;
    }
    false
}

#[cfg(test)]
mod tests {
    use crate::backend::CpuBackend;
    use crate::ops::Op;
    use crate::ops::shape::ShapeOp;
    use crate::plan::Plan;
    use crate::proto::ModelProto;
    use crate::tensor::{DType, Tensor};
    use crate::zoo::builder::{Builder, attr_ints, value_info};
    use prost::Message;

    /// `x + Transpose back(Relu(Max(Transpose(x), a one-element constant)))`, with the first
    /// transpose also a graph output when `shared`.
    fn elementwise_between(shared: bool) -> crate::graph::Graph {
        let mut b = Builder::new(1, false);
        let mut t = b.node("Transpose", &["x"], vec![attr_ints("perm", &[0, 2, 3, 1])]);
        if shared {
            b.node_rename_last(&t, "t");
            t = "t".to_string();
        }
        let floor = b.normal("floor", &[1, 1, 1, 1], 0.1);
        let m = b.node("Max", &[&t, &floor], vec![]);
        let r = b.node("Relu", &[&m], vec![]);
        let back = b.node("Transpose", &[&r], vec![attr_ints("perm", &[0, 3, 1, 2])]);
        let y = b.node("Add", &[&back, "x"], vec![]);
        b.node_rename_last(&y, "y");
        let mut outputs = vec![value_info(
            "y",
            DType::F32,
            &[Some(2), Some(3), Some(4), Some(5)],
        )];
        if shared {
            outputs.push(value_info(
                "t",
                DType::F32,
                &[Some(2), Some(4), Some(5), Some(3)],
            ));
        }
        let proto: ModelProto = b.finish(
            "elementwise",
            13,
            vec![value_info(
                "x",
                DType::F32,
                &[Some(2), Some(3), Some(4), Some(5)],
            )],
            outputs,
        );
        crate::import::import(&proto.encode_to_vec(), None).expect("imports")
    }

    #[test]
    fn elementwise_ops_move_behind_transposes_that_then_cancel() {
        for shared in [false, true] {
            let g = elementwise_between(shared);
            let raw = Plan::build(&g).expect("plan");
            let mut moved = g;
            super::cancel_transposes(&mut moved);
            let names: Vec<String> = moved.nodes.iter().map(|n| n.op.name()).collect();
            // A transpose something else reads stays, and the ops stay behind it: moving them
            // would add a transpose.
            let want: &[&str] = match shared {
                false => &["Max*", "Relu", "Add"],
                true => &["Transpose", "Max*", "Relu", "Transpose", "Add"],
            };
            assert_eq!(names, want);
            let x = Tensor::f32(
                vec![2, 3, 4, 5],
                (0..120).map(|i| i as f32 * 0.01 - 0.6).collect(),
            );
            let be = CpuBackend::new(1);
            let want = raw
                .run(&be, vec![("x".into(), x.clone().unwrap())])
                .unwrap();
            let got = Plan::build(&moved)
                .unwrap()
                .run(&be, vec![("x".into(), x.unwrap())])
                .unwrap();
            assert_eq!(want, got);
        }
    }

    #[test]
    fn a_transpose_of_a_transpose_becomes_one() {
        let mut b = Builder::new(1, false);
        let t = b.node("Transpose", &["x"], vec![attr_ints("perm", &[0, 2, 1, 3])]);
        let y = b.node("Transpose", &[&t], vec![attr_ints("perm", &[0, 2, 3, 1])]);
        b.node_rename_last(&y, "y");
        let proto: ModelProto = b.finish(
            "transposes",
            13,
            vec![value_info(
                "x",
                DType::F32,
                &[Some(2), Some(3), Some(4), Some(5)],
            )],
            vec![value_info(
                "y",
                DType::F32,
                &[Some(2), Some(3), Some(5), Some(4)],
            )],
        );
        let g = crate::import::import(&proto.encode_to_vec(), None).expect("imports");
        let raw = Plan::build(&g).expect("plan");
        let mut one = g;
        super::cancel_transposes(&mut one);
        let perms: Vec<_> = one.nodes.iter().map(|n| n.op.clone()).collect();
        // Axis b of the result is axis p1[p2[b]] of x.
        let composed = Op::Shape(ShapeOp::Transpose {
            perm: Some(vec![0, 1, 3, 2]),
        });
        assert_eq!(perms, [composed]);
        let x = Tensor::f32(vec![2, 3, 4, 5], (0..120).map(|i| i as f32).collect()).unwrap();
        let be = CpuBackend::new(1);
        let want = raw.run(&be, vec![("x".into(), x.clone())]).unwrap();
        let got = Plan::build(&one)
            .unwrap()
            .run(&be, vec![("x".into(), x)])
            .unwrap();
        assert_eq!(want, got);
    }
}
