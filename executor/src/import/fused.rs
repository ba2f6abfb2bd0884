//! The fused operators onnxruntime's graph optimizer and transformer optimizer write into the
//! models they save (GELU forms, FusedMatMul, FusedConv, FusedGemm, the skip and embedding layer
//! normalisations), written out as the standard operators they fuse. The executor's own passes
//! fuse them again where it has kernels for the pattern.

use super::expansion::{Expansion, R, float_attr, int_attr, string_attr, tensor_attr};
use crate::tensor::{Data, Tensor};

/// `Gelu` (erf), `FastGelu` (tanh, optional bias), `BiasGelu`, `QuickGelu`.
pub fn gelu(e: &mut Expansion, op: &str) -> R<()> {
    let x = e.required(0, "X")?;
    let out = e.output(0);
    match op {
        "Gelu" => {
            e.node_to("Gelu", &[x], &[out], vec![]);
        }
        "BiasGelu" => {
            let sum = e.node("Add", &[x, e.required(1, "bias")?], vec![]);
            e.node_to("Gelu", &[&sum], &[out], vec![]);
        }
        "FastGelu" => {
            let x = match e.input(1) {
                "" => x.to_string(),
                bias => e.node("Add", &[x, bias], vec![]),
            };
            e.node_to(
                "Gelu",
                &[&x],
                &[out],
                vec![string_attr("approximate", "tanh")],
            );
        }
        "QuickGelu" => {
            let alpha = e.attrs().float_or("alpha", 1.702)?;
            let scaled = match alpha == 1.0 {
                true => x.to_string(),
                false => {
                    let a = e.float(alpha);
                    e.node("Mul", &[x, &a], vec![])
                }
            };
            let gate = e.node("Sigmoid", &[&scaled], vec![]);
            e.node_to("Mul", &[x, &gate], &[out], vec![]);
        }
        _ => unreachable!("contrib dispatches only GELU forms here"),
    }
    Ok(())
}

/// `FusedMatMul` (and its older name `TransposeMatMul`): MatMul of A and B, times `alpha`.
/// `transA`/`transB` transpose an operand's last two axes; `transBatchA`/`transBatchB` read it
/// with its first axis where the rows go ([M, batch..., K] as [batch..., M, K]), as
/// onnxruntime's transpose fusion writes a Transpose that moved the batch axes in front.
pub fn fused_matmul(e: &mut Expansion) -> R<()> {
    let a = e.attrs();
    let alpha = a.float_or("alpha", 1.0)?;
    let mut operands = [
        e.required(0, "A")?.to_string(),
        e.required(1, "B")?.to_string(),
    ];
    for (k, (batch, last)) in [("transBatchA", "transA"), ("transBatchB", "transB")]
        .into_iter()
        .enumerate()
    {
        // Whatever the rank: constant operands fold to their transpose.
        let equation = match (a.flag(batch, false)?, a.flag(last, false)?) {
            (false, false) => continue,
            (false, true) => "...ij->...ji",
            (true, false) => "i...j->...ij",
            (true, true) => "i...j->...ji",
        };
        operands[k] = e.node(
            "Einsum",
            &[&operands[k]],
            vec![string_attr("equation", equation)],
        );
    }
    let out = e.output(0);
    if alpha == 1.0 {
        e.node_to("MatMul", &[&operands[0], &operands[1]], &[out], vec![]);
    } else {
        let product = e.node("MatMul", &[&operands[0], &operands[1]], vec![]);
        let alpha = e.float(alpha);
        e.node_to("Mul", &[&product, &alpha], &[out], vec![]);
    }
    Ok(())
}

/// An activation by name, as FusedConv and FusedGemm give it, applied to `x` into `out`.
fn activation(e: &mut Expansion, x: &str, name: &str, params: &[f32], out: &str) -> R<()> {
    let param = |k: usize| {
        params.get(k).copied().ok_or_else(|| {
            format!(
                "activation {name:?} needs {} activation_params, has {}",
                k + 1,
                params.len()
            )
        })
    };
    match name {
        "" => e.node_to("Identity", &[x], &[out], vec![]),
        "Relu" | "Tanh" | "Sigmoid" => e.node_to(name, &[x], &[out], vec![]),
        "LeakyRelu" => e.node_to(name, &[x], &[out], vec![float_attr("alpha", param(0)?)]),
        "HardSigmoid" => e.node_to(
            name,
            &[x],
            &[out],
            vec![
                float_attr("alpha", param(0)?),
                float_attr("beta", param(1)?),
            ],
        ),
        "Clip" => {
            let (lo, hi) = (e.float(param(0)?), e.float(param(1)?));
            e.node_to("Clip", &[x, &lo, &hi], &[out], vec![]);
        }
        other => {
            return Err(format!(
                "activation {other:?} is not supported (Relu, Tanh, Sigmoid, LeakyRelu, \
                 HardSigmoid, Clip)"
            ));
        }
    }
    Ok(())
}

