//! Every family's lowering, run on the simulated device and compared with the CPU op, whole and
//! in pieces: resizing must never change what a step computes, and its pieces must be launches
//! over parts of the same buffers, not copies.

use crate::backend::CpuBackend;
use crate::gpu::instance::Coordination;
use crate::gpu::record::{Call, Recorder};
use crate::gpu::{Budget, Instance, SimDevice, StepKind, Weights};
use crate::plan::{Model, Plan};
use crate::proto::AttributeProto;
use crate::tensor::{DType, Tensor};
use crate::zoo::builder::{Builder, Rng, attr_float, attr_int, attr_ints, value_info};
use prost::Message;
use std::sync::Arc;

/// A graph of one node reading the model inputs `inputs` (name, shape) and the initializers
/// `consts` adds, with the given attributes; output `y`.
fn single(
    op: &str,
    inputs: &[(&str, &[usize])],
    consts: impl FnOnce(&mut Builder) -> Vec<String>,
    attrs: Vec<AttributeProto>,
    opset: i64,
) -> Arc<Model> {
    let mut b = Builder::new(7, false);
    let extra = consts(&mut b);
    let mut names: Vec<&str> = inputs.iter().map(|(n, _)| *n).collect();
    names.extend(extra.iter().map(String::as_str));
    let y = b.node(op, &names, attrs);
    b.node_rename_last(&y, "y");
    let decl = inputs
        .iter()
        .map(|(n, s)| {
            let dims: Vec<Option<usize>> = s.iter().map(|&d| Some(d)).collect();
            value_info(n, DType::F32, &dims)
        })
        .collect();
    let proto = b.finish("one", opset, decl, vec![value_info("y", DType::F32, &[])]);
    let g = crate::import::import(&proto.encode_to_vec(), None).expect("imports");
    Arc::new(Model {
        plan: Plan::build(&g).expect("plans"),
    })
}

fn random(shape: &[usize], seed: u64) -> Tensor {
    let mut r = Rng::new(seed);
    let n: usize = shape.iter().product();
    Tensor::f32(shape.to_vec(), (0..n).map(|_| r.normal()).collect()).expect("tensor")
}

struct Pieces(usize);
impl Coordination for Pieces {
    fn pieces(&self, _: usize) -> usize {
        self.0
    }
}

/// The largest difference between two outputs, relative to the reference's magnitude (at
/// least 1).
pub(crate) fn max_rel_diff(a: &Tensor, b: &Tensor) -> f32 {
    let (a, b) = (a.as_f32().expect("f32"), b.as_f32().expect("f32"));
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            if x.is_nan() && y.is_nan() {
                0.0
            } else {
                (x - y).abs()
            }
        })
        .fold(0.0, f32::max)
        / scale
}

