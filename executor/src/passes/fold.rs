//! Constant folding: a node whose inputs are all constants is evaluated once at build time.
//! Control flow (If, Loop, Scan) is not: what its bodies allocate and how long a loop runs are
//! not known before it runs, and only a run is held to the tenant's memory budget.

use crate::graph::Graph;
use crate::ops::{Cx, Op};
use crate::tensor::Tensor;
use std::sync::Arc;

/// Folded results larger than this stay as nodes: folding must not bloat the model. It is
/// checked before a node is evaluated (`ops::size`), so a node asking for more is never run
/// here; at run time the tenant's memory budget decides.
const MAX_FOLDED_BYTES: usize = 64 << 20;

pub fn fold_constants(g: &mut Graph) {
    let cx = Cx::new(1);
    let nodes = std::mem::take(&mut g.nodes);
    for node in nodes {
        let foldable = !matches!(node.op, Op::Dropout | Op::Control(_))
            && node
                .inputs
                .iter()
                .flatten()
                .all(|v| g.constants.contains_key(v));
        if foldable {
            let refs: Vec<Option<&Tensor>> = node
                .inputs
                .iter()
                .map(|i| i.and_then(|v| g.constants.get(&v).map(|t| &**t)))
                .collect();
            let affordable = matches!(
                crate::ops::size::allocation(&node.op, &refs),
                Ok(None) | Ok(Some(0..=MAX_FOLDED_BYTES))
            );
            if affordable
                && let Ok(outs) = node.op.eval(&cx, &refs)
                && outs.len() >= node.outputs.len()
                && outs.iter().map(Tensor::bytes).sum::<usize>() <= MAX_FOLDED_BYTES
            {
                for (o, t) in node.outputs.iter().zip(outs) {
                    g.constants.insert(*o, Arc::new(t));
                }
                continue;
            }
        }
        g.nodes.push(node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Node;
    use crate::ops::elementwise::Binary;

    #[test]
    fn add_of_constants_becomes_a_constant() {
        let mut g = Graph::default();
        let (a, b, c) = (g.add_value("a"), g.add_value("b"), g.add_value("c"));
        g.constants.insert(a, Arc::new(Tensor::scalar_f32(1.0)));
        g.constants.insert(b, Arc::new(Tensor::scalar_f32(2.0)));
        g.nodes.push(Node {
            name: "add".into(),
            op: Op::Binary(Binary::Add),
            inputs: vec![Some(a), Some(b)],
            outputs: vec![c],
        });
        g.outputs = vec![c];
        fold_constants(&mut g);
        assert!(g.nodes.is_empty());
        assert_eq!(g.constants[&c].as_f32().unwrap(), &[3.0]);
    }
}
