//! The transformer operators of opsets 23/24: Attention (scaled dot-product attention with
//! masks, causality, grouped key/value heads, softcap and a key/value cache) and
//! RotaryEmbedding.

use super::attrs::Attrs;
use super::shape::{concat, transpose};
use super::{Cx, input, opt_input};
use crate::error::{OpError, OpResult, shape_err};
use crate::tensor::{Data, Tensor, checked_numel};
use cotenant_kernels::gemm::{Mat, sgemm};
use cotenant_kernels::norm::softmax_rows;
use rayon::prelude::*;

#[derive(Clone, Debug, PartialEq)]
pub struct AttentionAttrs {
    pub is_causal: bool,
    /// Heads of Q and of K/V, which 3-D inputs need to be split into heads.
    pub q_heads: Option<usize>,
    pub kv_heads: Option<usize>,
    /// What the fourth output holds: the scaled product Q·Kᵀ (0), after the softcap (1), with
    /// the mask added (2), after the softmax (3).
    pub qk_output: QkOutput,
    /// Factor of Q·Kᵀ; by default `1 / sqrt(head size)`.
    pub scale: Option<f32>,
    /// `softcap * tanh(scores / softcap)` when positive.
    pub softcap: f32,
    /// The node has the fourth output.
    pub wants_qk: bool,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum QkOutput {
    Product,
    Softcapped,
    Masked,
    Softmax,
}

impl AttentionAttrs {
    pub fn parse(a: &Attrs, n_outputs: usize) -> Result<AttentionAttrs, String> {
        let heads = |name: &str| -> Result<Option<usize>, String> {
            match a.int(name)? {
                None => Ok(None),
                Some(h) if h > 0 => Ok(Some(h as usize)),
                Some(h) => Err(format!("attribute {name:?} is {h}, not positive")),
            }
        };
        let qk_output = match a.int_or("qk_matmul_output_mode", 0)? {
            0 => QkOutput::Product,
            1 => QkOutput::Softcapped,
            2 => QkOutput::Masked,
            3 => QkOutput::Softmax,
            m => {
                return Err(format!(
                    "attribute \"qk_matmul_output_mode\" is {m}, not 0..=3"
                ));
            }
        };
        // The softmax runs in f32, at least the precision of every float type but double.
        match a.int_or("softmax_precision", 0)? {
            0 | 1 | 10 | 16 => {}
            p => {
                return Err(format!(
                    "attribute \"softmax_precision\" is element type {p}: float, float16 and bfloat16 are supported"
                ));
            }
        }
        let softcap = a.float_or("softcap", 0.0)?;
        if softcap.is_nan() || softcap < 0.0 {
            return Err(format!("attribute \"softcap\" is {softcap}, not >= 0"));
        }
        Ok(AttentionAttrs {
            is_causal: a.flag("is_causal", false)?,
            q_heads: heads("q_num_heads")?,
            kv_heads: heads("kv_num_heads")?,
            qk_output,
            scale: a.float("scale")?,
            softcap,
            wants_qk: n_outputs > 3,
        })
    }
}

/// `[batch, heads, sequence, head size]`.
type Dims = [usize; 4];

/// A Q, K or V input as `[batch, heads, sequence, head size]`: 4-D as it is, 3-D
/// `[batch, sequence, heads * head size]` split into `heads` and transposed.
fn heads_first(t: &Tensor, heads: Option<usize>, what: &str) -> OpResult<(Tensor, Dims)> {
    match t.shape[..] {
        [b, h, s, d] => {
            if heads.is_some_and(|n| n != h) {
                return shape_err(format!(
                    "{what} {:?} has {h} heads where the attribute says {heads:?}",
                    t.shape
                ));
            }
            Ok((t.clone(), [b, h, s, d]))
        }
        [b, s, hidden] => {
            let h = heads.ok_or_else(|| {
                OpError::Shape(format!(
                    "3-D {what} needs q_num_heads and kv_num_heads to be split into heads"
                ))
            })?;
            if !hidden.is_multiple_of(h) {
                return shape_err(format!(
                    "{what} hidden size {hidden} does not split into {h} heads"
                ));
            }
            let d = hidden / h;
            let split = t.clone().reshaped(vec![b, s, h, d])?;
            Ok((transpose(&split, Some(&[0, 2, 1, 3]))?, [b, h, s, d]))
        }
        _ => shape_err(format!("{what} {:?} must be 3-D or 4-D", t.shape)),
    }
}

/// `cache` (`[batch, heads, past, size]`) followed along the sequence by `new`.
fn with_past(past: Option<&Tensor>, new: Tensor, dims: Dims, what: &str) -> OpResult<Tensor> {
    let Some(past) = past else {
        return Ok(new);
    };
    match past.shape[..] {
        [b, h, _, d] if [b, h, d] == [dims[0], dims[1], dims[3]] => {
            concat(&[Some(past), Some(&new)], 2)
        }
        _ => shape_err(format!(
            "past {what} {:?} does not match {what} {:?}",
            past.shape, dims
        )),
    }
}

/// The additive bias of every score, `[batch, q heads, q length, total length]` flattened, or
/// none when nothing is masked: the attention mask (boolean: false masks; float: added), its
/// positions past its last axis masked, the causal mask, and the keys past each batch's
/// `nonpad_kv_seqlen`.
fn bias(
    a: &AttentionAttrs,
    mask: Option<&Tensor>,
    nonpad: Option<&Tensor>,
    dims: Dims,
    total: usize,
    past: usize,
) -> OpResult<Option<Vec<f32>>> {
    if mask.is_none() && nonpad.is_none() && !a.is_causal {
        return Ok(None);
    }
    let [b, h, s, _] = dims;
    let mut out = vec![0.0f32; checked_numel(&[b, h, s, total])?];
    if let Some(m) = mask {
        add_mask(&mut out, m, [b, h, s, total])?;
    }
    // Keys each batch attends to at most.
    let lengths: Vec<usize> = match nonpad {
        Some(n) if n.len() != b => {
            return shape_err(format!(
                "nonpad_kv_seqlen has {} values for batch {b}",
                n.len()
            ));
        }
        Some(n) => n
            .to_i64_vec()?
            .into_iter()
            .map(|l| usize::try_from(l).unwrap_or(0))
            .collect(),
        None => vec![total; b],
    };
    let rows = out.chunks_mut(total.max(1));
    for (r, row) in rows.enumerate().filter(|_| total > 0) {
        let (bi, i) = (r / (h * s), r % s);
        let causal = if a.is_causal { i + past + 1 } else { total };
        let visible = causal.min(lengths[bi]);
        row.iter_mut()
            .skip(visible)
            .for_each(|v| *v = f32::NEG_INFINITY);
    }
    Ok(Some(out))
}

/// Adds the attention mask, broadcast to `target` (its last axis may be shorter: the rest is
/// masked), onto `out`.
fn add_mask(out: &mut [f32], m: &Tensor, target: Dims) -> OpResult<()> {
    if m.rank() > 4 || m.rank() == 0 {
        return shape_err(format!(
            "attention mask {:?} must have rank 1 to 4",
            m.shape
        ));
    }
    let mut shape = vec![1; 4 - m.rank()];
    shape.extend(&m.shape);
    let fits = (0..3).all(|k| shape[k] == 1 || shape[k] == target[k]);
    if !fits || shape[3] > target[3] {
        return shape_err(format!(
            "attention mask {:?} does not broadcast to {target:?}",
            m.shape
        ));
    }
    let values: Vec<f32> = match &m.data {
        Data::Bool(v) => v
            .iter()
            .map(|&keep| if keep { 0.0 } else { f32::NEG_INFINITY })
            .collect(),
        Data::F32(v) => v.clone(),
        _ => return Err(OpError::DType(format!("attention mask of {:?}", m.dtype()))),
    };
    let strides = crate::tensor::strides(&shape);
    let at = |k: usize, i: usize| if shape[k] == 1 { 0 } else { i * strides[k] };
    let total = target[3];
    for (r, row) in out
        .chunks_mut(total.max(1))
        .enumerate()
        .filter(|_| total > 0)
    {
        let (bi, hi, si) = (
            r / (target[1] * target[2]),
            r / target[2] % target[1],
            r % target[2],
        );
        let base = at(0, bi) + at(1, hi) + at(2, si);
        for (j, v) in row.iter_mut().enumerate() {
            *v += if j < shape[3] {
                values[base + j]
            } else {
                f32::NEG_INFINITY
            };
        }
    }
    Ok(())
}

/// Elements of the scores of all heads, `[batch, q heads, q length, total length]`: what the
/// bias, the fourth output and the score buffers each hold at most, from the input shapes.
pub(crate) fn score_elements(a: &AttentionAttrs, inputs: &[Option<&Tensor>]) -> OpResult<usize> {
    let (q, k) = (input(inputs, 0)?, input(inputs, 1)?);
    let (b, h, s) = match q.shape[..] {
        [b, h, s, _] => (b, h, s),
        [b, s, _] => (b, a.q_heads.unwrap_or(1), s),
        _ => return shape_err(format!("Q {:?} must be 3-D or 4-D", q.shape)),
    };
    let keys = match k.shape[..] {
        [_, _, t, _] | [_, t, _] => t,
        _ => return shape_err(format!("K {:?} must be 3-D or 4-D", k.shape)),
    };
    let past = opt_input(inputs, 4).and_then(|p| p.shape.get(2).copied());
    let total = keys
        .checked_add(past.unwrap_or(0))
        .ok_or(OpError::TooLarge(usize::MAX))?;
    checked_numel(&[b, h, s, total])
}

/// Outputs: `[Y, present_key, present_value, qk_matmul_output]`.
pub fn attention(cx: &Cx, a: &AttentionAttrs, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
    let (q, k, v) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    // A 3-D Q may attend over a 4-D K and V: onnxruntime's MultiHeadAttention over a
    // cross-attention cache comes here so.
    if k.rank() != v.rank() {
        return shape_err(format!(
            "K {:?} and V {:?} differ in rank",
            k.shape, v.shape
        ));
    }
    let (q4, qd) = heads_first(q, a.q_heads, "Q")?;
    let (k4, kd) = heads_first(k, a.kv_heads, "K")?;
    let (v4, vd) = heads_first(v, a.kv_heads, "V")?;
    if qd[0] != kd[0] || kd[..3] != vd[..3] || qd[3] != kd[3] {
        return shape_err(format!(
            "Q {qd:?}, K {kd:?} and V {vd:?} (batch, heads, sequence, head size) do not fit"
        ));
    }
    let (batch, heads, sq, d) = (qd[0], qd[1], qd[2], qd[3]);
    let (kv_heads, dv) = (kd[1], vd[3]);
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return shape_err(format!(
            "{heads} query heads do not share {kv_heads} key/value heads evenly"
        ));
    }
    let (past_k, past_v) = (opt_input(inputs, 4), opt_input(inputs, 5));
    if past_k.is_some() != past_v.is_some() {
        return shape_err("past_key and past_value come together");
    }
    let past = past_k.map_or(0, |p| p.shape.get(2).copied().unwrap_or(0));
    let present_k = with_past(past_k, k4, kd, "key")?;
    let present_v = with_past(past_v, v4, vd, "value")?;
    let total = present_k.shape[2];
    if present_v.shape[2] != total {
        return shape_err("past_key and past_value differ in length");
    }
    let bias = bias(
        a,
        opt_input(inputs, 3),
        opt_input(inputs, 6),
        qd,
        total,
        past,
    )?;
    let scale = a.scale.unwrap_or(1.0 / (d as f32).sqrt());
    let (qv, kv, vv) = (q4.as_f32()?, present_k.as_f32()?, present_v.as_f32()?);
    let group = heads / kv_heads;
    let plane = sq * total;
    checked_numel(&[batch, heads, sq, total])?;
    // One (batch, head) pair: its output rows and, when asked for, its scores.
    let pair = |p: usize, threads: usize| -> (Vec<f32>, Vec<f32>) {
        let kvp = p / heads * kv_heads + p % heads / group;
        let qm = &qv[p * sq * d..(p + 1) * sq * d];
        let km = &kv[kvp * total * d..(kvp + 1) * total * d];
        let vm = &vv[kvp * total * dv..(kvp + 1) * total * dv];
        let mut scores = vec![0.0f32; plane];
        let (at, bt) = (Mat::row_major(qm, d), Mat::transposed(km, d));
        sgemm(threads, sq, total, d, at, bt, &mut scores, total, false);
        scores.iter_mut().for_each(|s| *s *= scale);
        let mut qk = Vec::new();
        let keep = |stage: QkOutput, s: &[f32], qk: &mut Vec<f32>| {
            if a.wants_qk && a.qk_output == stage {
                *qk = s.to_vec();
            }
        };
        keep(QkOutput::Product, &scores, &mut qk);
        if a.softcap > 0.0 {
            let c = a.softcap;
            scores.iter_mut().for_each(|s| *s = c * (*s / c).tanh());
        }
        keep(QkOutput::Softcapped, &scores, &mut qk);
        if let Some(b) = &bias {
            let bp = &b[p * plane..(p + 1) * plane];
            scores.iter_mut().zip(bp).for_each(|(s, b)| *s += b);
        }
        keep(QkOutput::Masked, &scores, &mut qk);
        if total > 0 {
            softmax_rows(1, &mut scores, total, false);
        }
        keep(QkOutput::Softmax, &scores, &mut qk);
        let mut y = vec![0.0f32; sq * dv];
        let (pm, vmat) = (Mat::row_major(&scores, total), Mat::row_major(vm, dv));
        sgemm(threads, sq, dv, total, pm, vmat, &mut y, dv, false);
        (y, qk)
    };
    let pairs = batch * heads;
    let results: Vec<(Vec<f32>, Vec<f32>)> = if cx.threads > 1 && pairs >= cx.threads {
        (0..pairs).into_par_iter().map(|p| pair(p, 1)).collect()
    } else {
        (0..pairs).map(|p| pair(p, cx.threads)).collect()
    };
    let (ys, qks): (Vec<Vec<f32>>, Vec<Vec<f32>>) = results.into_iter().unzip();
    let mut y = Tensor::f32(vec![batch, heads, sq, dv], ys.concat())?;
    if q.rank() == 3 {
        y = transpose(&y, Some(&[0, 2, 1, 3]))?.reshaped(vec![batch, sq, heads * dv])?;
    }
    let mut out = vec![y, present_k, present_v];
    if a.wants_qk {
        out.push(Tensor::f32(vec![batch, heads, sq, total], qks.concat())?);
    }
    Ok(out)
}

