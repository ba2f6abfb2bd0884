//! Chains of 2-D convolutions run NHWC where the CPU has the kernels (AVX-512 or AVX2 + FMA:
//! `kernels::nhwc_conv`, `nhwc_depthwise`): a pixel's channels are contiguous there, so the
//! kernels vectorise over channels and lose no lanes whatever the image size, and read their
//! taps in place.
//!
//! Members of a chain join where one reads another's output: convolutions (as input or as
//! fused residual), and after them max and global pools, Concats and Splits of members (YOLO's
//! blocks), and elementwise ops (hard-swish's parts, a squeeze-and-excitation block's scale by
//! its gate, shifts by constants). An elementwise op joins when it reads a member, and reads
//! otherwise only constants (of rank 4 or less, transposed with it) and one-pixel values,
//! `[N, C, 1, 1]`, which have the same bytes in either layout. A chain of two or more
//! convolutions becomes NHWC, each node wrapped in transposes from NCHW and back, which
//! `transposes` then cancels between neighbours: what remains is one transpose where the chain
//! reads a value from outside it and one where a value leaves it. A convolution alone pays
//! both transposes, so it stays NCHW unless its products repay them; so do ungrouped ones with
//! fewer than 16 output channels, which the kernel runs slower than the NCHW kernels.

use super::elementwise;
use super::qdq::{NCHW_TO_NHWC, NHWC_TO_NCHW, transpose};
use super::transposes::cancel_transposes;
use crate::graph::{Graph, Node};
use crate::ops::Op;
use crate::ops::shape::ShapeOp;
use crate::tensor::{DType, Tensor};
use cotenant_kernels::{nhwc_conv, nhwc_depthwise};
use std::sync::Arc;

/// Products per moved element from which a convolution alone runs NHWC: a transpose moves an
/// element in about the time of 25 products, so at 64 the two cost a fifth or less of what
/// the im2col they replace did.
const ALONE_RATIO: usize = 64;

/// Fewest output channels: one panel of 16 leaves the tile a quarter full.
const MIN_OUTPUTS: usize = 16;

pub fn nhwc_convolutions(g: &mut Graph) {
    if !nhwc_conv::available() {
        return;
    }
    let producers = g.producers();
    let mut member: Vec<Option<Member>> = vec![None; g.nodes.len()];
    let mut unit = vec![false; g.value_names.len()];
    // Chains: union-find over the members, joined where one reads another's output.
    let mut root: Vec<usize> = (0..g.nodes.len()).collect();
    fn find(root: &mut [usize], mut i: usize) -> usize {
        while root[i] != i {
            root[i] = root[root[i]];
            i = root[i];
        }
        i
    }
    // In node order, so that a node's producers are decided before it.
    for (i, n) in g.nodes.iter().enumerate() {
        let from = |member: &[Option<Member>], k: usize| {
            let v = n.inputs.get(k).copied().flatten()?;
            producers[v].filter(|&p| member[p].is_some())
        };
        member[i] = match &n.op {
            Op::Conv(_) if suits(g, n) => {
                // The residual is transposed with the rest: it must have the output's rank,
                // which a member's output has.
                (!residual(n) || from(&member, 3).is_some()).then_some(Member::Conv)
            }
            // A pool joins a chain only behind one of its members.
            _ if max_pool(n) || global_pool(n) || resize(g, n) => {
                from(&member, 0).map(|_| Member::Follower)
            }
            // Concat and Split of images along an axis: all their images members.
            _ if along_axis(n).is_some() => {
                let images = || n.inputs.iter().take(images_read(n)).flatten().copied();
                let all = images().all(|v| producers[v].is_some_and(|p| member[p].is_some()));
                (all && images().next().is_some()).then_some(Member::Follower)
            }
            _ if elementwise(n) => {
                let fits = |v: usize| {
                    producers[v].is_some_and(|p| member[p].is_some())
                        || unit[v]
                        || g.constants.get(&v).is_some_and(|t| t.rank() <= 4)
                };
                let inputs = || n.inputs.iter().flatten().copied();
                let joins = inputs().any(|v| producers[v].is_some_and(|p| member[p].is_some()));
                (joins && inputs().all(fits)).then_some(Member::Follower)
            }
            _ => None,
        };
        if member[i].is_some() {
            for k in 0..n.inputs.len() {
                if let Some(p) = from(&member, k) {
                    let (a, b) = (find(&mut root, i), find(&mut root, p));
                    root[a] = b;
                }
            }
        } else if spatially_one(g, n, &unit) {
            unit[n.outputs[0]] = true;
        }
        if member[i].is_some() && global_pool(n) {
            unit[n.outputs[0]] = true;
        }
    }
    // A chain runs NHWC with two or more convolutions, or one worth its transposes alone.
    let mut size = vec![0usize; g.nodes.len()];
    let mut alone = vec![false; g.nodes.len()];
    for i in (0..g.nodes.len()).filter(|&i| member[i] == Some(Member::Conv)) {
        let r = find(&mut root, i);
        size[r] += 1;
        alone[r] |= worth_alone(g, &g.nodes[i]);
    }
    let chosen: Vec<usize> = (0..g.nodes.len())
        .filter(|&i| member[i].is_some())
        .filter(|&i| {
            let r = find(&mut root, i);
            size[r] >= 2 || alone[r]
        })
        .collect();
    if chosen.is_empty() {
        return;
    }
    // Last first, so the indices of the ones before stay put.
    for &i in chosen.iter().rev() {
        to_nhwc(g, i);
    }
    cancel_transposes(g);
}

