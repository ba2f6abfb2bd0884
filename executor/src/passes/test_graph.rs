//! Graphs built by hand for the passes' tests (the zoo builder only writes f32 weights), and
//! running a graph as it is and optimised.

use crate::backend::CpuBackend;
use crate::graph::{Dim, Graph, GraphInput, Node};
use crate::ops::Op;
use crate::ops::attrs::Attrs;
use crate::plan::Plan;
use crate::proto::AttributeProto;
use crate::tensor::{DType, Data, Tensor};
use std::sync::Arc;

/// A graph being built by hand.
pub(super) struct G(pub(super) Graph);

impl G {
    pub(super) fn new() -> G {
        G(Graph {
            opset: 21,
            ..Graph::default()
        })
    }
    pub(super) fn input(&mut self, name: &str, dtype: DType, dims: &[usize]) -> usize {
        let v = self.0.add_value(name);
        let mut d: Vec<Dim> = dims.iter().map(|&d| Dim::Fixed(d)).collect();
        if name == "x" {
            d[0] = Dim::Symbol("batch".into());
        }
        self.0.inputs.push(GraphInput {
            value: v,
            name: name.into(),
            dtype,
            dims: Some(d),
        });
        v
    }
    pub(super) fn constant(&mut self, t: Tensor) -> usize {
        let v = self.0.add_value(format!("c{}", self.0.value_names.len()));
        self.0.constants.insert(v, Arc::new(t));
        v
    }
    pub(super) fn node(
        &mut self,
        op: &str,
        inputs: &[Option<usize>],
        outs: usize,
        attrs: Vec<AttributeProto>,
    ) -> Vec<usize> {
        let op = Op::parse(op, &Attrs { list: &attrs }, 21, inputs.len(), outs)
            .expect("parses")
            .expect("supported");
        let outputs: Vec<usize> = (0..outs)
            .map(|k| {
                self.0
                    .add_value(format!("v{}_{k}", self.0.value_names.len()))
            })
            .collect();
        self.0.nodes.push(Node {
            name: format!("n{}", self.0.nodes.len()),
            op,
            inputs: inputs.to_vec(),
            outputs: outputs.clone(),
        });
        outputs
    }
    pub(super) fn output(mut self, v: usize) -> Graph {
        self.0.outputs.push(v);
        self.0
    }
}

pub(super) fn t(shape: &[usize], data: Data) -> Tensor {
    Tensor::new(shape.to_vec(), data).expect("tensor")
}

/// `n` pseudo-random bytes from `seed`.
pub(super) fn bytes(n: usize, seed: u32) -> Vec<u8> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 20) as u8
        })
        .collect()
}

pub(super) fn attr_int(name: &str, v: i64) -> AttributeProto {
    crate::zoo::builder::attr_int(name, v)
}

pub(super) fn names(g: &Graph) -> Vec<String> {
    g.nodes.iter().map(|n| n.op.name()).collect()
}

/// Runs the graph as it is and optimised on `inputs`; the optimised graph's op names and
/// both outputs.
pub(super) fn run_both(
    g: Graph,
    inputs: &dyn Fn() -> Vec<(String, Tensor)>,
) -> (Vec<String>, Tensor, Tensor) {
    let raw = Plan::build(&g).expect("plan");
    let mut opt = g;
    crate::passes::optimize(&mut opt);
    let fused = Plan::build(&opt).expect("plan");
    let be = CpuBackend::new(2);
    let want = raw.run(&be, inputs()).expect("runs").remove(0).1;
    let got = fused.run(&be, inputs()).expect("runs").remove(0).1;
    (names(&opt), want, got)
}
