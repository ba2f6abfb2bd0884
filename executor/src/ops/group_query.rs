//! onnxruntime's `com.microsoft.GroupQueryAttention`, the attention of the decoder layers its
//! generative-model exports write: causal self-attention of `num_heads` query heads over
//! `kv_num_heads` key/value heads, appending the new keys and values to a cache whose valid
//! length differs per sequence. No standard operator says that (each sequence's new keys land
//! at its own position), so it runs here, as onnxruntime's CPU kernel does:
//! - sequence `b` holds `seqlens_k[b] + 1` positions after this step; on the first prompt
//!   (`total_sequence_length` equal to the query's length) none came before and the sequence is
//!   right-padded, else the `seqlens_k[b] + 1 - S` first positions of `past_key`/`past_value`
//!   came before;
//! - `present_key`/`present_value` are `[B, kv heads, max(total_sequence_length, past length),
//!   head size]`: the past positions kept, the new ones after them, zeros beyond;
//! - query `s` sees the keys up to its own position (`past + s`, at most the sequence's
//!   length), the last `local_window_size` of them when that is positive;
//! - scores scaled (`scale`, by default `1/√head size`), capped (`softcap`), and the softmax
//!   optionally "smooth" (an extra logit of zero);
//! - with `do_rotary`, Q and K rotate first by the caches' rows of their positions.

use super::attention::rotate;
use super::{Cx, input, opt_input};
use crate::error::{OpError, OpResult, shape_err};
use crate::tensor::{Tensor, checked_numel};
use cotenant_kernels::gemm::{Mat, sgemm};
use rayon::prelude::*;

#[derive(Clone, Debug, PartialEq)]
pub struct GroupQueryAttrs {
    pub heads: usize,
    pub kv_heads: usize,
    pub scale: Option<f32>,
    /// `softcap · tanh(score / softcap)` when positive.
    pub softcap: f32,
    /// Keys each query sees at most, when set.
    pub window: Option<usize>,
    pub smooth_softmax: bool,
    /// Rotary embeddings of Q and K (`do_rotary`), interleaved or not.
    pub rotary: Option<bool>,
}

/// The sizes of one call, from its inputs.
struct Dims {
    batch: usize,
    seq: usize,
    /// `total_sequence_length`.
    total: usize,
    head: usize,
    past: usize,
    present: usize,
}

/// The inputs read: `[query, key?, value?, past_key?, past_value?, seqlens_k,
/// total_sequence_length, cos_cache?, sin_cache?]`.
fn dims(a: &GroupQueryAttrs, inputs: &[Option<&Tensor>]) -> OpResult<Dims> {
    let q = input(inputs, 0)?;
    let &[batch, seq, width] = q.shape.as_slice() else {
        return shape_err(format!(
            "query {:?} is not [batch, sequence, hidden]",
            q.shape
        ));
    };
    let packed = opt_input(inputs, 1).is_none();
    let parts = if packed {
        a.heads + 2 * a.kv_heads
    } else {
        a.heads
    };
    if !width.is_multiple_of(parts) || width == 0 {
        return shape_err(format!(
            "query width {width} does not split into {parts} heads"
        ));
    }
    let head = width / parts;
    if !packed {
        for (i, what) in [(1, "key"), (2, "value")] {
            let t = input(inputs, i)?;
            if t.shape != [batch, seq, a.kv_heads * head] {
                return shape_err(format!(
                    "{what} {:?} is not [{batch}, {seq}, {}] ({} heads of {head})",
                    t.shape,
                    a.kv_heads * head,
                    a.kv_heads
                ));
            }
        }
    }
    let past = match (opt_input(inputs, 3), opt_input(inputs, 4)) {
        (None, None) => 0,
        (Some(k), Some(v)) if k.shape == v.shape => match k.shape[..] {
            [b, h, p, d] if b == batch && h == a.kv_heads && d == head => p,
            _ => {
                return shape_err(format!(
                    "past_key {:?} is not [{batch}, {}, length, {head}]",
                    k.shape, a.kv_heads
                ));
            }
        },
        _ => return shape_err("past_key and past_value come together, of one shape"),
    };
    let total = scalar(input(inputs, 6)?, "total_sequence_length")?;
    let present = total.max(past);
    checked_numel(&[batch, a.kv_heads, present, head])?;
    Ok(Dims {
        batch,
        seq,
        total,
        head,
        past,
        present,
    })
}

