//! Dead-node removal: drops nodes none of whose outputs reach a graph output, and constants
//! nothing reads any more.

use crate::graph::Graph;

pub fn remove_dead(g: &mut Graph) {
    loop {
        let uses = g.use_counts();
        let before = g.nodes.len();
        g.nodes.retain(|n| n.outputs.iter().any(|&o| uses[o] > 0));
        if g.nodes.len() == before {
            break;
        }
    }
    let uses = g.use_counts();
    g.constants.retain(|v, _| uses[*v] > 0);
}
