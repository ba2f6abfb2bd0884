//! float16 and bfloat16 models against onnxruntime. Each op a half-precision export contains
//! runs as a one-node model on random inputs, and a small BERT and SqueezeNet from the zoo run
//! converted to float16 (initializers, inputs, outputs, constants and casts, as
//! onnxconverter-common's `convert_float_to_float16` does).
//!
//! float16: the reference is onnxruntime on the same float16 model. bfloat16: onnxruntime's CPU
//! kernels have almost no bfloat16, so the reference is onnxruntime on the float32 model fed the
//! same (bfloat16-exact) values. Tolerances are relative to the output's largest magnitude: one
//! op rounds once, so a few units in the last place of the half type; whole models accumulate
//! one rounding per op.

mod common;

use common::proto::{float_attr, int_attr, ints_attr, string_attr, unshaped, value_info};
use cotenant_executor::proto::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
};
use cotenant_executor::tensor_proto::{decode_tensor, encode_tensor};
use cotenant_executor::zoo::{self, BertOptions, Rng, ZooOptions};
use cotenant_executor::{CpuBackend, DType, Data, Model, Tensor, npy};
use prost::Message;
use std::path::{Path, PathBuf};

/// float16 against onnxruntime's float16: one unit in the last place at the output's scale
/// (both compute in f32 and round each output; they agree to the bit on every case but Gelu).
const F16_OP_TOL: f64 = 1.0 / 1024.0;
/// bfloat16 against the unrounded f32 result: one unit in the last place at the output's scale
/// (rounding alone costs at most half of one).
const BF16_OP_TOL: f64 = 1.0 / 256.0;
/// Whole float16 models, computed in float32 as onnxruntime computes them, which still rounds
/// to float16 where an op it has a float16 kernel for sits between two others (BERT's
/// reshapes and transposes: measured 5.5e-4). SqueezeNet has none of those but the Flatten
/// before its output: 2.4e-6, or with float inputs and outputs (which round after the Flatten)
/// 3.0e-4; rounded to float16 after every op, it was 6.1e-4 from onnxruntime.
const F16_MODEL_TOL: f64 = 4e-3;
const F16_CNN_TOL: f64 = 1e-4;

