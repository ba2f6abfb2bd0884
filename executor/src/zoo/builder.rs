//! A small ONNX graph builder for the zoo: adds nodes and seeded initializers, counts parameters
//! and multiply-accumulates. In `dry` mode no weight data is generated (for `list()`).

use crate::proto::{
    AttributeProto, DimValue, Dimension, GraphProto, ModelProto, NodeProto, OperatorSetIdProto,
    TensorProto, TensorShapeProto, TypeProto, TypeProtoTensor, ValueInfoProto,
    attribute_type as at,
};
use crate::tensor::DType;

/// SplitMix64 with Box–Muller normals: small, deterministic and good enough for weights.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    pub fn normal(&mut self) -> f32 {
        let u1 = ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        let u2 = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
    }
}

pub struct Builder {
    pub rng: Rng,
    pub dry: bool,
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
    counter: usize,
    pub params: u64,
    pub macs: u64,
}

pub fn attr_int(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: at::INT,
        i: v,
        ..Default::default()
    }
}
pub fn attr_ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: at::INTS,
        ints: v.to_vec(),
        ..Default::default()
    }
}
pub fn attr_string(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: at::STRING,
        s: v.as_bytes().to_vec(),
        ..Default::default()
    }
}
pub fn attr_float(name: &str, v: f32) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: at::FLOAT,
        f: v,
        ..Default::default()
    }
}

impl Builder {
    pub fn new(seed: u64, dry: bool) -> Builder {
        Builder {
            rng: Rng::new(seed),
            dry,
            nodes: vec![],
            inits: vec![],
            counter: 0,
            params: 0,
            macs: 0,
        }
    }

    pub fn fresh(&mut self, hint: &str) -> String {
        self.counter += 1;
        format!("{hint}_{}", self.counter)
    }

    /// Adds a node and returns its (first) output name.
    pub fn node(&mut self, op: &str, inputs: &[&str], attrs: Vec<AttributeProto>) -> String {
        self.node_outputs(op, inputs, attrs, 1).remove(0)
    }

    /// A node with `n` outputs (Split, TopK); returns their names.
    pub fn node_outputs(
        &mut self,
        op: &str,
        inputs: &[&str],
        attrs: Vec<AttributeProto>,
        n: usize,
    ) -> Vec<String> {
        let outs: Vec<String> = (0..n).map(|_| self.fresh(&op.to_lowercase())).collect();
        self.nodes.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outs.clone(),
            name: outs[0].clone(),
            op_type: op.into(),
            attribute: attrs,
            ..Default::default()
        });
        outs
    }

    /// Adds an f32 initializer filled by `f` (not called in dry mode); counts it as parameters.
    pub fn weight(
        &mut self,
        hint: &str,
        shape: &[usize],
        mut f: impl FnMut(&mut Rng) -> f32,
    ) -> String {
        let name = self.fresh(hint);
        let n: usize = shape.iter().product();
        self.params += n as u64;
        let raw = if self.dry {
            vec![]
        } else {
            let mut raw = Vec::with_capacity(n * 4);
            for _ in 0..n {
                raw.extend(f(&mut self.rng).to_le_bytes());
            }
            raw
        };
        self.inits.push(TensorProto {
            dims: shape.iter().map(|&d| d as i64).collect(),
            data_type: DType::F32.onnx(),
            name: name.clone(),
            raw_data: raw.into(),
            ..Default::default()
        });
        name
    }

    /// A normal(0, std) weight.
    pub fn normal(&mut self, hint: &str, shape: &[usize], std: f32) -> String {
        self.weight(hint, shape, |r| r.normal() * std)
    }

    /// A constant that is not a parameter (shapes, scalars).
    pub fn const_i64(&mut self, hint: &str, v: &[i64]) -> String {
        let name = self.fresh(hint);
        self.inits.push(TensorProto {
            dims: vec![v.len() as i64],
            data_type: DType::I64.onnx(),
            name: name.clone(),
            int64_data: v.to_vec(),
            ..Default::default()
        });
        name
    }
    pub fn const_f32(&mut self, hint: &str, v: f32) -> String {
        let name = self.fresh(hint);
        self.inits.push(TensorProto {
            dims: vec![],
            data_type: DType::F32.onnx(),
            name: name.clone(),
            float_data: vec![v],
            ..Default::default()
        });
        name
    }

    /// Renames the output of the node that produced `old` (to give graph outputs fixed names).
    pub fn node_rename_last(&mut self, old: &str, new: &str) {
        for n in self.nodes.iter_mut().rev() {
            if let Some(o) = n.output.iter_mut().find(|o| *o == old) {
                *o = new.to_string();
                return;
            }
        }
    }

    pub fn finish(
        self,
        name: &str,
        opset: i64,
        inputs: Vec<ValueInfoProto>,
        outputs: Vec<ValueInfoProto>,
    ) -> ModelProto {
        ModelProto {
            ir_version: 8,
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: opset,
            }],
            producer_name: "cotenant-zoo".into(),
            graph: Some(GraphProto {
                node: self.nodes,
                name: name.into(),
                initializer: self.inits,
                input: inputs,
                output: outputs,
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

/// A tensor value declaration; `None` dims are the symbolic `batch`.
pub fn value_info(name: &str, dtype: DType, dims: &[Option<usize>]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d {
                Some(v) => DimValue::DimValue(*v as i64),
                None => DimValue::DimParam("batch".into()),
            }),
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type: dtype.onnx(),
                shape: Some(TensorShapeProto { dim }),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}