/// `FusedConv`: Conv, plus the optional sum input Z, then the activation.
pub fn fused_conv(e: &mut Expansion) -> R<()> {
    let a = e.attrs();
    let act = a.string_or("activation", "")?;
    let params = a.floats("activation_params")?.unwrap_or_default();
    let conv_attrs = e.same_attrs(&[
        "auto_pad",
        "dilations",
        "group",
        "kernel_shape",
        "pads",
        "strides",
    ]);
    let (x, w) = (e.required(0, "X")?, e.required(1, "W")?);
    let mut y = e.node("Conv", &[x, w, e.input(2)], conv_attrs);
    let z = e.input(3);
    if !z.is_empty() {
        y = e.node("Add", &[&y, z], vec![]);
    }
    activation(e, &y, &act, &params, e.output(0))
}

/// `FusedGemm`: Gemm, then the activation (`activation_alpha`/`_beta` its parameters).
pub fn fused_gemm(e: &mut Expansion) -> R<()> {
    let a = e.attrs();
    let act = a.string_or("activation", "")?;
    let mut params = vec![];
    for p in ["activation_alpha", "activation_beta"] {
        if let Some(v) = a.float(p)? {
            params.push(v);
        }
    }
    if a.has("activation_gamma") {
        return Err("attribute \"activation_gamma\" is not supported".into());
    }
    let gemm_attrs = e.same_attrs(&["alpha", "beta", "transA", "transB"]);
    let (x, w) = (e.required(0, "A")?, e.required(1, "B")?);
    let y = e.node("Gemm", &[x, w, e.input(2)], gemm_attrs);
    activation(e, &y, &act, &params, e.output(0))
}

/// `SkipLayerNormalization` and `SkipSimplifiedLayerNormalization`: input + skip (+ bias),
/// normalised over the last axis; output 3 is the sum.
pub fn skip_layer_norm(e: &mut Expansion, simplified: bool) -> R<()> {
    let eps = e.attrs().float_or("epsilon", 1e-12)?;
    let (bias_at, beta) = match simplified {
        true => (3, ""),
        false => (4, e.input(3)),
    };
    let (x, skip, gamma) = (
        e.required(0, "input")?,
        e.required(1, "skip")?,
        e.required(2, "gamma")?,
    );
    let sum_out = e.output(3);
    let bias = e.input(bias_at);
    // The bias first: the input is usually a MatMul's product, whose epilogue takes it.
    let sum = match bias {
        "" => e.node_into("Add", &[x, skip], vec![], sum_out),
        _ => {
            let biased = e.node("Add", &[x, bias], vec![]);
            e.node_into("Add", &[&biased, skip], vec![], sum_out)
        }
    };
    normalize(e, &sum, gamma, beta, eps, simplified, 1)
}

/// Layer normalisation (RMS when `simplified`) of `x` over its last axis into the node's
/// outputs `first..first + 3` (output, mean, inverse standard deviation).
fn normalize(
    e: &mut Expansion,
    x: &str,
    gamma: &str,
    beta: &str,
    eps: f32,
    simplified: bool,
    stats_at: usize,
) -> R<()> {
    let attrs = vec![int_attr("axis", -1), float_attr("epsilon", eps)];
    let out = e.output(0);
    if simplified {
        e.unsupported_output(stats_at, "mean")?;
        e.unsupported_output(stats_at + 1, "inv_std_var")?;
        e.node_to("RMSNormalization", &[x, gamma], &[out], attrs);
        return Ok(());
    }
    let outputs = [out, e.output(stats_at), e.output(stats_at + 1)];
    let n = outputs.iter().rposition(|o| !o.is_empty()).unwrap_or(0) + 1;
    e.node_to(
        "LayerNormalization",
        &[x, gamma, beta],
        &outputs[..n],
        attrs,
    );
    Ok(())
}

