//! A node of onnxruntime's `com.microsoft` domain written out as standard nodes (and, where no
//! standard operator says it, an executor op), which the importer then reads like any others.
//! Intermediate values are named after the node, `node/Op3`.

use crate::ops::Op;
use crate::ops::attrs::Attrs;
use crate::proto::{AttributeProto, NodeProto, attribute_type as at};
use crate::tensor::Tensor;
use crate::tensor_proto::encode_tensor;
use std::sync::Arc;

/// The default-domain opset the written nodes are read at: Split takes `num_outputs`, the
/// reductions and Squeeze/Unsqueeze take their axes as inputs, Softmax works on one axis.
pub const OPSET: i64 = 21;

/// One node of an expansion.
pub enum Step {
    /// A standard node, read at `opset`.
    Node { node: NodeProto, opset: i64 },
    /// A constant the expansion computed from the node's constant inputs.
    Constant { name: String, tensor: Arc<Tensor> },
    /// An executor op no standard operator expresses.
    Op {
        name: String,
        op: Op,
        inputs: Vec<String>,
        outputs: Vec<String>,
    },
}

/// The tensor of a constant value (an initializer or a Constant's output) by name.
pub type Constants<'a> = &'a dyn Fn(&str) -> Option<Arc<Tensor>>;

/// The node being expanded and the steps written so far.
pub struct Expansion<'a> {
    pub np: &'a NodeProto,
    name: &'a str,
    constants: Constants<'a>,
    pub steps: Vec<Step>,
    counter: usize,
}

pub type R<T> = Result<T, String>;

impl<'a> Expansion<'a> {
    pub fn new(np: &'a NodeProto, name: &'a str, constants: Constants<'a>) -> Expansion<'a> {
        Expansion {
            np,
            name,
            constants,
            steps: Vec::new(),
            counter: 0,
        }
    }

    /// Input `i`, which must be a constant.
    pub fn constant_input(&self, i: usize, what: &str) -> R<Arc<Tensor>> {
        let name = self.required(i, what)?;
        (self.constants)(name).ok_or_else(|| format!("input {i} ({what}) is not a constant"))
    }

    /// A new constant value holding `tensor`.
    pub fn computed(&mut self, tensor: Tensor) -> String {
        let name = self.fresh_value("computed");
        self.steps.push(Step::Constant {
            name: name.clone(),
            tensor: Arc::new(tensor),
        });
        name
    }

    pub fn attrs(&self) -> Attrs<'a> {
        Attrs {
            list: &self.np.attribute,
        }
    }

    /// Input `i`'s name; `""` when omitted.
    pub fn input(&self, i: usize) -> &'a str {
        self.np.input.get(i).map_or("", String::as_str)
    }

    /// Input `i`, which the operator requires.
    pub fn required(&self, i: usize, what: &str) -> R<&'a str> {
        match self.input(i) {
            "" => Err(format!("input {i} ({what}) is required")),
            name => Ok(name),
        }
    }

    /// Output `i`'s name; `""` when the node does not name it.
    pub fn output(&self, i: usize) -> &'a str {
        self.np.output.get(i).map_or("", String::as_str)
    }

    /// Refuses a node that names output `i`, which this expansion does not compute.
    pub fn unsupported_output(&self, i: usize, what: &str) -> R<()> {
        match self.output(i) {
            "" => Ok(()),
            _ => Err(format!("output {i} ({what}) is not supported")),
        }
    }

    /// Refuses a node given input `i`, which this expansion does not read.
    pub fn unsupported_input(&self, i: usize, what: &str) -> R<()> {
        match self.input(i) {
            "" => Ok(()),
            _ => Err(format!("input {i} ({what}) is not supported")),
        }
    }

    /// A new value name.
    pub fn fresh_value(&mut self, tag: &str) -> String {
        self.counter += 1;
        format!("{}/{tag}{}", self.name, self.counter)
    }

    /// A standard node with outputs `outputs` (read at [`OPSET`]).
    pub fn node_to(
        &mut self,
        op: &str,
        inputs: &[&str],
        outputs: &[&str],
        attrs: Vec<AttributeProto>,
    ) {
        self.node_at(op, inputs, outputs, attrs, OPSET);
    }

    /// A standard node read at `opset`.
    pub fn node_at(
        &mut self,
        op: &str,
        inputs: &[&str],
        outputs: &[&str],
        attribute: Vec<AttributeProto>,
        opset: i64,
    ) {
        let name = self.fresh_value(op);
        self.steps.push(Step::Node {
            node: NodeProto {
                input: inputs.iter().map(|s| s.to_string()).collect(),
                output: outputs.iter().map(|s| s.to_string()).collect(),
                name,
                op_type: op.into(),
                attribute,
                ..Default::default()
            },
            opset,
        });
    }

    /// A standard node with one new output, whose name it returns.
    pub fn node(&mut self, op: &str, inputs: &[&str], attrs: Vec<AttributeProto>) -> String {
        let out = self.fresh_value(op);
        self.node_to(op, inputs, &[&out], attrs);
        out
    }

    /// `node`, writing into `out` when it is named (an output of the expanded node).
    pub fn node_into(
        &mut self,
        op: &str,
        inputs: &[&str],
        attrs: Vec<AttributeProto>,
        out: &str,
    ) -> String {
        match out {
            "" => self.node(op, inputs, attrs),
            _ => {
                self.node_to(op, inputs, &[out], attrs);
                out.to_string()
            }
        }
    }

    /// An executor op with one new output.
    pub fn op(&mut self, op: Op, inputs: &[&str]) -> String {
        let out = self.fresh_value("value");
        self.op_to(op, inputs, &[&out]);
        out
    }

    /// An executor op with outputs `outputs`.
    pub fn op_to(&mut self, op: Op, inputs: &[&str], outputs: &[&str]) {
        let name = self.fresh_value(&op.name());
        self.steps.push(Step::Op {
            name,
            op,
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            outputs: outputs.iter().map(|s| s.to_string()).collect(),
        });
    }

    /// A constant tensor.
    pub fn constant(&mut self, t: &Tensor) -> String {
        let out = self.fresh_value("const");
        self.node_to("Constant", &[], &[&out], vec![tensor_attr("value", t)]);
        out
    }

    /// A 1-D int64 constant (axes, shapes, split sizes).
    pub fn ints(&mut self, v: &[i64]) -> String {
        self.constant(&Tensor::i64(vec![v.len()], v.to_vec()).expect("a 1-D tensor"))
    }

    /// A float32 scalar.
    pub fn float(&mut self, v: f32) -> String {
        self.constant(&Tensor::f32(vec![], vec![v]).expect("a scalar"))
    }

    /// Copies of the node's attributes `names` (those it has), for the standard node that
    /// takes the same ones.
    pub fn same_attrs(&self, names: &[&str]) -> Vec<AttributeProto> {
        self.np
            .attribute
            .iter()
            .filter(|a| names.contains(&a.name.as_str()))
            .cloned()
            .collect()
    }
}

pub use crate::zoo::builder::{
    attr_float as float_attr, attr_int as int_attr, attr_string as string_attr,
};

pub fn tensor_attr(name: &str, t: &Tensor) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: at::TENSOR,
        t: Some(encode_tensor(name, t)),
        ..Default::default()
    }
}
