//! Operators of onnxruntime's `com.microsoft` domain that its own tools write into models, read
//! as the standard operators they stand for: most are written out as standard nodes
//! ([`expand`]: the fused transformer and convolution operators in `fused` and `attention`, the
//! 8-bit operator format in `qlinear`).
//!
//! `DynamicQuantizeLSTM` is what `onnxruntime.quantization.quantize_dynamic` makes of every
//! LSTM: int8 weights, stored input-major (`[directions, input, 4·hidden]`), with a scale and
//! zero point per direction or per gate unit. It is read as an LSTM on the dequantized weights,
//! transposed to ONNX's `[directions, 4·hidden, input]`, with R also kept in 8 bits for the
//! recurrent product ([`QuantizedR`]): like onnxruntime, each step quantizes its state and
//! multiplies in integers. The input's product, all steps at once, stays in float; onnxruntime
//! quantizes that input too, and the outputs differ by about 4e-3 of their magnitude on
//! ddddocr's OCR model.

use super::expansion::{Constants, Expansion, Step};
use super::{attention, fused, nbits, qlinear};
use crate::graph::Graph;
use crate::ops::rnn::QuantizedR;
use crate::proto::NodeProto;
use crate::tensor::{DType, Data, Tensor};
use cotenant_kernels::qgemm::PackedB;
use std::sync::Arc;

/// The domain these operators belong to.
pub const DOMAIN: &str = "com.microsoft";

/// The operators of [`DOMAIN`] the importer reads: [`standard`] the first, [`expand`] the rest.
pub const SUPPORTED: &[&str] = &[
    "DynamicQuantizeLSTM",
    "Attention",
    "BiasGelu",
    "DequantizeLinear",
    "DynamicQuantizeMatMul",
    "EmbedLayerNormalization",
    "FastGelu",
    "FusedConv",
    "FusedGemm",
    "FusedMatMul",
    "Gelu",
    "GroupQueryAttention",
    "MatMulIntegerToFloat",
    "MatMulNBits",
    "MultiHeadAttention",
    "QAttention",
    "QEmbedLayerNormalization",
    "QGemm",
    "QLinearAdd",
    "QLinearAveragePool",
    "QLinearConcat",
    "QLinearGlobalAveragePool",
    "QLinearLeakyRelu",
    "QLinearMul",
    "QLinearSigmoid",
    "QLinearSoftmax",
    "QLinearWhere",
    "QuantizeLinear",
    "QuickGelu",
    "RotaryEmbedding",
    "SimplifiedLayerNormalization",
    "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization",
    "TransposeMatMul",
];

/// Operators onnxruntime registers in the default domain although ONNX has no such operator.
pub const IN_DEFAULT_DOMAIN: &[&str] = &["SimplifiedLayerNormalization"];

/// The standard nodes that node `np` (named `name`) of [`DOMAIN`] stands for; `None` for an
/// operator this module does not expand.
pub fn expand(
    np: &NodeProto,
    name: &str,
    constants: Constants,
) -> Option<Result<Vec<Step>, String>> {
    let mut e = Expansion::new(np, name, constants);
    let op = np.op_type.as_str();
    let done = match op {
        "Gelu" | "FastGelu" | "BiasGelu" | "QuickGelu" => fused::gelu(&mut e, op),
        "FusedMatMul" | "TransposeMatMul" => fused::fused_matmul(&mut e),
        "FusedConv" => fused::fused_conv(&mut e),
        "FusedGemm" => fused::fused_gemm(&mut e),
        "SkipLayerNormalization" => fused::skip_layer_norm(&mut e, false),
        "SkipSimplifiedLayerNormalization" => fused::skip_layer_norm(&mut e, true),
        "SimplifiedLayerNormalization" => fused::simplified_layer_norm(&mut e),
        "EmbedLayerNormalization" => fused::embed_layer_norm(&mut e, false),
        "QEmbedLayerNormalization" => fused::embed_layer_norm(&mut e, true),
        "Attention" => attention::attention(&mut e),
        "QAttention" => attention::quantized_attention(&mut e),
        "MultiHeadAttention" => attention::multi_head_attention(&mut e),
        "GroupQueryAttention" => attention::group_query_attention(&mut e),
        "RotaryEmbedding" => attention::rotary_embedding(&mut e),
        // The standard operators (as of opset 21, which takes 16-bit and 4-bit integers), which
        // onnxruntime's quantizer writes in its own domain for those types at older opsets.
        "QuantizeLinear" | "DequantizeLinear" => {
            let (inputs, outputs) = (&e.np.input, &e.np.output);
            let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
            let outputs: Vec<&str> = outputs.iter().map(String::as_str).collect();
            e.node_at(op, &inputs, &outputs, e.same_attrs(&["axis"]), 21);
            Ok(())
        }
        "MatMulIntegerToFloat" => qlinear::matmul_integer_to_float(&mut e),
        "DynamicQuantizeMatMul" => qlinear::dynamic_quantize_matmul(&mut e),
        "QGemm" => qlinear::qgemm(&mut e),
        "MatMulNBits" => nbits::matmul_nbits(&mut e),
        _ if op.starts_with("QLinear") && SUPPORTED.contains(&op) => qlinear::qlinear(&mut e, op),
        _ => return None,
    };
    Some(done.map(|()| e.steps))
}

