//! Operators that carry a sequence model's state from one call to the next: TensorScatter
//! (writes new entries into a key/value cache), CausalConvWithState (a depthwise causal 1-D
//! convolution over the previous call's tail and the new input) and LinearAttention (linear,
//! gated and delta-rule recurrent attention over a state matrix per head). Computed in f64.

use super::attrs::Attrs;
use super::elementwise::cast;
use super::{input, opt_input};
use crate::error::{OpError, OpResult, shape_err};
use crate::tensor::{DType, Data, Tensor, axis_in, checked_numel};

fn float(t: &Tensor, op: &str) -> OpResult<Vec<f64>> {
    match t.dtype() {
        DType::F32 | DType::F64 => Ok(t.to_f64_vec()),
        d => Err(OpError::DType(format!("{op} of {d:?}"))),
    }
}

fn output(shape: Vec<usize>, v: Vec<f64>, to: DType) -> OpResult<Tensor> {
    Ok(cast(&Tensor::new(shape, Data::F64(v))?, to))
}

/// TensorScatter's attributes: where the sequence axis is, and whether writes wrap around it.
#[derive(Clone, Debug, PartialEq)]
pub struct ScatterAttrs {
    pub circular: bool,
    pub axis: i64,
}

impl ScatterAttrs {
    pub fn parse(a: &Attrs) -> Result<ScatterAttrs, String> {
        let circular = match a.string_or("mode", "linear")?.as_str() {
            "linear" => false,
            "circular" => true,
            m => {
                return Err(format!(
                    "attribute \"mode\" is {m:?}, not linear or circular"
                ));
            }
        };
        Ok(ScatterAttrs {
            circular,
            axis: a.int_or("axis", -2)?,
        })
    }
}

/// TensorScatter: `past_cache` with `update` written along the sequence axis from each batch
/// entry's `write_indices` (zero without them), wrapping in circular mode.
pub fn tensor_scatter(a: &ScatterAttrs, inputs: &[Option<&Tensor>]) -> OpResult<Tensor> {
    let (cache, update) = (input(inputs, 0)?, input(inputs, 1)?);
    let r = cache.rank();
    let axis = axis_in(a.axis, r)?;
    if axis == 0 {
        return shape_err("TensorScatter axis is the batch axis");
    }
    let fits = update.rank() == r
        && (0..r).all(|i| {
            if i == axis {
                update.shape[i] <= cache.shape[i]
            } else {
                update.shape[i] == cache.shape[i]
            }
        });
    if !fits || cache.dtype() != update.dtype() {
        return shape_err(format!(
            "TensorScatter of {:?} {:?} into {:?} {:?} along axis {axis}",
            update.dtype(),
            update.shape,
            cache.dtype(),
            cache.shape
        ));
    }
    let batch = cache.shape[0];
    let starts = match opt_input(inputs, 2) {
        Some(t) if t.len() != batch => {
            return shape_err(format!(
                "TensorScatter has {} write indices for a batch of {batch}",
                t.len()
            ));
        }
        Some(t) => t.to_i64_vec()?,
        None => vec![0; batch],
    };
    let (max, len) = (cache.shape[axis], update.shape[axis]);
    let outer: usize = cache.shape[1..axis].iter().product();
    let inner: usize = cache.shape[axis + 1..].iter().product();
    // Every element reads the cache, or the update at the position written there.
    let mut from: Vec<usize> = (0..cache.len()).collect();
    for (b, &start) in starts.iter().enumerate() {
        for s in 0..len {
            let at = i64::try_from(s).ok().and_then(|s| start.checked_add(s));
            let at = match at {
                Some(p) if a.circular && max > 0 => p.rem_euclid(max as i64) as usize,
                Some(p) if (0..max as i64).contains(&p) => p as usize,
                _ => {
                    return shape_err(format!(
                        "TensorScatter writes position {start} + {s} of a sequence of {max}"
                    ));
                }
            };
            for o in 0..outer {
                let row = b * outer + o;
                for i in 0..inner {
                    from[(row * max + at) * inner + i] = cache.len() + (row * len + s) * inner + i;
                }
            }
        }
    }
    let mut all = cache.data.clone();
    all.extend_from(&update.data, 0..update.len());
    Tensor::new(cache.shape.clone(), all.gather(&from))
}

