//! ONNX import: protobuf bytes → [`Graph`]. Decodes initializers (typed fields, raw data,
//! external data files next to the model), checks the graph is consistent and parses every node
//! into a typed [`Op`], naming node, op and opset in every error. The bodies of If, Loop and
//! Scan are imported the same way, under the names of the graphs enclosing them (`subgraph`).

use crate::error::ImportError;
use crate::graph::{Dim, Graph, GraphInput, Node};
use crate::ops::{Op, attrs::Attrs};
use crate::proto::{DimValue, GraphProto, ModelProto, NodeProto};
use crate::tensor::{DType, MAX_ELEMENTS, Tensor};
use crate::tensor_proto::decode_tensor;
use prost::Message;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

mod attention;
mod buffer;
mod contrib;
mod expansion;
mod fused;
mod nbits;
mod order;
mod qlinear;
mod subgraph;

use buffer::ModelBuffer;
pub use contrib::{DOMAIN as ONNXRUNTIME_DOMAIN, SUPPORTED as ONNXRUNTIME_OPS};

/// Reads and imports a model file; external data is looked up next to it.
pub fn load(path: impl AsRef<Path>) -> Result<Graph, ImportError> {
    let path = path.as_ref();
    let buffer = std::fs::File::open(path)
        .and_then(ModelBuffer::read)
        .map_err(|source| ImportError::Io {
            path: path.display().to_string(),
            source,
        })?;
    // Decoding from `Bytes` lets every raw_data field point into this one buffer, whose pages
    // go back to the system as the initializers are decoded.
    let model = ModelProto::decode(buffer.bytes())?;
    import_graph(&model, path.parent(), Some(&buffer))
}

/// Imports a model from bytes; `base_dir` is where external data files live (none: refuse them).
pub fn import(bytes: &[u8], base_dir: Option<&Path>) -> Result<Graph, ImportError> {
    let model = ModelProto::decode(bytes)?;
    import_model(&model, base_dir)
}

pub fn import_model(model: &ModelProto, base_dir: Option<&Path>) -> Result<Graph, ImportError> {
    import_graph(model, base_dir, None)
}

/// `import_model`; with `buffer`, the buffer `model` was decoded from, whose pages holding the
/// main graph's initializers are released as each is decoded (`model` must not be read again).
fn import_graph(
    model: &ModelProto,
    base_dir: Option<&Path>,
    buffer: Option<&ModelBuffer>,
) -> Result<Graph, ImportError> {
    let opset = model
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map_or(1, |o| o.version);
    if !(1..=27).contains(&opset) {
        return Err(ImportError::Opset { opset });
    }
    let gp = model.graph.as_ref().ok_or(ImportError::NoGraph)?;
    let mut g = Graph {
        opset,
        ..Default::default()
    };
    let cx = Context {
        opset,
        base_dir,
        depth: 0,
        buffer,
    };
    let mut scope = Scope::new(&[]);
    initializers(gp, &mut g, &mut scope, &cx)?;
    for vi in &gp.input {
        // Older exporters list initializers among the inputs too; those stay constants.
        if scope.ids.contains_key(&vi.name) {
            continue;
        }
        let tt = vi.r#type.as_ref().and_then(|t| t.tensor_type.as_ref());
        let code = tt.map_or(0, |t| t.elem_type);
        let dtype = DType::from_onnx(code).ok_or_else(|| {
            ImportError::Graph(format!(
                "input {:?} has unsupported element type {code}",
                vi.name
            ))
        })?;
        let dims = match tt.and_then(|t| t.shape.as_ref()) {
            Some(s) => Some(declared_dims(&vi.name, &s.dim)?),
            None => None,
        };
        let v = g.add_value(&vi.name);
        scope.ids.insert(vi.name.clone(), v);
        g.inputs.push(GraphInput {
            value: v,
            name: vi.name.clone(),
            dtype,
            dims,
        });
    }
    name_unknown_axes(&mut g.inputs);
    import_nodes(gp, &mut g, &mut scope, &cx)?;
    for vi in &gp.output {
        let v = scope.ids.get(&vi.name).ok_or_else(|| {
            ImportError::Graph(format!("graph output {:?} is never produced", vi.name))
        })?;
        g.outputs.push(*v);
        let code = vi.r#type.as_ref().and_then(|t| t.tensor_type.as_ref());
        g.output_dtypes
            .push(code.and_then(|t| DType::from_onnx(t.elem_type)));
    }
    if g.outputs.is_empty() {
        return Err(ImportError::Graph("graph has no outputs".into()));
    }
    Ok(g)
}

