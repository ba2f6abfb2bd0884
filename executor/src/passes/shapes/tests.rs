use super::*;
use crate::backend::CpuBackend;
use crate::ops::shape::ShapeOp;
use crate::passes::{fold_constants, remove_dead};
use crate::plan::Plan;
use crate::proto::ModelProto;
use crate::zoo::builder::{Builder, attr_int, attr_ints, value_info};
use prost::Message;

/// What a PyTorch export of `x.view(b, 8, 4, h // 4).transpose(1, 2).reshape(b, -1)` looks
/// like, plus `x.reshape(b, *x.shape[1:3])`, with x of shape [batch, 8, 32].
fn exported() -> Graph {
    let mut m = Builder::new(1, false);
    let s = m.node("Shape", &["x"], vec![]);
    let axis0 = m.const_i64("axis0", &[0]);
    let scalar = |m: &mut Builder, v: i64| {
        let c = m.const_i64("c", &[v]);
        m.node("Squeeze", &[&c, &axis0], vec![])
    };
    let (i0, i2, four) = (scalar(&mut m, 0), scalar(&mut m, 2), scalar(&mut m, 4));
    let b = m.node("Gather", &[&s, &i0], vec![]);
    let h = m.node("Gather", &[&s, &i2], vec![]);
    let head = m.node("Div", &[&h, &four], vec![]);
    let b1 = m.node("Unsqueeze", &[&b, &axis0], vec![]);
    let head1 = m.node("Unsqueeze", &[&head, &axis0], vec![]);
    let (c8, c4) = (m.const_i64("c8", &[8]), m.const_i64("c4", &[4]));
    let target = m.node(
        "Concat",
        &[&b1, &c8, &c4, &head1],
        vec![crate::zoo::builder::attr_int("axis", 0)],
    );
    let y = m.node("Reshape", &["x", &target], vec![]);
    let t = m.node("Transpose", &[&y], vec![attr_ints("perm", &[0, 2, 1, 3])]);
    let minus1 = m.const_i64("m1", &[-1]);
    let flat = m.node(
        "Concat",
        &[&b1, &minus1],
        vec![crate::zoo::builder::attr_int("axis", 0)],
    );
    let z = m.node("Reshape", &[&t, &flat], vec![]);
    m.node_rename_last(&z, "z");
    let (c1, c3) = (m.const_i64("s", &[1]), m.const_i64("e", &[3]));
    let middle = m.node("Slice", &[&s, &c1, &c3], vec![]);
    let same = m.node(
        "Concat",
        &[&b1, &middle],
        vec![crate::zoo::builder::attr_int("axis", 0)],
    );
    let w = m.node("Reshape", &["x", &same], vec![]);
    m.node_rename_last(&w, "w");
    let proto: ModelProto = m.finish(
        "export",
        13,
        vec![value_info("x", DType::F32, &[None, Some(8), Some(32)])],
        vec![
            value_info("z", DType::F32, &[None, Some(256)]),
            value_info("w", DType::F32, &[None, Some(8), Some(32)]),
        ],
    );
    crate::import::import(&proto.encode_to_vec(), None).expect("imports")
}

fn count(g: &Graph, name: &str) -> usize {
    g.nodes
        .iter()
        .filter(|n| match &n.op {
            Op::Shape(s) => s.name() == name,
            Op::Binary(Binary::Div) => name == "Div",
            _ => false,
        })
        .count()
}

#[test]
fn everything_but_the_batch_is_folded() {
    let mut g = exported();
    fold_constants(&mut g);
    assert!(fold_shapes(&mut g) > 0);
    fold_constants(&mut g);
    remove_dead(&mut g);
    // Left: Shape -> Gather(0) -> Unsqueeze -> Concat, for the batch, and the reshapes.
    assert_eq!(count(&g, "Div"), 0);
    assert_eq!(count(&g, "Slice"), 0);
    assert_eq!(count(&g, "Gather"), 1);
    assert_eq!(count(&g, "Shape"), 1);
    let concats: Vec<usize> = g
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::Shape(ShapeOp::Concat { .. })))
        .map(|n| n.inputs.len())
        .collect();
    assert_eq!(concats.len(), 3);
    // The head size (32 / 4) and the sliced [8, 32] are constants now.
    let has = |v: &[i64]| {
        g.constants
            .values()
            .any(|t| t.to_i64_vec().ok().as_deref() == Some(v))
    };
    assert!(has(&[8]) && has(&[8, 32]));
}