fn scalar(t: &Tensor, what: &str) -> OpResult<usize> {
    match t.to_i64_vec()?[..] {
        [v] => {
            usize::try_from(v).map_err(|_| OpError::Shape(format!("{what} is {v}, not a length")))
        }
        _ => shape_err(format!("{what} {:?} is not one value", t.shape)),
    }
}

/// Bytes a call allocates: the present key and value, the output and one score matrix a
/// (batch, head) pair.
pub(crate) fn allocation(a: &GroupQueryAttrs, inputs: &[Option<&Tensor>]) -> OpResult<usize> {
    let d = dims(a, inputs)?;
    let present = checked_numel(&[2, d.batch, a.kv_heads, d.present, d.head])?;
    let scores = checked_numel(&[d.batch, a.heads, d.seq, d.present])?;
    let out = checked_numel(&[d.batch, d.seq, a.heads, d.head])?;
    present
        .checked_add(scores)
        .and_then(|n| n.checked_add(out))
        .and_then(|n| n.checked_mul(4))
        .ok_or(OpError::TooLarge(usize::MAX))
}

pub fn group_query_attention(
    cx: &Cx,
    a: &GroupQueryAttrs,
    inputs: &[Option<&Tensor>],
) -> OpResult<Vec<Tensor>> {
    let d = dims(a, inputs)?;
    let (batch, seq, head, present) = (d.batch, d.seq, d.head, d.present);
    let (heads, kv_heads) = (a.heads, a.kv_heads);
    let lengths = input(inputs, 5)?.to_i64_vec()?;
    if lengths.len() != batch {
        return shape_err(format!(
            "seqlens_k has {} values for a batch of {batch}",
            lengths.len()
        ));
    }
    let first_prompt = d.total == seq;
    // Per sequence: its length after this step, and the positions before the new ones.
    let spans = lengths
        .iter()
        .map(|&l| {
            let total = usize::try_from(l + 1).ok().filter(|&t| t <= present);
            let before = match first_prompt {
                true => Some(0),
                false => total.and_then(|t| t.checked_sub(seq)),
            };
            match (total, before) {
                (Some(t), Some(b)) if b <= d.past && b + seq <= present => Ok((t, b)),
                _ => shape_err(format!(
                    "seqlens_k {l} does not fit {seq} new positions after a past of {} in \
                     {present}",
                    d.past
                )),
            }
        })
        .collect::<OpResult<Vec<_>>>()?;
    // Q, K and V as [batch, sequence, heads, head size].
    let q_all = input(inputs, 0)?.as_f32()?;
    let width = q_all.len() / (batch * seq).max(1);
    let part = |t: Option<&Tensor>, from: usize, n: usize| -> OpResult<Vec<f32>> {
        let (src, w, at) = match t {
            Some(t) => (t.as_f32()?, n * head, 0),
            None => (q_all, width, from * head),
        };
        Ok((0..batch * seq)
            .flat_map(|r| &src[r * w + at..r * w + at + n * head])
            .copied()
            .collect())
    };
    let mut q = part(None, 0, heads)?;
    let (k_in, v_in) = (opt_input(inputs, 1), opt_input(inputs, 2));
    let mut k = part(k_in, heads, kv_heads)?;
    let v = part(v_in, heads + kv_heads, kv_heads)?;
    if let Some(interleaved) = a.rotary {
        let (cos, sin) = (input(inputs, 7)?, input(inputs, 8)?);
        let half = cos.shape.last().copied().unwrap_or(0);
        if cos.rank() != 2 || cos.shape != sin.shape || half == 0 || 2 * half > head {
            return shape_err(format!(
                "cos {:?} and sin {:?} caches must be [positions, at most {}]",
                cos.shape,
                sin.shape,
                head / 2
            ));
        }
        let (cv, sv) = (cos.as_f32()?, sin.as_f32()?);
        for (b, &(_, before)) in spans.iter().enumerate() {
            for s in 0..seq {
                let position = before + s;
                if position >= cos.shape[0] {
                    return shape_err(format!(
                        "position {position} outside a rotary cache of {}",
                        cos.shape[0]
                    ));
                }
                let c = &cv[position * half..][..half];
                let sn = &sv[position * half..][..half];
                let token = b * seq + s;
                for (t, n) in [(&mut q, heads), (&mut k, kv_heads)] {
                    for x in t[token * n * head..][..n * head].chunks_exact_mut(head) {
                        rotate(&mut x[..2 * half], c, sn, interleaved);
                    }
                }
            }
        }
    }
    // The caches: the past positions kept, the new ones after them.
    let cache = |new: &[f32], past: Option<&Tensor>| -> OpResult<Vec<f32>> {
        let past = past.map(Tensor::as_f32).transpose()?;
        let mut out = vec![0.0f32; batch * kv_heads * present * head];
        for (b, &(_, before)) in spans.iter().enumerate() {
            for h in 0..kv_heads {
                let plane = &mut out[(b * kv_heads + h) * present * head..][..present * head];
                if let Some(p) = past {
                    let from = &p[(b * kv_heads + h) * d.past * head..][..before * head];
                    plane[..before * head].copy_from_slice(from);
                }
                for s in 0..seq {
                    let src = &new[((b * seq + s) * kv_heads + h) * head..][..head];
                    plane[(before + s) * head..][..head].copy_from_slice(src);
                }
            }
        }
        Ok(out)
    };
    let present_k = cache(&k, opt_input(inputs, 3))?;
    let present_v = cache(&v, opt_input(inputs, 4))?;
    let scale = a
        .scale
        .filter(|&s| s != 0.0)
        .unwrap_or(1.0 / (head as f32).sqrt());
    let group = heads / kv_heads;
    // One (batch, head) pair: its output rows [seq, head].
    let pair = |p: usize| -> Vec<f32> {
        let (b, h) = (p / heads, p % heads);
        let (total, before) = spans[b];
        let plane = (b * kv_heads + h / group) * present * head;
        let (keys, values) = (&present_k[plane..], &present_v[plane..]);
        let qm: Vec<f32> = (0..seq)
            .flat_map(|s| &q[((b * seq + s) * heads + h) * head..][..head])
            .copied()
            .collect();
        let mut scores = vec![0.0f32; seq * total];
        let (qa, kt) = (Mat::row_major(&qm, head), Mat::transposed(keys, head));
        sgemm(1, seq, total, head, qa, kt, &mut scores, total, false);
        for (s, row) in scores.chunks_exact_mut(total.max(1)).enumerate() {
            let end = (before + s + 1).min(total);
            let start = a.window.map_or(0, |w| end.saturating_sub(w));
            probabilities(a, scale, &mut row[start..end]);
            row[..start].fill(0.0);
            row[end..].fill(0.0);
        }
        let mut y = vec![0.0f32; seq * head];
        let (pm, vm) = (Mat::row_major(&scores, total), Mat::row_major(values, head));
        sgemm(1, seq, head, total, pm, vm, &mut y, head, false);
        y
    };
    let pairs = batch * heads;
    let ys: Vec<Vec<f32>> = match cx.threads > 1 {
        true => (0..pairs).into_par_iter().map(pair).collect(),
        false => (0..pairs).map(pair).collect(),
    };
    let mut out = vec![0.0f32; batch * seq * heads * head];
    for (p, y) in ys.iter().enumerate() {
        let (b, h) = (p / heads, p % heads);
        for (s, row) in y.chunks_exact(head).enumerate() {
            out[((b * seq + s) * heads + h) * head..][..head].copy_from_slice(row);
        }
    }
    let cache_shape = vec![batch, kv_heads, present, head];
    Ok(vec![
        Tensor::f32(vec![batch, seq, heads * head], out)?,
        Tensor::f32(cache_shape.clone(), present_k)?,
        Tensor::f32(cache_shape, present_v)?,
    ])
}

/// The scores a query sees, scaled, capped and turned into probabilities in place.
fn probabilities(a: &GroupQueryAttrs, scale: f32, row: &mut [f32]) {
    row.iter_mut().for_each(|s| *s *= scale);
    if a.softcap > 0.0 {
        let c = a.softcap;
        row.iter_mut().for_each(|s| *s = c * (*s / c).tanh());
    }
    let mut max = row.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    // The smooth softmax's extra logit of zero.
    if a.smooth_softmax {
        max = max.max(0.0);
    }
    let mut sum = if a.smooth_softmax { (-max).exp() } else { 0.0 };
    for s in row.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    row.iter_mut().for_each(|s| *s /= sum);
}