/// What every graph of one model, the main graph and the subgraphs in it, is imported under.
pub(crate) struct Context<'a> {
    pub opset: i64,
    pub base_dir: Option<&'a Path>,
    /// How many subgraphs enclose the graph being imported (0: the main graph).
    pub depth: usize,
    /// The buffer the model was decoded from, where its initializers' pages can be released.
    pub buffer: Option<&'a ModelBuffer>,
}

/// The names one graph can read while it is imported: its own values, and those of the graphs
/// enclosing it (a subgraph reads an outer value by name; see `subgraph`).
pub(crate) struct Scope<'o> {
    pub ids: HashMap<String, usize>,
    /// The enclosing graphs, outermost first; empty for the main graph.
    outer: &'o [Outer<'o>],
    /// The outer names this graph reads, in the order first read, each with the value of this
    /// graph that stands for it. Outer constants are not among them: they become constants of
    /// this graph (the same tensors), so that its passes fold and pack them as the main graph's.
    pub implicit: Vec<(String, usize)>,
}

/// One enclosing graph, as a subgraph sees it: its names and its constants.
#[derive(Clone, Copy)]
pub(crate) struct Outer<'o> {
    ids: &'o HashMap<String, usize>,
    constants: &'o HashMap<usize, Arc<Tensor>>,
}

impl<'o> Scope<'o> {
    pub fn new(outer: &'o [Outer<'o>]) -> Scope<'o> {
        Scope {
            ids: HashMap::new(),
            outer,
            implicit: Vec::new(),
        }
    }

    /// The value `name` is in this graph: its own, an outer constant's tensor, or a new value
    /// standing for an outer one (the innermost graph's where several define it).
    pub fn resolve(&mut self, g: &mut Graph, name: &str) -> Option<usize> {
        if let Some(&v) = self.ids.get(name) {
            return Some(v);
        }
        let level = self.outer.iter().rev().find(|l| l.ids.contains_key(name))?;
        let v = g.add_value(name);
        self.ids.insert(name.to_string(), v);
        match level.constants.get(&level.ids[name]) {
            Some(t) => {
                g.constants.insert(v, t.clone());
            }
            None => self.implicit.push((name.to_string(), v)),
        }
        Some(v)
    }

    /// Every graph visible here, for a subgraph of a node of this graph (whose constants are
    /// `constants`).
    pub fn chain<'a>(&'a self, constants: &'a HashMap<usize, Arc<Tensor>>) -> Vec<Outer<'a>> {
        let mut c = self.outer.to_vec();
        c.push(Outer {
            ids: &self.ids,
            constants,
        });
        c
    }
}

pub(crate) fn initializers(
    gp: &GraphProto,
    g: &mut Graph,
    scope: &mut Scope<'_>,
    cx: &Context<'_>,
) -> Result<(), ImportError> {
    for t in &gp.initializer {
        let v = g.add_value(&t.name);
        if scope.ids.insert(t.name.clone(), v).is_some() {
            return Err(ImportError::Graph(format!(
                "initializer {:?} defined twice",
                t.name
            )));
        }
        g.constants
            .insert(v, Arc::new(decode_tensor(t, cx.base_dir)?));
        // The main graph's initializers are decoded once, here: their raw bytes are done with.
        if let (Some(buffer), 0) = (cx.buffer, cx.depth) {
            buffer.release(&t.raw_data);
        }
    }
    Ok(())
}