/// One node of `op` over f32 tensors; `half` turns every f32 feed and initializer but those in
/// `keep` into the half type, and every output marked `None` into the half type.
struct Case {
    name: &'static str,
    op: &'static str,
    opset: i64,
    attrs: Vec<AttributeProto>,
    feeds: Vec<(&'static str, Tensor)>,
    consts: Vec<(&'static str, Tensor)>,
    order: Vec<&'static str>,
    keep: Vec<&'static str>,
    outputs: Vec<Option<DType>>,
}

fn to_half(t: &Tensor, half: DType) -> Tensor {
    match t.dtype() {
        DType::F32 => cotenant_executor::ops::elementwise::cast(t, half),
        _ => t.clone(),
    }
}

impl Case {
    fn feeds(&self, half: Option<DType>) -> Vec<(String, Tensor)> {
        self.feeds
            .iter()
            .map(|(n, t)| match half {
                Some(h) if !self.keep.contains(n) => (n.to_string(), to_half(t, h)),
                _ => (n.to_string(), t.clone()),
            })
            .collect()
    }

    /// The model in `half` (None: all f32).
    fn model(&self, half: Option<DType>) -> Vec<u8> {
        let dims = |t: &Tensor| t.shape.iter().map(|&d| d as i64).collect::<Vec<_>>();
        let outputs: Vec<String> = (0..self.outputs.len()).map(|k| format!("y{k}")).collect();
        let consts = self.consts.iter().map(|(n, t)| match half {
            Some(h) if !self.keep.contains(n) => encode_tensor(n, &to_half(t, h)),
            _ => encode_tensor(n, t),
        });
        ModelProto {
            ir_version: 9,
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: self.opset,
            }],
            graph: Some(GraphProto {
                node: vec![NodeProto {
                    input: self.order.iter().map(|s| s.to_string()).collect(),
                    output: outputs.clone(),
                    name: "n".into(),
                    op_type: self.op.into(),
                    attribute: self.attrs.clone(),
                    ..Default::default()
                }],
                initializer: consts.collect(),
                input: self
                    .feeds(half)
                    .iter()
                    .map(|(n, t)| value_info(n, t.dtype().onnx(), &dims(t)))
                    .collect(),
                output: outputs
                    .iter()
                    .zip(&self.outputs)
                    .map(|(n, d)| {
                        let d = d.unwrap_or(half.unwrap_or(DType::F32));
                        unshaped(n, d.onnx())
                    })
                    .collect(),
                name: self.name.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
        .encode_to_vec()
    }
}

fn f32s(rng: &mut Rng, shape: &[usize], f: impl Fn(f32) -> f32) -> Tensor {
    let n = shape.iter().product();
    Tensor::f32(shape.to_vec(), (0..n).map(|_| f(rng.normal())).collect()).unwrap()
}

fn i64s(v: &[i64]) -> Tensor {
    Tensor::i64(vec![v.len()], v.to_vec()).unwrap()
}

fn cases() -> Vec<Case> {
    let mut r = Rng::new(5);
    let r = &mut r;
    let id = |v: f32| v;
    let case = |name, op, opset, attrs, feeds: Vec<(&'static str, Tensor)>, consts| {
        let consts: Vec<(&'static str, Tensor)> = consts;
        let order = feeds.iter().chain(&consts).map(|(n, _)| *n).collect();
        Case {
            name,
            op,
            opset,
            attrs,
            feeds,
            consts,
            order,
            keep: vec![],
            outputs: vec![None],
        }
    };
    let unary = |name, op, x: Tensor| case(name, op, 17, vec![], vec![("x", x)], vec![]);
    let binary = |name, op, a: Tensor, b: Tensor| {
        case(name, op, 17, vec![], vec![("a", a), ("b", b)], vec![])
    };
    let mut v = vec![
        case(
            "conv3x3",
            "Conv",
            17,
            vec![ints_attr("pads", &[1, 1, 1, 1])],
            vec![("x", f32s(r, &[1, 8, 9, 9], id))],
            vec![
                ("w", f32s(r, &[16, 8, 3, 3], |v| v * 0.2)),
                ("b", f32s(r, &[16], id)),
            ],
        ),
        case(
            "conv_depthwise_strided",
            "Conv",
            17,
            vec![
                int_attr("group", 8),
                ints_attr("strides", &[2, 2]),
                ints_attr("pads", &[1, 1, 1, 1]),
            ],
            vec![("x", f32s(r, &[2, 8, 9, 9], id))],
            vec![("w", f32s(r, &[8, 1, 3, 3], id))],
        ),
        case(
            "conv1x1",
            "Conv",
            17,
            vec![],
            vec![("x", f32s(r, &[1, 32, 5, 5], id))],
            vec![("w", f32s(r, &[24, 32, 1, 1], |v| v * 0.2))],
        ),
        case(
            "matmul_batched",
            "MatMul",
            17,
            vec![],
            vec![("a", f32s(r, &[2, 5, 64], id))],
            vec![("b", f32s(r, &[64, 24], |v| v * 0.1))],
        ),
        case(
            "gemm_trans_b",
            "Gemm",
            17,
            vec![int_attr("transB", 1), float_attr("alpha", 0.5)],
            vec![("a", f32s(r, &[3, 48], id))],
            vec![("b", f32s(r, &[16, 48], id)), ("c", f32s(r, &[16], id))],
        ),
        binary(
            "add_broadcast",
            "Add",
            f32s(r, &[2, 3, 8], id),
            f32s(r, &[8], id),
        ),
        binary("sub", "Sub", f32s(r, &[4, 8], id), f32s(r, &[4, 8], id)),
        binary("mul", "Mul", f32s(r, &[4, 8], id), f32s(r, &[1, 8], id)),
        binary(
            "div",
            "Div",
            f32s(r, &[4, 8], id),
            f32s(r, &[4, 8], |v| v.signum() * (1.0 + v.abs())),
        ),
        binary(
            "pow",
            "Pow",
            f32s(r, &[4, 8], |v| v.abs() + 0.5),
            Tensor::scalar_f32(2.0),
        ),
        unary("relu", "Relu", f32s(r, &[3, 16], id)),
        unary("sigmoid", "Sigmoid", f32s(r, &[3, 16], |v| v * 3.0)),
        unary("tanh", "Tanh", f32s(r, &[3, 16], id)),
        unary("erf", "Erf", f32s(r, &[3, 16], id)),
        unary("exp", "Exp", f32s(r, &[3, 16], id)),
        unary("sqrt", "Sqrt", f32s(r, &[3, 16], |v| v.abs())),
        unary("neg", "Neg", f32s(r, &[3, 16], id)),
        case(
            "gelu_tanh",
            "Gelu",
            20,
            vec![string_attr("approximate", "tanh")],
            vec![("x", f32s(r, &[3, 16], |v| v * 2.0))],
            vec![],
        ),
        case(
            "gelu",
            "Gelu",
            20,
            vec![],
            vec![("x", f32s(r, &[3, 16], |v| v * 2.0))],
            vec![],
        ),
        case(
            "softmax",
            "Softmax",
            17,
            vec![int_attr("axis", -1)],
            vec![("x", f32s(r, &[3, 4, 33], |v| v * 3.0))],
            vec![],
        ),
        case(
            "layer_norm",
            "LayerNormalization",
            17,
            vec![int_attr("axis", -1), float_attr("epsilon", 1e-5)],
            vec![("x", f32s(r, &[2, 5, 64], |v| v * 2.0 + 1.0))],
            vec![("scale", f32s(r, &[64], id)), ("bias", f32s(r, &[64], id))],
        ),
        case(
            "reduce_mean",
            "ReduceMean",
            17,
            vec![ints_attr("axes", &[-1])],
            vec![("x", f32s(r, &[3, 4, 40], id))],
            vec![],
        ),
        case(
            "batch_norm",
            "BatchNormalization",
            15,
            vec![],
            vec![("x", f32s(r, &[2, 4, 5, 5], id))],
            vec![
                ("scale", f32s(r, &[4], id)),
                ("bias", f32s(r, &[4], id)),
                ("mean", f32s(r, &[4], |v| v * 0.1)),
                ("var", f32s(r, &[4], |v| v.abs() + 0.5)),
            ],
        ),
        case(
            "max_pool",
            "MaxPool",
            17,
            vec![
                ints_attr("kernel_shape", &[3, 3]),
                ints_attr("strides", &[2, 2]),
            ],
            vec![("x", f32s(r, &[1, 4, 9, 9], id))],
            vec![],
        ),
        case(
            "average_pool",
            "AveragePool",
            17,
            vec![
                ints_attr("kernel_shape", &[2, 2]),
                ints_attr("strides", &[2, 2]),
            ],
            vec![("x", f32s(r, &[1, 4, 8, 8], id))],
            vec![],
        ),
        unary(
            "global_average_pool",
            "GlobalAveragePool",
            f32s(r, &[2, 6, 7, 7], id),
        ),
        case(
            "reshape",
            "Reshape",
            17,
            vec![],
            vec![("x", f32s(r, &[2, 3, 4], id))],
            vec![("shape", i64s(&[4, -1]))],
        ),
        case(
            "transpose",
            "Transpose",
            17,
            vec![ints_attr("perm", &[0, 2, 1, 3])],
            vec![("x", f32s(r, &[2, 3, 4, 5], id))],
            vec![],
        ),
        case(
            "concat",
            "Concat",
            17,
            vec![int_attr("axis", 1)],
            vec![("a", f32s(r, &[2, 3], id)), ("b", f32s(r, &[2, 5], id))],
            vec![],
        ),
        case(
            "gather",
            "Gather",
            17,
            vec![int_attr("axis", 0)],
            vec![("x", f32s(r, &[10, 6], id))],
            vec![("i", i64s(&[3, 0, 9, 3]))],
        ),
        case(
            "slice",
            "Slice",
            17,
            vec![],
            vec![("x", f32s(r, &[4, 10], id))],
            vec![
                ("starts", i64s(&[1, -8])),
                ("ends", i64s(&[3, 9])),
                ("axes", i64s(&[0, 1])),
                ("steps", i64s(&[1, 2])),
            ],
        ),
        case(
            "where",
            "Where",
            17,
            vec![],
            vec![
                (
                    "c",
                    Tensor::new(
                        vec![2, 5],
                        Data::Bool((0..10).map(|i| i % 3 == 0).collect()),
                    )
                    .unwrap(),
                ),
                ("a", f32s(r, &[2, 5], id)),
                ("b", f32s(r, &[5], id)),
            ],
            vec![],
        ),
        case(
            "clip",
            "Clip",
            17,
            vec![],
            vec![("x", f32s(r, &[3, 8], |v| v * 4.0))],
            vec![
                ("lo", Tensor::scalar_f32(0.0)),
                ("hi", Tensor::scalar_f32(6.0)),
            ],
        ),
        case(
            "resize_nearest",
            "Resize",
            17,
            vec![string_attr("mode", "nearest")],
            vec![("x", f32s(r, &[1, 2, 3, 3], id))],
            vec![
                ("", Tensor::f32(vec![0], vec![]).unwrap()),
                (
                    "scales",
                    Tensor::f32(vec![4], vec![1.0, 1.0, 2.0, 2.0]).unwrap(),
                ),
            ],
        ),
    ];
    // Resize: the omitted roi is an empty name, and the scales stay f32.
    if let Some(c) = v.iter_mut().find(|c| c.name == "resize_nearest") {
        c.consts.retain(|(n, _)| !n.is_empty());
        c.order = vec!["x", "", "scales"];
        c.keep = vec!["scales"];
    }
    // Casts in and out of the half type.
    let mut to_float = unary("cast_to_float", "Cast", f32s(r, &[3, 7], |v| v * 100.0));
    to_float.attrs = vec![int_attr("to", 1)];
    to_float.outputs = vec![Some(DType::F32)];
    v.push(to_float);
    let mut to_int = unary("cast_to_int64", "Cast", f32s(r, &[3, 7], |v| v * 100.0));
    to_int.attrs = vec![int_attr("to", 7)];
    to_int.outputs = vec![Some(DType::I64)];
    v.push(to_int);
    v
}

/// A Cast from float into the half type: the one case whose attribute depends on it.
fn cast_from_float(half: DType, r: &mut Rng) -> Case {
    Case {
        name: "cast_from_float",
        op: "Cast",
        opset: 17,
        attrs: vec![int_attr("to", half.onnx() as i64)],
        // Large, tiny (subnormal in f16) and ordinary values.
        feeds: vec![("x", f32s(r, &[4, 9], |v| v * 3e4))],
        consts: vec![],
        order: vec!["x"],
        keep: vec!["x"],
        outputs: vec![None],
    }
}

/// Runs onnxruntime on `model` with `feeds`; its outputs in order.
fn onnxruntime(dir: &Path, name: &str, model: &[u8], feeds: &[(String, Tensor)]) -> Vec<Tensor> {
    let path = dir.join(format!("{name}.onnx"));
    std::fs::write(&path, model).unwrap();
    let out_dir = common::onnxruntime_outputs(&path, feeds, dir, name);
    let m = ModelProto::decode(model).unwrap();
    m.graph
        .unwrap()
        .output
        .iter()
        .map(|o| npy::read(&out_dir.join(format!("{}.npy", o.name))).unwrap())
        .collect()
}

/// Largest |ours - reference| over the reference's largest magnitude; `None` when the
/// shapes, or (`same_type`) the element types, differ, or integers differ at all.
fn worst(ours: &Tensor, reference: &Tensor, same_type: bool) -> Option<f64> {
    if ours.shape != reference.shape || (same_type && ours.dtype() != reference.dtype()) {
        return None;
    }
    match ours.dtype() {
        DType::I64 | DType::I32 | DType::Bool => (ours.data == reference.data).then_some(0.0),
        _ => {
            let (a, b) = (ours.to_f64_vec(), reference.to_f64_vec());
            let scale = b.iter().fold(1e-12f64, |m, v| m.max(v.abs()));
            let w = a
                .iter()
                .zip(&b)
                .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
            (!w.is_nan()).then_some(w / scale)
        }
    }
}

fn scratch_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cotenant-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
#[ignore = "needs COTENANT_PYTHON: run cargo xtask test"]
fn half_precision_ops_match_onnxruntime() {
    let dir = scratch_dir("half-ops");
    let backend = CpuBackend::new(2);
    let mut failures = Vec::new();
    let mut report = Vec::new();
    let mut r = Rng::new(9);
    for half in [DType::F16, DType::BF16] {
        let tol = if half == DType::F16 {
            F16_OP_TOL
        } else {
            BF16_OP_TOL
        };
        let mut all = cases();
        all.push(cast_from_float(half, &mut r));
        for case in all {
            let tag = format!("{}_{half:?}", case.name);
            let feeds = case.feeds(Some(half));
            let model = case.model(Some(half));
            // The bfloat16 reference: the f32 model on the same, bfloat16-exact values.
            let reference = if half == DType::F16 {
                onnxruntime(&dir, &tag, &model, &feeds)
            } else {
                let exact: Vec<(String, Tensor)> = feeds
                    .iter()
                    .map(|(n, t)| (n.clone(), cotenant_executor::ops::widen(t)))
                    .collect();
                let mut f32_model = ModelProto::decode(case.model(None).as_slice()).unwrap();
                let g = f32_model.graph.as_mut().unwrap();
                // Initializers of the f32 model get the bfloat16-rounded values too.
                for t in g.initializer.iter_mut() {
                    let d = decode_tensor(t, None).unwrap();
                    if d.dtype() == DType::F32 {
                        let rounded = cotenant_executor::ops::widen(&to_half(&d, half));
                        *t = encode_tensor(&t.name.clone(), &rounded);
                    }
                }
                if case.name == "cast_from_float" {
                    // onnxruntime rounds to bfloat16 itself, and hands back f32 (numpy has no
                    // bfloat16): y0 = Cast(Cast(x, bfloat16), float).
                    g.node[0].output = vec!["h".into()];
                    g.node.push(NodeProto {
                        input: vec!["h".into()],
                        output: vec!["y0".into()],
                        name: "back".into(),
                        op_type: "Cast".into(),
                        attribute: vec![int_attr("to", 1)],
                        ..Default::default()
                    });
                }
                onnxruntime(&dir, &tag, &f32_model.encode_to_vec(), &exact)
            };
            let m = Model::from_bytes(&model).unwrap_or_else(|e| panic!("{tag}: {e}"));
            let ours = m
                .plan
                .run(&backend, feeds)
                .unwrap_or_else(|e| panic!("{tag}: {e}"));
            for (k, ((_, o), want)) in ours.iter().zip(&reference).enumerate() {
                let expect = case.outputs[k].unwrap_or(half);
                if o.dtype() != expect {
                    failures.push(format!("{tag} output {k}: {:?}, not {expect:?}", o.dtype()));
                    continue;
                }
                // bfloat16 against an f32 reference: compare values, not types.
                let same_type = half == DType::F16;
                match worst(o, want, same_type) {
                    Some(w) if w <= tol => report.push(format!("{tag}: {w:.1e}")),
                    Some(w) => failures.push(format!("{tag} output {k}: {w:.2e} > {tol:.1e}")),
                    None => failures.push(format!(
                        "{tag} output {k}: {:?} {:?} vs {:?} {:?}",
                        o.dtype(),
                        o.shape,
                        want.dtype(),
                        want.shape
                    )),
                }
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    println!("{}", report.join("\n"));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `m` converted to float16 the way onnxconverter-common does it: float initializers, inputs,
/// outputs and Constant values become float16, and so do Casts to float. With `keep_io_types`
/// the float inputs and outputs stay float, through Casts appended after the graph's last node
/// (out of topological order, as that converter writes them).
fn to_float16(mut m: ModelProto, keep_io_types: bool) -> ModelProto {
    const FLOAT: i32 = 1;
    const FLOAT16: i32 = 10;
    let half = |t: &mut TensorProto| {
        if t.data_type == FLOAT {
            let d = decode_tensor(t, None).unwrap();
            *t = encode_tensor(&t.name.clone(), &to_half(&d, DType::F16));
        }
    };
    let g = m.graph.as_mut().unwrap();
    g.initializer.iter_mut().for_each(half);
    let mut casts = Vec::new();
    for (k, vi) in g.input.iter_mut().chain(g.output.iter_mut()).enumerate() {
        if let Some(tt) = vi.r#type.as_mut().and_then(|t| t.tensor_type.as_mut())
            && tt.elem_type == FLOAT
        {
            match keep_io_types {
                false => tt.elem_type = FLOAT16,
                true => casts.push((vi.name.clone(), format!("io_cast{k}"))),
            }
        }
    }
    let inputs: Vec<String> = g.input.iter().map(|vi| vi.name.clone()).collect();
    let mut appended = Vec::new();
    for (name, half_name) in casts {
        let rename = |v: &mut String| {
            if *v == name {
                *v = half_name.clone();
            }
        };
        let (from, to, to_type) = match inputs.contains(&name) {
            true => (name.clone(), half_name.clone(), FLOAT16),
            false => (half_name.clone(), name.clone(), FLOAT),
        };
        for n in g.node.iter_mut() {
            n.input.iter_mut().for_each(rename);
            n.output.iter_mut().for_each(rename);
        }
        appended.push(NodeProto {
            input: vec![from],
            output: vec![to],
            name: format!("{half_name}_node"),
            op_type: "Cast".into(),
            attribute: vec![int_attr("to", to_type as i64)],
            ..Default::default()
        });
    }
    for n in g.node.iter_mut() {
        for a in n.attribute.iter_mut() {
            if let Some(t) = a.t.as_mut() {
                half(t);
            }
            if n.op_type == "Cast" && a.name == "to" && a.i == FLOAT as i64 {
                a.i = FLOAT16 as i64;
            }
        }
    }
    g.node.extend(appended);
    m
}

#[test]
#[ignore = "needs COTENANT_PYTHON: run cargo xtask test"]
fn float16_zoo_models_match_onnxruntime() {
    let dir = scratch_dir("half-zoo");
    let o = ZooOptions {
        seed: 3,
        bert: BertOptions {
            layers: 2,
            hidden: 64,
            heads: 4,
            seq: 16,
            vocab: 100,
        },
    };
    let backend = CpuBackend::new(2);
    let mut failures = Vec::new();
    for (name, keep_io_types, tol) in [
        ("bert", false, F16_MODEL_TOL),
        ("squeezenet", false, F16_CNN_TOL),
        ("squeezenet", true, F16_MODEL_TOL),
    ] {
        let bytes = to_float16(zoo::build(name, &o).unwrap(), keep_io_types).encode_to_vec();
        let m = Model::from_bytes(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut rng = Rng::new(21);
        let feeds: Vec<(String, Tensor)> = m
            .plan
            .example_inputs(2)
            .into_iter()
            .map(|(n, t)| {
                let t = match t.dtype() {
                    DType::F16 => {
                        let x = f32s(&mut rng, &t.shape, |v| v);
                        to_half(&x, DType::F16)
                    }
                    DType::F32 => f32s(&mut rng, &t.shape, |v| v),
                    DType::I64 => Tensor::i64(
                        t.shape.clone(),
                        (0..t.len()).map(|i| (i * 7 % 100) as i64).collect(),
                    )
                    .unwrap(),
                    _ => t,
                };
                (n, t)
            })
            .collect();
        let reference = onnxruntime(&dir, name, &bytes, &feeds);
        let ours = m
            .plan
            .run(&backend, feeds)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        for ((_, o), want) in ours.iter().zip(&reference) {
            match worst(o, want, true) {
                Some(w) if w <= tol => println!("{name} float16 ({keep_io_types}): {w:.1e}"),
                w => failures.push(format!("{name} ({keep_io_types}): {w:?} (tol {tol:.0e})")),
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