#[derive(Clone, Debug, PartialEq)]
pub struct RotaryAttrs {
    /// Rotate pairs `(x[2i], x[2i+1])` instead of `(x[i], x[i + rotary_dim/2])`.
    pub interleaved: bool,
    /// Heads of a 3-D input.
    pub heads: Option<usize>,
    /// Leading elements of each head that rotate (by default all).
    pub rotary_dim: Option<usize>,
    /// onnxruntime's `com.microsoft.RotaryEmbedding`: `position_ids` may be `[1]`, the first
    /// position of every sequence, and a 3-D input without `num_heads` splits into heads of
    /// the rotary size (`rotary_embedding_dim`, else twice the caches' width).
    pub onnxruntime_form: bool,
}

impl RotaryAttrs {
    pub fn parse(a: &Attrs) -> Result<RotaryAttrs, String> {
        let positive = |name: &str| -> Result<Option<usize>, String> {
            match a.int_or(name, 0)? {
                0 => Ok(None),
                n if n > 0 => Ok(Some(n as usize)),
                n => Err(format!("attribute {name:?} is {n}, not >= 0")),
            }
        };
        Ok(RotaryAttrs {
            interleaved: a.flag("interleaved", false)?,
            heads: positive("num_heads")?,
            rotary_dim: positive("rotary_embedding_dim")?,
            onnxruntime_form: false,
        })
    }
}