#[test]
fn folded_models_compute_the_same_at_any_batch() {
    let raw = Plan::build(&exported()).expect("plan");
    let mut g = exported();
    crate::passes::optimize(&mut g);
    let folded = Plan::build(&g).expect("plan");
    let be = CpuBackend::new(1);
    for batch in [1, 3] {
        let x: Vec<f32> = (0..batch * 256).map(|i| i as f32 * 0.5).collect();
        let input = || {
            vec![(
                "x".to_string(),
                Tensor::f32(vec![batch, 8, 32], x.clone()).expect("x"),
            )]
        };
        let want = raw.run(&be, input()).expect("raw runs");
        let got = folded.run(&be, input()).expect("folded runs");
        assert_eq!(got.len(), 2);
        for ((n1, a), (n2, b)) in want.iter().zip(&got) {
            assert_eq!(n1, n2);
            assert_eq!(a.shape, b.shape, "{n1} at batch {batch}");
            assert_eq!(a.as_f32().expect("f32"), b.as_f32().expect("f32"));
        }
        assert_eq!(got[0].1.shape, vec![batch, 256]);
    }
}

#[test]
fn symbolic_products_and_reshapes() {
    let b = || Sym::Named("batch".into());
    let k = Sym::Known;
    assert_eq!(product(&[k(2), k(3)]), k(6));
    assert_eq!(product(&[b(), k(1)]), b());
    assert_eq!(product(&[b(), k(2)]), Sym::Unknown);
    // [batch, 8, 32] -> [batch, -1] = [batch, 256]; -> [-1, 32] = unknown (8·batch).
    let x = [b(), k(8), k(32)];
    assert_eq!(reshape(&x, &[b(), k(-1)], false), vec![b(), k(256)]);
    assert_eq!(reshape(&x, &[k(-1), k(256)], false), vec![b(), k(256)]);
    assert_eq!(
        reshape(&x, &[k(-1), k(32)], false),
        vec![Sym::Unknown, k(32)]
    );
    assert_eq!(
        reshape(&x, &[k(0), k(0), k(4), k(8)], false)[..2],
        [b(), k(8)]
    );
    assert_eq!(
        broadcast_all(&[&vec![b(), k(1)], &vec![k(1), k(5)]]),
        Some(vec![b(), k(5)])
    );
}

/// Shape arithmetic knows Mod in both forms; a zero divisor or an overflow leaves the element
/// to run time.
#[test]
fn shape_arithmetic_takes_remainders_with_either_sign() {
    let k = |v: i64| Some(vec![Sym::Known(v)]);
    let rem = |op, a: i64, b: i64| arithmetic(op, k(a).as_ref(), k(b).as_ref());
    assert_eq!(rem(Binary::Mod, -7, 3), k(2));
    assert_eq!(rem(Binary::Mod, 7, -3), k(-2));
    assert_eq!(rem(Binary::Fmod, -7, 3), k(-1));
    assert_eq!(rem(Binary::Mod, 7, 0), Some(vec![Sym::Unknown]));
    assert_eq!(rem(Binary::Mod, i64::MIN, -1), Some(vec![Sym::Unknown]));
}

/// Normalisations, scatters, CumSum and Trilu keep their input's shape, symbols included.
#[test]
fn shape_keeping_ops_keep_symbolic_shapes() {
    let x = Known {
        shape: Some(vec![
            Sym::Named("batch".into()),
            Sym::Known(4),
            Sym::Known(6),
        ]),
        elements: None,
        int32: false,
    };
    let ops = [
        Op::GroupNorm {
            groups: Some(2),
            eps: 1e-5,
            per_group: false,
        },
        Op::CumSum {
            exclusive: false,
            reverse: false,
        },
        Op::Shape(ShapeOp::Trilu { upper: true }),
        Op::Index(IndexOp::ScatterNd {
            reduction: crate::ops::index::Reduction::Add,
        }),
    ];
    for op in ops {
        let out = infer_node(&op, &[&x, &UNKNOWN, &UNKNOWN], &[], 1);
        assert_eq!(out[0].shape, x.shape, "{}", op.name());
    }
}

