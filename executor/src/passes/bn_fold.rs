//! Folds an inference BatchNormalization into the Conv that feeds it: `W' = W·a`, `b' = b·a + c`
//! per output channel, where `bn(x) = a·x + c`.

use super::sole_reader;
use crate::graph::Graph;
use crate::ops::{Op, norm::fold_params};
use crate::tensor::Tensor;
use std::sync::Arc;

pub fn fold_batch_norm(g: &mut Graph) {
    let mut i = 0;
    while i < g.nodes.len() {
        if try_fold(g, i) {
            continue;
        }
        i += 1;
    }
}

/// Folds the BatchNorm reading node `i` (a Conv) into it; true when the graph changed.
fn try_fold(g: &mut Graph, i: usize) -> bool {
    let Op::Conv(attrs) = &g.nodes[i].op else {
        return false;
    };
    if attrs.act.is_some() {
        return false;
    }
    let uses = g.use_counts();
    let Some(&out) = g.nodes[i].outputs.first() else {
        return false;
    };
    let Some(j) = sole_reader(g, &uses, out) else {
        return false;
    };
    let Op::BatchNorm { eps } = g.nodes[j].op else {
        return false;
    };
    let bn = &g.nodes[j];
    if bn.inputs.first() != Some(&Some(out)) || bn.outputs.len() != 1 {
        return false;
    }
    let konst = |v: Option<&Option<usize>>| {
        v.copied()
            .flatten()
            .and_then(|v| g.constants.get(&v).cloned())
    };
    let params: Option<Vec<Arc<Tensor>>> = (1..5).map(|k| konst(bn.inputs.get(k))).collect();
    let conv = &g.nodes[i];
    let (Some(params), Some(w)) = (params, konst(conv.inputs.get(1))) else {
        return false;
    };
    let bias = konst(conv.inputs.get(2));
    if conv.inputs.get(2).copied().flatten().is_some() && bias.is_none() {
        return false;
    }
    let Ok(p) = params
        .iter()
        .map(|t| t.as_f32())
        .collect::<Result<Vec<_>, _>>()
    else {
        return false;
    };
    let Ok(wv) = w.as_f32() else { return false };
    let m = w.shape.first().copied().unwrap_or(0);
    if m == 0 || p.iter().any(|v| v.len() != m) || wv.len() % m != 0 {
        return false;
    }
    let (a, c) = fold_params(p[0], p[1], p[2], p[3], eps);
    let per = wv.len() / m;
    let new_w: Vec<f32> = wv.iter().enumerate().map(|(k, x)| x * a[k / per]).collect();
    let old_b: Vec<f32> = match &bias {
        Some(b) => match b.as_f32() {
            Ok(v) if v.len() == m => v.to_vec(),
            _ => return false,
        },
        None => vec![0.0; m],
    };
    let new_b: Vec<f32> = (0..m).map(|k| old_b[k] * a[k] + c[k]).collect();
    let (Ok(new_w), Ok(new_b)) = (
        Tensor::f32(w.shape.clone(), new_w),
        Tensor::f32(vec![m], new_b),
    ) else {
        return false;
    };
    let wid = g.add_value(format!("{}_bn_weight", g.nodes[i].name));
    let bid = g.add_value(format!("{}_bn_bias", g.nodes[i].name));
    g.constants.insert(wid, Arc::new(new_w));
    g.constants.insert(bid, Arc::new(new_b));
    let bn_out = g.nodes[j].outputs[0];
    let conv = &mut g.nodes[i];
    conv.inputs.resize(3, None);
    conv.inputs[1] = Some(wid);
    conv.inputs[2] = Some(bid);
    conv.outputs[0] = bn_out;
    g.nodes.remove(j);
    true
}