/// A standard operator and the inputs to give it.
pub struct Standard {
    pub op: &'static str,
    pub inputs: Vec<Option<usize>>,
    /// For an LSTM, its R in 8 bits.
    pub quantized_r: Option<Arc<QuantizedR>>,
}

/// The standard operator `op` (of [`DOMAIN`]) stands for, and the inputs to give it, adding the
/// constants they need to `g`; `None` for an operator this module does not know.
pub fn standard(
    op: &str,
    g: &mut Graph,
    inputs: &[Option<usize>],
) -> Option<Result<Standard, String>> {
    match op {
        "DynamicQuantizeLSTM" => Some(quantized_lstm(g, inputs).map(|(inputs, r)| Standard {
            op: "LSTM",
            inputs,
            quantized_r: Some(Arc::new(r)),
        })),
        _ => None,
    }
}

/// LSTM's inputs `[X, W, R, B, sequence_lens, initial_h, initial_c, P]` from
/// DynamicQuantizeLSTM's, which add `W_scale, W_zero_point, R_scale, R_zero_point` (8..12), and
/// R in 8 bits.
fn quantized_lstm(
    g: &mut Graph,
    inputs: &[Option<usize>],
) -> Result<(Vec<Option<usize>>, QuantizedR), String> {
    if inputs.len() != 12 {
        return Err(format!(
            "has {} inputs; DynamicQuantizeLSTM takes 12 (X, W, R, B, sequence_lens, \
             initial_h, initial_c, P, W_scale, W_zero_point, R_scale, R_zero_point)",
            inputs.len()
        ));
    }
    let constant = |i: usize, what: &str| -> Result<Arc<Tensor>, String> {
        inputs[i]
            .and_then(|v| g.constants.get(&v).cloned())
            .ok_or_else(|| format!("{what} (input {i}) is not a constant initializer"))
    };
    let quantized = |q: usize, scale: usize, zero: usize, name: &str| {
        let (q, scale, zero) = (
            constant(q, name)?,
            constant(scale, &format!("{name}_scale"))?,
            constant(zero, &format!("{name}_zero_point"))?,
        );
        dequantized(&q, &scale, &zero).map_err(|e| format!("{name}: {e}"))
    };
    let (w, r) = (quantized(1, 8, 9, "W")?, quantized(2, 10, 11, "R")?);
    let r8 = packed(
        &*constant(2, "R")?,
        &*constant(10, "R_scale")?,
        &*constant(11, "R_zero_point")?,
    );
    let mut lstm = inputs[..8].to_vec();
    for (slot, t, name) in [(1, w, "W"), (2, r, "R")] {
        let v = g.add_value(format!(
            "{}/dequantized_{name}",
            g.value_names[inputs[slot].unwrap_or(0)]
        ));
        g.constants.insert(v, Arc::new(t));
        lstm[slot] = Some(v);
    }
    Ok((lstm, r8))
}

/// `q` (`[directions, rows, cols]`, checked by [`dequantized`] first) packed per direction as
/// `rows × cols` for `qgemm`, with its scales per column.
fn packed(q: &Tensor, scale: &Tensor, zero: &Tensor) -> QuantizedR {
    let &[dirs, rows, cols] = q.shape.as_slice() else {
        unreachable!("dequantized checks the shape");
    };
    let per_column = scale.rank() == 2;
    let at = |i: usize| if per_column { i } else { i / cols };
    let sv = scale.to_f64_vec();
    let scales = (0..dirs * cols).map(|i| sv[at(i)] as f32).collect();
    let zeros = |d: usize| {
        if per_column {
            d * cols..(d + 1) * cols
        } else {
            d..d + 1
        }
    };
    let packs = (0..dirs)
        .map(|d| {
            let part = d * rows * cols..(d + 1) * rows * cols;
            match (&q.data, &zero.data) {
                (Data::I8(v), Data::I8(z)) => {
                    PackedB::new(rows, cols, &v[part], (cols, 1), &z[zeros(d)])
                }
                (Data::U8(v), Data::U8(z)) => {
                    PackedB::new(rows, cols, &v[part], (cols, 1), &z[zeros(d)])
                }
                _ => unreachable!("dequantized checks the types"),
            }
        })
        .collect();
    QuantizedR { packs, scales }
}