/// `Gemm(Reshape(Transpose(LSTM(x).Y), [-1, 3]), W)`, x of `[5, batch, 4]`: the LSTM's output
/// shape gives the Gemm's input its rank, so that the Gemm's weight is packed on the CPU.
#[test]
fn a_recurrent_layers_outputs_have_their_shapes() {
    let graph = || {
        let mut m = Builder::new(2, false);
        let w = m.normal("w", &[1, 12, 4], 0.3);
        let r = m.normal("r", &[1, 12, 3], 0.3);
        let y = m.node("LSTM", &["x", &w, &r], vec![attr_int("hidden_size", 3)]);
        let t = m.node("Transpose", &[&y], vec![attr_ints("perm", &[0, 2, 1, 3])]);
        let rows = m.const_i64("rows", &[-1, 3]);
        let flat = m.node("Reshape", &[&t, &rows], vec![]);
        let proj = m.normal("proj", &[7, 3], 0.3);
        let out = m.node("Gemm", &[&flat, &proj], vec![attr_int("transB", 1)]);
        m.node_rename_last(&out, "y");
        let proto: ModelProto = m.finish(
            "lstm",
            14,
            vec![value_info("x", DType::F32, &[Some(5), None, Some(4)])],
            vec![value_info("y", DType::F32, &[None, Some(7)])],
        );
        crate::import::import(&proto.encode_to_vec(), None).expect("imports")
    };
    let g = graph();
    let ranks = known_ranks(&g);
    let lstm = &g.nodes[0];
    assert_eq!(ranks.get(&lstm.outputs[0]), Some(&4), "Y");
    assert_eq!(
        ranks.get(&g.nodes[2].outputs[0]),
        Some(&2),
        "the Gemm's input"
    );
    if !cotenant_kernels::nhwc_conv::available() {
        return;
    }
    let mut optimized = graph();
    crate::passes::optimize_for_cpu(&mut optimized);
    assert!(
        optimized.nodes.iter().any(|n| matches!(
            n.op,
            Op::MatMul {
                packed: Some(_),
                ..
            }
        )),
        "the Gemm runs packed"
    );
    let be = CpuBackend::new(1);
    let x = Tensor::f32(
        vec![5, 2, 4],
        (0..40).map(|i| (i as f32 * 0.3).cos()).collect(),
    )
    .unwrap();
    let want = Plan::build(&g)
        .unwrap()
        .run(&be, vec![("x".into(), x.clone())])
        .unwrap();
    let got = Plan::build(&optimized)
        .unwrap()
        .run(&be, vec![("x".into(), x)])
        .unwrap();
    let (want, got) = (want[0].1.as_f32().unwrap(), got[0].1.as_f32().unwrap());
    assert_eq!(want.len(), 70);
    for (a, b) in want.iter().zip(got) {
        assert!((a - b).abs() <= 1e-5 * (1.0 + a.abs()), "{a} against {b}");
    }
}

/// jax2tf's one-hot: `Expand(Reshape(x, [-1, 8, 1]), Cast64(Concat(Slice(Cast32(Shape(x))),
/// [8, 1])))`, then a strided Slice of the result. The sizes survive the int32 round trip, so
/// Expand's target and every output's rank are known.
#[test]
fn int32_shapes_expand_and_slices_keep_their_ranks() {
    let mut m = Builder::new(3, false);
    let s = m.node("Shape", &["x"], vec![]);
    let s32 = m.node("Cast", &[&s], vec![attr_int("to", 6)]);
    let (c0, c1) = (m.const_i64("c0", &[0]), m.const_i64("c1", &[1]));
    let batch = m.node("Slice", &[&s32, &c0, &c1, &c0], vec![]);
    let rest = m.const_i64("rest", &[8, 1]);
    let rest = m.node("Cast", &[&rest], vec![attr_int("to", 6)]);
    let target = m.node("Concat", &[&batch, &rest], vec![attr_int("axis", 0)]);
    let target = m.node("Cast", &[&target], vec![attr_int("to", 7)]);
    let shape = m.const_i64("shape", &[-1, 8, 1]);
    let r = m.node("Reshape", &["x", &shape], vec![]);
    let e = m.node("Expand", &[&r, &target], vec![]);
    let (c2, c5) = (m.const_i64("c2", &[2]), m.const_i64("c5", &[5]));
    let cut = m.node("Slice", &[&e, &c1, &c5, &c1, &c2], vec![]);
    m.node_rename_last(&cut, "y");
    let proto: ModelProto = m.finish(
        "one_hot",
        13,
        vec![value_info("x", DType::F32, &[None, Some(8)])],
        vec![value_info("y", DType::F32, &[None, Some(2), Some(1)])],
    );
    let g = crate::import::import(&proto.encode_to_vec(), None).expect("imports");
    let ranks = known_ranks(&g);
    let rank = |op: &str| {
        let n = g.nodes.iter().rfind(|n| n.op.name() == op).expect(op);
        ranks.get(&n.outputs[0]).copied()
    };
    assert_eq!(rank("Expand"), Some(3));
    assert_eq!(rank("Slice"), Some(3), "a strided slice of a rank-3 value");
}

