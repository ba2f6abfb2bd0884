//! Folds an inference BatchNormalization, or a Mul by a per-channel constant, into the Conv that
//! feeds it: `W' = W·a`, `b' = b·a + c` per output channel, where `bn(x) = a·x + c`.

use super::bias::per_channel;
use super::{other, sole_reader};
use crate::graph::Graph;
use crate::ops::{Op, elementwise::Binary, norm::fold_params};
use crate::tensor::Tensor;
use std::sync::Arc;

pub fn fold_batch_norm(g: &mut Graph) -> usize {
    let (mut i, mut folded) = (0, 0);
    while i < g.nodes.len() {
        if try_fold(g, i) {
            folded += 1;
            continue;
        }
        i += 1;
    }
    folded
}

/// Folds the BatchNorm, or the Mul by a constant with one value per output channel (a learned
/// scale, as PP-LCNetV3 writes one after each convolution), reading node `i` (a Conv) into it;
/// true when the graph changed.
fn try_fold(g: &mut Graph, i: usize) -> bool {
    let Op::Conv(attrs) = &g.nodes[i].op else {
        return false;
    };
    if attrs.act.is_some() || attrs.residual {
        return false;
    }
    let uses = g.use_counts();
    let Some(&out) = g.nodes[i].outputs.first() else {
        return false;
    };
    let Some(j) = sole_reader(g, &uses, out) else {
        return false;
    };
    let konst = |v: Option<&Option<usize>>| {
        v.copied()
            .flatten()
            .and_then(|v| g.constants.get(&v).cloned())
    };
    let conv = &g.nodes[i];
    let Some(w) = konst(conv.inputs.get(1)) else {
        return false;
    };
    let m = w.shape.first().copied().unwrap_or(0);
    let affine = &g.nodes[j];
    // `affine(x) = a·x + c` per output channel.
    let (a, c) = match affine.op {
        Op::BatchNorm { eps } if affine.inputs.first() == Some(&Some(out)) => {
            let params: Option<Vec<Arc<Tensor>>> =
                (1..5).map(|k| konst(affine.inputs.get(k))).collect();
            let Some(params) = params else {
                return false;
            };
            let Ok(p) = params
                .iter()
                .map(|t| t.as_f32())
                .collect::<Result<Vec<_>, _>>()
            else {
                return false;
            };
            if m == 0 || p.iter().any(|v| v.len() != m) {
                return false;
            }
            fold_params(p[0], p[1], p[2], p[3], eps)
        }
        Op::Binary(Binary::Mul) => {
            let scale = other(affine, out)
                .flatten()
                .and_then(|v| g.constants.get(&v))
                .and_then(|t| per_channel(t, w.rank(), m));
            match scale {
                Some(a) => (a, vec![0.0; m]),
                None => return false,
            }
        }
        _ => return false,
    };
    if affine.outputs.len() != 1 {
        return false;
    }
    let bias = konst(conv.inputs.get(2));
    if conv.inputs.get(2).copied().flatten().is_some() && bias.is_none() {
        return false;
    }
    let Ok(wv) = w.as_f32() else { return false };
    if m == 0 || wv.len() % m != 0 {
        return false;
    }
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
    let affine_out = g.nodes[j].outputs[0];
    let conv = &mut g.nodes[i];
    conv.inputs.resize(3, None);
    conv.inputs[1] = Some(wid);
    conv.inputs[2] = Some(bid);
    conv.outputs[0] = affine_out;
    g.nodes.remove(j);
    true
}

#[cfg(test)]
mod tests {
    use crate::graph::Graph;
    use crate::proto::ModelProto;
    use crate::tensor::{DType, Tensor};
    use crate::zoo::builder::{Builder, value_info};
    use prost::Message;

    /// PP-LCNetV3's learned affine after a convolution, `Conv → Mul(a) → Add(b)` with one-element
    /// a and b, then a Mul by per-channel `[1, 6, 1, 1]` scales; and a convolution scaled per
    /// column, `[5]`, which no weight can hold.
    fn graph() -> Graph {
        let mut m = Builder::new(8, false);
        let w = m.normal("w", &[6, 4, 3, 3], 0.5);
        let b = m.normal("b", &[6], 0.5);
        let pads = crate::zoo::builder::attr_ints("pads", &[1; 4]);
        let y = m.node("Conv", &["x", &w, &b], vec![pads]);
        let a = m.const_f32("a", 1.7);
        let y = m.node("Mul", &[&a, &y], vec![]);
        let shift = m.const_f32("s", -0.3);
        let y = m.node("Add", &[&y, &shift], vec![]);
        let scales = m.normal("k", &[1, 6, 1, 1], 1.0);
        let y = m.node("Mul", &[&y, &scales], vec![]);
        m.node_rename_last(&y, "y");
        let w = m.normal("w", &[6, 4, 1, 1], 0.5);
        let z = m.node("Conv", &["x", &w], vec![]);
        let columns = m.normal("c", &[5], 1.0);
        let z = m.node("Mul", &[&z, &columns], vec![]);
        m.node_rename_last(&z, "z");
        let shape = [Some(1), Some(6), Some(4), Some(5)];
        let x = value_info("x", DType::F32, &[Some(1), Some(4), Some(4), Some(5)]);
        let outputs = vec![
            value_info("y", DType::F32, &shape),
            value_info("z", DType::F32, &shape),
        ];
        let proto: ModelProto = m.finish("affine", 13, vec![x], outputs);
        crate::import::import(&proto.encode_to_vec(), None).expect("imports")
    }

    #[test]
    fn per_channel_scales_and_shifts_fold_into_the_convolution() {
        let mut g = graph();
        while super::super::fold_conv_bias(&mut g) + super::fold_batch_norm(&mut g) > 0 {}
        let names: Vec<String> = g.nodes.iter().map(|n| n.op.name()).collect();
        assert_eq!(names, ["Conv", "Conv", "Mul"], "{names:?}");
        let x: Vec<f32> = (0..80).map(|i| (i % 7) as f32 / 3.0 - 1.0).collect();
        let x = Tensor::f32(vec![1, 4, 4, 5], x).expect("x");
        crate::passes::assert_same_outputs(&graph(), &g, &[("x".into(), x)], 1e-5);
    }
}
