//! The GPU check, one command on a GPU host (`cargo xtask device-check` bundles it): every kernel
//! family and every zoo model on the GPU against the CPU backend; copies, launches and host waits
//! counted per batch on the real device; latency of resnet50 / mobilenet_v2 / bert at batch 1 and
//! 8; a tenant's memory budget refusing what does not fit while another tenant serves.
//!
//!     device_check --out results.md [--iters 20] [--tf32] [--device cuda|sim] [--json latency.json]
//!
//! `--device sim` runs the same checks on the simulated GPU (slowly), to try the check itself on
//! a machine without one. Exits 2 when there is no usable GPU (with the reason), 1 when a check
//! failed, 0 otherwise. The markdown report is written either way once a device was found.

use cotenant_executor::device::Gpu;
use cotenant_executor::gpu::api::DeviceApi;
use cotenant_executor::gpu::{Alone, Budget, Call, Instance, Recorder, StepKind, Weights};
use cotenant_executor::graph::{Graph, GraphInput, Node};
use cotenant_executor::ops::Activation;
use cotenant_executor::ops::Op;
use cotenant_executor::ops::conv::{ConvAttrs, PointwiseDepthwise};
use cotenant_executor::ops::elementwise::{Binary, Unary};
use cotenant_executor::ops::matmul::GemmAttrs;
use cotenant_executor::ops::pool::PoolAttrs;
use cotenant_executor::ops::reduce::{ReduceAttrs, ReduceKind};
use cotenant_executor::ops::shape::ShapeOp;
use cotenant_executor::zoo::{self, ZooOptions};
use cotenant_executor::{CpuBackend, DType, Device, DeviceRequest, Model, Plan, Target, Tensor};
use prost::Message;
use std::fmt::Write as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