/// Parses the nodes of `gp` into `g` in topological order (`order`), each reading only values
/// defined before it.
pub(crate) fn import_nodes(
    gp: &GraphProto,
    g: &mut Graph,
    scope: &mut Scope<'_>,
    cx: &Context<'_>,
) -> Result<(), ImportError> {
    for idx in order::topological(gp) {
        let np = &gp.node[idx];
        let node_name = if np.name.is_empty() {
            format!("{}_{idx}", np.op_type)
        } else {
            np.name.clone()
        };
        let default_domain = np.domain.is_empty() || np.domain == "ai.onnx";
        let ort = np.domain == contrib::DOMAIN
            || (default_domain && contrib::IN_DEFAULT_DOMAIN.contains(&np.op_type.as_str()));
        let constant = |name: &str| {
            scope
                .ids
                .get(name)
                .and_then(|v| g.constants.get(v))
                .cloned()
        };
        let expanded = ort
            .then(|| contrib::expand(np, &node_name, &constant))
            .flatten();
        match expanded {
            Some(Ok(steps)) => {
                for step in steps {
                    import_step(step, g, scope, cx)?;
                }
            }
            Some(Err(reason)) => {
                return Err(ImportError::BadNode {
                    node: node_name,
                    op: match default_domain {
                        true => np.op_type.clone(),
                        false => format!("{}.{}", np.domain, np.op_type),
                    },
                    opset: cx.opset,
                    reason,
                });
            }
            None => import_node(np, node_name, cx.opset, g, scope, cx)?,
        }
    }
    Ok(())
}

/// One step of an expansion: a standard node, or an executor op on named values.
fn import_step(
    step: expansion::Step,
    g: &mut Graph,
    scope: &mut Scope<'_>,
    cx: &Context<'_>,
) -> Result<(), ImportError> {
    let (name, op, inputs, outputs) = match step {
        expansion::Step::Node { node, opset } => {
            let name = node.name.clone();
            return import_node(&node, name, opset, g, scope, cx);
        }
        expansion::Step::Constant { name, tensor } => {
            let v = g.add_value(&name);
            if scope.ids.insert(name.clone(), v).is_some() {
                return Err(ImportError::Graph(format!("{name} is defined twice")));
            }
            g.constants.insert(v, tensor);
            return Ok(());
        }
        expansion::Step::Op {
            name,
            op,
            inputs,
            outputs,
        } => (name, op, inputs, outputs),
    };
    let mut ins = Vec::with_capacity(inputs.len());
    for input in &inputs {
        ins.push(match input.as_str() {
            "" => None,
            n => Some(scope.resolve(g, n).ok_or_else(|| {
                ImportError::Graph(format!("{name}: input {n:?} is not defined before it"))
            })?),
        });
    }
    let mut outs = Vec::with_capacity(outputs.len());
    for o in outputs {
        let v = g.add_value(&o);
        if scope.ids.insert(o.clone(), v).is_some() {
            return Err(ImportError::Graph(format!(
                "{name}: output {o:?} is defined twice"
            )));
        }
        outs.push(v);
    }
    g.nodes.push(Node {
        name,
        op,
        inputs: ins,
        outputs: outs,
    });
    Ok(())
}

