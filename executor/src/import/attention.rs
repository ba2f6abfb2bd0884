//! onnxruntime's fused attention operators, read as the standard Attention over `num_heads`
//! heads:
//! - `Attention` (float) and `QAttention` (its input projection in 8 bits, as `quantize_dynamic`
//!   writes it): self-attention from a packed Q/K/V projection, with the mask its `mask_index`
//!   describes ([`MaskIndexAttrs`]). Their key/value cache (`past`, `present`) and rotary
//!   embeddings are refused.
//! - `RotaryEmbedding`: the standard RotaryEmbedding's arithmetic with onnxruntime's inputs
//!   (`position_ids` second, and possibly `[1]`, the first position).
//! - `GroupQueryAttention`: an executor op ([`GroupQueryAttrs`]); what it leaves out (position
//!   ids, an attention bias, head sinks, a quantized or window-sized cache, Q/K norms, the
//!   scores as an output, non-causal attention) is refused.
//! - `MultiHeadAttention`: projected Q, K and V (separate, or packed as `[B, S, N, 3, H]` or
//!   `[B, L, N, 2, H]`), a key and value as tokens or already in heads (a cross-attention
//!   cache, which takes no bias), a key padding mask, an attention bias and a key/value cache.

use super::expansion::{Expansion, R, float_attr, int_attr};
use crate::ops::Op;
use crate::ops::attention::RotaryAttrs;
use crate::ops::attrs::Attrs;
use crate::ops::group_query::GroupQueryAttrs;
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
    let heads = num_heads(&a)?;
    let causal = a.flag("unidirectional", false)?;
    let filter = a.float_or("mask_filter_value", -10000.0)?;
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
    let attrs = standard_attrs(&a, heads, false)?;
    e.node_at(
        "Attention",
        &[&q, &k, &v, &additive],
        &[e.output(0)],
        attrs,
        23,
    );
    Ok(())
}