/// CausalConvWithState: each channel of `input` `[B, C, L]` convolved with its own kernel
/// (`weight` `[C, 1, k]`) over the previous `k - 1` steps (`past_state`, zeros without it)
/// and the input, optionally followed by SiLU; the new state is the last `k - 1` steps.
pub fn causal_conv(silu: bool, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
    let (x, w) = (input(inputs, 0)?, input(inputs, 1)?);
    let (xv, wv) = (
        float(x, "CausalConvWithState")?,
        float(w, "CausalConvWithState")?,
    );
    let (&[b, c, l], &[wc, 1, k]) = (x.shape.as_slice(), w.shape.as_slice()) else {
        return shape_err(format!(
            "CausalConvWithState of {:?} by {:?}: [B, C, L] by [C, 1, k]",
            x.shape, w.shape
        ));
    };
    if wc != c || k == 0 {
        return shape_err(format!(
            "CausalConvWithState weight {:?} for {c} channels",
            w.shape
        ));
    }
    let bias = match opt_input(inputs, 2) {
        Some(t) if t.len() != c => {
            return shape_err(format!(
                "CausalConvWithState bias of {} for {c} channels",
                t.len()
            ));
        }
        Some(t) => float(t, "CausalConvWithState")?,
        None => vec![0.0; c],
    };
    let tail = k - 1;
    let past = match opt_input(inputs, 3) {
        Some(t) if t.shape != [b, c, tail] => {
            return shape_err(format!(
                "CausalConvWithState past_state {:?}, expected {:?}",
                t.shape,
                [b, c, tail]
            ));
        }
        Some(t) => float(t, "CausalConvWithState")?,
        None => vec![0.0; b * c * tail],
    };
    let padded_len = l + tail;
    let mut y = Vec::with_capacity(checked_numel(&[b, c, l])?);
    let mut state = Vec::with_capacity(b * c * tail);
    for bc in 0..b * c {
        let ch = bc % c;
        let padded: Vec<f64> = past[bc * tail..][..tail]
            .iter()
            .chain(&xv[bc * l..][..l])
            .copied()
            .collect();
        let kernel = &wv[ch * k..][..k];
        for t in 0..l {
            let v = bias[ch] + (0..k).map(|j| kernel[j] * padded[t + j]).sum::<f64>();
            y.push(if silu { v / (1.0 + (-v).exp()) } else { v });
        }
        state.extend_from_slice(&padded[padded_len - tail..]);
    }
    Ok(vec![
        output(vec![b, c, l], y, x.dtype())?,
        output(vec![b, c, tail], state, x.dtype())?,
    ])
}

/// LinearAttention's attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct LinearAttentionAttrs {
    pub q_heads: usize,
    pub kv_heads: usize,
    /// 0: `1 / sqrt(d_k)`.
    pub scale: f32,
    /// The state decays by `exp(decay)` before each step (input 4).
    pub gated: bool,
    /// Each step writes `beta · (v - S k)` rather than `v` (input 5).
    pub delta: bool,
}

impl LinearAttentionAttrs {
    pub fn parse(a: &Attrs) -> Result<LinearAttentionAttrs, String> {
        let (gated, delta) = match a.string_or("update_rule", "gated_delta")?.as_str() {
            "linear" => (false, false),
            "gated" => (true, false),
            "delta" => (false, true),
            "gated_delta" => (true, true),
            u => {
                return Err(format!(
                    "attribute \"update_rule\" is {u:?}, not linear, gated, delta or gated_delta"
                ));
            }
        };
        let heads = |name: &str| -> Result<usize, String> {
            match a.int(name)? {
                Some(h @ 1..=65536) => Ok(h as usize),
                h => Err(format!(
                    "attribute {name:?} is {h:?}, not a positive head count"
                )),
            }
        };
        let (q_heads, kv_heads) = (heads("q_num_heads")?, heads("kv_num_heads")?);
        if !q_heads.is_multiple_of(kv_heads) {
            return Err(format!(
                "attribute \"q_num_heads\" {q_heads} is not a multiple of \"kv_num_heads\" \
                 {kv_heads}"
            ));
        }
        let scale = a.float_or("scale", 0.0)?;
        if !scale.is_finite() {
            return Err(format!("attribute \"scale\" is {scale}"));
        }
        Ok(LinearAttentionAttrs {
            q_heads,
            kv_heads,
            scale,
            gated,
            delta,
        })
    }
}