/// RotaryEmbedding of `[batch, heads, sequence, head size]` or `[batch, sequence, hidden]`
/// (split into `num_heads`), with cos/sin caches `[max position, rotary_dim / 2]` indexed by
/// `position_ids` `[batch, sequence]`, or `[batch, sequence, rotary_dim / 2]` without.
pub fn rotary_embedding(r: &RotaryAttrs, inputs: &[Option<&Tensor>]) -> OpResult<Tensor> {
    let x = input(inputs, 0)?;
    let (cos, sin) = (input(inputs, 1)?, input(inputs, 2)?);
    // Strides of (batch, sequence, head) in the input, and the head size.
    let (b, s, d, st) = match x.shape[..] {
        [b, h, s, d] => (b, s, d, [h * s * d, d, s * d]),
        [b, s, hidden] => {
            let per_cache = || {
                let head = r.rotary_dim.or(cos.shape.last().map(|w| 2 * w))?;
                let splits = head > 0 && hidden >= head && hidden.is_multiple_of(head);
                (r.onnxruntime_form && splits).then(|| hidden / head)
            };
            let h = r.heads.or_else(per_cache).ok_or_else(|| {
                OpError::Shape("a 3-D RotaryEmbedding input needs num_heads".into())
            })?;
            if !hidden.is_multiple_of(h) {
                return shape_err(format!(
                    "hidden size {hidden} does not split into {h} heads"
                ));
            }
            (b, s, hidden / h, [s * hidden, hidden, hidden / h])
        }
        _ => {
            return shape_err(format!(
                "RotaryEmbedding input {:?} must be 3-D or 4-D",
                x.shape
            ));
        }
    };
    let heads = x.len() / (b * s * d).max(1);
    let rot = r.rotary_dim.unwrap_or(d);
    if rot > d || !rot.is_multiple_of(2) {
        return shape_err(format!(
            "rotary_embedding_dim {rot} must be even and at most the head size {d}"
        ));
    }
    let half = rot / 2;
    let start = |p: &Tensor| r.onnxruntime_form && p.shape == [1];
    let row = match opt_input(inputs, 3) {
        Some(p) if start(p) => {
            let first = p.to_i64_vec()?[0];
            let positions = (0..b * s).map(|i| first + (i % s) as i64).collect();
            cache_rows(
                Some(&Tensor::i64(vec![b, s], positions)?),
                cos,
                sin,
                [b, s],
                half,
            )?
        }
        positions => cache_rows(positions, cos, sin, [b, s], half)?,
    };
    let (cv, sv) = (cos.as_f32()?, sin.as_f32()?);
    let mut out = x.as_f32()?.to_vec();
    for bi in 0..b {
        for si in 0..s {
            let c0 = row[bi * s + si] * half;
            let (c, sn) = (&cv[c0..c0 + half], &sv[c0..c0 + half]);
            for hi in 0..heads {
                let at = bi * st[0] + si * st[1] + hi * st[2];
                rotate(&mut out[at..at + rot], c, sn, r.interleaved);
            }
        }
    }
    Tensor::f32(x.shape.clone(), out)
}