/// What a node is in a chain: a convolution (which counts towards the chain's size), or a
/// pool, Concat, Split or elementwise op between or after its convolutions.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Member {
    Conv,
    Follower,
}

/// Whether Conv `n` may run NHWC: 2-D (constant rank-4 f32 weights), ungrouped with enough
/// output channels or depthwise (one input and one output channel per group), with a constant
/// bias or none.
fn suits(g: &Graph, n: &Node) -> bool {
    let Op::Conv(c) = &n.op else {
        return false;
    };
    let input = |k: usize| n.inputs.get(k).copied().flatten();
    let Some(w) = input(1).and_then(|v| g.constants.get(&v)) else {
        return false;
    };
    let bias_ok = input(2).is_none_or(|v| g.constants.contains_key(&v));
    let channels_ok = match *w.shape.as_slice() {
        [m, 1, _, _] if c.group == m && m > 0 => nhwc_depthwise::available(),
        [m, ci, _, _] => c.group == 1 && ci > 0 && m >= MIN_OUTPUTS,
        _ => false,
    };
    channels_ok
        && !c.nhwc
        && n.outputs.len() == 1
        && input(0).is_some()
        && bias_ok
        && w.dtype() == DType::F32
}

/// Whether Conv `n` (which [`suits`]) is worth its two transposes alone: an ungrouped kernel
/// wider than 1x1 (which the NCHW path runs through im2col) with at least [`ALONE_RATIO`]
/// products per element the transposes move (at stride 1).
fn worth_alone(g: &Graph, n: &Node) -> bool {
    let w = n
        .inputs
        .get(1)
        .copied()
        .flatten()
        .and_then(|v| g.constants.get(&v));
    match w.map(|w| w.shape.as_slice()) {
        Some(&[m, c, kh, kw]) if kh * kw > 1 && matches!(&n.op, Op::Conv(a) if a.group == 1) => {
            m * c * kh * kw >= ALONE_RATIO * (m + c)
        }
        _ => false,
    }
}

/// Whether `n` is a 2-D MaxPool without Indices, which runs NHWC between the convolutions of a
/// chain (resnet's stem, then its max pool, then its blocks).
fn max_pool(n: &Node) -> bool {
    matches!(&n.op, Op::Pool(p) if p.max && !p.indices && !p.nhwc && p.kernel_shape.len() == 2)
        && n.outputs.len() == 1
        && n.inputs.first().copied().flatten().is_some()
}

/// Whether `n` is a Resize of all four axes whose region, scales and sizes are constants (or
/// absent): it resamples each axis alone, in axis order, so NHWC gives the same values once
/// those are permuted (an FPN's or YOLO's upsampling between convolutions).
fn resize(g: &Graph, n: &Node) -> bool {
    let Op::Resize(r) = &n.op else {
        return false;
    };
    let per_axis = |v: &Option<usize>| {
        v.is_none_or(|v| {
            g.constants
                .get(&v)
                .is_some_and(|t| matches!(t.len(), 0 | 4 | 8))
        })
    };
    !r.legacy
        && r.scales_attr.is_none()
        && r.axes.is_none()
        && (3..=4).contains(&n.inputs.len())
        && n.inputs[0].is_some()
        && n.inputs[1..].iter().all(per_axis)
        && n.outputs.len() == 1
}

fn residual(n: &Node) -> bool {
    matches!(&n.op, Op::Conv(c) if c.residual) && n.inputs.get(3).copied().flatten().is_some()
}

/// Whether `n` is a GlobalAveragePool or GlobalMaxPool.
fn global_pool(n: &Node) -> bool {
    matches!(&n.op, Op::GlobalPool { nhwc: false, .. })
        && n.outputs.len() == 1
        && n.inputs.first().copied().flatten().is_some()
}

/// The axis of a Concat or Split of rank-4 values, from 0 to 3.
fn along_axis(n: &Node) -> Option<usize> {
    let axis = match &n.op {
        Op::Shape(ShapeOp::Concat { axis } | ShapeOp::Split { axis, .. }) => *axis,
        _ => return None,
    };
    let axis = if axis < 0 { axis + 4 } else { axis };
    (0..4).contains(&axis).then_some(axis as usize)
}

