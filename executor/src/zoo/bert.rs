//! A BERT-style encoder: token + position embeddings, `layers` post-LayerNorm transformer blocks
//! (multi-head self-attention, GELU feed-forward), output = last hidden state
//! `[batch, seq, hidden]`. Linear weights are normal(0, 1/sqrt(fan_in)) so activations stay O(1).

use super::builder::{Builder, attr_float, attr_int, attr_ints};

#[derive(Clone, Debug, PartialEq)]
pub struct BertOptions {
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub seq: usize,
    pub vocab: usize,
}

impl Default for BertOptions {
    fn default() -> Self {
        BertOptions {
            layers: 12,
            hidden: 768,
            heads: 12,
            seq: 128,
            vocab: 30522,
        }
    }
}

fn linear(b: &mut Builder, x: &str, tokens: usize, cin: usize, cout: usize) -> String {
    let w = b.normal("lin_w", &[cin, cout], (1.0 / cin as f32).sqrt());
    let bias = b.weight("lin_b", &[cout], |r| (r.uniform() - 0.5) * 0.1);
    b.macs += (tokens * cin * cout) as u64;
    let m = b.node("MatMul", &[x, &w], vec![]);
    b.node("Add", &[&m, &bias], vec![])
}

fn layer_norm(b: &mut Builder, x: &str, hidden: usize) -> String {
    let g = b.weight("ln_g", &[hidden], |r| 0.9 + 0.2 * r.uniform());
    let be = b.weight("ln_b", &[hidden], |r| (r.uniform() - 0.5) * 0.1);
    b.node(
        "LayerNormalization",
        &[x, &g, &be],
        vec![attr_int("axis", -1), attr_float("epsilon", 1e-12)],
    )
}

/// `x * 0.5 * (1 + erf(x / sqrt(2)))`, as exporters write GELU before opset 20.
fn gelu(b: &mut Builder, x: &str) -> String {
    let sqrt2 = b.const_f32("sqrt2", std::f32::consts::SQRT_2);
    let one = b.const_f32("one", 1.0);
    let half = b.const_f32("half", 0.5);
    let d = b.node("Div", &[x, &sqrt2], vec![]);
    let e = b.node("Erf", &[&d], vec![]);
    let a = b.node("Add", &[&e, &one], vec![]);
    let m = b.node("Mul", &[x, &a], vec![]);
    b.node("Mul", &[&m, &half], vec![])
}

/// Builds the graph; returns the output name. Input: `input_ids` int64 `[batch, seq]`.
pub fn bert(b: &mut Builder, o: &BertOptions) -> String {
    let (h, s, nh) = (o.hidden, o.seq, o.heads);
    let dh = h / nh;
    let tok = b.normal("tok_emb", &[o.vocab, h], 1.0);
    let pos = b.normal("pos_emb", &[s, h], 0.5);
    let e = b.node("Gather", &[&tok, "input_ids"], vec![attr_int("axis", 0)]);
    let e = b.node("Add", &[&e, &pos], vec![]);
    let mut x = layer_norm(b, &e, h);
    let heads_shape = b.const_i64("heads_shape", &[0, 0, nh as i64, dh as i64]);
    let merged_shape = b.const_i64("merged_shape", &[0, 0, h as i64]);
    let scale = b.const_f32("scale", 1.0 / (dh as f32).sqrt());
    for _ in 0..o.layers {
        let split = |b: &mut Builder, t: &str, perm: &[i64]| {
            let r = b.node("Reshape", &[t, &heads_shape], vec![]);
            b.node("Transpose", &[&r], vec![attr_ints("perm", perm)])
        };
        let q = linear(b, &x, s, h, h);
        let k = linear(b, &x, s, h, h);
        let v = linear(b, &x, s, h, h);
        let q = split(b, &q, &[0, 2, 1, 3]);
        let k = split(b, &k, &[0, 2, 3, 1]);
        let v = split(b, &v, &[0, 2, 1, 3]);
        let scores = b.node("MatMul", &[&q, &k], vec![]);
        let scores = b.node("Mul", &[&scores, &scale], vec![]);
        let probs = b.node("Softmax", &[&scores], vec![attr_int("axis", -1)]);
        let ctx = b.node("MatMul", &[&probs, &v], vec![]);
        b.macs += (2 * nh * s * s * dh) as u64;
        let ctx = b.node("Transpose", &[&ctx], vec![attr_ints("perm", &[0, 2, 1, 3])]);
        let ctx = b.node("Reshape", &[&ctx, &merged_shape], vec![]);
        let attn = linear(b, &ctx, s, h, h);
        let r1 = b.node("Add", &[&attn, &x], vec![]);
        let x1 = layer_norm(b, &r1, h);
        let f = linear(b, &x1, s, h, 4 * h);
        let f = gelu(b, &f);
        let f = linear(b, &f, s, 4 * h, h);
        let r2 = b.node("Add", &[&f, &x1], vec![]);
        x = layer_norm(b, &r2, h);
    }
    x
}