/// Runs the model on the CPU and on the simulated device in 1, 2, 3 and 5 pieces; the device
/// outputs match the CPU's, every step ran on the device, and a step that can split did, into
/// launches over the same buffers.
fn check(model: &Arc<Model>, inputs: &[(&str, Tensor)]) {
    let inputs: Vec<(String, Tensor)> = inputs
        .iter()
        .map(|(n, t)| (n.to_string(), t.clone()))
        .collect();
    let want = model
        .plan
        .run(&CpuBackend::new(1), inputs.clone())
        .expect("the CPU runs it");
    let sim: Arc<dyn crate::gpu::DeviceApi> = Arc::new(SimDevice::new(8, 1 << 30));
    let rec = Arc::new(Recorder::new(sim));
    let budget = Budget::new("t", u64::MAX);
    let dev: Arc<dyn crate::gpu::DeviceApi> = rec.clone();
    let weights = Weights::upload(dev.clone(), &model.plan.constants, &budget).expect("weights");
    let mut inst = Instance::new(dev, model.clone(), weights, budget, None).expect("instance");
    let shapes: Vec<Vec<usize>> = inputs.iter().map(|(_, t)| t.shape.clone()).collect();
    let layout = inst.layout(&shapes).expect("layout");
    assert!(
        layout
            .kinds
            .iter()
            .all(|k| !matches!(k, StepKind::Fallback(_))),
        "{:?}",
        layout.fallbacks(&model.plan)
    );
    let splits = layout.max_pieces.iter().copied().max().unwrap_or(1);
    let mut work_whole = 0;
    for pieces in [1, 2, 3, 5] {
        rec.take();
        let got = inst
            .run(inputs.clone(), &Pieces(pieces))
            .unwrap_or_else(|e| panic!("{pieces} pieces: {e}"));
        for ((n, g), (_, w)) in got.iter().zip(&want) {
            assert_eq!(g.shape, w.shape, "{n}, {pieces} pieces");
            let d = max_rel_diff(g, w);
            assert!(d <= 1e-5, "{n}: {pieces} pieces differ by {d}");
        }
        let calls = rec.take();
        let work: Vec<&Call> = calls
            .iter()
            .filter(|c| matches!(c, Call::Launch { .. } | Call::Gemm { .. }))
            .collect();
        if pieces == 1 {
            work_whole = work.len();
        } else if splits >= pieces {
            assert!(
                work.len() > work_whole,
                "{pieces} pieces: {} launches, as many as whole",
                work.len()
            );
        }
        // Pieces are launches over the same buffers: no copy besides each input's one up and
        // each output's one down.
        let ups = calls
            .iter()
            .filter(|c| matches!(c, Call::CopyHtoD { .. }))
            .count();
        let downs = calls
            .iter()
            .filter(|c| matches!(c, Call::CopyDtoH { .. }))
            .count();
        assert_eq!((ups, downs), (inputs.len(), want.len()), "{pieces} pieces");
    }
}

fn x(shape: &[usize]) -> (&'static str, Tensor) {
    ("x", random(shape, 11))
}

#[test]
fn unary_and_clip() {
    for op in [
        "Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Abs", "Neg", "Softplus", "Floor",
    ] {
        check(
            &single(op, &[("x", &[2, 3, 5])], |_| vec![], vec![], 13),
            &[x(&[2, 3, 5])],
        );
    }
    let m = single(
        "LeakyRelu",
        &[("x", &[4, 7])],
        |_| vec![],
        vec![attr_float("alpha", 0.2)],
        13,
    );
    check(&m, &[x(&[4, 7])]);
    let m = single(
        "Clip",
        &[("x", &[4, 7])],
        |b| vec![b.const_f32("lo", -0.5), b.const_f32("hi", 0.75)],
        vec![],
        13,
    );
    check(&m, &[x(&[4, 7])]);
}

#[test]
fn binary_same_shape_scalar_and_broadcast() {
    let m = single(
        "Add",
        &[("x", &[3, 4]), ("z", &[3, 4])],
        |_| vec![],
        vec![],
        13,
    );
    check(&m, &[x(&[3, 4]), ("z", random(&[3, 4], 2))]);
    let m = single(
        "Mul",
        &[("x", &[3, 4])],
        |b| vec![b.const_f32("s", 0.5)],
        vec![],
        13,
    );
    check(&m, &[x(&[3, 4])]);
    let m = single(
        "Sub",
        &[("x", &[2, 3, 4])],
        |b| vec![b.normal("c", &[3, 1], 1.0)],
        vec![],
        13,
    );
    check(&m, &[x(&[2, 3, 4])]);
    let m = single(
        "Div",
        &[("x", &[5, 1, 4]), ("z", &[3, 1])],
        |_| vec![],
        vec![],
        13,
    );
    check(&m, &[x(&[5, 1, 4]), ("z", random(&[3, 1], 3))]);
}

fn conv_attrs(k: usize, stride: usize, pad: usize, group: usize) -> Vec<AttributeProto> {
    vec![
        attr_ints("kernel_shape", &[k as i64, k as i64]),
        attr_ints("strides", &[stride as i64, stride as i64]),
        attr_ints("pads", &[pad as i64; 4]),
        attr_int("group", group as i64),
    ]
}

