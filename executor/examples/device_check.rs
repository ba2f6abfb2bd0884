//! The GPU check: CUDA backend vs CPU backend on fresh random inputs, per kernel family and per
//! zoo model, then CUDA latency of resnet50 / mobilenet_v2 / bert at batch 1 and 8.
//!
//!     device_check --out results.md [--iters 20] [--skip-models] [--tf32]
//!
//! Exits 2 when there is no usable GPU (with the reason), 1 when a check failed, 0 otherwise.
//! The markdown report is written either way once a GPU was found.

use cotenant_executor::cuda::{CudaBackend, CudaOptions};
use cotenant_executor::ops::Activation;
use cotenant_executor::ops::Op;
use cotenant_executor::ops::conv::{ConvAttrs, PointwiseDepthwise};
use cotenant_executor::ops::elementwise::{Binary, Unary};
use cotenant_executor::ops::matmul::GemmAttrs;
use cotenant_executor::ops::pool::PoolAttrs;
use cotenant_executor::ops::reduce::{ReduceAttrs, ReduceKind};
use cotenant_executor::ops::shape::ShapeOp;
use cotenant_executor::zoo::{self, ZooOptions};
use cotenant_executor::{Backend, CpuBackend, Model, OpError, Tensor};
use prost::Message;
use std::fmt::Write as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

/// Weights of 4 MiB on a tenant with a 1 MiB budget: that tenant gets a device error naming its
/// budget, and `other` (unlimited) still takes the same weights and runs an op on the device.
fn budget_isolation(other: &CudaBackend, tf32: bool) -> String {
    let small = CudaBackend::new(CudaOptions {
        tenant: "small".into(),
        budget_bytes: 1 << 20,
        tf32,
        ..Default::default()
    });
    let weights = match Tensor::f32(vec![1 << 20], vec![0.5; 1 << 20]) {
        Ok(t) => Arc::new(t),
        Err(e) => return format!("Memory budget: FAIL ({e})"),
    };
    let refused = match small.map(|s| s.register_constants(std::slice::from_ref(&weights))) {
        Ok(Err(OpError::Device(why))) if why.contains("over budget") => Ok(why),
        other => Err(format!("expected over budget, got {other:?}")),
    };
    let relu = Op::Unary(Unary::Relu);
    let x = Tensor::f32(vec![4], vec![-1.0, 0.0, 1.0, 2.0]).ok();
    let still = other
        .register_constants(&[weights])
        .map_err(|e| e.to_string())
        .and_then(|_| {
            other
                .execute_device(&relu, &[x.as_ref()])
                .map_err(|e| e.to_string())
        });
    match (refused, still) {
        (Ok(why), Ok(Some(_))) => {
            format!("Memory budget: pass (the small tenant: \"{why}\"; the other ran)")
        }
        (r, s) => format!("Memory budget: FAIL (small tenant: {r:?}; other tenant: {s:?})"),
    }
}

/// fp32 kernels vs the CPU: max |cuda - cpu| / max |cpu|.
const KERNEL_TOL: f64 = 1e-4;
const KERNEL_TOL_TF32: f64 = 1e-3;
/// Whole models (dozens of layers, different summation orders) get a looser bound.
const MODEL_TOL: f64 = 1e-3;

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn tensor(&mut self, shape: &[usize], lo: f32, hi: f32) -> Tensor {
        let n = shape.iter().product();
        let v = (0..n)
            .map(|_| lo + (self.next() + 1.0) * 0.5 * (hi - lo))
            .collect();
        Tensor::f32(shape.to_vec(), v).unwrap()
    }
    fn ids(&mut self, shape: &[usize], below: i64) -> Tensor {
        let n = shape.iter().product();
        let v = (0..n)
            .map(|_| (((self.next() + 1.0) * 0.5 * below as f32) as i64).clamp(0, below - 1))
            .collect();
        Tensor::i64(shape.to_vec(), v).unwrap()
    }
}