/// fp32 kernels vs the CPU: max |gpu - cpu| / max |cpu|.
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
        column_major: false,
        indices: false,
        nhwc: false,
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
            packed: None,
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
        Op::MatMul {
            act: None,
            packed: None,
        },
        vec![
            r.tensor(&[2, 12, 128, 64], -1.0, 1.0),
            r.tensor(&[2, 12, 64, 128], -1.0, 1.0),
        ],
    ));
    v.push((
        "matmul",
        "[5,7] x [3,7,4] (A repeated)".into(),
        Op::MatMul {
            act: None,
            packed: None,
        },
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
        Op::GlobalPool {
            max: false,
            nhwc: false,
        },
        vec![r.tensor(&[8, 2048, 7, 7], -1.0, 1.0)],
    ));
    v.push((
        "global pool",
        "max [2,64,13,13]".into(),
        Op::GlobalPool {
            max: true,
            nhwc: false,
        },
        vec![r.tensor(&[2, 64, 13, 13], -1.0, 1.0)],
    ));
    v.push((
        "softmax",
        "[2,12,128,128] last axis".into(),
        Op::Softmax {
            axis: -1,
            log: false,
            legacy: false,
            scale: 1.0,
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
            scale: 1.0,
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
            scale: 1.0,
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

/// A model of the one node `op`: input 0 comes with the request, the others are constants (as
/// weights and shape arguments are in real models).
fn one_node(op: Op, inputs: &[Tensor]) -> Result<Arc<Model>, String> {
    let mut g = Graph {
        opset: 17,
        ..Default::default()
    };
    let mut ids = Vec::new();
    for (i, t) in inputs.iter().enumerate() {
        let v = g.add_value(format!("in{i}"));
        if i == 0 {
            g.inputs.push(GraphInput {
                value: v,
                name: "in0".into(),
                dtype: t.dtype(),
                dims: None,
            });
        } else {
            g.constants.insert(v, Arc::new(t.clone()));
        }
        ids.push(Some(v));
    }
    let out = g.add_value("out");
    g.nodes.push(Node {
        name: "node".into(),
        op,
        inputs: ids,
        outputs: vec![out],
    });
    g.outputs.push(out);
    let plan = Plan::build(&g).map_err(|e| e.to_string())?;
    Ok(Arc::new(Model { plan }))
}

/// A device wrapped to count what each batch does.
struct Counted {
    rec: Arc<Recorder>,
    api: Arc<dyn DeviceApi>,
}

fn counted(gpu: &Gpu) -> Counted {
    let rec = Arc::new(Recorder::new(gpu.api.clone()));
    let api: Arc<dyn DeviceApi> = rec.clone();
    Counted { rec, api }
}

/// An instance of `model` on `api` with an unlimited budget.
fn instance(api: &Arc<dyn DeviceApi>, name: &str, model: &Arc<Model>) -> Result<Instance, String> {
    let budget = Budget::new(name, u64::MAX);
    let w =
        Weights::upload(api.clone(), &model.plan.constants, &budget).map_err(|e| e.to_string())?;
    Instance::new(api.clone(), model.clone(), w, budget, None).map_err(|e| e.to_string())
}

fn zoo_inputs(m: &Model, batch: usize, r: &mut Lcg) -> Vec<(String, Tensor)> {
    m.plan
        .example_inputs(batch)
        .into_iter()
        .map(|(n, t)| {
            let t = match t.dtype() {
                DType::I64 => r.ids(&t.shape, 30522),
                _ => r.tensor(&t.shape, -1.0, 1.0),
            };
            (n, t)
        })
        .collect()
}

/// One batch's calls, counted.
struct Counts {
    up: usize,
    down: usize,
    syncs: usize,
    launches: usize,
}

fn counts(calls: &[Call]) -> Counts {
    let n = |f: fn(&Call) -> bool| calls.iter().filter(|c| f(c)).count();
    Counts {
        up: n(|c| matches!(c, Call::CopyHtoD { .. })),
        down: n(|c| matches!(c, Call::CopyDtoH { .. })),
        syncs: n(|c| matches!(c, Call::Sync { .. })),
        launches: n(|c| matches!(c, Call::Launch { .. } | Call::Gemm { .. })),
    }
}

/// A tenant with a 1 MiB budget asked to hold 4 MiB of weights is refused with its budget named;
/// another tenant then places the same weights and runs.
fn budget_isolation(gpu: &Gpu) -> Result<String, String> {
    let w = Tensor::f32(vec![1 << 20], vec![0.5; 1 << 20]).map_err(|e| e.to_string())?;
    let x = Tensor::f32(vec![1 << 20], vec![1.0; 1 << 20]).map_err(|e| e.to_string())?;
    let model = one_node(Op::Binary(Binary::Mul), &[x.clone(), w])?;
    let small = Budget::new("small", 1 << 20);
    let refused = match Weights::upload(gpu.api.clone(), &model.plan.constants, &small) {
        Ok(_) => return Err("4 MiB of weights fit a 1 MiB budget".into()),
        Err(e) => e.to_string(),
    };
    let mut other = instance(&gpu.api, "other", &model)?;
    let out = other
        .run(vec![("in0".into(), x)], &Alone)
        .map_err(|e| e.to_string())?;
    let ok = out[0]
        .1
        .as_f32()
        .map_err(|e| e.to_string())?
        .iter()
        .all(|&v| v == 0.5);
    if !ok {
        return Err("the other tenant computed a wrong product".into());
    }
    Ok(format!("refused: {refused}; the other tenant ran"))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
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
        eprintln!(
            "usage: device_check --out REPORT.md [--iters N] [--tf32] [--device cuda|sim] [--json FILE]"
        );
        return ExitCode::from(2);
    };
    let iters: usize = value("--iters")
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
        .max(2);
    let tf32 = flag("--tf32");
    let request: DeviceRequest = value("--device")
        .and_then(|v| v.parse().ok())
        .unwrap_or(DeviceRequest::Cuda);
    let threads = std::thread::available_parallelism()
        .map_or(4, |n| n.get())
        .min(16);
    let started = Instant::now();
    let gpu = match Device::choose(request, 0, u64::MAX, tf32) {
        Ok((Device::Gpu(g), _)) => g,
        Ok((Device::Cpu, why)) | Err(why) => {
            eprintln!("device_check: no usable GPU: {why}");
            return ExitCode::from(2);
        }
    };
    let cpu = CpuBackend::new(threads);
    let mut md = String::new();
    let mut failed = 0usize;
    let _ = writeln!(md, "# cotenant device check\n");
    let _ = writeln!(
        md,
        "Device: {} ({}, {} SMs, {} MiB), CPU reference: {threads} threads, TF32 {}. Started up \
         (probe, NVRTC or PTX cache, cuBLAS) in {:.1} s.\n",
        gpu.name,
        gpu.arch,
        gpu.multiprocessors,
        gpu.total_bytes >> 20,
        if tf32 { "on" } else { "off" },
        started.elapsed().as_secs_f64()
    );
    println!("{}", md.trim_end());

    // (a) Kernel families: one-node models on the GPU vs the CPU op.
    let tol = if tf32 { KERNEL_TOL_TF32 } else { KERNEL_TOL };
    let mut r = Lcg(0x5eed);
    let _ = writeln!(md, "## Kernels vs the CPU backend (tolerance {tol:e})\n");
    let _ = writeln!(md, "| family | case | max rel err | on device | ok |");
    let _ = writeln!(md, "|---|---|---|---|---|");
    for (family, case, op, inputs) in kernel_cases(&mut r) {
        let line = (|| -> Result<(f64, bool), String> {
            let model = one_node(op, &inputs)?;
            let feed = vec![("in0".to_string(), inputs[0].clone())];
            let want = model
                .plan
                .run(&cpu, feed.clone())
                .map_err(|e| e.to_string())?;
            let mut inst = instance(&gpu.api, "kernels", &model)?;
            let layout = inst
                .layout(&[inputs[0].shape.clone()])
                .map_err(|e| e.to_string())?;
            let on_device = layout.kinds.iter().all(|k| *k == StepKind::Device);
            let got = inst.run(feed, &Alone).map_err(|e| e.to_string())?;
            Ok((rel_err(&got[0].1, &want[0].1), on_device))
        })();
        let (err, on_device, ok) = match line {
            Ok((e, d)) => (format!("{e:.2e}"), d, e <= tol && d),
            Err(e) => (format!("error: {e}"), false, false),
        };
        failed += usize::from(!ok);
        let _ = writeln!(
            md,
            "| {family} | {case} | {err} | {} | {} |",
            if on_device { "yes" } else { "no" },
            if ok { "yes" } else { "**NO**" }
        );
    }
    let _ = writeln!(md);

    // (b) Zoo models: accuracy and what one batch does on the device.
    let _ = writeln!(
        md,
        "## Zoo models vs the CPU backend, batch 2 (tolerance {MODEL_TOL:e}), and one batch's \
         device calls\n"
    );
    let _ = writeln!(
        md,
        "| model | max rel err | host fallbacks | copies up | copies down | host waits | launches | arena MiB | ok |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
    let c = counted(&gpu);
    for name in zoo::NAMES {
        let line = (|| -> Result<String, String> {
            let bytes = zoo::build(name, &ZooOptions::default())
                .map_err(|e| e.to_string())?
                .encode_to_vec();
            let model =
                Arc::new(Model::from_bytes_for(&bytes, Target::Gpu).map_err(|e| e.to_string())?);
            let feed = zoo_inputs(&model, 2, &mut r);
            let want = model
                .plan
                .run(&cpu, feed.clone())
                .map_err(|e| e.to_string())?;
            let mut inst = instance(&c.api, name, &model)?;
            let shapes: Vec<Vec<usize>> = feed.iter().map(|(_, t)| t.shape.clone()).collect();
            let layout = inst.layout(&shapes).map_err(|e| e.to_string())?;
            let fallbacks = layout.fallbacks(&model.plan).len();
            inst.run(feed.clone(), &Alone).map_err(|e| e.to_string())?;
            c.rec.take();
            let got = inst.run(feed.clone(), &Alone).map_err(|e| e.to_string())?;
            let n = counts(&c.rec.take());
            let err = got
                .iter()
                .zip(&want)
                .map(|((_, a), (_, b))| rel_err(a, b))
                .fold(0.0, f64::max);
            let ok = err <= MODEL_TOL
                && fallbacks == 0
                && (n.up, n.down, n.syncs) == (feed.len(), want.len(), 1);
            failed += usize::from(!ok);
            Ok(format!(
                "| {name} | {err:.2e} | {fallbacks} | {} | {} | {} | {} | {} | {} |",
                n.up,
                n.down,
                n.syncs,
                n.launches,
                inst.arena_bytes() >> 20,
                if ok { "yes" } else { "**NO**" }
            ))
        })();
        let row = line.unwrap_or_else(|e| {
            failed += 1;
            format!("| {name} | error: {e} | | | | | | | **NO** |")
        });
        println!("{row}");
        let _ = writeln!(md, "{row}");
    }
    let _ = writeln!(md);

    // (c) Latency on the GPU, for the PyTorch eager comparison.
    let _ = writeln!(
        md,
        "## Latency on the GPU (ms, {iters} batches after 3 warm-ups; host to host: copies up, \
         all steps, copies down)\n"
    );
    let _ = writeln!(md, "| model | batch | p50 | p99 | mean | rows/s |");
    let _ = writeln!(md, "|---|---|---|---|---|---|");
    let mut json = Vec::new();
    for name in ["resnet50", "mobilenet_v2", "bert"] {
        for batch in [1usize, 8] {
            let line = (|| -> Result<String, String> {
                let bytes = zoo::build(name, &ZooOptions::default())
                    .map_err(|e| e.to_string())?
                    .encode_to_vec();
                let model = Arc::new(
                    Model::from_bytes_for(&bytes, Target::Gpu).map_err(|e| e.to_string())?,
                );
                let feed = zoo_inputs(&model, batch, &mut r);
                let mut inst = instance(&gpu.api, name, &model)?;
                for _ in 0..3 {
                    inst.run(feed.clone(), &Alone).map_err(|e| e.to_string())?;
                }
                let mut ms = Vec::with_capacity(iters);
                for _ in 0..iters {
                    let t = Instant::now();
                    inst.run(feed.clone(), &Alone).map_err(|e| e.to_string())?;
                    ms.push(t.elapsed().as_secs_f64() * 1e3);
                }
                ms.sort_by(f64::total_cmp);
                let mean = ms.iter().sum::<f64>() / ms.len() as f64;
                let (p50, p99) = (percentile(&ms, 0.5), percentile(&ms, 0.99));
                json.push(format!(
                    "{{\"model\":\"{name}\",\"batch\":{batch},\"p50\":{p50:.4},\"p99\":{p99:.4}}}"
                ));
                Ok(format!(
                    "| {name} | {batch} | {p50:.2} | {p99:.2} | {mean:.2} | {:.1} |",
                    batch as f64 * 1e3 / mean
                ))
            })();
            let row = line.unwrap_or_else(|e| {
                failed += 1;
                format!("| {name} | {batch} | error: {e} | | | |")
            });
            println!("{row}");
            let _ = writeln!(md, "{row}");
        }
    }
    let _ = writeln!(md);

    // (d) Memory isolation between tenants.
    let _ = writeln!(md, "## Device memory budgets\n");
    match budget_isolation(&gpu) {
        Ok(s) => {
            let _ = writeln!(md, "ok: {s}\n");
        }
        Err(e) => {
            failed += 1;
            let _ = writeln!(md, "**FAILED**: {e}\n");
        }
    }
    let _ = writeln!(
        md,
        "{failed} check(s) failed; {:.0} s in all.",
        started.elapsed().as_secs_f64()
    );
    if let Some(path) = value("--json")
        && let Err(e) = std::fs::write(&path, format!("[{}]\n", json.join(",")))
    {
        eprintln!("device_check: writing {path}: {e}");
    }
    if let Err(e) = std::fs::write(&out_path, &md) {
        eprintln!("device_check: writing {out_path}: {e}");
        return ExitCode::from(1);
    }
    println!("{failed} check(s) failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