#[test]
fn convolutions_of_every_kind_at_batch_one_and_more() {
    for n in [1, 3] {
        // 1x1 (a plain GEMM), 3x3 strided with padding (im2col), depthwise with a multiplier,
        // grouped (the direct kernel).
        for (cin, cout, k, stride, pad, group) in [
            (8, 16, 1, 1, 0, 1),
            (4, 6, 3, 2, 1, 1),
            (4, 8, 3, 1, 1, 4),
            (6, 4, 3, 1, 1, 2),
        ] {
            let shape = [n, cin, 9, 9];
            let m = single(
                "Conv",
                &[("x", &shape)],
                |b| {
                    vec![
                        b.normal("w", &[cout, cin / group, k, k], 0.3),
                        b.normal("b", &[cout], 0.1),
                    ]
                },
                conv_attrs(k, stride, pad, group),
                13,
            );
            check(&m, &[x(&shape)]);
        }
    }
}

#[test]
fn fused_convolutions_match_the_cpu_in_pieces() {
    // Conv → Relu → Add(residual) and a 1x1 → depthwise → 1x1 block, as the passes fuse them.
    let mut b = Builder::new(3, false);
    let w1 = b.normal("w1", &[12, 6, 1, 1], 0.3);
    let w2 = b.normal("w2", &[12, 1, 3, 3], 0.3);
    let w3 = b.normal("w3", &[6, 12, 1, 1], 0.3);
    let e = b.node(
        "Conv",
        &["x", &w1],
        vec![attr_ints("kernel_shape", &[1, 1])],
    );
    let e = b.node("Relu", &[&e], vec![]);
    let d = b.node("Conv", &[&e, &w2], conv_attrs(3, 1, 1, 12));
    let d = b.node(
        "Clip",
        &[&d],
        vec![attr_float("min", 0.0), attr_float("max", 6.0)],
    );
    let p = b.node("Conv", &[&d, &w3], vec![attr_ints("kernel_shape", &[1, 1])]);
    let y = b.node("Add", &[&p, "x"], vec![]);
    b.node_rename_last(&y, "y");
    let proto = b.finish(
        "block",
        11,
        vec![value_info(
            "x",
            DType::F32,
            &[None, Some(6), Some(8), Some(8)],
        )],
        vec![value_info("y", DType::F32, &[])],
    );
    let m =
        Arc::new(Model::from_bytes_for(&proto.encode_to_vec(), crate::Target::Gpu).expect("loads"));
    assert!(
        m.plan
            .steps
            .iter()
            .any(|s| matches!(s.op, crate::ops::Op::PointwiseDepthwise(_))),
        "the passes fused the block"
    );
    for n in [1, 4] {
        check(&m, &[x(&[n, 6, 8, 8])]);
    }
}

#[test]
fn gemm_and_matmul_in_rows_and_columns() {
    for (m_rows, ta, tb) in [(1, false, true), (5, false, false), (4, true, true)] {
        let (k, n) = (6, 7);
        let a_shape = if ta { [k, m_rows] } else { [m_rows, k] };
        let b_shape = if tb { [n, k] } else { [k, n] };
        let m = single(
            "Gemm",
            &[("x", &a_shape)],
            |b| vec![b.normal("w", &b_shape, 0.5), b.normal("c", &[n], 0.5)],
            vec![
                attr_int("transA", ta as i64),
                attr_int("transB", tb as i64),
                attr_float("alpha", 0.5),
                attr_float("beta", 2.0),
            ],
            13,
        );
        check(&m, &[x(&a_shape)]);
    }
    // A full C matrix, and a per-row bias.
    for c_shape in [[3, 4], [3, 1]] {
        let m = single(
            "Gemm",
            &[("x", &[3, 5])],
            |b| vec![b.normal("w", &[5, 4], 0.5), b.normal("c", &c_shape, 0.5)],
            vec![attr_float("beta", 0.5)],
            13,
        );
        check(&m, &[x(&[3, 5])]);
    }
    // Tall (B shared), batched with broadcast, and at one row.
    let m = single(
        "MatMul",
        &[("x", &[2, 3, 6])],
        |b| vec![b.normal("w", &[6, 5], 0.5)],
        vec![],
        13,
    );
    check(&m, &[x(&[2, 3, 6])]);
    let m = single(
        "MatMul",
        &[("x", &[2, 2, 3, 4]), ("z", &[2, 2, 4, 5])],
        |_| vec![],
        vec![],
        13,
    );
    check(&m, &[x(&[2, 2, 3, 4]), ("z", random(&[2, 2, 4, 5], 5))]);
    let m = single(
        "MatMul",
        &[("x", &[1, 4]), ("z", &[3, 4, 5])],
        |_| vec![],
        vec![],
        13,
    );
    check(&m, &[x(&[1, 4]), ("z", random(&[3, 4, 5], 5))]);
}