/// How many of `n`'s first inputs are images: a Concat's all, a Split's first (its second is
/// the sizes).
fn images_read(n: &Node) -> usize {
    match &n.op {
        Op::Shape(ShapeOp::Split { .. }) => 1,
        _ => n.inputs.len(),
    }
}

/// Whether `n`'s output is `[N, C, 1, 1]` because its inputs are (`unit` says which values
/// are): a 1x1 convolution without padding, or an elementwise op, of such values. Such a value
/// has the same bytes in either layout, so a chain reads it through a transpose that costs
/// next to nothing (a squeeze-and-excitation block's scale).
fn spatially_one(g: &Graph, n: &Node, unit: &[bool]) -> bool {
    let input = |k: usize| n.inputs.get(k).copied().flatten();
    let operands = || n.inputs.iter().flatten().copied();
    match &n.op {
        Op::Conv(c) => {
            let w = input(1).and_then(|v| g.constants.get(&v));
            let pointwise = w.is_some_and(|w| w.rank() == 4 && w.shape[2..] == [1, 1]);
            let unpadded = c.pads.as_ref().is_none_or(|p| p.iter().all(|&p| p == 0));
            pointwise
                && unpadded
                && input(0).is_some_and(|v| unit[v])
                && (!residual(n) || input(3).is_some_and(|v| unit[v]))
        }
        _ if elementwise(n) => {
            operands().any(|v| unit[v])
                && operands().all(|v| unit[v] || g.constants.get(&v).is_some_and(|t| t.rank() <= 4))
        }
        _ => false,
    }
}

/// Makes member `i` NHWC: transposes from NCHW on the inputs it reads as images, constants of
/// more than one element transposed in place of them, and a transpose back on its output.
fn to_nhwc(g: &mut Graph, i: usize) {
    let name = g.nodes[i].name.clone();
    let images: Vec<usize> = match &g.nodes[i].op {
        Op::Conv(_) if residual(&g.nodes[i]) => vec![0, 3],
        Op::Conv(_) | Op::Pool(_) | Op::GlobalPool { .. } | Op::Resize(_) => vec![0],
        _ => (0..images_read(&g.nodes[i])).collect(),
    };
    let mut before = Vec::new();
    for k in images {
        let Some(v) = g.nodes[i].inputs[k] else {
            continue;
        };
        if let Some(t) = g.constants.get(&v) {
            if t.len() > 1 {
                let moved = Arc::new(nhwc_constant(t));
                let c = g.add_value(format!("{name}/nhwc_constant_{k}"));
                g.constants.insert(c, moved);
                g.nodes[i].inputs[k] = Some(c);
            }
            continue;
        }
        let t = g.add_value(format!("{name}/nhwc_{k}"));
        before.push(transpose(
            format!("{name}/input_{k}_to_nhwc"),
            NCHW_TO_NHWC,
            v,
            t,
        ));
        g.nodes[i].inputs[k] = Some(t);
    }
    if matches!(g.nodes[i].op, Op::Resize(_)) {
        // The region (starts then ends), scales and sizes, one entry per axis, in NHWC order.
        for k in 1..g.nodes[i].inputs.len() {
            let Some(t) = g.nodes[i].inputs[k].and_then(|v| g.constants.get(&v)) else {
                continue;
            };
            if t.is_empty() {
                continue;
            }
            let picks: Vec<usize> = (0..t.len() / 4)
                .flat_map(|half| NCHW_TO_NHWC.iter().map(move |&a| half * 4 + a))
                .collect();
            let moved = Tensor::new(vec![picks.len()], t.data.gather(&picks));
            let moved = Arc::new(moved.expect("as many elements as picks"));
            let c = g.add_value(format!("{name}/nhwc_axes_{k}"));
            g.constants.insert(c, moved);
            g.nodes[i].inputs[k] = Some(c);
        }
    }
    let axis = along_axis(&g.nodes[i]);
    match &mut g.nodes[i].op {
        Op::Conv(c) => c.nhwc = true,
        Op::Pool(p) => p.nhwc = true,
        Op::GlobalPool { nhwc, .. } => *nhwc = true,
        Op::Shape(ShapeOp::Concat { axis: a } | ShapeOp::Split { axis: a, .. }) => {
            // NCHW's axis `perm[j]` is NHWC's `j`.
            let at = NCHW_TO_NHWC.iter().position(|&d| Some(d) == axis);
            *a = at.expect("a rank-4 axis") as i64;
        }
        _ => {}
    }
    for k in (0..g.nodes[i].outputs.len()).rev() {
        let out = g.nodes[i].outputs[k];
        let inner = g.add_value(format!("{name}/nhwc_output_{k}"));
        g.nodes[i].outputs[k] = inner;
        g.nodes.insert(
            i + 1,
            transpose(
                format!("{name}/output_{k}_to_nchw"),
                NHWC_TO_NCHW,
                inner,
                out,
            ),
        );
    }
    for (j, t) in before.into_iter().enumerate() {
        g.nodes.insert(i + j, t);
    }
}