/// max |a - b| / max |b| (NaN when they disagree on NaNs or shapes).
fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    if a.shape != b.shape {
        return f64::NAN;
    }
    let (Ok(a), Ok(b)) = (a.as_f32(), b.as_f32()) else {
        return if a == b { 0.0 } else { f64::NAN };
    };
    let mut diff = 0.0f64;
    let mut scale = 0.0f64;
    for (&x, &y) in a.iter().zip(b) {
        if x.is_nan() != y.is_nan() {
            return f64::NAN;
        }
        if x.is_nan() || (x.is_infinite() && x == y) {
            continue;
        }
        diff = diff.max((x as f64 - y as f64).abs());
        scale = scale.max((y as f64).abs());
    }
    diff / scale.max(1e-30)
}

fn conv_attrs(
    k: &[usize],
    pads: &[usize],
    strides: &[usize],
    group: usize,
    act: Option<Activation>,
) -> ConvAttrs {
    ConvAttrs {
        kernel_shape: Some(k.to_vec()),
        pads: Some(pads.to_vec()),
        strides: Some(strides.to_vec()),
        group,
        act,
        auto_pad: "NOTSET".into(),
        ..Default::default()
    }
}

fn conv(
    k: &[usize],
    pads: &[usize],
    strides: &[usize],
    group: usize,
    act: Option<Activation>,
) -> Op {
    Op::Conv(conv_attrs(k, pads, strides, group, act))
}

fn pool(max: bool, k: usize, s: usize, p: usize, ceil: bool, include_pad: bool) -> Op {
    Op::Pool(PoolAttrs {
        max,
        kernel_shape: vec![k, k],
        strides: Some(vec![s, s]),
        dilations: None,
        pads: Some(vec![p; 4]),
        auto_pad: "NOTSET".into(),
        ceil_mode: ceil,
        count_include_pad: include_pad,
    })
}

fn reduce(kind: ReduceKind, axes: &[i64], keepdims: bool) -> Op {
    Op::Reduce(ReduceAttrs {
        kind,
        axes: Some(axes.to_vec()),
        keepdims,
        noop_with_empty_axes: false,
    })
}

fn i64s(v: &[i64]) -> Tensor {
    Tensor::i64(vec![v.len()], v.to_vec()).unwrap()
}