/// Parses node `np` into `g`, its operator read at `opset`.
fn import_node(
    np: &NodeProto,
    node_name: String,
    opset: i64,
    g: &mut Graph,
    scope: &mut Scope<'_>,
    cx: &Context<'_>,
) -> Result<(), ImportError> {
    let default_domain = np.domain.is_empty() || np.domain == "ai.onnx";
    let foreign = || ImportError::UnsupportedDomainOp {
        node: node_name.clone(),
        op: np.op_type.clone(),
        domain: np.domain.clone(),
        known: match np.domain == contrib::DOMAIN {
            true => format!(" (of that domain, only {})", contrib::SUPPORTED.join(", ")),
            false => String::new(),
        },
    };
    if !default_domain && np.domain != contrib::DOMAIN {
        return Err(foreign());
    }
    let bad = |reason: String| ImportError::BadNode {
        node: node_name.clone(),
        op: np.op_type.clone(),
        opset,
        reason,
    };
    let mut inputs = Vec::with_capacity(np.input.len());
    for name in &np.input {
        if name.is_empty() {
            inputs.push(None);
        } else {
            let v = scope
                .resolve(g, name)
                .ok_or_else(|| bad(format!("input {name:?} is not defined before this node")))?;
            inputs.push(Some(v));
        }
    }
    let attrs = Attrs {
        list: &np.attribute,
    };
    if np.op_type == "Constant" {
        let t = crate::ops::constant_attr(&attrs).map_err(bad)?;
        let out = np
            .output
            .first()
            .ok_or_else(|| bad("Constant has no output".into()))?;
        let v = g.add_value(out);
        if scope.ids.insert(out.clone(), v).is_some() {
            return Err(bad(format!("output {out:?} is defined twice")));
        }
        g.constants.insert(v, Arc::new(t));
        return Ok(());
    }
    // An operator of onnxruntime's domain reads as the standard one it stands for.
    let mut op_type = np.op_type.as_str();
    let mut quantized_r = None;
    if !default_domain {
        match contrib::standard(op_type, g, &inputs) {
            Some(Ok(standard)) => {
                (op_type, inputs) = (standard.op, standard.inputs);
                quantized_r = standard.quantized_r;
            }
            Some(Err(reason)) => return Err(bad(reason)),
            None => return Err(foreign()),
        }
    }
    let control = match default_domain {
        true => subgraph::control(np, &attrs, scope, &g.constants, cx, inputs.len()),
        false => None,
    };
    let parsed = match control {
        Some(parsed) => {
            let (op, implicit) = parsed.map_err(&bad)?;
            // The outer values the bodies read are inputs of this node, so that the plan
            // orders it after them and keeps them alive until it has run.
            for name in implicit {
                let v = scope.resolve(g, &name).ok_or_else(|| {
                    bad(format!(
                        "a body reads {name:?}, which is not defined before this node"
                    ))
                })?;
                inputs.push(Some(v));
            }
            Ok(Some(op))
        }
        None => Op::parse(op_type, &attrs, opset, inputs.len(), np.output.len()),
    };
    let mut op = match parsed {
        Ok(Some(op)) => op,
        Ok(None) => {
            return Err(ImportError::UnsupportedOp {
                node: node_name,
                op: np.op_type.clone(),
                opset,
            });
        }
        Err(reason) => return Err(bad(reason)),
    };
    if let (Some(q), Op::Rnn(r)) = (quantized_r, &mut op) {
        r.quantized_r = Some(q);
    }
    let mut outputs = Vec::with_capacity(np.output.len());
    for out in &np.output {
        // An omitted optional output still gets a value so output positions stay stable.
        let v = g.add_value(out);
        if !out.is_empty() && scope.ids.insert(out.clone(), v).is_some() {
            return Err(bad(format!("output {out:?} is defined twice")));
        }
        outputs.push(v);
    }
    g.nodes.push(Node {
        name: node_name,
        op,
        inputs,
        outputs,
    });
    Ok(())
}

/// The declared dimensions of input `name`: an unknown axis (`?`, an empty name,
/// `dim_value: -1`, no value) is an empty symbol until [`name_unknown_axes`] names it. A
/// concrete dimension must be one a tensor can have; the only negative one accepted is -1.
fn declared_dims(name: &str, dims: &[crate::proto::Dimension]) -> Result<Vec<Dim>, ImportError> {
    let mut fixed = 1usize;
    let mut out = Vec::with_capacity(dims.len());
    for (axis, d) in dims.iter().enumerate() {
        let bad = |what: String| ImportError::Graph(format!("input {name:?}, axis {axis}: {what}"));
        out.push(match &d.value {
            Some(DimValue::DimValue(-1)) => Dim::Symbol(String::new()),
            Some(DimValue::DimValue(v)) if *v < 0 => {
                return Err(bad(format!(
                    "dimension {v} (the only negative dimension is -1, unknown)"
                )));
            }
            Some(DimValue::DimValue(v)) => {
                let v = usize::try_from(*v).unwrap_or(usize::MAX);
                fixed = fixed.saturating_mul(v.max(1));
                if fixed > MAX_ELEMENTS {
                    return Err(bad(format!(
                        "dimension {v} makes the input larger than any tensor may be \
                         ({MAX_ELEMENTS} elements)"
                    )));
                }
                Dim::Fixed(v)
            }
            Some(DimValue::DimParam(p)) if p != "?" => Dim::Symbol(p.clone()),
            _ => Dim::Symbol(String::new()),
        });
    }
    Ok(out)
}