/// Constant `t` (rank 4 or less, broadcast from the right) as an NHWC operand: padded to rank
/// 4 with leading ones, then transposed.
fn nhwc_constant(t: &Tensor) -> Tensor {
    let mut padded = t.clone();
    padded.shape = [vec![1; 4 - t.rank()], t.shape.clone()].concat();
    crate::ops::shape::transpose(&padded, Some(&NCHW_TO_NHWC)).expect("a rank-4 transpose")
}

#[cfg(test)]
mod tests {
    use crate::backend::CpuBackend;
    use crate::graph::Graph;
    use crate::ops::Op;
    use crate::ops::shape::ShapeOp;
    use crate::plan::Plan;
    use crate::proto::ModelProto;
    use crate::tensor::{DType, Tensor};
    use crate::zoo::builder::{Builder, attr_float, attr_int, attr_ints, value_info};
    use prost::Message;

    /// A stem, a max pool, then a residual block of three convolutions whose middle output is
    /// also a graph output, and a global pool.
    fn graph() -> Graph {
        let mut m = Builder::new(3, false);
        let conv = |m: &mut Builder, x: &str, c: usize, o: usize, k: usize, s: usize| {
            let w = m.normal("w", &[o, c, k, k], 0.3);
            let b = m.normal("b", &[o], 0.1);
            let pads = attr_ints("pads", &[(k / 2) as i64; 4]);
            m.node(
                "Conv",
                &[x, &w, &b],
                vec![pads, attr_ints("strides", &[s as i64; 2])],
            )
        };
        let stem = conv(&mut m, "x", 3, 16, 3, 1);
        let pool = m.node(
            "MaxPool",
            &[&stem],
            vec![
                attr_ints("kernel_shape", &[2, 2]),
                attr_ints("strides", &[2, 2]),
            ],
        );
        let a = conv(&mut m, &pool, 16, 32, 1, 1);
        let a = m.node("Relu", &[&a], vec![]);
        let b = conv(&mut m, &a, 32, 32, 3, 1);
        let b = m.node("Relu", &[&b], vec![]);
        m.node_rename_last(&b, "mid");
        let c = conv(&mut m, "mid", 32, 32, 3, 2);
        let d = conv(&mut m, &a, 32, 32, 1, 2);
        let s = m.node("Add", &[&c, &d], vec![]);
        let s = m.node("Relu", &[&s], vec![]);
        let y = m.node("GlobalAveragePool", &[&s], vec![]);
        m.node_rename_last(&y, "y");
        let proto: ModelProto = m.finish(
            "nhwc",
            13,
            vec![value_info(
                "x",
                DType::F32,
                &[None, Some(3), Some(9), Some(10)],
            )],
            vec![
                value_info("y", DType::F32, &[None, Some(32), Some(1), Some(1)]),
                value_info("mid", DType::F32, &[None, Some(32), Some(4), Some(5)]),
            ],
        );
        crate::import::import(&proto.encode_to_vec(), None).expect("imports")
    }

    #[test]
    fn a_chain_of_convolutions_runs_nhwc_with_transposes_at_its_ends() {
        if !cotenant_kernels::nhwc_conv::available() {
            eprintln!(
                "skipped: this CPU lacks AVX-512F and AVX2, one of which the NHWC convolution needs"
            );
            return;
        }
        let raw = Plan::build(&graph()).expect("plan");
        let mut g = graph();
        crate::passes::optimize(&mut g);
        super::nhwc_convolutions(&mut g);
        let names: Vec<String> = g.nodes.iter().map(|n| n.op.name()).collect();
        assert_eq!(
            names,
            [
                // The input image to NHWC, then the stem and its pool join the chain.
                "Transpose",
                "Conv(NHWC)",
                "MaxPool(NHWC)",
                "Conv(NHWC)+Relu",
                "Conv(NHWC)+Relu",
                // `mid` leaves the chain: back to NCHW.
                "Transpose",
                "Conv(NHWC)",
                "Conv(NHWC)+Add+Relu",
                // The pool joins the chain too; its output, a graph output, goes back to NCHW
                // (the same bytes: one pixel).
                "GlobalAveragePool(NHWC)",
                "Transpose",
            ],
            "{names:?}"
        );
        let nhwc = Plan::build(&g).expect("plan");
        // The NHWC Convs hold their weights packed only: the ONNX copy is freed.
        let packed_only = nhwc
            .steps
            .iter()
            .filter(|s| matches!(&s.op, Op::Conv(c) if c.nhwc))
            .all(|s| s.inputs[1].is_none());
        assert!(packed_only, "the NHWC Convs' ONNX weights are freed");
        // Held once, packed: the stem's padding to whole panels aside, and the Winograd
        // transform (16 values for 9) of the stride-1 3x3 32 → 32 filter.
        let transform = 16 * 32 * 32 * 4;
        assert!(
            nhwc.weight_bytes() < raw.weight_bytes() + 4 * 16 * 3 * 9 + transform,
            "weights held once"
        );
        let be = CpuBackend::new(2);
        for batch in [1, 3] {
            let x: Vec<f32> = (0..batch * 270)
                .map(|i| (i % 11) as f32 / 5.0 - 1.0)
                .collect();
            let input = || {
                vec![(
                    "x".to_string(),
                    Tensor::f32(vec![batch, 3, 9, 10], x.clone()).expect("x"),
                )]
            };
            let want = raw.run(&be, input()).expect("raw runs");
            let got = nhwc.run(&be, input()).expect("nhwc runs");
            for ((n, a), (_, b)) in want.iter().zip(&got) {
                assert_eq!(a.shape, b.shape, "{n}");
                let (a, b) = (a.as_f32().expect("f32"), b.as_f32().expect("f32"));
                for (p, q) in a.iter().zip(b) {
                    assert!((p - q).abs() <= 1e-4 * (1.0 + p.abs()), "{n}: {p} vs {q}");
                }
            }
        }
    }