#[test]
fn pooling_and_global_pooling() {
    for (op, attrs) in [
        (
            "MaxPool",
            vec![
                attr_ints("kernel_shape", &[3, 3]),
                attr_ints("strides", &[2, 2]),
                attr_ints("pads", &[1, 1, 1, 1]),
            ],
        ),
        (
            "AveragePool",
            vec![
                attr_ints("kernel_shape", &[3, 3]),
                attr_ints("strides", &[2, 2]),
                attr_ints("pads", &[1, 1, 1, 1]),
                attr_int("ceil_mode", 1),
                attr_int("count_include_pad", 1),
            ],
        ),
        ("GlobalAveragePool", vec![]),
        ("GlobalMaxPool", vec![]),
    ] {
        for n in [1, 2] {
            let shape = [n, 3, 8, 8];
            check(
                &single(op, &[("x", &shape)], |_| vec![], attrs.clone(), 13),
                &[x(&shape)],
            );
        }
    }
}

#[test]
fn row_ops_softmax_layernorm_reduce() {
    check(
        &single(
            "Softmax",
            &[("x", &[2, 3, 7])],
            |_| vec![],
            vec![attr_int("axis", -1)],
            13,
        ),
        &[x(&[2, 3, 7])],
    );
    check(
        &single("LogSoftmax", &[("x", &[4, 9])], |_| vec![], vec![], 13),
        &[x(&[4, 9])],
    );
    let m = single(
        "LayerNormalization",
        &[("x", &[2, 3, 8])],
        |b| vec![b.normal("g", &[8], 1.0), b.normal("b", &[8], 0.1)],
        vec![attr_int("axis", -1), attr_float("epsilon", 1e-5)],
        17,
    );
    check(&m, &[x(&[2, 3, 8])]);
    for (op, axes, keep) in [
        ("ReduceMean", vec![-1], 1),
        ("ReduceSum", vec![1, 2], 0),
        ("ReduceMax", vec![0], 1),
        ("ReduceL2", vec![2], 0),
    ] {
        let m = single(
            op,
            &[("x", &[3, 4, 5])],
            |_| vec![],
            vec![attr_ints("axes", &axes), attr_int("keepdims", keep)],
            13,
        );
        check(&m, &[x(&[3, 4, 5])]);
    }
}

#[test]
fn data_movement() {
    for perm in [vec![0, 2, 1], vec![2, 0, 1]] {
        let m = single(
            "Transpose",
            &[("x", &[2, 33, 40])],
            |_| vec![],
            vec![attr_ints("perm", &perm)],
            13,
        );
        check(&m, &[x(&[2, 33, 40])]);
    }
    let m = single(
        "Concat",
        &[("x", &[2, 3]), ("z", &[2, 5])],
        |b| vec![b.normal("c", &[2, 1], 1.0)],
        vec![attr_int("axis", 1)],
        13,
    );
    check(&m, &[x(&[2, 3]), ("z", random(&[2, 5], 4))]);
    let m = single(
        "Slice",
        &[("x", &[4, 10])],
        |b| {
            vec![
                b.const_i64("s", &[1, 8]),
                b.const_i64("e", &[4, 1]),
                b.const_i64("a", &[0, 1]),
                b.const_i64("st", &[2, -3]),
            ]
        },
        vec![],
        13,
    );
    check(&m, &[x(&[4, 10])]);
    let m = single(
        "Pad",
        &[("x", &[2, 3, 4])],
        |b| vec![b.const_i64("p", &[0, 1, 2, 0, 2, 1])],
        vec![],
        13,
    );
    check(&m, &[x(&[2, 3, 4])]);
}

