//! The graph IR the importer produces and the passes rewrite: values by index, nodes in
//! topological order, constants (initializers and folded values) kept beside the nodes.

use crate::ops::Op;
use crate::tensor::{DType, Tensor};
use std::collections::HashMap;
use std::sync::Arc;

pub type ValueId = usize;

/// One dimension of a declared graph input.
#[derive(Clone, Debug, PartialEq)]
pub enum Dim {
    Fixed(usize),
    /// A symbolic dimension, resolved from the inputs at run time: a name the model gives
    /// (e.g. `batch`), shared by the inputs that use it, or `input?axis` for an axis the model
    /// leaves unknown (see `import`).
    Symbol(String),
}

#[derive(Clone, Debug)]
pub struct GraphInput {
    pub value: ValueId,
    pub name: String,
    pub dtype: DType,
    /// `None` when the model declares no shape at all.
    pub dims: Option<Vec<Dim>>,
}

impl GraphInput {
    /// The shape of an example of this input at `batch`: the first symbolic dimension is the
    /// batch, other symbolic ones are 1 (empty when no shape is declared).
    pub fn example_shape(&self, batch: usize) -> Vec<usize> {
        self.dims
            .iter()
            .flatten()
            .enumerate()
            .map(|(k, d)| match d {
                Dim::Fixed(v) => *v,
                Dim::Symbol(_) if k == 0 => batch,
                Dim::Symbol(_) => 1,
            })
            .collect()
    }
}

#[derive(Clone, Debug)]
pub struct Node {
    pub name: String,
    pub op: Op,
    /// `None` for an omitted optional input.
    pub inputs: Vec<Option<ValueId>>,
    pub outputs: Vec<ValueId>,
}

#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub value_names: Vec<String>,
    pub nodes: Vec<Node>,
    pub inputs: Vec<GraphInput>,
    pub outputs: Vec<ValueId>,
    /// The element type the model declares for each output, where it declares one.
    pub output_dtypes: Vec<Option<DType>>,
    pub constants: HashMap<ValueId, Arc<Tensor>>,
    pub opset: i64,
}

impl Graph {
    pub fn add_value(&mut self, name: impl Into<String>) -> ValueId {
        self.value_names.push(name.into());
        self.value_names.len() - 1
    }

    /// How many node inputs and graph outputs read each value.
    pub fn use_counts(&self) -> Vec<usize> {
        let mut uses = vec![0; self.value_names.len()];
        for n in &self.nodes {
            for v in n.inputs.iter().flatten() {
                uses[*v] += 1;
            }
        }
        for &o in &self.outputs {
            uses[o] += 1;
        }
        uses
    }

    /// Index of the node producing each value, if any.
    pub fn producers(&self) -> Vec<Option<usize>> {
        let mut p = vec![None; self.value_names.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            for &o in &n.outputs {
                p[o] = Some(i);
            }
        }
        p
    }
}
