//! The operators detection, transformer and vision exports need beyond the zoo's, each as a
//! one-node model on random inputs (ties and repeated indices included), run by the executor
//! and by onnxruntime: float outputs within 1e-4 of the output's scale, integer outputs equal.

mod common;

use common::proto::{float_attr, int_attr, ints_attr, string_attr, unshaped, value_info};
use cotenant_executor::proto::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto,
};
use cotenant_executor::tensor_proto::encode_tensor;
use cotenant_executor::zoo::Rng;
use cotenant_executor::{CpuBackend, DType, Data, Model, Tensor, npy};
use prost::Message;
use std::path::Path;
use std::process::Command;

/// One node of `op`: `feeds` are graph inputs (given to both runtimes as arrays), `consts`
/// initializers; `outputs` the element types of its outputs.
struct Case {
    name: &'static str,
    op: &'static str,
    opset: i64,
    attrs: Vec<AttributeProto>,
    feeds: Vec<(&'static str, Tensor)>,
    consts: Vec<(&'static str, Tensor)>,
    /// Input names in the node's order ("" for an omitted optional input).
    order: Vec<&'static str>,
    outputs: Vec<DType>,
}

impl Case {
    fn model(&self) -> Vec<u8> {
        let dims = |t: &Tensor| t.shape.iter().map(|&d| d as i64).collect::<Vec<_>>();
        let outputs: Vec<String> = (0..self.outputs.len()).map(|k| format!("y{k}")).collect();
        ModelProto {
            ir_version: 8,
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
                initializer: self
                    .consts
                    .iter()
                    .map(|(n, t)| encode_tensor(n, t))
                    .collect(),
                input: self
                    .feeds
                    .iter()
                    .map(|(n, t)| value_info(n, t.dtype().onnx(), &dims(t)))
                    .collect(),
                // Output shapes are left for the runtimes to work out.
                output: outputs
                    .iter()
                    .zip(&self.outputs)
                    .map(|(n, d)| unshaped(n, d.onnx()))
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

/// Normal values rounded to halves: many ties and zeros.
fn coarse(rng: &mut Rng, shape: &[usize]) -> Tensor {
    f32s(rng, shape, |v| (v * 2.0).round() / 2.0)
}

fn ints(rng: &mut Rng, shape: &[usize], lo: i64, hi: i64) -> Tensor {
    let n = shape.iter().product();
    let span = (hi - lo + 1) as u64;
    Tensor::i64(
        shape.to_vec(),
        (0..n)
            .map(|_| lo + (rng.next_u64() % span) as i64)
            .collect(),
    )
    .unwrap()
}

/// int32 sequence lengths.
fn lengths(v: &[i32]) -> Tensor {
    Tensor::new(vec![v.len()], Data::I32(v.to_vec())).unwrap()
}

fn strings_attr(name: &str, v: &[&str]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: 8,
        strings: v.iter().map(|s| s.as_bytes().to_vec()).collect(),
        ..Default::default()
    }
}

fn scalar(v: i64) -> Tensor {
    Tensor::i64(vec![], vec![v]).unwrap()
}

fn vector(v: &[i64]) -> Tensor {
    Tensor::i64(vec![v.len()], v.to_vec()).unwrap()
}

fn cases() -> Vec<Case> {
    let mut r = Rng::new(11);
    let r = &mut r;
    let unary = |name, op, opset, x: Tensor| Case {
        name,
        op,
        opset,
        attrs: vec![],
        feeds: vec![("x", x)],
        consts: vec![],
        order: vec!["x"],
        outputs: vec![DType::F32],
    };
    let mut boxes = f32s(r, &[1, 24, 4], |v| v * 4.0);
    // Corners near each other, so that many boxes overlap.
    if let Data::F32(v) = &mut boxes.data {
        for b in v.chunks_mut(4) {
            b[2] = b[0] + 2.0 + b[2].abs();
            b[3] = b[1] + 2.0 + b[3].abs();
        }
    }
    vec![
        Case {
            name: "topk_largest_ties",
            op: "TopK",
            opset: 11,
            attrs: vec![int_attr("axis", 1)],
            feeds: vec![("x", coarse(r, &[3, 9]))],
            consts: vec![("k", vector(&[5]))],
            order: vec!["x", "k"],
            outputs: vec![DType::F32, DType::I64],
        },
        Case {
            name: "topk_smallest_axis0",
            op: "TopK",
            opset: 11,
            attrs: vec![int_attr("axis", 0), int_attr("largest", 0)],
            feeds: vec![("x", coarse(r, &[6, 4]))],
            consts: vec![("k", vector(&[3]))],
            order: vec!["x", "k"],
            outputs: vec![DType::F32, DType::I64],
        },
        Case {
            name: "argmax_last",
            op: "ArgMax",
            opset: 13,
            attrs: vec![
                int_attr("axis", -1),
                int_attr("keepdims", 0),
                int_attr("select_last_index", 1),
            ],
            feeds: vec![("x", coarse(r, &[4, 7]))],
            consts: vec![],
            order: vec!["x"],
            outputs: vec![DType::I64],
        },
        Case {
            name: "argmin_first",
            op: "ArgMin",
            opset: 13,
            attrs: vec![int_attr("axis", 0)],
            feeds: vec![("x", coarse(r, &[5, 3]))],
            consts: vec![],
            order: vec!["x"],
            outputs: vec![DType::I64],
        },
        Case {
            name: "gather_elements",
            op: "GatherElements",
            opset: 13,
            attrs: vec![int_attr("axis", 1)],
            feeds: vec![
                ("x", f32s(r, &[3, 4], |v| v)),
                ("i", ints(r, &[3, 6], -4, 3)),
            ],
            consts: vec![],
            order: vec!["x", "i"],
            outputs: vec![DType::F32],
        },
        Case {
            name: "gathernd_batch",
            op: "GatherND",
            opset: 13,
            attrs: vec![int_attr("batch_dims", 1)],
            feeds: vec![
                ("x", f32s(r, &[2, 3, 4], |v| v)),
                ("i", ints(r, &[2, 5, 1], -3, 2)),
            ],
            consts: vec![],
            order: vec!["x", "i"],
            outputs: vec![DType::F32],
        },
        Case {
            name: "scatternd_add",
            op: "ScatterND",
            opset: 18,
            attrs: vec![string_attr("reduction", "add")],
            feeds: vec![
                ("x", f32s(r, &[4, 3], |v| v)),
                ("i", ints(r, &[5, 1], -4, 3)),
                ("u", f32s(r, &[5, 3], |v| v)),
            ],
            consts: vec![],
            order: vec!["x", "i", "u"],
            outputs: vec![DType::F32],
        },
        Case {
            name: "scatter_elements_max",
            op: "ScatterElements",
            opset: 18,
            attrs: vec![int_attr("axis", 0), string_attr("reduction", "max")],
            feeds: vec![
                ("x", f32s(r, &[3, 4], |v| v)),
                ("i", ints(r, &[2, 4], -3, 2)),
                ("u", f32s(r, &[2, 4], |v| v)),
            ],
            consts: vec![],
            order: vec!["x", "i", "u"],
            outputs: vec![DType::F32],
        },
        Case {
            name: "nonzero",
            op: "NonZero",
            opset: 13,
            attrs: vec![],
            feeds: vec![("x", coarse(r, &[3, 5]))],
            consts: vec![],
            order: vec!["x"],
            outputs: vec![DType::I64],
        },
        Case {
            name: "nms",
            op: "NonMaxSuppression",
            opset: 11,
            attrs: vec![],
            feeds: vec![("b", boxes), ("s", f32s(r, &[1, 2, 24], |v| v.abs()))],
            consts: vec![
                ("m", vector(&[6])),
                ("iou", Tensor::f32(vec![1], vec![0.3]).unwrap()),
                ("st", Tensor::f32(vec![1], vec![0.2]).unwrap()),
            ],
            order: vec!["b", "s", "m", "iou", "st"],
            outputs: vec![DType::I64],
        },
        Case {
            name: "cumsum_exclusive_reverse",
            op: "CumSum",
            opset: 14,
            attrs: vec![int_attr("exclusive", 1), int_attr("reverse", 1)],
            feeds: vec![("x", f32s(r, &[3, 5], |v| v))],
            consts: vec![("a", scalar(1))],
            order: vec!["x", "a"],
            outputs: vec![DType::F32],
        },
        Case {
            name: "trilu_lower",
            op: "Trilu",
            opset: 14,
            attrs: vec![int_attr("upper", 0)],
            feeds: vec![("x", f32s(r, &[2, 4, 5], |v| v))],
            consts: vec![("k", scalar(-1))],
            order: vec!["x", "k"],
            outputs: vec![DType::F32],
        },
        unary("sin", "Sin", 13, f32s(r, &[4, 6], |v| v * 3.0)),
        unary("cos", "Cos", 13, f32s(r, &[4, 6], |v| v * 3.0)),
        unary(
            "round",
            "Round",
            13,
            f32s(r, &[4, 6], |v| (v * 4.0).round() / 2.0),
        ),
        unary("sign", "Sign", 13, coarse(r, &[4, 6])),
        unary("mish", "Mish", 18, f32s(r, &[4, 6], |v| v * 8.0)),
        Case {
            name: "mod_int",
            op: "Mod",
            opset: 13,
            attrs: vec![],
            feeds: vec![("a", ints(r, &[4, 5], -20, 20)), ("b", ints(r, &[5], 1, 6))],
            consts: vec![],
            order: vec!["a", "b"],
            outputs: vec![DType::I64],
        },
        Case {
            name: "mod_fmod",
            op: "Mod",
            opset: 13,
            attrs: vec![int_attr("fmod", 1)],
            feeds: vec![
                ("a", f32s(r, &[4, 5], |v| v * 10.0)),
                ("b", f32s(r, &[4, 5], |v| v * 3.0)),
            ],
            consts: vec![],
            order: vec!["a", "b"],
            outputs: vec![DType::F32],
        },
        Case {
            name: "onehot",
            op: "OneHot",
            opset: 11,
            attrs: vec![int_attr("axis", 1)],
            feeds: vec![("i", ints(r, &[2, 3], -5, 6))],
            consts: vec![
                ("d", scalar(5)),
                ("v", Tensor::f32(vec![2], vec![-1.0, 3.0]).unwrap()),
            ],
            order: vec!["i", "d", "v"],
            outputs: vec![DType::F32],
        },
        Case {
            name: "einsum_attention",
            op: "Einsum",
            opset: 12,
            attrs: vec![string_attr("equation", "bhqd,bhkd->bhqk")],
            feeds: vec![
                ("q", f32s(r, &[2, 2, 3, 8], |v| v)),
                ("k", f32s(r, &[2, 2, 5, 8], |v| v)),
            ],
            consts: vec![],
            order: vec!["q", "k"],
            outputs: vec![DType::F32],
        },
        Case {
            name: "einsum_broadcast_batch",
            op: "Einsum",
            opset: 12,
            attrs: vec![string_attr("equation", "...ij,...jk->...ik")],
            feeds: vec![
                ("a", f32s(r, &[2, 1, 3, 4], |v| v)),
                ("b", f32s(r, &[1, 5, 4, 2], |v| v)),
            ],
            consts: vec![],
            order: vec!["a", "b"],
            outputs: vec![DType::F32],
        },
        Case {
            name: "einsum_diagonal_sum",
            op: "Einsum",
            opset: 12,
            attrs: vec![string_attr("equation", "bii->b")],
            feeds: vec![("a", f32s(r, &[3, 4, 4], |v| v))],
            consts: vec![],
            order: vec!["a"],
            outputs: vec![DType::F32],
        },
        Case {
            name: "einsum_chain",
            op: "Einsum",
            opset: 12,
            attrs: vec![string_attr("equation", "ij,jk,kl->il")],
            feeds: vec![
                ("a", f32s(r, &[3, 4], |v| v)),
                ("b", f32s(r, &[4, 5], |v| v)),
                ("c", f32s(r, &[5, 2], |v| v)),
            ],
            consts: vec![],
            order: vec!["a", "b", "c"],
            outputs: vec![DType::F32],
        },
        Case {
            name: "instance_norm",
            op: "InstanceNormalization",
            opset: 6,
            attrs: vec![float_attr("epsilon", 1e-3)],
            feeds: vec![("x", f32s(r, &[2, 3, 4, 5], |v| v * 3.0 + 1.0))],
            consts: vec![("s", f32s(r, &[3], |v| v)), ("b", f32s(r, &[3], |v| v))],
            order: vec!["x", "s", "b"],
            outputs: vec![DType::F32],
        },
        Case {
            name: "group_norm",
            op: "GroupNormalization",
            opset: 21,
            attrs: vec![int_attr("num_groups", 2)],
            feeds: vec![("x", f32s(r, &[2, 4, 3, 3], |v| v * 2.0 - 1.0))],
            consts: vec![("s", f32s(r, &[4], |v| v)), ("b", f32s(r, &[4], |v| v))],
            order: vec!["x", "s", "b"],
            outputs: vec![DType::F32],
        },
        Case {
            name: "group_norm_opset18",
            op: "GroupNormalization",
            opset: 18,
            attrs: vec![int_attr("num_groups", 2), float_attr("epsilon", 1e-2)],
            feeds: vec![("x", f32s(r, &[2, 4, 3, 3], |v| v * 2.0 - 1.0))],
            consts: vec![("s", f32s(r, &[2], |v| v)), ("b", f32s(r, &[2], |v| v))],
            order: vec!["x", "s", "b"],
            outputs: vec![DType::F32],
        },
        Case {
            name: "depth_to_space_crd",
            op: "DepthToSpace",
            opset: 13,
            attrs: vec![int_attr("blocksize", 2), string_attr("mode", "CRD")],
            feeds: vec![("x", f32s(r, &[2, 8, 2, 3], |v| v))],
            consts: vec![],
            order: vec!["x"],
            outputs: vec![DType::F32],
        },
        Case {
            name: "depth_to_space_dcr",
            op: "DepthToSpace",
            opset: 13,
            attrs: vec![int_attr("blocksize", 2)],
            feeds: vec![("x", f32s(r, &[1, 8, 3, 2], |v| v))],
            consts: vec![],
            order: vec!["x"],
            outputs: vec![DType::F32],
        },
        Case {
            name: "rnn_bidirectional_sequence_lens",
            op: "RNN",
            opset: 22,
            attrs: vec![
                int_attr("hidden_size", 3),
                string_attr("direction", "bidirectional"),
            ],
            feeds: vec![("x", f32s(r, &[5, 3, 4], |v| v))],
            consts: vec![
                ("w", f32s(r, &[2, 3, 4], |v| v * 0.5)),
                ("r", f32s(r, &[2, 3, 3], |v| v * 0.5)),
                ("b", f32s(r, &[2, 6], |v| v * 0.5)),
                ("lens", lengths(&[5, 2, 3])),
                ("h0", f32s(r, &[2, 3, 3], |v| v)),
            ],
            order: vec!["x", "w", "r", "b", "lens", "h0"],
            outputs: vec![DType::F32, DType::F32],
        },
        Case {
            name: "gru_reverse_linear_before_reset",
            op: "GRU",
            opset: 22,
            attrs: vec![
                int_attr("hidden_size", 3),
                string_attr("direction", "reverse"),
                int_attr("linear_before_reset", 1),
                float_attr("clip", 1.5),
            ],
            feeds: vec![("x", f32s(r, &[4, 3, 2], |v| v))],
            consts: vec![
                ("w", f32s(r, &[1, 9, 2], |v| v * 0.5)),
                ("r", f32s(r, &[1, 9, 3], |v| v * 0.5)),
                ("b", f32s(r, &[1, 18], |v| v * 0.5)),
                ("lens", lengths(&[4, 1, 3])),
                ("h0", f32s(r, &[1, 3, 3], |v| v)),
            ],
            order: vec!["x", "w", "r", "b", "lens", "h0"],
            outputs: vec![DType::F32, DType::F32],
        },
        Case {
            name: "gru_bidirectional_activations",
            op: "GRU",
            opset: 22,
            attrs: vec![
                int_attr("hidden_size", 2),
                string_attr("direction", "bidirectional"),
                strings_attr(
                    "activations",
                    &["HardSigmoid", "Softsign", "Sigmoid", "Relu"],
                ),
            ],
            feeds: vec![("x", f32s(r, &[3, 2, 3], |v| v))],
            consts: vec![
                ("w", f32s(r, &[2, 6, 3], |v| v * 0.5)),
                ("r", f32s(r, &[2, 6, 2], |v| v * 0.5)),
            ],
            order: vec!["x", "w", "r"],
            outputs: vec![DType::F32, DType::F32],
        },
        Case {
            name: "lstm_bidirectional_peepholes_clip",
            op: "LSTM",
            opset: 22,
            attrs: vec![
                int_attr("hidden_size", 3),
                string_attr("direction", "bidirectional"),
                float_attr("clip", 2.0),
                strings_attr(
                    "activations",
                    &[
                        "Sigmoid",
                        "Tanh",
                        "Tanh",
                        "Sigmoid",
                        "LeakyRelu",
                        "Softsign",
                    ],
                ),
            ],
            feeds: vec![("x", f32s(r, &[4, 2, 3], |v| v))],
            consts: vec![
                ("w", f32s(r, &[2, 12, 3], |v| v * 0.5)),
                ("r", f32s(r, &[2, 12, 3], |v| v * 0.5)),
                ("b", f32s(r, &[2, 24], |v| v * 0.5)),
                ("lens", lengths(&[4, 2])),
                ("h0", f32s(r, &[2, 2, 3], |v| v)),
                ("c0", f32s(r, &[2, 2, 3], |v| v)),
                ("p", f32s(r, &[2, 9], |v| v * 0.5)),
            ],
            order: vec!["x", "w", "r", "b", "lens", "h0", "c0", "p"],
            outputs: vec![DType::F32, DType::F32, DType::F32],
        },
        // The default activations, unclipped: the gates in f32 vectors (37 lanes: two full
        // vectors of 16 and a remainder), with peepholes, lengths and initial states.
        Case {
            name: "lstm_default_activations_peepholes",
            op: "LSTM",
            opset: 22,
            attrs: vec![
                int_attr("hidden_size", 37),
                string_attr("direction", "bidirectional"),
            ],
            feeds: vec![("x", f32s(r, &[4, 2, 5], |v| v))],
            consts: vec![
                ("w", f32s(r, &[2, 148, 5], |v| v * 0.5)),
                ("r", f32s(r, &[2, 148, 37], |v| v * 0.3)),
                ("b", f32s(r, &[2, 296], |v| v * 0.5)),
                ("lens", lengths(&[4, 3])),
                ("h0", f32s(r, &[2, 2, 37], |v| v)),
                ("c0", f32s(r, &[2, 2, 37], |v| v)),
                ("p", f32s(r, &[2, 111], |v| v * 0.5)),
            ],
            order: vec!["x", "w", "r", "b", "lens", "h0", "c0", "p"],
            outputs: vec![DType::F32, DType::F32, DType::F32],
        },
        // A window wider than the input in ceil mode: one output, over what the window covers
        // (Hugging Face's EfficientNet pools its last map with a window of its 1280 channels).
        Case {
            name: "average_pool_window_past_the_input",
            op: "AveragePool",
            opset: 19,
            attrs: vec![
                ints_attr("kernel_shape", &[9, 6]),
                ints_attr("strides", &[9, 6]),
                int_attr("ceil_mode", 1),
            ],
            feeds: vec![("x", f32s(r, &[2, 3, 7, 5], |v| v))],
            consts: vec![],
            order: vec!["x"],
            outputs: vec![DType::F32],
        },
        Case {
            name: "max_pool_window_past_the_padded_input",
            op: "MaxPool",
            opset: 12,
            attrs: vec![
                ints_attr("kernel_shape", &[6, 4]),
                ints_attr("strides", &[4, 4]),
                ints_attr("pads", &[1, 0, 0, 1]),
                int_attr("ceil_mode", 1),
            ],
            feeds: vec![("x", f32s(r, &[1, 2, 3, 5], |v| v))],
            consts: vec![],
            order: vec!["x"],
            outputs: vec![DType::F32],
        },
        Case {
            name: "space_to_depth",
            op: "SpaceToDepth",
            opset: 13,
            attrs: vec![int_attr("blocksize", 3)],
            feeds: vec![("x", f32s(r, &[2, 2, 6, 9], |v| v))],
            consts: vec![],
            order: vec!["x"],
            outputs: vec![DType::F32],
        },
    ]
}

/// Linear Resize and Upsample over the layouts onnxruntime interpolates (both axes of 2-D, all
/// three of 3-D, NCHW, NHWC, NCDHW, one axis of four), up and down, by scales and by sizes:
/// compared bit for bit, since a quantized model re-quantizes what they output.
fn linear_resizes() -> Vec<Case> {
    let mut r = Rng::new(12);
    let r = &mut r;
    let mut resize = |name, shape: &[usize], mode, target: Tensor, by_sizes: bool| Case {
        name,
        op: "Resize",
        opset: 13,
        attrs: vec![
            string_attr("mode", "linear"),
            string_attr("coordinate_transformation_mode", mode),
        ],
        feeds: vec![("x", f32s(r, shape, |v| v * 3.0))],
        consts: vec![(if by_sizes { "sizes" } else { "scales" }, target)],
        order: if by_sizes {
            vec!["x", "", "", "sizes"]
        } else {
            vec!["x", "", "scales"]
        },
        outputs: vec![DType::F32],
    };
    let scales = |v: &[f32]| Tensor::f32(vec![v.len()], v.to_vec()).unwrap();
    let mut cases = vec![
        resize(
            "nchw_half_pixel_x2",
            &[1, 3, 9, 7],
            "half_pixel",
            scales(&[1.0, 1.0, 2.0, 2.0]),
            false,
        ),
        resize(
            "nchw_pytorch_half_pixel_sizes",
            &[2, 3, 5, 4],
            "pytorch_half_pixel",
            vector(&[2, 3, 7, 11]),
            true,
        ),
        resize(
            "nchw_width_only",
            &[1, 2, 6, 5],
            "half_pixel",
            scales(&[1.0, 1.0, 1.0, 2.0]),
            false,
        ),
        resize(
            "nhwc_asymmetric",
            &[1, 5, 6, 3],
            "asymmetric",
            scales(&[1.0, 1.5, 0.7, 1.0]),
            false,
        ),
        resize(
            "plane_align_corners",
            &[6, 5],
            "align_corners",
            vector(&[9, 13]),
            true,
        ),
        resize(
            "three_axes_half_pixel",
            &[2, 4, 5],
            "half_pixel",
            vector(&[3, 8, 9]),
            true,
        ),
        resize(
            "ncdhw_mixed",
            &[1, 2, 3, 4, 5],
            "half_pixel",
            scales(&[1.0, 1.0, 2.0, 1.5, 0.5]),
            false,
        ),
    ];
    cases.push(Case {
        name: "upsample_bilinear",
        op: "Upsample",
        opset: 9,
        attrs: vec![string_attr("mode", "linear")],
        feeds: vec![("x", f32s(r, &[1, 2, 3, 4], |v| v))],
        consts: vec![("scales", scales(&[1.0, 1.0, 2.0, 2.5]))],
        order: vec!["x", "scales"],
        outputs: vec![DType::F32],
    });
    cases
}

/// Float32 STFT and DFT at power-of-two and other lengths (onnxruntime's radix-2 and Bluestein
/// paths), compared within 2e-6 of the output's scale: the exact transform is 3e-5 away from
/// onnxruntime's float32 one at a length of 400, which a log-mel front end turns into 5e-4.
fn spectra() -> Vec<Case> {
    let mut r = Rng::new(13);
    let r = &mut r;
    let hann = |n: usize| {
        let w = (0..n).map(|k| (std::f32::consts::PI * k as f32 / n as f32).sin().powi(2));
        Tensor::f32(vec![n], w.collect()).unwrap()
    };
    let stft = |name, x: Tensor, n: usize, step: i64| Case {
        name,
        op: "STFT",
        opset: 17,
        attrs: vec![],
        feeds: vec![("x", x)],
        consts: vec![
            ("step", scalar(step)),
            ("window", hann(n)),
            ("length", scalar(n as i64)),
        ],
        order: vec!["x", "step", "window", "length"],
        outputs: vec![DType::F32],
    };
    let dft = |name, x: Tensor, n: i64, inverse: i64| Case {
        name,
        op: "DFT",
        opset: 17,
        attrs: vec![int_attr("axis", 1), int_attr("inverse", inverse)],
        feeds: vec![("x", x)],
        consts: vec![("n", scalar(n))],
        order: vec!["x", "n"],
        outputs: vec![DType::F32],
    };
    vec![
        stft(
            "stft_400_no_last_axis",
            f32s(r, &[2, 2000], |v| v),
            400,
            160,
        ),
        stft("stft_512_real", f32s(r, &[1, 2100, 1], |v| v), 512, 128),
        stft("stft_320_complex", f32s(r, &[1, 1000, 2], |v| v), 320, 100),
        dft("dft_12_complex", f32s(r, &[3, 12, 2], |v| v), 12, 0),
        dft("dft_padded_to_400", f32s(r, &[2, 390, 1], |v| v), 400, 0),
        dft("dft_inverse_400", f32s(r, &[1, 400, 2], |v| v), 400, 1),
        dft("dft_inverse_64", f32s(r, &[2, 64, 2], |v| v), 64, 1),
    ]
}

/// Float outputs: max |ours - ref| relative to max |ref| within `tolerance`; others: equal.
fn differs(ours: &Tensor, reference: &Tensor, tolerance: f64) -> Option<String> {
    if ours.shape != reference.shape || ours.dtype() != reference.dtype() {
        return Some(format!(
            "{:?} {:?}, expected {:?} {:?}",
            ours.dtype(),
            ours.shape,
            reference.dtype(),
            reference.shape
        ));
    }
    match ours.dtype() {
        DType::F32 | DType::F64 => {
            let (a, b) = (ours.to_f64_vec(), reference.to_f64_vec());
            let scale = b.iter().fold(1e-12f64, |m, v| m.max(v.abs()));
            let worst = a
                .iter()
                .zip(&b)
                .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
            (worst / scale > tolerance || worst.is_nan())
                .then(|| format!("max |diff| / max |ref| = {:.2e}", worst / scale))
        }
        _ => (ours.data != reference.data)
            .then(|| format!("{:?} vs {:?}", ours.to_f64_vec(), reference.to_f64_vec())),
    }
}

#[test]
#[ignore = "needs COTENANT_PYTHON: run cargo xtask test"]
fn new_operators_match_onnxruntime() {
    run_against_onnxruntime("ops", cases(), 1e-4);
}

#[test]
#[ignore = "needs COTENANT_PYTHON: run cargo xtask test"]
fn linear_resize_rounds_as_onnxruntime_does() {
    run_against_onnxruntime("resize", linear_resizes(), 0.0);
}

#[test]
#[ignore = "needs COTENANT_PYTHON: run cargo xtask test"]
fn float32_spectra_round_as_onnxruntime_does() {
    run_against_onnxruntime("spectra", spectra(), 2e-6);
}

/// Runs every case through onnxruntime and the executor and fails listing the outputs that differ.
fn run_against_onnxruntime(suite: &str, cases: Vec<Case>, tolerance: f64) {
    let python = common::python();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/ort_run.py");
    let dir = std::env::temp_dir().join(format!("cotenant-{suite}-vs-ort-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let backend = CpuBackend::new(2);
    let mut failures = Vec::new();
    for case in cases {
        let path = dir.join(format!("{}.onnx", case.name));
        std::fs::write(&path, case.model()).unwrap();
        let out_dir = dir.join(format!("{}_ort", case.name));
        let mut cmd = Command::new(&python);
        cmd.arg(&script)
            .arg("--model")
            .arg(&path)
            .arg("--output-dir")
            .arg(&out_dir);
        for (n, t) in &case.feeds {
            let p = dir.join(format!("{}_{n}.npy", case.name));
            npy::write(&p, t).unwrap();
            cmd.arg("--input").arg(format!("{n}={}", p.display()));
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "onnxruntime failed on {}: {}",
            case.name,
            String::from_utf8_lossy(&out.stderr)
        );
        let model = Model::load(&path).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let feeds = case
            .feeds
            .iter()
            .map(|(n, t)| (n.to_string(), t.clone()))
            .collect();
        let ours = model
            .plan
            .run(&backend, feeds)
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        for (name, t) in ours {
            let reference = npy::read(&out_dir.join(format!("{name}.npy"))).unwrap();
            if let Some(why) = differs(&t, &reference, tolerance) {
                failures.push(format!("{} output {name}: {why}", case.name));
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        failures.is_empty(),
        "operators differ from onnxruntime:\n{}",
        failures.join("\n")
    );
}