/// Gives the graph inputs their symbolic dimensions. As in onnxruntime, only concrete dimensions
/// constrain what an input may be: an unknown axis (`?`, empty, -1, no value) and a name that one
/// input gives to several of its axes (H and W both `height`, say) name nothing, and each such
/// axis gets a symbol of its own, `input?axis`. A name shared by axes of different inputs (the
/// batch of `input_ids` and `attention_mask`) stays one symbol: the planner folds shapes and
/// splits batches on that equality, and the plan checks it at run time.
fn name_unknown_axes(inputs: &mut [GraphInput]) {
    let mut repeated: HashSet<String> = HashSet::new();
    let mut names: HashSet<String> = HashSet::new();
    for dims in inputs.iter().filter_map(|i| i.dims.as_ref()) {
        let mut seen = HashSet::new();
        for d in dims {
            if let Dim::Symbol(s) = d {
                if !seen.insert(s.as_str()) {
                    repeated.insert(s.clone());
                }
                names.insert(s.clone());
            }
        }
    }
    for input in inputs.iter_mut() {
        let name = input.name.clone();
        for (axis, d) in input.dims.iter_mut().flatten().enumerate() {
            let fresh = matches!(d, Dim::Symbol(s) if s.is_empty() || repeated.contains(s));
            if fresh {
                let mut s = format!("{name}?{axis}");
                while names.contains(&s) {
                    s.push('?');
                }
                names.insert(s.clone());
                *d = Dim::Symbol(s);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{
        GraphProto, NodeProto, OperatorSetIdProto, StringStringEntryProto, TensorProto, TypeProto,
        TypeProtoTensor, ValueInfoProto,
    };

    fn model_with(weight: TensorProto) -> ModelProto {
        let vi = |name: &str| ValueInfoProto {
            name: name.into(),
            r#type: Some(TypeProto {
                tensor_type: Some(TypeProtoTensor {
                    elem_type: 1,
                    shape: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        ModelProto {
            ir_version: 8,
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: 13,
            }],
            graph: Some(GraphProto {
                node: vec![NodeProto {
                    input: vec!["x".into(), "w".into()],
                    output: vec!["y".into()],
                    op_type: "Add".into(),
                    ..Default::default()
                }],
                initializer: vec![weight],
                input: vec![vi("x")],
                output: vec![vi("y")],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn external(location: &str, offset: usize) -> TensorProto {
        let kv = |k: &str, v: String| StringStringEntryProto {
            key: k.into(),
            value: v,
        };
        TensorProto {
            dims: vec![3],
            data_type: 1,
            name: "w".into(),
            data_location: 1,
            external_data: vec![
                kv("location", location.into()),
                kv("offset", offset.to_string()),
                kv("length", "12".into()),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn reads_external_data_next_to_the_model() {
        let dir = std::env::temp_dir().join(format!("cotenant-extdata-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut blob = vec![0u8; 4];
        for v in [1.0f32, 2.0, 3.0] {
            blob.extend(v.to_le_bytes());
        }
        std::fs::write(dir.join("weights.bin"), &blob).unwrap();
        std::fs::write(
            dir.join("m.onnx"),
            model_with(external("weights.bin", 4)).encode_to_vec(),
        )
        .unwrap();
        let g = load(dir.join("m.onnx")).unwrap();
        let w = g.constants.values().next().unwrap();
        assert_eq!(w.as_f32().unwrap(), &[1.0, 2.0, 3.0]);
        // Outside the model's folder, past the end of the file, or without a folder: errors.
        for (loc, off) in [
            ("../weights.bin", 4),
            ("/etc/passwd", 0),
            ("weights.bin", 8),
        ] {
            std::fs::write(
                dir.join("bad.onnx"),
                model_with(external(loc, off)).encode_to_vec(),
            )
            .unwrap();
            assert!(
                matches!(
                    load(dir.join("bad.onnx")),
                    Err(ImportError::BadTensor { .. })
                ),
                "{loc} at {off}"
            );
        }
        assert!(
            import(
                &model_with(external("weights.bin", 4)).encode_to_vec(),
                None
            )
            .is_err()
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