/// LinearAttention over `query` `[B, T, Hq·dk]`, `key` `[B, T, Hkv·dk]` and `value`
/// `[B, T, Hkv·dv]`: per key/value head a state `S` (`[dk, dv]`, `past_state` or zeros) is
/// decayed (gated), corrected by the delta rule, updated by `k vᵀ`, and read by each query
/// head of its group as `scale · qᵀ S`. Outputs `[B, T, Hq·dv]` and the final state.
pub fn linear_attention(
    a: &LinearAttentionAttrs,
    inputs: &[Option<&Tensor>],
) -> OpResult<Vec<Tensor>> {
    let (q, k, v) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    let op = "LinearAttention";
    let ([b, t, qd], [kb, kt, kd], [vb, vt, vd]) = (
        <[usize; 3]>::try_from(q.shape.as_slice())
            .map_err(|_| OpError::Shape(format!("{op} query {:?} is not [B, T, H*D]", q.shape)))?,
        <[usize; 3]>::try_from(k.shape.as_slice())
            .map_err(|_| OpError::Shape(format!("{op} key {:?} is not [B, T, H*D]", k.shape)))?,
        <[usize; 3]>::try_from(v.shape.as_slice())
            .map_err(|_| OpError::Shape(format!("{op} value {:?} is not [B, T, H*D]", v.shape)))?,
    );
    let (hq, hk) = (a.q_heads, a.kv_heads);
    if (kb, kt, vb, vt) != (b, t, b, t)
        || !qd.is_multiple_of(hq)
        || !vd.is_multiple_of(hk)
        || kd != hk * (qd / hq)
    {
        return shape_err(format!(
            "{op} of query {:?}, key {:?}, value {:?} with {hq} query and {hk} key/value heads",
            q.shape, k.shape, v.shape
        ));
    }
    let (dk, dv, group) = (qd / hq, vd / hk, hq / hk);
    let gate = opt_input(inputs, 4);
    let beta = opt_input(inputs, 5);
    if gate.is_some() != a.gated || beta.is_some() != a.delta {
        return shape_err(format!(
            "{op}: the update rule takes {} decay and {} beta input",
            if a.gated { "a" } else { "no" },
            if a.delta { "a" } else { "no" }
        ));
    }
    // How many decay values per head: one, or one per key dimension.
    let gate_width = match gate {
        Some(g) if g.rank() == 3 && g.shape[..2] == [b, t] && g.shape[2] == hk => Some(1),
        Some(g) if g.rank() == 3 && g.shape[..2] == [b, t] && g.shape[2] == hk * dk => Some(dk),
        Some(g) => return shape_err(format!("{op} decay {:?}", g.shape)),
        None => None,
    };
    let beta_heads = match beta {
        Some(g)
            if g.rank() == 3 && g.shape[..2] == [b, t] && (g.shape[2] == hk || g.shape[2] == 1) =>
        {
            Some(g.shape[2])
        }
        Some(g) => return shape_err(format!("{op} beta {:?}", g.shape)),
        None => None,
    };
    let state_shape = vec![b, hk, dk, dv];
    checked_numel(&state_shape)?;
    let (mut state, state_type) = match opt_input(inputs, 3) {
        Some(s) if s.shape != state_shape => {
            return shape_err(format!(
                "{op} past_state {:?}, expected {state_shape:?}",
                s.shape
            ));
        }
        Some(s) => (float(s, op)?, s.dtype()),
        None => (vec![0.0; b * hk * dk * dv], q.dtype()),
    };
    let (qv, kv, vv) = (float(q, op)?, float(k, op)?, float(v, op)?);
    let gv = gate.map(|g| float(g, op)).transpose()?;
    let bv = beta.map(|g| float(g, op)).transpose()?;
    let scale = if a.scale == 0.0 {
        1.0 / (dk as f64).sqrt()
    } else {
        f64::from(a.scale)
    };
    let mut y = vec![0.0; checked_numel(&[b, t, hq * dv])?];
    let mut vt_row = vec![0.0; dv];
    for bi in 0..b {
        for ti in 0..t {
            for h in 0..hk {
                let s = &mut state[(bi * hk + h) * dk * dv..][..dk * dv];
                let key = &kv[(bi * t + ti) * kd + h * dk..][..dk];
                vt_row.copy_from_slice(&vv[(bi * t + ti) * vd + h * dv..][..dv]);
                if let (Some(g), Some(w)) = (&gv, gate_width) {
                    let at = (bi * t + ti) * hk * w + h * w;
                    for d in 0..dk {
                        let f = g[at + if w == 1 { 0 } else { d }].exp();
                        s[d * dv..][..dv].iter_mut().for_each(|x| *x *= f);
                    }
                }
                if let (Some(bt), Some(n)) = (&bv, beta_heads) {
                    let beta = bt[(bi * t + ti) * n + if n == 1 { 0 } else { h }];
                    for (m, vm) in vt_row.iter_mut().enumerate() {
                        let retrieved: f64 = (0..dk).map(|d| s[d * dv + m] * key[d]).sum();
                        *vm = beta * (*vm - retrieved);
                    }
                }
                for d in 0..dk {
                    for m in 0..dv {
                        s[d * dv + m] += key[d] * vt_row[m];
                    }
                }
                for g in 0..group {
                    let hq_i = h * group + g;
                    let query = &qv[(bi * t + ti) * qd + hq_i * dk..][..dk];
                    let out = &mut y[(bi * t + ti) * hq * dv + hq_i * dv..][..dv];
                    for (m, o) in out.iter_mut().enumerate() {
                        *o = scale * (0..dk).map(|d| query[d] * s[d * dv + m]).sum::<f64>();
                    }
                }
            }
        }
    }
    Ok(vec![
        output(vec![b, t, hq * dv], y, q.dtype())?,
        output(state_shape, state, state_type)?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caches_are_written_and_bad_positions_refused() {
        let cache = Tensor::f32(vec![1, 3, 1], vec![1.0, 2.0, 3.0]).unwrap();
        let update = Tensor::f32(vec![1, 2, 1], vec![8.0, 9.0]).unwrap();
        let at = Tensor::i64(vec![1], vec![2]).unwrap();
        let linear = ScatterAttrs {
            circular: false,
            axis: -2,
        };
        let ins = [Some(&cache), Some(&update), Some(&at)];
        assert!(tensor_scatter(&linear, &ins).is_err());
        let circular = ScatterAttrs {
            circular: true,
            ..linear.clone()
        };
        let y = tensor_scatter(&circular, &ins).unwrap();
        assert_eq!(y.as_f32().unwrap(), &[9.0, 2.0, 8.0]);
        let y = tensor_scatter(&linear, &[Some(&cache), Some(&update)]).unwrap();
        assert_eq!(y.as_f32().unwrap(), &[8.0, 9.0, 3.0]);
    }

    #[test]
    fn causal_convolution_carries_its_tail() {
        let x = Tensor::f32(vec![1, 1, 3], vec![1.0, 2.0, 3.0]).unwrap();
        let w = Tensor::f32(vec![1, 1, 2], vec![1.0, 10.0]).unwrap();
        let past = Tensor::f32(vec![1, 1, 1], vec![5.0]).unwrap();
        let out = causal_conv(false, &[Some(&x), Some(&w), None, Some(&past)]).unwrap();
        assert_eq!(out[0].as_f32().unwrap(), &[15.0, 21.0, 32.0]);
        assert_eq!(out[1].as_f32().unwrap(), &[3.0]);
        let bad = Tensor::f32(vec![1, 1, 2], vec![0.0; 2]).unwrap();
        assert!(causal_conv(false, &[Some(&x), Some(&w), None, Some(&bad)]).is_err());
    }

    #[test]
    fn linear_attention_accumulates_outer_products() {
        let a = LinearAttentionAttrs {
            q_heads: 1,
            kv_heads: 1,
            scale: 1.0,
            gated: false,
            delta: false,
        };
        let ones = Tensor::f32(vec![1, 2, 1], vec![1.0, 1.0]).unwrap();
        let v = Tensor::f32(vec![1, 2, 1], vec![2.0, 3.0]).unwrap();
        let out = linear_attention(&a, &[Some(&ones), Some(&ones), Some(&v)]).unwrap();
        assert_eq!(out[0].as_f32().unwrap(), &[2.0, 5.0]);
        assert_eq!(out[1].as_f32().unwrap(), &[5.0]);
        // A gated rule without its decay input.
        let gated = LinearAttentionAttrs { gated: true, ..a };
        assert!(linear_attention(&gated, &[Some(&ones), Some(&ones), Some(&v)]).is_err());
    }
}