/// `(q - zero) · scale` of int8 or uint8 `q` shaped `[directions, rows, cols]`, transposed to
/// `[directions, cols, rows]`; scale and zero point are per direction (`[directions]`) or per
/// column (`[directions, cols]`), and of one shape.
fn dequantized(q: &Tensor, scale: &Tensor, zero: &Tensor) -> Result<Tensor, String> {
    let &[dirs, rows, cols] = q.shape.as_slice() else {
        return Err(format!(
            "shape {:?}, not [directions, rows, columns]",
            q.shape
        ));
    };
    if !matches!(q.dtype(), DType::I8 | DType::U8) {
        return Err(format!("element type {:?}, not int8 or uint8", q.dtype()));
    }
    if zero.dtype() != q.dtype() || scale.dtype() != DType::F32 {
        return Err(format!(
            "scale of {:?} and zero point of {:?}: want float and the weights' {:?}",
            scale.dtype(),
            zero.dtype(),
            q.dtype()
        ));
    }
    let per_column = match scale.shape.as_slice() {
        [d] if *d == dirs => false,
        [d, c] if *d == dirs && *c == cols => true,
        s => {
            return Err(format!(
                "scale shape {s:?}, not [{dirs}] or [{dirs}, {cols}]"
            ));
        }
    };
    if zero.shape != scale.shape {
        return Err(format!(
            "zero point shape {:?}, not the scale's {:?}",
            zero.shape, scale.shape
        ));
    }
    let (q, scale, zero) = (q.to_f64_vec(), scale.to_f64_vec(), zero.to_f64_vec());
    let at = |d: usize, c: usize| if per_column { d * cols + c } else { d };
    let mut out = vec![0f32; dirs * rows * cols];
    for d in 0..dirs {
        for row in 0..rows {
            for c in 0..cols {
                let k = at(d, c);
                let x = (q[(d * rows + row) * cols + c] - zero[k]) * scale[k];
                out[(d * cols + c) * rows + row] = x as f32;
            }
        }
    }
    Tensor::f32(vec![dirs, cols, rows], out).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::CpuBackend;
    use crate::proto::{AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto};
    use crate::proto::{TensorProto, attribute_type as at};
    use crate::zoo::builder::{attr_int, value_info};
    use prost::Message;

    const STEPS: usize = 3;
    const BATCH: usize = 2;
    const INPUT: usize = 4;
    const HIDDEN: usize = 2;
    const DIRS: usize = 2;
    const GATES: usize = 4 * HIDDEN;

    fn tensor(name: &str, dtype: DType, dims: &[usize], raw: Vec<u8>) -> TensorProto {
        TensorProto {
            dims: dims.iter().map(|&d| d as i64).collect(),
            data_type: dtype.onnx(),
            name: name.into(),
            raw_data: raw.into(),
            ..Default::default()
        }
    }

    fn floats(name: &str, dims: &[usize], v: &[f32]) -> TensorProto {
        tensor(
            name,
            DType::F32,
            dims,
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        )
    }

    /// A model of one LSTM-like node of `domain` on `X` (`[steps, batch, input]`).
    fn model(op: &str, domain: &str, inputs: &[&str], inits: Vec<TensorProto>) -> Vec<u8> {
        let direction = AttributeProto {
            name: "direction".into(),
            r#type: at::STRING,
            s: b"bidirectional".to_vec(),
            ..Default::default()
        };
        let dims = |d: &[usize]| d.iter().map(|&x| Some(x)).collect::<Vec<_>>();
        let graph = GraphProto {
            node: vec![NodeProto {
                input: inputs.iter().map(|s| s.to_string()).collect(),
                output: vec!["Y".into(), "Y_h".into(), "Y_c".into()],
                name: "lstm".into(),
                op_type: op.into(),
                domain: domain.into(),
                attribute: vec![attr_int("hidden_size", HIDDEN as i64), direction],
                ..Default::default()
            }],
            initializer: inits,
            input: vec![value_info("X", DType::F32, &dims(&[STEPS, BATCH, INPUT]))],
            output: vec![
                value_info("Y", DType::F32, &dims(&[STEPS, DIRS, BATCH, HIDDEN])),
                value_info("Y_h", DType::F32, &dims(&[DIRS, BATCH, HIDDEN])),
                value_info("Y_c", DType::F32, &dims(&[DIRS, BATCH, HIDDEN])),
            ],
            ..Default::default()
        };
        ModelProto {
            ir_version: 8,
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: 14,
            }],
            graph: Some(graph),
            ..Default::default()
        }
        .encode_to_vec()
    }

    /// Int8 `q` of `[DIRS, rows, GATES]` with its float values, dequantized and transposed to
    /// ONNX's `[DIRS, GATES, rows]` here by hand: per direction (W), or per gate unit with zero
    /// points (R).
    fn weights(rows: usize, seed: i32, per_gate: bool) -> (Vec<u8>, Vec<f32>, Vec<f32>, Vec<u8>) {
        let q: Vec<i8> = (0..(DIRS * rows * GATES) as i32)
            .map(|i| ((i * 37 + seed) % 255 - 127) as i8)
            .collect();
        let n = if per_gate { DIRS * GATES } else { DIRS };
        let scale: Vec<f32> = (0..n).map(|k| 0.01 + 0.002 * k as f32).collect();
        let zero: Vec<i8> = (0..n)
            .map(|k| if per_gate { k as i8 % 5 - 2 } else { 0 })
            .collect();
        let mut f = vec![0f32; q.len()];
        for d in 0..DIRS {
            for r in 0..rows {
                for g in 0..GATES {
                    let k = if per_gate { d * GATES + g } else { d };
                    let x = (q[(d * rows + r) * GATES + g] as f32 - zero[k] as f32) * scale[k];
                    f[(d * GATES + g) * rows + r] = x;
                }
            }
        }
        let bytes = |v: &[i8]| v.iter().map(|&x| x as u8).collect::<Vec<u8>>();
        (bytes(&q), f, scale, bytes(&zero))
    }

    fn quantized_model(r_scale_dims: &[usize]) -> Vec<u8> {
        let (wq, _, ws, wz) = weights(INPUT, 3, false);
        let (rq, _, rs, rz) = weights(HIDDEN, 11, true);
        let mut inits = vec![
            tensor("W", DType::I8, &[DIRS, INPUT, GATES], wq),
            tensor("R", DType::I8, &[DIRS, HIDDEN, GATES], rq),
            floats("W_scale", &[DIRS], &ws),
            tensor("W_zero", DType::I8, &[DIRS], wz),
            floats(
                "R_scale",
                r_scale_dims,
                &rs[..r_scale_dims.iter().product()],
            ),
            tensor("R_zero", DType::I8, &[DIRS, GATES], rz),
        ];
        inits.push(floats("B", &[DIRS, 2 * GATES], &[0.05; DIRS * 2 * GATES]));
        let inputs = [
            "X", "W", "R", "B", "", "", "", "", "W_scale", "W_zero", "R_scale", "R_zero",
        ];
        model("DynamicQuantizeLSTM", DOMAIN, &inputs, inits)
    }

    fn run(bytes: &[u8]) -> Vec<(String, Tensor)> {
        let x: Vec<f32> = (0..STEPS * BATCH * INPUT)
            .map(|i| (i as f32 * 0.7).sin())
            .collect();
        let m = crate::Model::from_bytes(bytes).expect("imports");
        let x = Tensor::f32(vec![STEPS, BATCH, INPUT], x).unwrap();
        m.plan
            .run(&CpuBackend::new(1), vec![("X".into(), x)])
            .expect("runs")
    }

    #[test]
    fn quantized_weights_dequantize_exactly_and_transposed() {
        for (rows, seed, per_gate) in [(INPUT, 3, false), (HIDDEN, 11, true)] {
            let (q, want, scale, zero) = weights(rows, seed, per_gate);
            let dims = if per_gate {
                vec![DIRS, GATES]
            } else {
                vec![DIRS]
            };
            let q = Tensor::new(
                vec![DIRS, rows, GATES],
                Data::I8(q.iter().map(|&b| b as i8).collect()),
            );
            let zero = Tensor::new(
                dims.clone(),
                Data::I8(zero.iter().map(|&b| b as i8).collect()),
            );
            let scale = Tensor::f32(dims, scale).unwrap();
            let got = dequantized(&q.unwrap(), &scale, &zero.unwrap()).expect("dequantizes");
            assert_eq!(got.shape, [DIRS, GATES, rows]);
            assert_eq!(got.as_f32().unwrap(), want.as_slice());
        }
    }

    /// The recurrent product in integers, on the state quantized each step, as onnxruntime runs
    /// this op: within the int8 tolerance of the float LSTM on the dequantized weights.
    #[test]
    fn a_dynamically_quantized_lstm_runs_as_an_lstm_on_its_dequantized_weights() {
        let m = crate::Model::from_bytes(&quantized_model(&[DIRS, GATES])).expect("imports");
        let r8 = m.plan.steps.iter().find_map(|s| match &s.op {
            crate::ops::Op::Rnn(r) => r.quantized_r.clone(),
            _ => None,
        });
        assert!(r8.is_some(), "R is kept in 8 bits");
        let (_, w, _, _) = weights(INPUT, 3, false);
        let (_, r, _, _) = weights(HIDDEN, 11, true);
        let float = model(
            "LSTM",
            "",
            &["X", "W", "R", "B"],
            vec![
                floats("W", &[DIRS, GATES, INPUT], &w),
                floats("R", &[DIRS, GATES, HIDDEN], &r),
                floats("B", &[DIRS, 2 * GATES], &[0.05; DIRS * 2 * GATES]),
            ],
        );
        let want = run(&float);
        let got = run(&quantized_model(&[DIRS, GATES]));
        assert_eq!(want.len(), 3);
        for ((name, want), (_, got)) in want.iter().zip(&got) {
            assert_eq!(want.shape, got.shape, "{name}");
            let (want, got) = (want.as_f32().unwrap(), got.as_f32().unwrap());
            let magnitude = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            let worst = want
                .iter()
                .zip(got)
                .fold(0f32, |m, (w, g)| m.max((w - g).abs()));
            assert!(worst <= 1e-2 * magnitude, "{name}: {worst} of {magnitude}");
        }
    }

    #[test]
    fn a_quantized_lstm_that_cannot_be_read_names_the_reason() {
        let err = |bytes: &[u8]| {
            crate::Model::from_bytes(bytes)
                .err()
                .expect("refused")
                .to_string()
        };
        let scale_shape = err(&quantized_model(&[GATES]));
        assert!(
            scale_shape.contains("scale shape [8], not [2] or [2, 8]"),
            "{scale_shape}"
        );
        let short = model("DynamicQuantizeLSTM", DOMAIN, &["X", "X", "X"], vec![]);
        let short = err(&short);
        assert!(
            short.contains("has 3 inputs; DynamicQuantizeLSTM takes 12"),
            "{short}"
        );
        let other = err(&model("PackedAttention", DOMAIN, &["X"], vec![]));
        assert!(
            other.contains(
                "com.microsoft.PackedAttention is not supported (of that domain, only \
                 DynamicQuantizeLSTM, Attention, "
            ),
            "{other}"
        );
        let ml = err(&model(
            "TreeEnsembleClassifier",
            "ai.onnx.ml",
            &["X"],
            vec![],
        ));
        assert!(
            ml.ends_with("operator ai.onnx.ml.TreeEnsembleClassifier is not supported"),
            "{ml}"
        );
    }

    /// A model of one node `op` of [`DOMAIN`] reading `inputs` (`X`: float `[2, 3, 8]`).
    fn node_model(
        op: &str,
        inputs: &[&str],
        outputs: &[&str],
        attribute: Vec<AttributeProto>,
    ) -> Vec<u8> {
        let graph = GraphProto {
            node: vec![NodeProto {
                input: inputs.iter().map(|s| s.to_string()).collect(),
                output: outputs.iter().map(|s| s.to_string()).collect(),
                name: "n".into(),
                op_type: op.into(),
                domain: DOMAIN.into(),
                attribute,
                ..Default::default()
            }],
            input: vec![value_info("X", DType::F32, &[Some(2), Some(3), Some(8)])],
            output: vec![value_info("Y", DType::F32, &[])],
            ..Default::default()
        };
        ModelProto {
            ir_version: 8,
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: 17,
            }],
            graph: Some(graph),
            ..Default::default()
        }
        .encode_to_vec()
    }

    /// A model of one node `op` of [`DOMAIN`] over float inputs of unknown rank (`m`, `t`: int32,
    /// `p`: int64), with output `Y`.
    fn dynamic_model(op: &str, inputs: &[&str], attribute: Vec<AttributeProto>) -> crate::Model {
        let dtype = |n: &str| match n {
            "m" | "t" => DType::I32,
            "p" => DType::I64,
            _ => DType::F32,
        };
        let mut names: Vec<&str> = inputs.iter().copied().filter(|n| !n.is_empty()).collect();
        names.dedup();
        let graph = GraphProto {
            node: vec![NodeProto {
                input: inputs.iter().map(|s| s.to_string()).collect(),
                output: vec!["Y".into()],
                name: "n".into(),
                op_type: op.into(),
                domain: DOMAIN.into(),
                attribute,
                ..Default::default()
            }],
            input: names
                .iter()
                .map(|n| {
                    let mut v = value_info(n, dtype(n), &[]);
                    if let Some(t) = v.r#type.as_mut().and_then(|t| t.tensor_type.as_mut()) {
                        t.shape = None;
                    }
                    v
                })
                .collect(),
            output: vec![value_info("Y", DType::F32, &[])],
            ..Default::default()
        };
        let bytes = ModelProto {
            ir_version: 8,
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: 17,
            }],
            graph: Some(graph),
            ..Default::default()
        }
        .encode_to_vec();
        crate::Model::from_bytes(&bytes).expect("imports")
    }

    /// Q, K and V packed per head (`[B, S, N, 3, H]`, onnxruntime's GPU layout, which its CPU
    /// does not run) attend as the same tensors given apart, with the same bias.
    #[test]
    fn packed_projections_attend_as_separate_ones() {
        let (b, s, n, h) = (2, 3, 2, 4);
        let packed: Vec<f32> = (0..b * s * n * 3 * h)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0)
            .collect();
        let bias: Vec<f32> = (0..3 * n * h).map(|i| (i as f32 - 12.0) / 9.0).collect();
        // Part p of the packed tensor as [B, S, N·H].
        let part = |p: usize| {
            let v = (0..b * s * n)
                .flat_map(|row| packed[(row * 3 + p) * h..(row * 3 + p + 1) * h].to_vec())
                .collect();
            Tensor::f32(vec![b, s, n * h], v).unwrap()
        };
        let bias_t = Tensor::f32(vec![3 * n * h], bias).unwrap();
        let run = |m: &crate::Model, feeds: Vec<(&str, Tensor)>| {
            let feeds = feeds.into_iter().map(|(n, t)| (n.to_string(), t)).collect();
            m.plan
                .run(&CpuBackend::new(1), feeds)
                .expect("runs")
                .remove(0)
                .1
        };
        let heads = || vec![attr_int("num_heads", n as i64)];
        let one = dynamic_model("MultiHeadAttention", &["q", "", "", "b"], heads());
        let got = run(
            &one,
            vec![
                (
                    "q",
                    Tensor::f32(vec![b, s, n, 3, h], packed.clone()).unwrap(),
                ),
                ("b", bias_t.clone()),
            ],
        );
        let apart = dynamic_model("MultiHeadAttention", &["q", "k", "v", "b"], heads());
        let want = run(
            &apart,
            vec![
                ("q", part(0)),
                ("k", part(1)),
                ("v", part(2)),
                ("b", bias_t),
            ],
        );
        assert_eq!(got.shape, [b, s, n * h]);
        assert_eq!(got, want);
        // Packed K and V beside a separate Q.
        let kv: Vec<f32> = (0..b * s * n)
            .flat_map(|row| packed[(row * 3 + 1) * h..(row * 3 + 3) * h].to_vec())
            .collect();
        let pair = dynamic_model("MultiHeadAttention", &["q", "k"], heads());
        let got = run(
            &pair,
            vec![
                ("q", part(0)),
                ("k", Tensor::f32(vec![b, s, n, 2, h], kv).unwrap()),
            ],
        );
        let apart = dynamic_model("MultiHeadAttention", &["q", "k", "v"], heads());
        let want = run(&apart, vec![("q", part(0)), ("k", part(1)), ("v", part(2))]);
        assert_eq!(got, want);
    }

    /// Shapes the attention operators cannot take are run-time errors naming them, not panics
    /// or answers.
    #[test]
    fn attention_inputs_of_the_wrong_shape_are_errors() {
        let zeros =
            |shape: &[usize]| Tensor::f32(shape.to_vec(), vec![0.0; shape.iter().product()]);
        let run = |m: &crate::Model, feeds: Vec<(&str, Tensor)>| {
            let feeds = feeds.into_iter().map(|(n, t)| (n.to_string(), t)).collect();
            m.plan
                .run(&CpuBackend::new(1), feeds)
                .map(|_| ())
                .err()
                .map(|e| e.to_string())
        };
        let heads = || vec![attr_int("num_heads", 2)];
        let mha = dynamic_model("MultiHeadAttention", &["q", "k", "v", "", "m"], heads());
        let ok = |m: Tensor| {
            run(
                &mha,
                vec![
                    ("q", zeros(&[2, 3, 8]).unwrap()),
                    ("k", zeros(&[2, 4, 8]).unwrap()),
                    ("v", zeros(&[2, 4, 8]).unwrap()),
                    ("m", m),
                ],
            )
        };
        assert_eq!(
            ok(Tensor::new(vec![2], Data::I32(vec![4, 1])).unwrap()),
            None
        );
        let bad = ok(Tensor::new(vec![3], Data::I32(vec![1; 3])).unwrap()).expect("refused");
        assert!(bad.contains("must be [2] (lengths)"), "{bad}");
        let bad = ok(Tensor::new(vec![2, 3], Data::I32(vec![1; 6])).unwrap()).expect("refused");
        assert!(bad.contains("[2, 4] or [2, 3, 4] (raw masks)"), "{bad}");
        // Hidden sizes that do not split into the heads; key and value of different ranks.
        let plain = dynamic_model("MultiHeadAttention", &["q", "k", "v"], heads());
        let odd = run(
            &plain,
            vec![
                ("q", zeros(&[1, 2, 7]).unwrap()),
                ("k", zeros(&[1, 2, 7]).unwrap()),
                ("v", zeros(&[1, 2, 7]).unwrap()),
            ],
        )
        .expect("refused");
        assert!(odd.contains("does not split into 2 heads"), "{odd}");
        let ranks = run(
            &plain,
            vec![
                ("q", zeros(&[1, 2, 8]).unwrap()),
                ("k", zeros(&[1, 2, 2, 4]).unwrap()),
                ("v", zeros(&[1, 2, 8]).unwrap()),
            ],
        )
        .expect("refused");
        assert!(ranks.contains("differ in rank"), "{ranks}");
        // A bias shorter than the query's and key's hidden sizes.
        let biased = dynamic_model("MultiHeadAttention", &["q", "k", "v", "b"], heads());
        let three = || zeros(&[1, 2, 8]).unwrap();
        let short = run(
            &biased,
            vec![
                ("q", three()),
                ("k", three()),
                ("v", three()),
                ("b", zeros(&[10]).unwrap()),
            ],
        );
        assert!(short.is_some());
        // Packed Q/K/V that is not [B, S, N, 3, H].
        let packed = dynamic_model("MultiHeadAttention", &["q"], heads());
        assert!(run(&packed, vec![("q", zeros(&[1, 2, 2, 2, 4]).unwrap())]).is_some());
        // Positions outside the rotary caches, and caches narrower than the attribute says.
        let rotary = dynamic_model(
            "RotaryEmbedding",
            &["x", "p", "c", "c"],
            vec![attr_int("num_heads", 2)],
        );
        let positions = |v: Vec<i64>| Tensor::i64(vec![1, 2], v).unwrap();
        let at = |p: Tensor, c: &[usize]| {
            run(
                &rotary,
                vec![
                    ("x", zeros(&[1, 2, 8]).unwrap()),
                    ("p", p),
                    ("c", zeros(c).unwrap()),
                ],
            )
        };
        assert_eq!(at(positions(vec![0, 9]), &[10, 2]), None);
        let past = at(positions(vec![0, 10]), &[10, 2]).expect("refused");
        assert!(past.contains("position 10 outside a cache of 10"), "{past}");
        let negative = at(Tensor::i64(vec![1], vec![-1]).unwrap(), &[10, 2]).expect("refused");
        assert!(negative.contains("position -1 outside"), "{negative}");
        let narrow = at(positions(vec![0, 1]), &[10, 3]).expect("refused");
        assert!(narrow.contains("rotary_embedding_dim / 2 = 2"), "{narrow}");

        // Lengths and cache sizes from the request that do not fit each other.
        let gqa = dynamic_model(
            "GroupQueryAttention",
            &["q", "k", "v", "pk", "pv", "m", "t"],
            vec![attr_int("num_heads", 2), attr_int("kv_num_heads", 1)],
        );
        let step = |lengths: Vec<i32>, total: i32, past: &[usize]| {
            let b = past[0];
            run(
                &gqa,
                vec![
                    ("q", zeros(&[b, 1, 8]).unwrap()),
                    ("k", zeros(&[b, 1, 4]).unwrap()),
                    ("v", zeros(&[b, 1, 4]).unwrap()),
                    ("pk", zeros(past).unwrap()),
                    ("pv", zeros(past).unwrap()),
                    (
                        "m",
                        Tensor::new(vec![lengths.len()], Data::I32(lengths)).unwrap(),
                    ),
                    ("t", Tensor::new(vec![], Data::I32(vec![total])).unwrap()),
                ],
            )
        };
        assert_eq!(step(vec![3, 1], 4, &[2, 1, 3, 4]), None);
        for (lengths, total, past, why) in [
            (vec![4, 1], 4, [2, 1, 3, 4], "seqlens_k 4 does not fit"),
            (vec![-3, 1], 4, [2, 1, 3, 4], "seqlens_k -3 does not fit"),
            (vec![3, 1], -1, [2, 1, 3, 4], "total_sequence_length is -1"),
            (
                vec![3],
                4,
                [2, 1, 3, 4],
                "seqlens_k has 1 values for a batch of 2",
            ),
            (
                vec![3, 1],
                4,
                [2, 2, 3, 4],
                "past_key [2, 2, 3, 4] is not [2, 1, length, 4]",
            ),
            (
                vec![3, 1],
                i32::MAX,
                [2, 1, 3, 4],
                "exceeds the executor's limit",
            ),
        ] {
            let e = step(lengths, total, &past).expect("refused");
            assert!(e.contains(why), "{why}: {e}");
        }
    }

    #[test]
    fn forms_of_onnxruntime_operators_it_does_not_read_are_errors_naming_node_and_reason() {
        let string = |name: &str, v: &str| super::super::expansion::string_attr(name, v);
        let nbits = [
            attr_int("K", 8),
            attr_int("N", 4),
            attr_int("block_size", 16),
        ];
        let cases = [
            (
                "Attention",
                vec!["X", "X", "", "", "X"],
                vec!["Y"],
                vec![attr_int("num_heads", 2)],
                "input 4 (past) is not supported",
            ),
            (
                "Attention",
                vec!["X", "X"],
                vec!["Y", "present"],
                vec![attr_int("num_heads", 2)],
                "output 1 (present) is not supported",
            ),
            (
                "Attention",
                vec!["X", "X"],
                vec!["Y"],
                vec![],
                "attribute \"num_heads\" is required",
            ),
            (
                "Attention",
                vec!["X", "X"],
                vec!["Y"],
                vec![
                    attr_int("num_heads", 2),
                    crate::zoo::builder::attr_ints("qkv_hidden_sizes", &[8, 8]),
                ],
                "attribute \"qkv_hidden_sizes\" is [8, 8]: three positive multiples of num_heads (2)",
            ),
            (
                "FusedConv",
                vec!["X", "X"],
                vec!["Y"],
                vec![string("activation", "Elu")],
                "activation \"Elu\" is not supported",
            ),
            (
                "FusedConv",
                vec!["X", "X"],
                vec!["Y"],
                vec![string("activation", "LeakyRelu")],
                "activation \"LeakyRelu\" needs 1 activation_params, has 0",
            ),
            (
                "QLinearGlobalAveragePool",
                vec!["X", "X", "X", "X", "X"],
                vec!["Y"],
                vec![attr_int("channels_last", 1)],
                "attribute \"channels_last\" is not supported (only 0)",
            ),
            (
                "QLinearConcat",
                vec!["X", "X", "X", "X"],
                vec!["Y"],
                vec![attr_int("axis", 1)],
                "has 4 inputs: Y_scale, Y_zero_point, then a (tensor, scale, zero point) triple",
            ),
            (
                "SkipLayerNormalization",
                vec!["X", "X"],
                vec!["Y"],
                vec![],
                "input 2 (gamma) is required",
            ),
            (
                "SkipSimplifiedLayerNormalization",
                vec!["X", "X", "X"],
                vec!["Y", "mean"],
                vec![],
                "output 1 (mean) is not supported",
            ),
            (
                "MatMulNBits",
                vec!["X", "X", "X"],
                vec!["Y"],
                nbits.to_vec(),
                "input 1 (B) is not a constant",
            ),
            (
                "MatMulNBits",
                vec!["X", "X", "X"],
                vec!["Y"],
                nbits[1..].to_vec(),
                "attribute \"K\" is required",
            ),
            (
                "MatMulNBits",
                vec!["X", "X", "X"],
                vec!["Y"],
                [&nbits[..], &[attr_int("bits", 3)]].concat(),
                "attribute \"bits\" is 3, not 2, 4 or 8",
            ),
            (
                "MatMulNBits",
                vec!["X", "X", "X", "", "X"],
                vec!["Y"],
                nbits.to_vec(),
                "input 4 (g_idx) is not supported",
            ),
            (
                "MultiHeadAttention",
                vec!["X", "", "X"],
                vec!["Y"],
                vec![attr_int("num_heads", 2)],
                "input 2 (value) is given without input 1 (key)",
            ),
            (
                "MultiHeadAttention",
                vec!["X", "X", "X", "", "", "", "X"],
                vec!["Y"],
                vec![attr_int("num_heads", 2)],
                "inputs 6 (past_key) and 7 (past_value) come together",
            ),
            (
                "MultiHeadAttention",
                vec!["X", "X", "X", "", "", "", "X", "X", "X"],
                vec!["Y"],
                vec![attr_int("num_heads", 2)],
                "input 8 (past_sequence_length) is not supported",
            ),
            (
                "MultiHeadAttention",
                vec!["X", "X", "X"],
                vec!["Y", "", "", "qk"],
                vec![attr_int("num_heads", 2)],
                "output 3 (qk) is not supported",
            ),
            (
                "MultiHeadAttention",
                vec!["X", "X", "X"],
                vec!["Y"],
                vec![attr_int("num_heads", -2)],
                "attribute \"num_heads\" is -2, not positive",
            ),
            (
                "GroupQueryAttention",
                vec!["X", "X", "X", "", "", "X", "X", "", "", "X"],
                vec!["Y"],
                vec![attr_int("num_heads", 4), attr_int("kv_num_heads", 2)],
                "input 9 (position_ids) is not supported",
            ),
            (
                "GroupQueryAttention",
                vec!["X", "X", "X", "", "", "X", "X"],
                vec!["Y"],
                vec![attr_int("num_heads", 4), attr_int("kv_num_heads", 3)],
                "attribute \"kv_num_heads\" is 3: a positive divisor of num_heads (4)",
            ),
            (
                "GroupQueryAttention",
                vec!["X", "X", "X", "", "", "X", "X"],
                vec!["Y"],
                vec![
                    attr_int("num_heads", 4),
                    attr_int("kv_num_heads", 2),
                    attr_int("causal", 0),
                ],
                "attribute \"causal\" is not supported (only 1)",
            ),
            (
                "GroupQueryAttention",
                vec!["X", "X", "X", "", "", "X", "X"],
                vec!["Y"],
                vec![
                    attr_int("num_heads", 4),
                    attr_int("kv_num_heads", 2),
                    attr_int("do_rotary", 1),
                ],
                "input 7 (cos_cache) is required",
            ),
            (
                "RotaryEmbedding",
                vec!["X", "X", "X", "X"],
                vec!["Y"],
                vec![attr_int("is_packed_batching", 1)],
                "attribute \"is_packed_batching\" is not supported (only 0)",
            ),
            (
                "RotaryEmbedding",
                vec!["X", "X", "X"],
                vec!["Y"],
                vec![],
                "input 3 (sin_cache) is required",
            ),
        ];
        for (op, inputs, outputs, attrs, want) in cases {
            let e = crate::Model::from_bytes(&node_model(op, &inputs, &outputs, attrs))
                .err()
                .expect("refused")
                .to_string();
            assert!(
                e.starts_with(&format!("node \"n\" (com.microsoft.{op}")),
                "{e}"
            );
            assert!(e.contains(want), "{op}: {e}");
        }
    }
}
