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
use std::collections::HashMap;

pub fn cancel_transposes(g: &mut Graph) {
    // Cancelling first: an elementwise op between two transposes that cancel would otherwise
    // move behind the first, to the side of the layout its neighbours do not use. The
    // transposes a rewrite leaves unread go at once: a hoist needs its input transposes read by
    // nothing else, and a dead reader would still count (a residual add after a cancelled
    // pair stayed between two transposes, a third of resnet50_int8's time).
    while merge_repeat(g)
        || cancel_pair(g)
        || compose_pair(g)
        || hoist_elementwise(g)
        || hoist_max_pool(g)
    {
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

/// Rewires the readers of every Transpose of a Transpose that undoes it to the first one's
/// input; whether it found any.
fn cancel_pair(g: &mut Graph) -> bool {
    let (producers, uses) = (g.producers(), g.use_counts());
    let mut to: HashMap<usize, usize> = HashMap::new();
    for n in &g.nodes {
        let (Some(p2), Some(&out)) = (perm(n), n.outputs.first()) else {
            continue;
        };
        let Some((src, p1)) = transposed(g, &producers, n.inputs.first().copied().flatten()) else {
            continue;
        };
        let undoes =
            p1.len() == p2.len() && (0..p2.len()).all(|b| p2[b] < p1.len() && p1[p2[b]] == b);
        if undoes && uses[out] > 0 && !g.outputs.contains(&out) {
            to.insert(out, src);
        }
    }
    rewire(g, &to)
}

/// Makes every Transpose of a Transpose (that does not undo it) a single transpose of the
/// first one's input, by the composed perm; whether it found any. The first is then dead
/// unless something else reads it.
fn compose_pair(g: &mut Graph) -> bool {
    let producers = g.producers();
    let mut changed = false;
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
        if composed.iter().enumerate().all(|(b, &a)| a == b) {
            // Undoes the composed first: cancel_pair removes it on the next pass.
            continue;
        }
        g.nodes[i].op = Op::Shape(ShapeOp::Transpose {
            perm: Some(composed),
        });
        g.nodes[i].inputs[0] = Some(src);
        changed = true;
    }
    changed
}

/// Makes every node that reads a value of `to` read what it maps to (through chains of them)
/// instead; whether there was any.
fn rewire(g: &mut Graph, to: &HashMap<usize, usize>) -> bool {
    for node in &mut g.nodes {
        for input in node.inputs.iter_mut().flatten() {
            while let Some(&v) = to.get(input) {
                *input = v;
            }
        }
    }
    !to.is_empty()
}

/// Rewires the readers of every Transpose that repeats an earlier one (the same input and
/// perm) to the earlier one's output; whether it found any. One pass, whatever the count.
fn merge_repeat(g: &mut Graph) -> bool {
    let uses = g.use_counts();
    let mut first: HashMap<(&[Option<usize>], &[usize]), usize> = HashMap::new();
    let mut repeats: HashMap<usize, usize> = HashMap::new();
    for n in &g.nodes {
        let (Some(p), Some(&out)) = (perm(n), n.outputs.first()) else {
            continue;
        };
        match first.get(&(n.inputs.as_slice(), p)) {
            Some(&earlier) if uses[out] > 0 && !g.outputs.contains(&out) => {
                repeats.insert(out, earlier);
            }
            Some(_) => {}
            None => {
                first.insert((n.inputs.as_slice(), p), out);
            }
        }
    }
    rewire(g, &repeats)
}

/// Moves every elementwise op (a QAdd, or any [`elementwise`] one) whose inputs are all
/// transposed by the same perm (or constants of one element) behind that transpose; whether it
/// moved any. An elementwise op commutes with transposing all its inputs alike (inputs of one
/// rank broadcast alike); the transposes it read must be read by nothing else, so that the
/// count never grows. One pass in order carries a transpose through a whole chain of them.
fn hoist_elementwise(g: &mut Graph) -> bool {
    let mut uses = g.use_counts();
    let mut producers = vec![None; g.value_names.len()];
    let mut moved = false;
    for n in std::mem::take(&mut g.nodes) {
        let i = g.nodes.len();
        let Some((inputs, perm)) = behind_transposes(g, &producers, &uses, &n) else {
            for &o in &n.outputs {
                producers[o] = Some(i);
            }
            g.nodes.push(n);
            continue;
        };
        // The transposes read lose their reader (and die); what they read gains it.
        for &v in n.inputs.iter().flatten() {
            uses[v] -= 1;
        }
        for &x in inputs.iter().flatten() {
            uses[x] += 1;
        }
        let mut n = n;
        let t = split_off_transpose(g, &mut n, inputs, perm);
        uses.push(1);
        producers.push(Some(i));
        producers[t.outputs[0]] = Some(i + 1);
        g.nodes.extend([n, t]);
        moved = true;
    }
    moved
}

/// What elementwise `n` reads once moved behind the transposes of its inputs, and their perm;
/// `None` unless it can move (see [`hoist_elementwise`]). `producers` index `g`'s nodes.
fn behind_transposes(
    g: &Graph,
    producers: &[Option<usize>],
    uses: &[usize],
    n: &Node,
) -> Option<(Vec<Option<usize>>, Vec<usize>)> {
    let moves = matches!(n.op, Op::Quant(QuantOp::QAdd(_))) || elementwise(n);
    if !moves || n.outputs.len() != 1 || n.inputs.is_empty() || n.inputs.contains(&None) {
        return None;
    }
    // Each input: transposed (its source and perm), or a constant of one element, which
    // broadcasts the same either way.
    let one = |v: usize| g.constants.get(&v).is_some_and(|t| t.len() == 1);
    let sources: Vec<(usize, Option<Vec<usize>>)> = n
        .inputs
        .iter()
        .flatten()
        .map(|&v| match transposed(g, producers, Some(v)) {
            Some((x, p)) => Some((x, Some(p))),
            None => one(v).then_some((v, None)),
        })
        .collect::<Option<_>>()?;
    let perm = sources.iter().find_map(|(_, p)| p.clone())?;
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
    (transposes_alone && same).then(|| (sources.into_iter().map(|(x, _)| Some(x)).collect(), perm))
}

/// Makes node `i` (one output) read `inputs` and adds a Transpose by `perm` of what it now
/// computes, which its output's readers read.
fn move_behind(g: &mut Graph, i: usize, inputs: Vec<Option<usize>>, perm: Vec<usize>) {
    let mut n = g.nodes.remove(i);
    let t = split_off_transpose(g, &mut n, inputs, perm);
    g.nodes.splice(i..i, [n, t]);
}

/// Makes `n` (one output) read `inputs` and write a new value, and returns the Transpose by
/// `perm` of that value that writes `n`'s output.
fn split_off_transpose(
    g: &mut Graph,
    n: &mut Node,
    inputs: Vec<Option<usize>>,
    perm: Vec<usize>,
) -> Node {
    let out = n.outputs[0];
    let inner = g.add_value(format!("{}/untransposed", g.value_names[out]));
    (n.inputs, n.outputs) = (inputs, vec![inner]);
    Node {
        name: format!("{}/transpose", n.name),
        op: Op::Shape(ShapeOp::Transpose { perm: Some(perm) }),
        inputs: vec![Some(inner)],
        outputs: vec![out],
    }
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

    /// Two residual blocks as the QDQ pass leaves resnet50's: each "kernel" (a Softmax over
    /// channels, which does not move) between a transpose to NHWC and one back, the first
    /// block's add of two kernels, the second's add of a kernel and the first block's sum.
    /// Once the second block's transpose to NHWC cancels with the first's back, its add must
    /// move too: one transpose in, one out.
    #[test]
    fn residual_blocks_keep_one_layout_between_their_kernels() {
        let mut b = Builder::new(1, false);
        let kernel = |b: &mut Builder, x: &str| {
            let t = b.node("Transpose", &[x], vec![attr_ints("perm", &[0, 2, 3, 1])]);
            let k = b.node(
                "Softmax",
                &[&t],
                vec![crate::zoo::builder::attr_int("axis", 3)],
            );
            b.node("Transpose", &[&k], vec![attr_ints("perm", &[0, 3, 1, 2])])
        };
        let (k1, k2) = (kernel(&mut b, "x"), kernel(&mut b, "x"));
        let sum = b.node("Add", &[&k1, &k2], vec![]);
        let k3 = kernel(&mut b, &sum);
        let y = b.node("Add", &[&k3, &sum], vec![]);
        b.node_rename_last(&y, "y");
        let dims = [Some(2), Some(3), Some(4), Some(5)];
        let proto: ModelProto = b.finish(
            "residual",
            13,
            vec![value_info("x", DType::F32, &dims)],
            vec![value_info("y", DType::F32, &dims)],
        );
        let g = crate::import::import(&proto.encode_to_vec(), None).expect("imports");
        let mut nhwc = g.clone();
        super::cancel_transposes(&mut nhwc);
        let names: Vec<String> = nhwc.nodes.iter().map(|n| n.op.name()).collect();
        let transposes = names.iter().filter(|n| *n == "Transpose").count();
        assert_eq!(transposes, 2, "{names:?}");
        let x = Tensor::f32(vec![2, 3, 4, 5], (0..120).map(|i| i as f32 * 0.1).collect());
        crate::passes::assert_same_outputs(&g, &nhwc, &[("x".into(), x.unwrap())], 0.0);
    }

    /// Three transposes, no two neighbours undoing each other, all three together the
    /// identity, read by a Relu: none is left.
    #[test]
    fn three_transposes_that_compose_to_nothing_go() {
        let mut b = Builder::new(1, false);
        let t1 = b.node("Transpose", &["x"], vec![attr_ints("perm", &[0, 2, 1, 3])]);
        let t2 = b.node("Transpose", &[&t1], vec![attr_ints("perm", &[0, 1, 3, 2])]);
        let t3 = b.node("Transpose", &[&t2], vec![attr_ints("perm", &[0, 3, 1, 2])]);
        let y = b.node("Relu", &[&t3], vec![]);
        b.node_rename_last(&y, "y");
        let dims = [Some(2), Some(3), Some(4), Some(5)];
        let proto: ModelProto = b.finish(
            "three",
            13,
            vec![value_info("x", DType::F32, &dims)],
            vec![value_info("y", DType::F32, &dims)],
        );
        let g = crate::import::import(&proto.encode_to_vec(), None).expect("imports");
        let raw = Plan::build(&g).expect("plan");
        let mut none = g;
        super::cancel_transposes(&mut none);
        let names: Vec<String> = none.nodes.iter().map(|n| n.op.name()).collect();
        assert_eq!(names, ["Relu"]);
        let x = Tensor::f32(
            vec![2, 3, 4, 5],
            (0..120).map(|i| i as f32 - 60.0).collect(),
        )
        .unwrap();
        let be = CpuBackend::new(1);
        let want = raw.run(&be, vec![("x".into(), x.clone())]).unwrap();
        let got = Plan::build(&none)
            .unwrap()
            .run(&be, vec![("x".into(), x)])
            .unwrap();
        assert_eq!(want, got);
    }
}
