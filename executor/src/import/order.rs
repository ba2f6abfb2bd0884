//! The order a graph's nodes are imported in. ONNX asks for nodes in topological order, but
//! tools that append nodes to a finished graph leave them out of it: onnxruntime's and
//! onnxconverter-common's float16 conversion adds the Casts of the graph's inputs at the end.
//! onnxruntime sorts such graphs, so they are served; so are they here.

use crate::proto::{GraphProto, NodeProto};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// The indices of `gp`'s nodes with each node after the nodes producing what it reads (a
/// subgraph's reads of outer names included), otherwise in the file's order. Nodes on a cycle
/// or reading a name no node produces keep their place relative to each other, after the
/// rest, so that the import names the first such read as undefined.
pub(crate) fn topological(gp: &GraphProto) -> Vec<usize> {
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (i, n) in gp.node.iter().enumerate() {
        for o in n.output.iter().filter(|o| !o.is_empty()) {
            producer.entry(o.as_str()).or_insert(i);
        }
    }
    let deps: Vec<Vec<usize>> = gp
        .node
        .iter()
        .map(|n| {
            let mut d = Vec::new();
            reads(n, &mut |name| {
                if let Some(&p) = producer.get(name) {
                    d.push(p);
                }
            });
            d
        })
        .collect();
    if deps
        .iter()
        .enumerate()
        .all(|(i, d)| d.iter().all(|&p| p < i))
    {
        return (0..gp.node.len()).collect();
    }
    let mut waiting: Vec<usize> = deps.iter().map(Vec::len).collect();
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); gp.node.len()];
    for (i, d) in deps.iter().enumerate() {
        for &p in d {
            users[p].push(i);
        }
    }
    let mut ready: BinaryHeap<Reverse<usize>> = (0..gp.node.len())
        .filter(|&i| waiting[i] == 0)
        .map(Reverse)
        .collect();
    let mut order = Vec::with_capacity(gp.node.len());
    let mut placed = vec![false; gp.node.len()];
    while let Some(Reverse(i)) = ready.pop() {
        order.push(i);
        placed[i] = true;
        for &u in &users[i] {
            waiting[u] -= 1;
            if waiting[u] == 0 {
                ready.push(Reverse(u));
            }
        }
    }
    order.extend((0..gp.node.len()).filter(|&i| !placed[i]));
    order
}

/// Calls `f` with every name `n` reads: its inputs and what the subgraphs in its attributes
/// read (their own names among them; those have no producer in the enclosing graph).
fn reads<'a>(n: &'a NodeProto, f: &mut impl FnMut(&'a str)) {
    for i in n.input.iter().filter(|i| !i.is_empty()) {
        f(i);
    }
    for a in &n.attribute {
        for g in a.g.iter().map(|g| &**g).chain(&a.graphs) {
            for inner in &g.node {
                reads(inner, f);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::AttributeProto;

    fn node(inputs: &[&str], outputs: &[&str]) -> NodeProto {
        NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn graph(nodes: Vec<NodeProto>) -> GraphProto {
        GraphProto {
            node: nodes,
            ..Default::default()
        }
    }

    #[test]
    fn nodes_follow_what_they_read_and_otherwise_keep_the_file_order() {
        // In order already: unchanged.
        let g = graph(vec![node(&["x"], &["a"]), node(&["a"], &["b"])]);
        assert_eq!(topological(&g), vec![0, 1]);
        // The input's Cast appended last, as float16 conversion writes it.
        let g = graph(vec![
            node(&["w"], &["w2"]),
            node(&["xc", "w2"], &["y"]),
            node(&["y"], &["z"]),
            node(&["x"], &["xc"]),
        ]);
        assert_eq!(topological(&g), vec![0, 3, 1, 2]);
        // A subgraph's read of an outer name counts.
        let body = GraphProto {
            node: vec![node(&["late"], &["inner"])],
            ..Default::default()
        };
        let mut iff = node(&["cond"], &["out"]);
        iff.attribute.push(AttributeProto {
            name: "then_branch".into(),
            g: Some(Box::new(body)),
            ..Default::default()
        });
        let g = graph(vec![iff, node(&["x"], &["late"])]);
        assert_eq!(topological(&g), vec![1, 0]);
        // A cycle and a read of an unknown name stay, in file order, after the rest.
        let g = graph(vec![
            node(&["b"], &["a"]),
            node(&["a"], &["b"]),
            node(&["x"], &["c"]),
        ]);
        assert_eq!(topological(&g), vec![2, 0, 1]);
    }
}
