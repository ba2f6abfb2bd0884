//! onnxruntime's fused self-attention, `Attention` (float) and `QAttention` (its input
//! projection in 8 bits, as `quantize_dynamic` writes it): the packed Q/K/V projection, then the
//! standard Attention over `num_heads` heads with the mask its `mask_index` describes
//! ([`MaskIndexAttrs`]). A key/value cache (`past`, `present`) and rotary embeddings are
//! refused.

use super::expansion::{Expansion, R, float_attr, int_attr};
use crate::ops::Op;
use crate::ops::mask_index::MaskIndexAttrs;

/// `Attention(input, weights, bias?, mask_index?, past?, attention_bias?, past_sequence_length?)`.
pub fn attention(e: &mut Expansion) -> R<()> {
    e.unsupported_input(4, "past")?;
    e.unsupported_input(6, "past_sequence_length")?;
    let x = e.required(0, "input")?;
    let mut qkv = e.node("MatMul", &[x, e.required(1, "weights")?], vec![]);
    let bias = e.input(2);
    if !bias.is_empty() {
        qkv = e.node("Add", &[&qkv, bias], vec![]);
    }
    let (mask, attention_bias) = (e.input(3), e.input(5));
    heads(e, &qkv, x, mask, attention_bias)
}

/// `QAttention(input, weight, bias, input_scale, weight_scale, mask_index?, input_zero_point?,
/// weight_zero_point?, past?)`: the projection's integer product, scaled by both scales.
pub fn quantized_attention(e: &mut Expansion) -> R<()> {
    e.unsupported_input(8, "past")?;
    let x = e.required(0, "input")?;
    let (w, bias) = (e.required(1, "weight")?, e.required(2, "bias")?);
    let (x_scale, w_scale) = (
        e.required(3, "input_scale")?,
        e.required(4, "weight_scale")?,
    );
    let (x_zero, w_zero) = (e.input(6), e.input(7));
    let sums = e.node("MatMulInteger", &[x, w, x_zero, w_zero], vec![]);
    let sums = e.node("Cast", &[&sums], vec![int_attr("to", 1)]);
    let scale = e.node("Mul", &[x_scale, w_scale], vec![]);
    let scaled = e.node("Mul", &[&sums, &scale], vec![]);
    let qkv = e.node("Add", &[&scaled, bias], vec![]);
    heads(e, &qkv, x, e.input(5), "")
}

/// The attention of the packed projection `qkv` (`[B, S, q + k + v]`) of `query`.
fn heads(e: &mut Expansion, qkv: &str, query: &str, mask: &str, attention_bias: &str) -> R<()> {
    let a = e.attrs();
    for unsupported in ["do_rotary", "past_present_share_buffer"] {
        if a.int_or(unsupported, 0)? != 0 {
            return Err(format!(
                "attribute {unsupported:?} is not supported (only 0)"
            ));
        }
    }
    e.unsupported_output(1, "present")?;
    let heads = match a.int("num_heads")? {
        Some(h) if h > 0 => h,
        Some(h) => return Err(format!("attribute \"num_heads\" is {h}, not positive")),
        None => return Err("attribute \"num_heads\" is required".into()),
    };
    let causal = a.flag("unidirectional", false)?;
    let filter = a.float_or("mask_filter_value", -10000.0)?;
    let scale = a.float("scale")?.filter(|&s| s != 0.0);
    let sizes = match a.ints("qkv_hidden_sizes")? {
        Some(sizes) if sizes.len() == 3 && sizes.iter().all(|&s| s > 0 && s % heads == 0) => {
            Some(e.ints(&sizes))
        }
        Some(sizes) => {
            return Err(format!(
                "attribute \"qkv_hidden_sizes\" is {sizes:?}: three positive multiples of \
                 num_heads ({heads})"
            ));
        }
        None => None,
    };
    let (q, k, v) = (format!("{qkv}/q"), format!("{qkv}/k"), format!("{qkv}/v"));
    let axis = int_attr("axis", -1);
    match &sizes {
        Some(sizes) => e.node_to("Split", &[qkv, sizes], &[&q, &k, &v], vec![axis]),
        None => e.node_to(
            "Split",
            &[qkv],
            &[&q, &k, &v],
            vec![axis, int_attr("num_outputs", 3)],
        ),
    }
    let mut additive = String::new();
    if !mask.is_empty() || causal {
        additive = e.op(
            Op::MaskIndex(MaskIndexAttrs { filter, causal }),
            &[mask, query],
        );
    }
    if !attention_bias.is_empty() {
        additive = match additive.as_str() {
            "" => attention_bias.to_string(),
            m => e.node("Add", &[m, attention_bias], vec![]),
        };
    }
    let mut attrs = vec![
        int_attr("q_num_heads", heads),
        int_attr("kv_num_heads", heads),
    ];
    if let Some(s) = scale {
        attrs.push(float_attr("scale", s));
    }
    e.node_at(
        "Attention",
        &[&q, &k, &v, &additive],
        &[e.output(0)],
        attrs,
        23,
    );
    Ok(())
}