    /// One convolution from `c` to `m` channels with a `k`x`k` kernel, alone in its graph.
    fn lone(c: usize, m: usize, k: usize) -> Graph {
        let mut b = Builder::new(7, false);
        let w = b.normal("w", &[m, c, k, k], 0.3);
        let y = b.node(
            "Conv",
            &["x", &w],
            vec![attr_ints("pads", &[(k / 2) as i64; 4])],
        );
        b.node_rename_last(&y, "y");
        let proto: ModelProto = b.finish(
            "lone",
            13,
            vec![value_info(
                "x",
                DType::F32,
                &[None, Some(c), Some(6), Some(7)],
            )],
            vec![value_info(
                "y",
                DType::F32,
                &[None, Some(m), Some(6), Some(7)],
            )],
        );
        crate::import::import(&proto.encode_to_vec(), None).expect("imports")
    }

    #[test]
    fn a_convolution_alone_runs_nhwc_where_its_products_repay_the_transposes() {
        if !cotenant_kernels::nhwc_conv::available() {
            eprintln!("skipped: this CPU lacks AVX-512F and AVX2");
            return;
        }
        // 32 -> 24 3x3: 123 products per moved element; 4 -> 16 3x3: 29; 1x1: no im2col.
        for (c, m, k, nhwc) in [(32, 24, 3, true), (4, 16, 3, false), (32, 24, 1, false)] {
            let raw = Plan::build(&lone(c, m, k)).expect("plan");
            let mut g = lone(c, m, k);
            crate::passes::optimize(&mut g);
            super::nhwc_convolutions(&mut g);
            let names: Vec<String> = g.nodes.iter().map(|n| n.op.name()).collect();
            let want: &[&str] = match nhwc {
                true => &["Transpose", "Conv(NHWC)", "Transpose"],
                false => &["Conv"],
            };
            assert_eq!(names, want, "{c} -> {m} {k}x{k}");
            let plan = Plan::build(&g).expect("plan");
            let x: Vec<f32> = (0..2 * c * 42)
                .map(|i| (i % 13) as f32 / 6.0 - 1.0)
                .collect();
            let input = || {
                vec![(
                    "x".to_string(),
                    Tensor::f32(vec![2, c, 6, 7], x.clone()).unwrap(),
                )]
            };
            let be = CpuBackend::new(2);
            let (a, b) = (
                raw.run(&be, input()).unwrap(),
                plan.run(&be, input()).unwrap(),
            );
            let (a, b) = (a[0].1.as_f32().unwrap(), b[0].1.as_f32().unwrap());
            assert_eq!(a.len(), b.len());
            for (p, q) in a.iter().zip(b) {
                assert!((p - q).abs() <= 1e-4 * (1.0 + p.abs()), "{p} vs {q}");
            }
        }
    }