/// For each (batch, sequence) position, the row of the cos/sin caches it reads; checks the
/// caches' shapes and the positions.
fn cache_rows(
    positions: Option<&Tensor>,
    cos: &Tensor,
    sin: &Tensor,
    [b, s]: [usize; 2],
    half: usize,
) -> OpResult<Vec<usize>> {
    if cos.shape != sin.shape || cos.shape.last() != Some(&half) {
        return shape_err(format!(
            "cos {:?} and sin {:?} caches must agree and end in rotary_embedding_dim / 2 = {half}",
            cos.shape, sin.shape
        ));
    }
    match positions {
        Some(p) => {
            let rows = cos.len() / half.max(1);
            if p.shape != [b, s] || cos.rank() != 2 {
                return shape_err(format!(
                    "position_ids {:?} for [{b}, {s}] positions into a cache {:?}",
                    p.shape, cos.shape
                ));
            }
            p.to_i64_vec()?
                .into_iter()
                .map(|i| {
                    usize::try_from(i)
                        .ok()
                        .filter(|&i| i < rows)
                        .ok_or_else(|| {
                            OpError::Shape(format!("position {i} outside a cache of {rows}"))
                        })
                })
                .collect()
        }
        None if cos.shape == [b, s, half] => Ok((0..b * s).collect()),
        None => shape_err(format!(
            "without position_ids the caches must be [{b}, {s}, {half}], not {:?}",
            cos.shape
        )),
    }
}