/// What a T5 exported and dynamically quantized needs for its values' ranks: reductions with
/// their axes as an input, Range, ConstantOfShape, and the integer products.
#[test]
fn reductions_ranges_and_integer_products_have_shapes() {
    use crate::ops::quant::QuantOp;
    use crate::ops::reduce::{ReduceAttrs, ReduceKind};
    let x = Known {
        shape: Some(vec![
            Sym::Named("batch".into()),
            Sym::Known(12),
            Sym::Known(8),
        ]),
        elements: None,
        int32: false,
    };
    let axes = Tensor::i64(vec![1], vec![-1]).unwrap();
    for (keepdims, want) in [
        (
            true,
            vec![Sym::Named("batch".into()), Sym::Known(12), Sym::Known(1)],
        ),
        (false, vec![Sym::Named("batch".into()), Sym::Known(12)]),
    ] {
        let mean = Op::Reduce(ReduceAttrs {
            kind: ReduceKind::ReduceMean,
            axes: None,
            keepdims,
            noop_with_empty_axes: false,
        });
        let out = infer_node(&mean, &[&x, &UNKNOWN], &[None, Some(&axes)], 1);
        assert_eq!(out[0].shape, Some(want), "keepdims {keepdims}");
    }
    let all = Op::Reduce(ReduceAttrs {
        kind: ReduceKind::ReduceSum,
        axes: None,
        keepdims: false,
        noop_with_empty_axes: false,
    });
    assert_eq!(infer_node(&all, &[&x], &[None], 1)[0].shape, Some(vec![]));
    let quantized = infer_node(&Op::Quant(QuantOp::DynamicQuantize), &[&x], &[None], 3);
    assert_eq!(quantized[0].shape, x.shape);
    assert_eq!(
        (quantized[1].shape.clone(), quantized[2].shape.clone()),
        (Some(vec![]), Some(vec![]))
    );
    let w = Known {
        shape: Some(vec![Sym::Known(8), Sym::Known(5)]),
        elements: None,
        int32: false,
    };
    let product = infer_node(&Op::Quant(QuantOp::MatMulInteger), &[&x, &w], &[], 1);
    assert_eq!(
        product[0].shape,
        Some(vec![
            Sym::Named("batch".into()),
            Sym::Known(12),
            Sym::Known(5)
        ])
    );
    assert_eq!(
        infer_node(&Op::Shape(ShapeOp::Range), &[], &[], 1)[0].shape,
        Some(vec![Sym::Unknown])
    );
    let three = Known {
        shape: Some(vec![Sym::Known(3)]),
        elements: None,
        int32: false,
    };
    let filled = infer_node(
        &Op::Shape(ShapeOp::ConstantOfShape {
            value: Tensor::f32(vec![1], vec![0.0]).unwrap(),
        }),
        &[&three],
        &[None],
        1,
    );
    assert_eq!(filled[0].shape, Some(vec![Sym::Unknown; 3]));
}

/// tf2onnx's reshape target in int32: `Reshape(x, Cast64(Concat(Slice(Cast32(Shape(x))),
/// [4, 2] as int32)))`. With a fixed batch the target folds, and every folded value keeps its
/// type (an int64 constant in place of the int32 slice met the int32 [4, 2] in the Concat);
/// with a symbolic one the output's rank is known.
#[test]
fn int32_shape_tensors_fold_as_int32() {
    let model = |batch: Option<usize>| {
        let mut m = Builder::new(3, false);
        let s = m.node("Shape", &["x"], vec![]);
        let s32 = m.node("Cast", &[&s], vec![attr_int("to", 6)]);
        let (c0, c1) = (m.const_i64("c0", &[0]), m.const_i64("c1", &[1]));
        let b = m.node("Slice", &[&s32, &c0, &c1, &c0], vec![]);
        let rest = m.const_i64("rest", &[4, 2]);
        let rest = m.node("Cast", &[&rest], vec![attr_int("to", 6)]);
        let target = m.node("Concat", &[&b, &rest], vec![attr_int("axis", 0)]);
        let target = m.node("Cast", &[&target], vec![attr_int("to", 7)]);
        let r = m.node("Reshape", &["x", &target], vec![]);
        m.node_rename_last(&r, "y");
        let proto: ModelProto = m.finish(
            "int32_target",
            13,
            vec![value_info("x", DType::F32, &[batch, Some(8)])],
            vec![value_info("y", DType::F32, &[batch, Some(4), Some(2)])],
        );
        crate::import::import(&proto.encode_to_vec(), None).expect("imports")
    };
    let g = model(None);
    let reshape = g.nodes.iter().rfind(|n| n.op.name() == "Reshape").unwrap();
    assert_eq!(known_ranks(&g).get(&reshape.outputs[0]), Some(&3));
    let mut g = model(Some(2));
    crate::passes::optimize_for_cpu(&mut g);
    let x = Tensor::f32(vec![2, 8], (0..16).map(|i| i as f32).collect()).unwrap();
    let y = Plan::build(&g)
        .unwrap()
        .run(&CpuBackend::new(1), vec![("x".into(), x)])
        .expect("runs");
    assert_eq!(y[0].1.shape, [2, 4, 2]);
    assert_eq!(
        y[0].1.as_f32().unwrap(),
        (0..16).map(|i| i as f32).collect::<Vec<_>>()
    );
}