    /// MobileNet's first blocks, small: a stem, a depthwise → projection block without
    /// expansion, a strided block, and a block with its residual.
    fn inverted_residuals() -> Graph {
        let mut m = Builder::new(5, false);
        let relu6 = |m: &mut Builder, v: &str| {
            m.node(
                "Clip",
                &[v],
                vec![attr_float("min", 0.0), attr_float("max", 6.0)],
            )
        };
        let conv = |m: &mut Builder, x: &str, c: usize, o: usize, k: usize, s: usize, g: usize| {
            let w = m.normal("w", &[o, c / g, k, k], 0.3);
            let b = m.normal("b", &[o], 0.1);
            let attrs = vec![
                attr_ints("pads", &[(k / 2) as i64; 4]),
                attr_ints("strides", &[s as i64; 2]),
                attr_int("group", g as i64),
            ];
            m.node("Conv", &[x, &w, &b], attrs)
        };
        let block = |m: &mut Builder, x: &str, c: usize, e: usize, o: usize, s: usize| {
            let h = conv(m, x, c, e, 1, 1, 1);
            let h = relu6(m, &h);
            let h = conv(m, &h, e, e, 3, s, e);
            let h = relu6(m, &h);
            conv(m, &h, e, o, 1, 1, 1)
        };
        let stem = conv(&mut m, "x", 3, 32, 3, 2, 1);
        let stem = relu6(&mut m, &stem);
        let d = conv(&mut m, &stem, 32, 32, 3, 1, 32);
        let d = relu6(&mut m, &d);
        let a = conv(&mut m, &d, 32, 16, 1, 1, 1);
        let b = block(&mut m, &a, 16, 48, 24, 2);
        let c = block(&mut m, &b, 24, 72, 24, 1);
        let c = m.node("Add", &[&b, &c], vec![]);
        let y = m.node("GlobalAveragePool", &[&c], vec![]);
        m.node_rename_last(&y, "y");
        let proto: ModelProto = m.finish(
            "mobile",
            13,
            vec![value_info(
                "x",
                DType::F32,
                &[None, Some(3), Some(22), Some(19)],
            )],
            vec![value_info(
                "y",
                DType::F32,
                &[None, Some(24), Some(1), Some(1)],
            )],
        );
        crate::import::import(&proto.encode_to_vec(), None).expect("imports")
    }

    /// The depthwise convolutions join the chain, the blocks fuse whole in NHWC (the one
    /// without expansion as plain Convs), and the values are the NCHW plan's.
    #[test]
    fn inverted_residual_blocks_run_nhwc_fused() {
        if !cotenant_kernels::nhwc_depthwise::available() {
            eprintln!("skipped: this CPU has neither AVX-512F nor AVX2 + FMA");
            return;
        }
        let raw = Plan::build(&inverted_residuals()).expect("plan");
        let mut g = inverted_residuals();
        crate::passes::optimize_for_cpu(&mut g);
        let names: Vec<String> = g.nodes.iter().map(|n| n.op.name()).collect();
        let block = "Conv(1x1)+Clip(0.0, 6.0)+Conv(depthwise)+Clip(0.0, 6.0)+Conv(1x1)";
        assert_eq!(
            names,
            [
                "Transpose".to_string(),
                "Conv(NHWC)+Clip(0.0, 6.0)".into(),
                "Conv(grouped)(NHWC)+Clip(0.0, 6.0)".into(),
                "Conv(NHWC)".into(),
                format!("{block}(NHWC)"),
                format!("{block}+Add(NHWC)"),
                "GlobalAveragePool(NHWC)".into(),
                "Transpose".into(),
            ],
            "{names:?}"
        );
        let nhwc = Plan::build(&g).expect("plan");
        assert!(
            nhwc.steps
                .iter()
                .filter(|s| matches!(s.op, Op::Conv(_) | Op::PointwiseDepthwise(_)))
                .all(|s| {
                    // The weights: input 1 of a Conv, inputs 1, 3 and 5 of a fused block.
                    let fused = matches!(s.op, Op::PointwiseDepthwise(_));
                    let weights: &[usize] = if fused { &[1, 3, 5] } else { &[1] };
                    weights.iter().all(|&k| s.inputs[k].is_none())
                }),
            "every NHWC convolution holds its weights packed only"
        );
        let be = CpuBackend::new(2);
        for batch in [1, 2] {
            let x: Vec<f32> = (0..batch * 3 * 22 * 19)
                .map(|i| (i % 13) as f32 / 6.0 - 1.0)
                .collect();
            let input = || {
                vec![(
                    "x".to_string(),
                    Tensor::f32(vec![batch, 3, 22, 19], x.clone()).expect("x"),
                )]
            };
            let want = raw.run(&be, input()).expect("raw runs");
            let got = nhwc.run(&be, input()).expect("nhwc runs");
            let (a, b) = (
                want[0].1.as_f32().expect("f32"),
                got[0].1.as_f32().expect("f32"),
            );
            assert_eq!(want[0].1.shape, got[0].1.shape);
            for (p, q) in a.iter().zip(b) {
                assert!((p - q).abs() <= 1e-4 * (1.0 + p.abs()), "{p} vs {q}");
            }
        }
    }