/// `SimplifiedLayerNormalization` (onnxruntime registers it in the default domain): RMS
/// normalisation over the axes from `axis` on.
pub fn simplified_layer_norm(e: &mut Expansion) -> R<()> {
    let a = e.attrs();
    let attrs = vec![
        int_attr("axis", a.int_or("axis", -1)?),
        float_attr("epsilon", a.float_or("epsilon", 1e-5)?),
    ];
    e.unsupported_output(1, "inv_std_var")?;
    let (x, scale) = (e.required(0, "X")?, e.required(1, "scale")?);
    e.node_to("RMSNormalization", &[x, scale], &[e.output(0)], attrs);
    Ok(())
}

/// `EmbedLayerNormalization`: the word, position and segment embeddings of BERT's inputs,
/// summed (output 2) and layer-normalised (output 0); output 1 counts each row's mask ones.
/// Without position ids, position `s` of every row reads row `s` of the position table.
/// `QEmbedLayerNormalization` (`quantized`) is the same on tables in 8 bits, dequantized first.
pub fn embed_layer_norm(e: &mut Expansion, quantized: bool) -> R<()> {
    let eps = e.attrs().float_or("epsilon", 1e-12)?;
    let ids = e.required(0, "input_ids")?;
    // The tables (word, position, segment, gamma, beta) at inputs 2..7; quantized, their
    // scales follow at 8.. and zero points at 13.., and there are no position ids.
    let mut tables = Vec::new();
    for (k, what) in ["word_embedding", "position_embedding", "", "gamma", "beta"]
        .iter()
        .enumerate()
    {
        let table = match what.is_empty() {
            true => e.input(4),
            false => e.required(2 + k, what)?,
        };
        tables.push(match (quantized, table) {
            (false, _) | (true, "") => table.to_string(),
            (true, _) => {
                let (scale, zero) = (e.required(8 + k, "a scale")?, e.input(13 + k));
                e.node("DequantizeLinear", &[table, scale, zero], vec![])
            }
        });
    }
    let [words, positions, segments, gamma, beta] = [0, 1, 2, 3, 4].map(|k| tables[k].as_str());
    let word = e.node("Gather", &[words, ids], vec![]);
    let position_ids = if quantized { "" } else { e.input(8) };
    let position = match position_ids {
        "" => {
            let length = e.node(
                "Shape",
                &[ids],
                vec![int_attr("start", 1), int_attr("end", 2)],
            );
            let (zero, axis) = (e.ints(&[0]), e.ints(&[0]));
            e.node("Slice", &[positions, &zero, &length, &axis], vec![])
        }
        position_ids => e.node("Gather", &[positions, position_ids], vec![]),
    };
    let segment_ids = e.input(1);
    let sum_out = if quantized { "" } else { e.output(2) };
    let sum = match (segments, segment_ids) {
        ("", _) | (_, "") => e.node_into("Add", &[&word, &position], vec![], sum_out),
        _ => {
            let segment = e.node("Gather", &[segments, segment_ids], vec![]);
            let s = e.node("Add", &[&word, &position], vec![]);
            e.node_into("Add", &[&s, &segment], vec![], sum_out)
        }
    };
    let attrs = vec![int_attr("axis", -1), float_attr("epsilon", eps)];
    e.node_to(
        "LayerNormalization",
        &[&sum, gamma, beta],
        &[e.output(0)],
        attrs,
    );
    let mask_index = e.output(1);
    if !mask_index.is_empty() {
        match e.input(7) {
            "" => {
                let batch = e.node("Shape", &[ids], vec![int_attr("end", 1)]);
                let zero = tensor_attr("value", &int32(vec![1], 0));
                e.node_to("ConstantOfShape", &[&batch], &[mask_index], vec![zero]);
            }
            mask => {
                let one = e.constant(&int32(vec![], 1));
                let ones = e.node("Equal", &[mask, &one], vec![]);
                let counted = e.node("Cast", &[&ones], vec![int_attr("to", 6)]);
                let axis = e.ints(&[1]);
                e.node_to(
                    "ReduceSum",
                    &[&counted, &axis],
                    &[mask_index],
                    vec![int_attr("keepdims", 0)],
                );
            }
        }
    }
    Ok(())
}

/// An int32 tensor of `shape` filled with `v`.
fn int32(shape: Vec<usize>, v: i32) -> Tensor {
    let n = shape.iter().product();
    Tensor::new(shape, Data::I32(vec![v; n])).expect("a small tensor")
}