/// (family, case, op, inputs).
type Case = (&'static str, String, Op, Vec<Tensor>);

fn kernel_cases(r: &mut Lcg) -> Vec<Case> {
    let mut v: Vec<Case> = Vec::new();
    let shape = [2usize, 3, 33, 17];
    for (name, u, lo, hi) in [
        ("relu", Unary::Relu, -3.0, 3.0),
        ("sigmoid", Unary::Sigmoid, -6.0, 6.0),
        ("tanh", Unary::Tanh, -3.0, 3.0),
        ("gelu", Unary::Gelu(false), -4.0, 4.0),
        ("gelu_tanh", Unary::Gelu(true), -4.0, 4.0),
        ("exp", Unary::Exp, -3.0, 3.0),
        ("log", Unary::Log, 0.1, 5.0),
        ("sqrt", Unary::Sqrt, 0.0, 5.0),
        ("erf", Unary::Erf, -3.0, 3.0),
        ("hardswish", Unary::HardSwish, -5.0, 5.0),
        ("leakyrelu", Unary::LeakyRelu(0.1), -3.0, 3.0),
        ("softplus", Unary::Softplus, -30.0, 30.0),
        ("elu", Unary::Elu(1.0), -3.0, 3.0),
    ] {
        v.push((
            "unary",
            format!("{name} {shape:?}"),
            Op::Unary(u),
            vec![r.tensor(&shape, lo, hi)],
        ));
    }
    v.push((
        "unary",
        "clip [-0.5, 0.5]".into(),
        Op::Clip {
            min: Some(-0.5),
            max: Some(0.5),
        },
        vec![r.tensor(&shape, -2.0, 2.0)],
    ));
    let big = [4usize, 64, 56, 56];
    v.push((
        "binary",
        format!("add {big:?}"),
        Op::Binary(Binary::Add),
        vec![r.tensor(&big, -1.0, 1.0), r.tensor(&big, -1.0, 1.0)],
    ));
    v.push((
        "binary",
        "mul [2,3,4,5] x [3,1,5] (broadcast)".into(),
        Op::Binary(Binary::Mul),
        vec![
            r.tensor(&[2, 3, 4, 5], -1.0, 1.0),
            r.tensor(&[3, 1, 5], -1.0, 1.0),
        ],
    ));
    v.push((
        "binary",
        "sub [8,128,768] - [1] (scalar)".into(),
        Op::Binary(Binary::Sub),
        vec![
            r.tensor(&[8, 128, 768], -1.0, 1.0),
            r.tensor(&[1], -1.0, 1.0),
        ],
    ));
    v.push((
        "binary",
        "div [1] / [7,9] (scalar first)".into(),
        Op::Binary(Binary::Div),
        vec![r.tensor(&[1], 1.0, 2.0), r.tensor(&[7, 9], 0.5, 2.0)],
    ));
    v.push((
        "binary",
        "pow [6,10] ^ [10]".into(),
        Op::Binary(Binary::Pow),
        vec![r.tensor(&[6, 10], 0.1, 2.0), r.tensor(&[10], -2.0, 2.0)],
    ));
    // Convolutions: im2col + GEMM, 1x1, stem, depthwise, grouped (direct), 1-D.
    type ConvCase = (&'static str, Op, Vec<usize>, Vec<usize>, bool);
    let conv_cases: Vec<ConvCase> = vec![
        (
            "3x3 p1 +bias+relu (im2col)",
            conv(&[3, 3], &[1, 1, 1, 1], &[1, 1], 1, Some(Activation::Relu)),
            vec![2, 16, 28, 28],
            vec![32, 16, 3, 3],
            true,
        ),
        (
            "1x1 (GEMM)",
            conv(&[1, 1], &[0, 0, 0, 0], &[1, 1], 1, None),
            vec![2, 64, 14, 14],
            vec![128, 64, 1, 1],
            true,
        ),
        (
            "7x7 s2 p3 stem",
            conv(&[7, 7], &[3, 3, 3, 3], &[2, 2], 1, None),
            vec![2, 3, 64, 64],
            vec![16, 3, 7, 7],
            false,
        ),
        (
            "depthwise 3x3 s2 +relu6",
            conv(
                &[3, 3],
                &[1, 1, 1, 1],
                &[2, 2],
                32,
                Some(Activation::Clip(0.0, 6.0)),
            ),
            vec![2, 32, 28, 28],
            vec![32, 1, 3, 3],
            true,
        ),
        (
            "grouped g=4 (direct)",
            conv(
                &[3, 3],
                &[1, 1, 1, 1],
                &[1, 1],
                4,
                Some(Activation::LeakyRelu(0.1)),
            ),
            vec![2, 16, 15, 15],
            vec![32, 4, 3, 3],
            true,
        ),
        (
            "3x3 +hardsigmoid (unary pass)",
            conv(
                &[3, 3],
                &[0, 0, 0, 0],
                &[1, 1],
                1,
                Some(Activation::HardSigmoid(0.2, 0.5)),
            ),
            vec![1, 8, 10, 10],
            vec![8, 8, 3, 3],
            true,
        ),
        (
            "1-D k5 p2",
            conv(&[5], &[2, 2], &[1], 1, None),
            vec![2, 8, 50],
            vec![16, 8, 5],
            true,
        ),
    ];
    for (name, op, x, w, bias) in conv_cases {
        let m = w[0];
        let mut ins = vec![r.tensor(&x, -1.0, 1.0), r.tensor(&w, -0.3, 0.3)];
        if bias {
            ins.push(r.tensor(&[m], -0.5, 0.5));
        }
        v.push(("conv", format!("{name} x{x:?} w{w:?}"), op, ins));
    }
    // A fused residual Add (input 3), on the GEMM path and on the depthwise path.
    let residual = |op: Op| match op {
        Op::Conv(c) => Op::Conv(ConvAttrs {
            residual: true,
            ..c
        }),
        other => other,
    };
    for (name, op, x, w, y) in [
        (
            "1x1 +bias+residual+relu",
            conv(&[1, 1], &[0, 0, 0, 0], &[1, 1], 1, Some(Activation::Relu)),
            vec![2, 64, 14, 14],
            vec![128, 64, 1, 1],
            vec![2, 128, 14, 14],
        ),
        (
            "depthwise 3x3 +bias+residual",
            conv(&[3, 3], &[1, 1, 1, 1], &[1, 1], 16, None),
            vec![2, 16, 12, 12],
            vec![16, 1, 3, 3],
            vec![2, 16, 12, 12],
        ),
    ] {
        let m = w[0];
        let ins = vec![
            r.tensor(&x, -1.0, 1.0),
            r.tensor(&w, -0.3, 0.3),
            r.tensor(&[m], -0.5, 0.5),
            r.tensor(&y, -1.0, 1.0),
        ];
        v.push(("conv", format!("{name} x{x:?} w{w:?}"), residual(op), ins));
    }
    // A 1x1 Conv fused with the depthwise Conv after it (two device convolutions on the GPU).
    let relu6 = Some(Activation::Clip(0.0, 6.0));
    let pointwise = conv_attrs(&[1, 1], &[0, 0, 0, 0], &[1, 1], 1, relu6);
    let pair_inputs = |r: &mut Lcg| {
        vec![
            r.tensor(&[2, 16, 14, 14], -1.0, 1.0),
            r.tensor(&[32, 16, 1, 1], -0.3, 0.3),
            r.tensor(&[32], -0.5, 0.5),
            r.tensor(&[32, 1, 3, 3], -0.3, 0.3),
            r.tensor(&[32], -0.5, 0.5),
        ]
    };
    let depthwise = conv_attrs(&[3, 3], &[1, 1, 1, 1], &[2, 2], 32, relu6);
    v.push((
        "conv",
        "1x1 +relu6 then depthwise 3x3 s2 +relu6 (fused) x[2,16,14,14]".into(),
        Op::PointwiseDepthwise(Box::new(PointwiseDepthwise {
            pointwise: pointwise.clone(),
            depthwise: depthwise.clone(),
            project: None,
        })),
        pair_inputs(r),
    ));
    // The whole inverted residual block: the projection and its residual too (three device
    // convolutions on the GPU, one band-by-band kernel on the CPU).
    let mut project = conv_attrs(&[1, 1], &[0, 0, 0, 0], &[1, 1], 1, None);
    project.residual = true;
    let depthwise = conv_attrs(&[3, 3], &[1, 1, 1, 1], &[1, 1], 32, relu6);
    v.push((
        "conv",
        "1x1 +relu6, depthwise 3x3 +relu6, 1x1 +residual (fused) x[2,16,14,14]".into(),
        Op::PointwiseDepthwise(Box::new(PointwiseDepthwise {
            pointwise,
            depthwise,
            project: Some(project),
        })),
        [
            pair_inputs(r),
            vec![
                r.tensor(&[16, 32, 1, 1], -0.3, 0.3),
                r.tensor(&[16], -0.5, 0.5),
                r.tensor(&[2, 16, 14, 14], -1.0, 1.0),
            ],
        ]
        .concat(),
    ));
    v.push((
        "batchnorm",
        "[2,8,5,5]".into(),
        Op::BatchNorm { eps: 1e-5 },
        vec![
            r.tensor(&[2, 8, 5, 5], -2.0, 2.0),
            r.tensor(&[8], 0.5, 1.5),
            r.tensor(&[8], -0.5, 0.5),
            r.tensor(&[8], -0.5, 0.5),
            r.tensor(&[8], 0.5, 2.0),
        ],
    ));
    let gemm = |ta, tb, alpha, beta, act| {
        Op::Gemm(GemmAttrs {
            alpha,
            beta,
            trans_a: ta,
            trans_b: tb,
            act,
        })
    };
    v.push((
        "gemm",
        "[8,2048] x [1000,2048]^T + bias".into(),
        gemm(false, true, 1.0, 1.0, None),
        vec![
            r.tensor(&[8, 2048], -1.0, 1.0),
            r.tensor(&[1000, 2048], -0.05, 0.05),
            r.tensor(&[1000], -1.0, 1.0),
        ],
    ));
    v.push((
        "gemm",
        "A^T, alpha 0.5, full C beta 2, relu".into(),
        gemm(true, false, 0.5, 2.0, Some(Activation::Relu)),
        vec![
            r.tensor(&[64, 33], -1.0, 1.0),
            r.tensor(&[64, 17], -1.0, 1.0),
            r.tensor(&[33, 17], -1.0, 1.0),
        ],
    ));
    v.push((
        "gemm",
        "C per row [m,1]".into(),
        gemm(false, false, 1.0, 1.0, None),
        vec![
            r.tensor(&[9, 12], -1.0, 1.0),
            r.tensor(&[12, 5], -1.0, 1.0),
            r.tensor(&[9, 1], -1.0, 1.0),
        ],
    ));
    v.push((
        "matmul",
        "[8,128,768] x [768,3072] + bias, gelu (tall)".into(),
        Op::MatMul {
            act: Some(Activation::Gelu),
        },
        vec![
            r.tensor(&[8, 128, 768], -1.0, 1.0),
            r.tensor(&[768, 3072], -0.05, 0.05),
            r.tensor(&[3072], -0.1, 0.1),
        ],
    ));
    v.push((
        "matmul",
        "[2,12,128,64] x [2,12,64,128] (batched)".into(),
        Op::MatMul { act: None },
        vec![
            r.tensor(&[2, 12, 128, 64], -1.0, 1.0),
            r.tensor(&[2, 12, 64, 128], -1.0, 1.0),
        ],
    ));
    v.push((
        "matmul",
        "[5,7] x [3,7,4] (A repeated)".into(),
        Op::MatMul { act: None },
        vec![
            r.tensor(&[5, 7], -1.0, 1.0),
            r.tensor(&[3, 7, 4], -1.0, 1.0),
        ],
    ));
    let px = [2usize, 16, 57, 57];
    v.push((
        "pool",
        "max 3x3 s2 p1".into(),
        pool(true, 3, 2, 1, false, false),
        vec![r.tensor(&px, -1.0, 1.0)],
    ));
    v.push((
        "pool",
        "max 3x3 s2 ceil".into(),
        pool(true, 3, 2, 0, true, false),
        vec![r.tensor(&px, -1.0, 1.0)],
    ));
    v.push((
        "pool",
        "avg 3x3 s2 p1 exclude pad".into(),
        pool(false, 3, 2, 1, false, false),
        vec![r.tensor(&px, -1.0, 1.0)],
    ));
    v.push((
        "pool",
        "avg 3x3 s2 p1 include pad ceil".into(),
        pool(false, 3, 2, 1, true, true),
        vec![r.tensor(&px, -1.0, 1.0)],
    ));
    v.push((
        "global pool",
        "avg [8,2048,7,7]".into(),
        Op::GlobalPool { max: false },
        vec![r.tensor(&[8, 2048, 7, 7], -1.0, 1.0)],
    ));
    v.push((
        "global pool",
        "max [2,64,13,13]".into(),
        Op::GlobalPool { max: true },
        vec![r.tensor(&[2, 64, 13, 13], -1.0, 1.0)],
    ));
    v.push((
        "softmax",
        "[2,12,128,128] last axis".into(),
        Op::Softmax {
            axis: -1,
            log: false,
            legacy: false,
        },
        vec![r.tensor(&[2, 12, 128, 128], -8.0, 8.0)],
    ));
    v.push((
        "softmax",
        "log [4,1000]".into(),
        Op::Softmax {
            axis: -1,
            log: true,
            legacy: false,
        },
        vec![r.tensor(&[4, 1000], -8.0, 8.0)],
    ));
    v.push((
        "softmax",
        "legacy axis 1 [3,4,5]".into(),
        Op::Softmax {
            axis: 1,
            log: false,
            legacy: true,
        },
        vec![r.tensor(&[3, 4, 5], -3.0, 3.0)],
    ));
    v.push((
        "layernorm",
        "[8,128,768]".into(),
        Op::LayerNorm {
            axis: -1,
            eps: 1e-12,
            stats: false,
        },
        vec![
            r.tensor(&[8, 128, 768], -2.0, 3.0),
            r.tensor(&[768], 0.5, 1.5),
            r.tensor(&[768], -0.5, 0.5),
        ],
    ));
    let rx = [4usize, 6, 10, 12];
    for (name, kind, axes, keep) in [
        ("mean last", ReduceKind::ReduceMean, vec![-1], true),
        ("sum axes 1,2", ReduceKind::ReduceSum, vec![1, 2], false),
        ("max axis 0", ReduceKind::ReduceMax, vec![0], true),
        ("l2 axis 1", ReduceKind::ReduceL2, vec![1], true),
        ("min all", ReduceKind::ReduceMin, vec![], false),
    ] {
        v.push((
            "reduce",
            format!("{name} {rx:?}"),
            reduce(kind, &axes, keep),
            vec![r.tensor(&rx, -2.0, 2.0)],
        ));
    }
    v.push((
        "transpose",
        "[2,128,12,64] perm 0213 (strided)".into(),
        Op::Shape(ShapeOp::Transpose {
            perm: Some(vec![0, 2, 1, 3]),
        }),
        vec![r.tensor(&[2, 128, 12, 64], -1.0, 1.0)],
    ));
    v.push((
        "transpose",
        "[2,12,100,70] perm 0132 (tiled)".into(),
        Op::Shape(ShapeOp::Transpose {
            perm: Some(vec![0, 1, 3, 2]),
        }),
        vec![r.tensor(&[2, 12, 100, 70], -1.0, 1.0)],
    ));
    v.push((
        "concat",
        "axis 1 of [2,3,5],[2,4,5],[2,1,5]".into(),
        Op::Shape(ShapeOp::Concat { axis: 1 }),
        vec![
            r.tensor(&[2, 3, 5], -1.0, 1.0),
            r.tensor(&[2, 4, 5], -1.0, 1.0),
            r.tensor(&[2, 1, 5], -1.0, 1.0),
        ],
    ));
    v.push((
        "slice",
        "[6,9,7] starts 1,-1 ends 5,-9 steps 2,-2".into(),
        Op::Shape(ShapeOp::Slice { attrs: None }),
        vec![
            r.tensor(&[6, 9, 7], -1.0, 1.0),
            i64s(&[1, -1]),
            i64s(&[5, -9]),
            i64s(&[0, 1]),
            i64s(&[2, -2]),
        ],
    ));
    v.push((
        "gather",
        "embedding [1000,64] ids [2,16]".into(),
        Op::Shape(ShapeOp::Gather { axis: 0 }),
        vec![r.tensor(&[1000, 64], -1.0, 1.0), r.ids(&[2, 16], 1000)],
    ));
    v.push((
        "gather",
        "axis 1 [4,10,3] ids [5]".into(),
        Op::Shape(ShapeOp::Gather { axis: 1 }),
        vec![r.tensor(&[4, 10, 3], -1.0, 1.0), i64s(&[0, 9, -1, 3, 3])],
    ));
    for mode in ["constant", "reflect", "edge", "wrap"] {
        v.push((
            "pad",
            format!("{mode} [2,3,6,5] pads 0,0,2,1 / 0,0,1,-1"),
            Op::Shape(ShapeOp::Pad {
                mode: mode.into(),
                pads: Some(vec![0, 0, 2, 1, 0, 0, 1, -1]),
                value: 0.5,
            }),
            vec![r.tensor(&[2, 3, 6, 5], -1.0, 1.0)],
        ));
    }
    v
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |f: &str| args.iter().any(|a| a == f);
    let value = |f: &str| {
        args.iter()
            .position(|a| a == f)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let Some(out_path) = value("--out") else {
        eprintln!("usage: device_check --out REPORT.md [--iters N] [--skip-models] [--tf32]");
        return ExitCode::from(2);
    };
    let iters: usize = value("--iters")
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
        .max(2);
    let tf32 = flag("--tf32");
    let threads = std::thread::available_parallelism()
        .map_or(4, |n| n.get())
        .min(16);

    let started = Instant::now();
    let cuda = match CudaBackend::new(CudaOptions {
        tenant: "device-check".into(),
        cpu_threads: threads,
        tf32,
        ..Default::default()
    }) {
        Ok(b) => b,
        Err(why) => {
            eprintln!("device_check: no usable GPU: {why}");
            return ExitCode::from(2);
        }
    };
    let cpu = CpuBackend::new(threads);
    let info = cuda.info().clone();
    let mut md = String::new();
    let mut failed = 0usize;
    let _ = writeln!(md, "# cotenant device check\n");
    let _ = writeln!(
        md,
        "Device: {} ({}, {} MiB), CPU reference: {} threads, TF32 {}. Started up (probe, NVRTC or PTX cache, cuBLAS) in {:.1} s.\n",
        info.name,
        info.arch(),
        info.total_bytes >> 20,
        threads,
        if tf32 { "on" } else { "off" },
        started.elapsed().as_secs_f64()
    );
    println!("{}", md.trim_end());

    // (a) kernels
    let tol = if tf32 { KERNEL_TOL_TF32 } else { KERNEL_TOL };
    let mut r = Lcg(0x5eed);
    let mut table = String::new();
    let _ = writeln!(
        table,
        "## Kernels: CUDA vs CPU (max |cuda-cpu| / max |cpu|, pass ≤ {tol:.0e})\n"
    );
    let _ = writeln!(
        table,
        "| family | case | rel. error | result |\n|---|---|---|---|"
    );
    for (family, case, op, inputs) in kernel_cases(&mut r) {
        let refs: Vec<Option<&Tensor>> = inputs.iter().map(Some).collect();
        let want = cpu.execute(&op, &refs);
        let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            cuda.execute_device(&op, &refs)
        }));
        let (err, verdict) = match (got, want) {
            (Ok(Ok(Some(g))), Ok(w)) => {
                let e = rel_err(&g[0], &w[0]);
                (format!("{e:.2e}"), if e <= tol { "pass" } else { "FAIL" })
            }
            (Ok(Ok(None)), _) => ("-".into(), "FAIL (declined: ran on no kernel)"),
            (Ok(Err(e)), _) => (e.to_string(), "FAIL (device error)"),
            (Err(_), _) => ("panic".into(), "FAIL (panic)"),
            (_, Err(e)) => (format!("cpu: {e}"), "FAIL (cpu reference)"),
        };
        if verdict != "pass" {
            failed += 1;
        }
        let line = format!("| {family} | {case} | {err} | {verdict} |");
        println!("{line}");
        let _ = writeln!(table, "{line}");
    }
    md.push('\n');
    md.push_str(&table);

    // (a2) a tenant over its device memory budget fails alone
    let line = format!("\n{}\n", budget_isolation(&cuda, tf32));
    if !line.starts_with("\nMemory budget: pass") {
        failed += 1;
    }
    println!("{}", line.trim());
    md.push_str(&line);

    // (b) and (c) models
    if !flag("--skip-models") {
        let mut acc = String::new();
        let _ = writeln!(
            acc,
            "\n## Zoo models: CUDA vs CPU, batch 1 (pass ≤ {MODEL_TOL:.0e})\n"
        );
        let _ = writeln!(
            acc,
            "| model | outputs | rel. error | op kinds on the CPU so far | result |\n|---|---|---|---|---|"
        );
        let mut lat = String::new();
        let _ = writeln!(
            lat,
            "\n## CUDA latency (ms; {iters} runs after 3 warm-ups; host tensors in and out per op)\n"
        );
        let _ = writeln!(
            lat,
            "| model | batch | p50 | p99 | mean |\n|---|---|---|---|---|"
        );
        for name in zoo::NAMES {
            let t0 = Instant::now();
            let model = match zoo::build(
                name,
                &ZooOptions {
                    seed: 7,
                    ..Default::default()
                },
            )
            .map_err(|e| e.to_string())
            .and_then(|m| Model::from_bytes(&m.encode_to_vec()).map_err(|e| e.to_string()))
            {
                Ok(m) => m,
                Err(e) => {
                    failed += 1;
                    let _ = writeln!(acc, "| {name} | - | {e} | - | FAIL (build) |");
                    continue;
                }
            };
            if let Err(e) = cuda.register_constants(&model.plan.constants) {
                failed += 1;
                let _ = writeln!(acc, "| {name} | - | {e} | - | FAIL (weights upload) |");
                continue;
            }
            let input = |batch: usize, r: &mut Lcg| -> Vec<(String, Tensor)> {
                if *name == "bert" {
                    vec![("input_ids".into(), r.ids(&[batch, 128], 30522))]
                } else {
                    vec![("input".into(), r.tensor(&[batch, 3, 224, 224], -1.0, 1.0))]
                }
            };
            let x = input(1, &mut r);
            let got = model.plan.run(&cuda, x.clone());
            let want = model.plan.run(&cpu, x);
            let line = match (got, want) {
                (Ok(g), Ok(w)) => {
                    let e =
                        g.iter()
                            .zip(&w)
                            .map(|(a, b)| rel_err(&a.1, &b.1))
                            .fold(0.0f64, |m, e| {
                                if e.is_nan() || m.is_nan() {
                                    f64::NAN
                                } else {
                                    m.max(e)
                                }
                            });
                    let ok = e <= MODEL_TOL;
                    failed += (!ok) as usize;
                    format!(
                        "| {name} | {} | {e:.2e} | {} | {} |",
                        g.len(),
                        cuda.fallbacks().join(", "),
                        if ok { "pass" } else { "FAIL" }
                    )
                }
                (Err(e), _) => {
                    failed += 1;
                    format!("| {name} | - | cuda: {e} | - | FAIL |")
                }
                (_, Err(e)) => {
                    failed += 1;
                    format!("| {name} | - | cpu: {e} | - | FAIL |")
                }
            };
            println!("{line}  ({:.1} s)", t0.elapsed().as_secs_f64());
            let _ = writeln!(acc, "{line}");
            if ["resnet50", "mobilenet_v2", "bert"].contains(name) {
                for batch in [1usize, 8] {
                    let x = input(batch, &mut r);
                    let mut times = Vec::with_capacity(iters);
                    let mut err = None;
                    for i in 0..iters + 3 {
                        let t = Instant::now();
                        if let Err(e) = model.plan.run(&cuda, x.clone()) {
                            err = Some(e.to_string());
                            break;
                        }
                        if i >= 3 {
                            times.push(t.elapsed().as_secs_f64() * 1e3);
                        }
                    }
                    let line = match err {
                        Some(e) => {
                            failed += 1;
                            format!("| {name} | {batch} | error: {e} | | |")
                        }
                        None => {
                            times.sort_by(|a, b| a.total_cmp(b));
                            let pct =
                                |p: f64| times[((times.len() - 1) as f64 * p).round() as usize];
                            let mean = times.iter().sum::<f64>() / times.len() as f64;
                            format!(
                                "| {name} | {batch} | {:.2} | {:.2} | {mean:.2} |",
                                pct(0.5),
                                pct(0.99)
                            )
                        }
                    };
                    println!("{line}");
                    let _ = writeln!(lat, "{line}");
                }
            }
            cuda.forget_constants();
        }
        md.push_str(&acc);
        md.push_str(&lat);
    }
    let (_, _, peak, _) = cuda.memory();
    let _ = writeln!(
        md,
        "\n{} check(s) failed. Peak device memory held by the backend: {} MiB. Total {:.0} s.",
        failed,
        peak >> 20,
        started.elapsed().as_secs_f64()
    );
    if let Err(e) = std::fs::write(&out_path, &md) {
        eprintln!("device_check: writing {out_path}: {e}");
        return ExitCode::from(1);
    }
    println!("\n{failed} check(s) failed; report written to {out_path}");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