    /// MobileNetV3's pieces: written-out hard-swish, a squeeze-and-excitation block with
    /// Paddle's separate bias Adds (its reducing convolution too narrow to run NHWC), and
    /// elementwise ops by constants of one element and of one per channel.
    fn squeeze_excitation() -> Graph {
        let mut m = Builder::new(9, false);
        let conv = |m: &mut Builder, x: &str, c: usize, o: usize, k: usize, g: usize| {
            let w = m.normal("w", &[o, c / g, k, k], 0.3);
            let attrs = vec![
                attr_ints("pads", &[(k / 2) as i64; 4]),
                attr_int("group", g as i64),
            ];
            let y = m.node("Conv", &[x, &w], attrs);
            let b = m.normal("b", &[1, o, 1, 1], 0.1);
            m.node("Add", &[&y, &b], vec![])
        };
        let c = |m: &mut Builder, v: f32| m.const_f32("c", v);
        let stem = conv(&mut m, "x", 3, 16, 3, 1);
        let three = c(&mut m, 3.0);
        let sum = m.node("Add", &[&stem, &three], vec![]);
        let (lo, hi) = (c(&mut m, 0.0), c(&mut m, 6.0));
        let gate = m.node("Clip", &[&sum, &lo, &hi], vec![]);
        let h = m.node("Mul", &[&stem, &gate], vec![]);
        let six = c(&mut m, 6.0);
        let h = m.node("Div", &[&h, &six], vec![]);
        let d = conv(&mut m, &h, 16, 16, 3, 16);
        let d = m.node("Relu", &[&d], vec![]);
        let pooled = m.node("GlobalAveragePool", &[&d], vec![]);
        let s = conv(&mut m, &pooled, 16, 8, 1, 1);
        let s = m.node("Relu", &[&s], vec![]);
        let s = conv(&mut m, &s, 8, 16, 1, 1);
        let s = m.node(
            "HardSigmoid",
            &[&s],
            vec![attr_float("alpha", 0.2), attr_float("beta", 0.5)],
        );
        let scaled = m.node("Mul", &[&d, &s], vec![]);
        let p = conv(&mut m, &scaled, 16, 24, 1, 1);
        let per_channel = m.normal("k", &[24, 1, 1], 1.0);
        let p = m.node("Sub", &[&per_channel, &p], vec![]);
        let half = c(&mut m, 0.5);
        let p = m.node("Mul", &[&p, &half], vec![]);
        let y = m.node("GlobalAveragePool", &[&p], vec![]);
        m.node_rename_last(&y, "y");
        let proto: ModelProto = m.finish(
            "se",
            13,
            vec![value_info(
                "x",
                DType::F32,
                &[None, Some(3), Some(11), Some(9)],
            )],
            vec![value_info(
                "y",
                DType::F32,
                &[None, Some(24), Some(1), Some(1)],
            )],
        );
        crate::import::import(&proto.encode_to_vec(), None).expect("imports")
    }

    /// The chain runs through the elementwise ops and the block: only one-pixel values cross
    /// in and out of it between its ends.
    #[test]
    fn chains_run_nhwc_through_elementwise_ops_and_squeeze_excitation() {
        if !cotenant_kernels::nhwc_depthwise::available() {
            eprintln!("skipped: this CPU has neither AVX-512F nor AVX2 + FMA");
            return;
        }
        let mut g = squeeze_excitation();
        crate::passes::optimize_for_cpu(&mut g);
        let names: Vec<String> = g.nodes.iter().map(|n| n.op.name()).collect();
        assert_eq!(
            names,
            [
                "Transpose",
                "Conv(NHWC)+HardSwish",
                "Conv(grouped)(NHWC)+Relu",
                "GlobalAveragePool(NHWC)",
                // One pixel to NCHW for the narrow convolution, and its output back.
                "Transpose",
                "Conv+Relu",
                "Transpose",
                "Conv(NHWC)+HardSigmoid(0.2, 0.5)",
                "Mul",
                "Conv(NHWC)",
                "Sub",
                "Mul",
                "GlobalAveragePool(NHWC)",
                "Transpose",
            ],
            "{names:?}"
        );
        let x: Vec<f32> = (0..2 * 3 * 99)
            .map(|i| (i % 17) as f32 / 4.0 - 2.0)
            .collect();
        let x = Tensor::f32(vec![2, 3, 11, 9], x).expect("x");
        crate::passes::assert_same_outputs(&squeeze_excitation(), &g, &[("x".into(), x)], 1e-4);
    }