/// `MultiHeadAttention(query, key?, value?, bias?, key_padding_mask?, attention_bias?,
/// past_key?, past_value?)` → `(output, present_key?, present_value?)`. A causal mask
/// (`unidirectional`) lets query `i` see the past and the first `i + 1` new keys.
pub fn multi_head_attention(e: &mut Expansion) -> R<()> {
    e.unsupported_input(8, "past_sequence_length")?;
    e.unsupported_input(9, "cache_indirection")?;
    e.unsupported_output(3, "qk")?;
    let a = e.attrs();
    let heads = num_heads(&a)?;
    let filter = a.float_or("mask_filter_value", -10000.0)?;
    let query = e.required(0, "query")?;
    let tokens = |e: &mut Expansion, packed: &str| {
        let shape = e.ints(&[0, 0, -1]);
        e.node("Reshape", &[packed, &shape], vec![])
    };
    // Unpacks [B, S, N, parts, H] into `parts` tensors [B, S, N·H].
    let unpack = |e: &mut Expansion, packed: &str, parts: i64| {
        let names: Vec<String> = (0..parts).map(|_| e.fresh_value("part")).collect();
        let outs: Vec<&str> = names.iter().map(String::as_str).collect();
        // Sizes, not `num_outputs`: an axis of another length is an error, not a ragged split.
        let sizes = e.ints(&vec![1; parts as usize]);
        e.node_to("Split", &[packed, &sizes], &outs, vec![int_attr("axis", 3)]);
        names.iter().map(|p| tokens(e, p)).collect::<Vec<_>>()
    };
    let (mut q, mut k, mut v) = match (e.input(1), e.input(2)) {
        ("", "") => match &unpack(e, query, 3)[..] {
            [q, k, v] => (q.clone(), k.clone(), v.clone()),
            _ => unreachable!("three parts"),
        },
        ("", _) => return Err("input 2 (value) is given without input 1 (key)".into()),
        (packed, "") => match &unpack(e, packed, 2)[..] {
            [k, v] => (query.to_string(), k.clone(), v.clone()),
            _ => unreachable!("two parts"),
        },
        (k, v) => (query.to_string(), k.to_string(), v.to_string()),
    };
    let bias = e.input(3);
    if !bias.is_empty() {
        // [D + D + D_v]: D is the query's hidden size, the value's takes the rest.
        let d = e.node("Shape", &[&q], vec![int_attr("start", 2)]);
        let two = e.ints(&[2]);
        let both = e.node("Mul", &[&d, &two], vec![]);
        let length = e.node("Shape", &[bias], vec![]);
        let dv = e.node("Sub", &[&length, &both], vec![]);
        let sizes = e.node("Concat", &[&d, &d, &dv], vec![int_attr("axis", 0)]);
        let parts = [
            e.fresh_value("bias"),
            e.fresh_value("bias"),
            e.fresh_value("bias"),
        ];
        let outs: Vec<&str> = parts.iter().map(String::as_str).collect();
        e.node_to("Split", &[bias, &sizes], &outs, vec![int_attr("axis", 0)]);
        q = e.node("Add", &[&q, &parts[0]], vec![]);
        k = e.op(Op::TokenBias, &[&k, &parts[1]]);
        v = e.op(Op::TokenBias, &[&v, &parts[2]]);
    }
    let (past_k, past_v) = (e.input(6), e.input(7));
    if past_k.is_empty() != past_v.is_empty() {
        return Err("inputs 6 (past_key) and 7 (past_value) come together".into());
    }
    let mut additive = String::new();
    let padding = e.input(4);
    if !padding.is_empty() {
        let attrs = MaskIndexAttrs {
            filter,
            causal: false,
        };
        additive = e.op(Op::MaskIndex(attrs), &[padding, &q, &k, past_k]);
    }
    let attention_bias = e.input(5);
    if !attention_bias.is_empty() {
        additive = match additive.as_str() {
            "" => attention_bias.to_string(),
            m => e.node("Add", &[m, attention_bias], vec![]),
        };
    }
    let causal = a.flag("unidirectional", false)?;
    let attrs = standard_attrs(&a, heads, causal)?;
    let outputs = [e.output(0), e.output(1), e.output(2)];
    let last = outputs.iter().rposition(|o| !o.is_empty()).unwrap_or(0);
    e.node_at(
        "Attention",
        &[&q, &k, &v, &additive, past_k, past_v],
        &outputs[..=last],
        attrs,
        23,
    );
    Ok(())
}

/// `RotaryEmbedding(input, position_ids, cos_cache, sin_cache)`.
pub fn rotary_embedding(e: &mut Expansion) -> R<()> {
    let a = e.attrs();
    if a.int_or("is_packed_batching", 0)? != 0 {
        return Err("attribute \"is_packed_batching\" is not supported (only 0)".into());
    }
    let r = RotaryAttrs {
        onnxruntime_form: true,
        ..RotaryAttrs::parse(&a)?
    };
    let x = e.required(0, "input")?;
    let positions = e.required(1, "position_ids")?;
    let (cos, sin) = (e.required(2, "cos_cache")?, e.required(3, "sin_cache")?);
    e.op_to(
        Op::RotaryEmbedding(r),
        &[x, cos, sin, positions],
        &[e.output(0)],
    );
    Ok(())
}