#[test]
fn gather_with_request_indices_is_checked_on_the_host() {
    let mut b = Builder::new(1, false);
    let table = b.normal("emb", &[10, 4], 1.0);
    let y = b.node("Gather", &[&table, "ids"], vec![attr_int("axis", 0)]);
    b.node_rename_last(&y, "y");
    let proto = b.finish(
        "emb",
        13,
        vec![value_info("ids", DType::I64, &[None, Some(3)])],
        vec![value_info("y", DType::F32, &[])],
    );
    let m =
        Arc::new(Model::from_bytes_for(&proto.encode_to_vec(), crate::Target::Gpu).expect("loads"));
    let ids = Tensor::i64(vec![2, 3], vec![0, 9, -1, 3, 4, 5]).expect("ids");
    check(&m, &[("ids", ids)]);
    let dev: Arc<dyn crate::gpu::DeviceApi> = Arc::new(SimDevice::new(8, 1 << 30));
    let budget = Budget::new("t", u64::MAX);
    let w = Weights::upload(dev.clone(), &m.plan.constants, &budget).expect("weights");
    let mut inst = Instance::new(dev, m.clone(), w, budget, None).expect("instance");
    let bad = Tensor::i64(vec![1, 3], vec![0, 10, 1]).expect("ids");
    let e = inst
        .run(vec![("ids".into(), bad)], &crate::gpu::Alone)
        .unwrap_err();
    assert!(e.to_string().contains("out of range"), "{e}");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

    /// For random convolutions of every kind and random matrix products, at batch 1 (channel,
    /// row or column splits) and above (image or member splits), every split computes what the
    /// whole step does (`check` runs 1, 2, 3 and 5 pieces).
    #[test]
    fn every_split_kind_computes_what_the_whole_step_does(
        n in 1usize..4,
        cin_unit in 1usize..4,
        kind in 0usize..3,
        k in proptest::sample::select(vec![1usize, 3]),
        stride in 1usize..3,
        (m, kk, nn) in (1usize..9, 1usize..9, 1usize..9),
        trans in proptest::prelude::any::<(bool, bool)>(),
    ) {
        // Conv: plain, depthwise (multiplier 2) or grouped (2 groups).
        let (cin, cout, group) = match kind {
            0 => (cin_unit * 2, cin_unit * 3, 1),
            1 => (cin_unit * 2, cin_unit * 4, cin_unit * 2),
            _ => (cin_unit * 2, 4, 2),
        };
        let shape = [n, cin, 7, 6];
        let conv = single(
            "Conv",
            &[("x", &shape)],
            |b| vec![b.normal("w", &[cout, cin / group, k, k], 0.3), b.normal("b", &[cout], 0.1)],
            conv_attrs(k, stride, k / 2, group),
            13,
        );
        check(&conv, &[x(&shape)]);
        // Gemm of m rows (one row: columns split), transposes at random.
        let a_shape = if trans.0 { [kk, m] } else { [m, kk] };
        let b_shape = if trans.1 { [nn, kk] } else { [kk, nn] };
        let gemm = single(
            "Gemm",
            &[("x", &a_shape)],
            |b| vec![b.normal("w", &b_shape, 0.5), b.normal("c", &[nn], 0.5)],
            vec![attr_int("transA", trans.0 as i64), attr_int("transB", trans.1 as i64)],
            13,
        );
        check(&gemm, &[x(&a_shape)]);
        // Batched MatMul of n members (one member: rows split).
        let a3 = [n, m, kk];
        let mm = single("MatMul", &[("x", &a3), ("z", &[n, kk, nn])], |_| vec![], vec![], 13);
        check(&mm, &[x(&a3), ("z", random(&[n, kk, nn], 9))]);
    }
}