/// Rotates the pairs of `x` by the angles whose cosines and sines are `c` and `s`.
pub(crate) fn rotate(x: &mut [f32], c: &[f32], s: &[f32], interleaved: bool) {
    let half = c.len();
    for i in 0..half {
        let (a, b) = if interleaved {
            (2 * i, 2 * i + 1)
        } else {
            (i, i + half)
        };
        let (x1, x2) = (x[a], x[b]);
        x[a] = c[i] * x1 - s[i] * x2;
        x[b] = s[i] * x1 + c[i] * x2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs() -> AttentionAttrs {
        AttentionAttrs {
            is_causal: false,
            q_heads: None,
            kv_heads: None,
            qk_output: QkOutput::Product,
            scale: Some(1.0),
            softcap: 0.0,
            wants_qk: true,
        }
    }

    #[test]
    fn attention_masks_causally_and_shares_kv_heads() {
        let cx = Cx::new(1);
        // Two query heads over one key/value head, two positions, head size 1.
        let q = Tensor::f32(vec![1, 2, 2, 1], vec![1.0, 1.0, 2.0, 2.0]).unwrap();
        let k = Tensor::f32(vec![1, 1, 2, 1], vec![0.0, 0.0]).unwrap();
        let v = Tensor::f32(vec![1, 1, 2, 1], vec![1.0, 3.0]).unwrap();
        let out = attention(&cx, &attrs(), &[Some(&q), Some(&k), Some(&v)]).unwrap();
        // Equal scores: the mean of the values.
        assert_eq!(out[0].as_f32().unwrap(), &[2.0; 4]);
        let causal = AttentionAttrs {
            is_causal: true,
            ..attrs()
        };
        let out = attention(&cx, &causal, &[Some(&q), Some(&k), Some(&v)]).unwrap();
        assert_eq!(out[0].as_f32().unwrap(), &[1.0, 2.0, 1.0, 2.0]);
        // A boolean mask hiding the first key.
        let m = Tensor::new(vec![2], Data::Bool(vec![false, true])).unwrap();
        let out = attention(&cx, &attrs(), &[Some(&q), Some(&k), Some(&v), Some(&m)]).unwrap();
        assert_eq!(out[0].as_f32().unwrap(), &[3.0; 4]);
        // Query heads that do not share the key/value heads evenly.
        let k3 = Tensor::f32(vec![1, 3, 2, 1], vec![0.0; 6]).unwrap();
        assert!(attention(&cx, &attrs(), &[Some(&q), Some(&k3), Some(&k3)]).is_err());
    }

    #[test]
    fn rotary_embedding_rotates_halves_or_pairs() {
        let x = Tensor::f32(vec![1, 1, 1, 4], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
        // A quarter turn for the first pair, none for the second.
        let cos = Tensor::f32(vec![1, 1, 2], vec![0.0, 1.0]).unwrap();
        let sin = Tensor::f32(vec![1, 1, 2], vec![1.0, 0.0]).unwrap();
        let r = RotaryAttrs {
            interleaved: false,
            heads: None,
            rotary_dim: None,
            onnxruntime_form: false,
        };
        let y = rotary_embedding(&r, &[Some(&x), Some(&cos), Some(&sin)]).unwrap();
        assert_eq!(y.as_f32().unwrap(), &[-3.0, 2.0, 1.0, 4.0]);
        let r = RotaryAttrs {
            interleaved: true,
            ..r
        };
        let y = rotary_embedding(&r, &[Some(&x), Some(&cos), Some(&sin)]).unwrap();
        assert_eq!(y.as_f32().unwrap(), &[-2.0, 1.0, 3.0, 4.0]);
        // A position past the cache.
        let pos = Tensor::i64(vec![1, 1], vec![5]).unwrap();
        let cos2 = Tensor::f32(vec![1, 2], vec![0.0, 1.0]).unwrap();
        assert!(rotary_embedding(&r, &[Some(&x), Some(&cos2), Some(&cos2), Some(&pos)]).is_err());
    }
}