/// `GroupQueryAttention(query, key?, value?, past_key?, past_value?, seqlens_k,
/// total_sequence_length, cos_cache?, sin_cache?)` → `(output, present_key, present_value)`.
pub fn group_query_attention(e: &mut Expansion) -> R<()> {
    for (i, what) in [
        (9, "position_ids"),
        (10, "attention_bias"),
        (11, "head_sink"),
        (12, "k_scale"),
        (13, "v_scale"),
        (14, "q_norm_weight"),
        (15, "k_norm_weight"),
        (16, "query_seqlens"),
    ] {
        e.unsupported_input(i, what)?;
    }
    e.unsupported_output(3, "output_qk")?;
    let a = e.attrs();
    for (name, only) in [
        ("causal", 1),
        ("sliding_window_cache", 0),
        ("qk_output", 0),
        ("kv_cache_bit_width", 0),
    ] {
        if a.int_or(name, only)? != only {
            return Err(format!("attribute {name:?} is not supported (only {only})"));
        }
    }
    for name in ["k_quant_type", "v_quant_type"] {
        if a.string(name)?.is_some_and(|t| t != "NONE") {
            return Err(format!(
                "attribute {name:?} is not supported (only \"NONE\")"
            ));
        }
    }
    let heads = num_heads(&a)?;
    let kv_heads = match a.int("kv_num_heads")? {
        Some(k) if k > 0 && heads % k == 0 => k,
        Some(k) => {
            return Err(format!(
                "attribute \"kv_num_heads\" is {k}: a positive divisor of num_heads ({heads})"
            ));
        }
        None => return Err("attribute \"kv_num_heads\" is required".into()),
    };
    let softcap = a.float_or("softcap", 0.0)?;
    if softcap.is_nan() || softcap < 0.0 {
        return Err(format!("attribute \"softcap\" is {softcap}, not >= 0"));
    }
    let smooth_softmax = match a.int_or("smooth_softmax", -1)? {
        -1 | 0 => false,
        1 => true,
        s => {
            return Err(format!(
                "attribute \"smooth_softmax\" is {s}, not -1, 0 or 1"
            ));
        }
    };
    let rotary = a.flag("do_rotary", false)?;
    let attrs = GroupQueryAttrs {
        heads: heads as usize,
        kv_heads: kv_heads as usize,
        scale: a.float("scale")?,
        softcap,
        window: usize::try_from(a.int_or("local_window_size", -1)?)
            .ok()
            .filter(|&w| w > 0),
        smooth_softmax,
        rotary: rotary
            .then(|| a.flag("rotary_interleaved", false))
            .transpose()?,
    };
    let query = e.required(0, "query")?;
    let (key, value) = (e.input(1), e.input(2));
    if key.is_empty() != value.is_empty() {
        return Err("inputs 1 (key) and 2 (value) come together".into());
    }
    let (past_k, past_v) = (e.input(3), e.input(4));
    if past_k.is_empty() != past_v.is_empty() {
        return Err("inputs 3 (past_key) and 4 (past_value) come together".into());
    }
    let lengths = e.required(5, "seqlens_k")?;
    let total = e.required(6, "total_sequence_length")?;
    let (cos, sin) = match rotary {
        true => (e.required(7, "cos_cache")?, e.required(8, "sin_cache")?),
        false => ("", ""),
    };
    let outputs: Vec<String> = (0..3)
        .map(|i| match e.output(i) {
            "" => e.fresh_value("present"),
            o => o.to_string(),
        })
        .collect();
    let outputs: Vec<&str> = outputs.iter().map(String::as_str).collect();
    e.op_to(
        Op::GroupQuery(attrs),
        &[query, key, value, past_k, past_v, lengths, total, cos, sin],
        &outputs,
    );
    Ok(())
}

fn num_heads(a: &Attrs) -> R<i64> {
    match a.int("num_heads")? {
        Some(h) if h > 0 => Ok(h),
        Some(h) => Err(format!("attribute \"num_heads\" is {h}, not positive")),
        None => Err("attribute \"num_heads\" is required".into()),
    }
}

/// The standard Attention's attributes: `heads` query and key/value heads, onnxruntime's
/// `scale` (0 or absent: 1/√head size) and `causal`.
fn standard_attrs(a: &Attrs, heads: i64, causal: bool) -> R<Vec<crate::proto::AttributeProto>> {
    let mut attrs = vec![
        int_attr("q_num_heads", heads),
        int_attr("kv_num_heads", heads),
    ];
    if let Some(s) = a.float("scale")?.filter(|&s| s != 0.0) {
        attrs.push(float_attr("scale", s));
    }
    if causal {
        attrs.push(int_attr("is_causal", 1));
    }
    Ok(attrs)
}