/// Runs the model on the CPU and on the simulated device; every step has no device path and
/// runs on the host (a fallback, never a device kernel computing something else), and the
/// outputs agree.
fn falls_back(model: &Arc<Model>, inputs: &[(&str, Tensor)]) {
    let inputs: Vec<(String, Tensor)> = inputs
        .iter()
        .map(|(n, t)| (n.to_string(), t.clone()))
        .collect();
    let want = model
        .plan
        .run(&CpuBackend::new(1), inputs.clone())
        .expect("the CPU runs it");
    let sim: Arc<dyn crate::gpu::DeviceApi> = Arc::new(SimDevice::new(8, 1 << 30));
    let budget = Budget::new("t", u64::MAX);
    let weights = Weights::upload(sim.clone(), &model.plan.constants, &budget).expect("weights");
    let mut inst = Instance::new(sim, model.clone(), weights, budget, None).expect("instance");
    let shapes: Vec<Vec<usize>> = inputs.iter().map(|(_, t)| t.shape.clone()).collect();
    let layout = inst.layout(&shapes).expect("layout");
    assert!(
        layout
            .kinds
            .iter()
            .all(|k| matches!(k, StepKind::Fallback(_))),
        "{:?}",
        layout.kinds
    );
    let got = inst.run(inputs, &Pieces(1)).expect("runs");
    for ((n, g), (_, w)) in got.iter().zip(&want) {
        assert_eq!(g.shape, w.shape, "{n}");
        assert!(max_rel_diff(g, w) <= 1e-6, "{n}");
    }
}

#[test]
fn ops_without_a_device_path_run_on_the_host() {
    let shape = [2, 4, 5, 6, 7];
    let conv = single(
        "Conv",
        &[("x", &shape)],
        |b| vec![b.normal("w", &[6, 2, 3, 3, 3], 0.3)],
        vec![attr_ints("pads", &[1, 1, 1, 1, 1, 1]), attr_int("group", 2)],
        13,
    );
    falls_back(&conv, &[x(&shape)]);
    let transpose = single(
        "ConvTranspose",
        &[("x", &shape)],
        |b| vec![b.normal("w", &[4, 3, 2, 2, 2], 0.3)],
        vec![attr_ints("strides", &[2, 2, 2])],
        13,
    );
    falls_back(&transpose, &[x(&shape)]);
    for op in ["MaxPool", "AveragePool", "LpPool"] {
        let pool = single(
            op,
            &[("x", &shape)],
            |_| vec![],
            vec![
                attr_ints("kernel_shape", &[3, 2, 3]),
                attr_ints("strides", &[2, 1, 2]),
            ],
            13,
        );
        falls_back(&pool, &[x(&shape)]);
    }
    // A 2-D window of more taps than its plane: the device would walk them all.
    let huge = 1 << 20;
    for op in ["MaxPool", "AveragePool"] {
        let pool = single(
            op,
            &[("x", &[1, 2, 3, 3])],
            |_| vec![],
            vec![
                attr_ints("kernel_shape", &[huge, 2]),
                attr_ints("strides", &[huge, 1]),
                attr_ints("pads", &[huge - 2, 0, huge - 2, 0]),
            ],
            13,
        );
        falls_back(&pool, &[x(&[1, 2, 3, 3])]);
    }
    // Ops with no device path at all.
    let det = single("Det", &[("x", &[3, 4, 4])], |_| vec![], vec![], 22);
    falls_back(&det, &[x(&[3, 4, 4])]);
    let dft = single(
        "DFT",
        &[("x", &[2, 8, 1])],
        |_| vec![],
        vec![attr_int("axis", 1)],
        17,
    );
    falls_back(&dft, &[x(&[2, 8, 1])]);
    let scatter = single(
        "TensorScatter",
        &[("x", &[2, 5, 3]), ("u", &[2, 2, 3])],
        |_| vec![],
        vec![],
        24,
    );
    falls_back(&scatter, &[x(&[2, 5, 3]), ("u", random(&[2, 2, 3], 5))]);
}