    /// YOLOv8's C2f block: a convolution split in two along the channels, a bottleneck on the
    /// second half with its shortcut, the three concatenated, then a convolution; the split
    /// sizes as an input and the concat axis negative.
    fn split_concat() -> Graph {
        let mut m = Builder::new(6, false);
        let conv = |m: &mut Builder, x: &str, c: usize, o: usize, k: usize| {
            let w = m.normal("w", &[o, c, k, k], 0.3);
            let y = m.node(
                "Conv",
                &[x, &w],
                vec![attr_ints("pads", &[(k / 2) as i64; 4])],
            );
            m.node("Relu", &[&y], vec![])
        };
        let h = conv(&mut m, "x", 8, 32, 3);
        let sizes = m.const_i64("split", &[16, 16]);
        let halves = m.node_outputs("Split", &[&h, &sizes], vec![attr_int("axis", 1)], 2);
        let (a, b) = (&halves[0], &halves[1]);
        let c = conv(&mut m, b, 16, 16, 3);
        let c = m.node("Add", &[b, &c], vec![]);
        let cat = m.node("Concat", &[a, b, &c], vec![attr_int("axis", -3)]);
        let y = conv(&mut m, &cat, 48, 24, 1);
        m.node_rename_last(&y, "y");
        let proto: ModelProto = m.finish(
            "c2f",
            13,
            vec![value_info(
                "x",
                DType::F32,
                &[None, Some(8), Some(7), Some(6)],
            )],
            vec![value_info(
                "y",
                DType::F32,
                &[None, Some(24), Some(7), Some(6)],
            )],
        );
        crate::import::import(&proto.encode_to_vec(), None).expect("imports")
    }

    #[test]
    fn splits_and_concats_of_a_chain_run_nhwc_along_the_channels() {
        if !cotenant_kernels::nhwc_conv::available() {
            eprintln!("skipped: this CPU lacks AVX-512F and AVX2");
            return;
        }
        let mut g = split_concat();
        crate::passes::optimize_for_cpu(&mut g);
        let names: Vec<String> = g.nodes.iter().map(|n| n.op.name()).collect();
        let transposes = names.iter().filter(|n| *n == "Transpose").count();
        assert_eq!(transposes, 2, "one in, one out: {names:?}");
        let axes: Vec<i64> = g
            .nodes
            .iter()
            .filter_map(|n| match &n.op {
                Op::Shape(ShapeOp::Split { axis, .. } | ShapeOp::Concat { axis }) => Some(*axis),
                _ => None,
            })
            .collect();
        assert_eq!(axes, [3, 3]);
        let x: Vec<f32> = (0..2 * 8 * 42)
            .map(|i| (i % 13) as f32 / 5.0 - 1.0)
            .collect();
        let x = Tensor::f32(vec![2, 8, 7, 6], x).expect("x");
        crate::passes::assert_same_outputs(&split_concat(), &g, &[("x".into(), x)], 1e-4);
    }

    /// Convolutions with a nearest upsampling by two and a linear resampling by 1.5 x 0.5
    /// between them (an FPN's top-down path).
    fn resized() -> Graph {
        let mut m = Builder::new(8, false);
        let conv = |m: &mut Builder, x: &str, c: usize, o: usize| {
            let w = m.normal("w", &[o, c, 3, 3], 0.3);
            m.node("Conv", &[x, &w], vec![attr_ints("pads", &[1; 4])])
        };
        let resize = |m: &mut Builder, x: &str, scales: [f32; 4], mode: &str| {
            let mut it = scales.into_iter();
            let s = m.weight("scales", &[4], |_| it.next().expect("four"));
            let mode = crate::zoo::builder::attr_string("mode", mode);
            m.node("Resize", &[x, "", &s], vec![mode])
        };
        let a = conv(&mut m, "x", 4, 16);
        let a = resize(&mut m, &a, [1.0, 1.0, 2.0, 2.0], "nearest");
        let b = conv(&mut m, &a, 16, 16);
        let b = resize(&mut m, &b, [1.0, 1.0, 1.5, 0.5], "linear");
        let y = conv(&mut m, &b, 16, 16);
        m.node_rename_last(&y, "y");
        let proto: ModelProto = m.finish(
            "fpn",
            13,
            vec![value_info(
                "x",
                DType::F32,
                &[None, Some(4), Some(5), Some(6)],
            )],
            vec![value_info(
                "y",
                DType::F32,
                &[None, Some(16), Some(15), Some(6)],
            )],
        );
        crate::import::import(&proto.encode_to_vec(), None).expect("imports")
    }

    #[test]
    fn resizes_between_convolutions_run_nhwc() {
        if !cotenant_kernels::nhwc_conv::available() {
            eprintln!("skipped: this CPU lacks AVX-512F and AVX2");
            return;
        }
        let mut g = resized();
        crate::passes::optimize_for_cpu(&mut g);
        let names: Vec<String> = g.nodes.iter().map(|n| n.op.name()).collect();
        let transposes = names.iter().filter(|n| *n == "Transpose").count();
        assert_eq!(transposes, 2, "one in, one out: {names:?}");
        let x: Vec<f32> = (0..2 * 4 * 30)
            .map(|i| (i % 11) as f32 / 4.0 - 1.0)
            .collect();
        let x = Tensor::f32(vec![2, 4, 5, 6], x).expect("x");
        crate::passes::assert_same_outputs(&resized(), &g, &[("x".into(), x)], 1e-4);
    }
}
