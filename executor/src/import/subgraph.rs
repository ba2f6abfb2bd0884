//! Subgraphs: the bodies of If, Loop and Scan, each imported into a plan of its own that the
//! node runs (`ops::control`). A body may read values of the graphs enclosing it by name. An
//! outer constant becomes a constant of the body (the same tensor), which its passes fold and
//! pack; any other such name becomes an input of the body after its declared ones, and an input
//! of the node after its own (`import_nodes` appends them), so that the outer plan orders the
//! node after those values and keeps them alive until it has run.

use super::{Context, Outer, Scope, import_nodes, initializers};
use crate::error::ImportError;
use crate::graph::{Graph, GraphInput};
use crate::ops::Op;
use crate::ops::attrs::Attrs;
use crate::ops::control::{Body, ControlOp, ScanAttrs, Subgraph};
use crate::proto::{GraphProto, NodeProto};
use crate::tensor::{DType, Tensor};
use std::collections::HashMap;
use std::sync::Arc;

/// Most subgraphs that may enclose one another (a Loop in an If in a Loop ...).
pub const MAX_DEPTH: usize = 16;

/// Parses If, Loop and Scan (`None` for any other operator): the op, and the outer names its
/// bodies read, which the node must read as inputs after its own.
pub(crate) fn control(
    np: &NodeProto,
    a: &Attrs,
    scope: &Scope<'_>,
    constants: &HashMap<usize, Arc<Tensor>>,
    cx: &Context<'_>,
    n_inputs: usize,
) -> Option<Result<(Op, Vec<String>), String>> {
    if !matches!(np.op_type.as_str(), "If" | "Loop" | "Scan") {
        return None;
    }
    let outer = scope.chain(constants);
    Some(parse(np, a, &outer, cx, n_inputs))
}

fn parse(
    np: &NodeProto,
    a: &Attrs,
    outer: &[Outer<'_>],
    cx: &Context<'_>,
    n_inputs: usize,
) -> Result<(Op, Vec<String>), String> {
    if cx.depth >= MAX_DEPTH {
        return Err(format!(
            "subgraphs nest more than {MAX_DEPTH} deep, the most the executor imports"
        ));
    }
    let n_out = np.output.len();
    // The outer names every body of this node reads, each once: node inputs `n_inputs..`.
    let mut implicit: Vec<String> = Vec::new();
    let mut position: HashMap<String, usize> = HashMap::new();
    let mut body = |attr: &str, formal: usize, outputs: usize| -> Result<Subgraph, String> {
        let gp = a
            .graph(attr)?
            .ok_or_else(|| format!("the graph attribute {attr:?} is missing"))?;
        let invariant = match np.op_type.as_str() {
            "Loop" => invariant_carried(np, gp, outer),
            _ => Vec::new(),
        };
        let Imported {
            graph: g,
            outer: names,
            output_dtypes: dtypes,
        } = import_body(gp, outer, &invariant, cx).map_err(|e| format!("{attr}: {e}"))?;
        let declared = g.inputs.len() - names.len();
        if declared != formal {
            return Err(format!(
                "{attr} declares {declared} inputs where this node gives it {formal}"
            ));
        }
        if g.outputs.len() != outputs {
            return Err(format!(
                "{attr} has {} outputs where this node needs {outputs}",
                g.outputs.len()
            ));
        }
        let feeds = names
            .into_iter()
            .map(|n| {
                let k = *position.entry(n.clone()).or_insert_with(|| {
                    implicit.push(n);
                    implicit.len() - 1
                });
                n_inputs + k
            })
            .collect();
        let plan = crate::plan::Model::from_graph(g)
            .map_err(|e| format!("{attr}: {e}"))?
            .plan;
        Ok(Subgraph(Arc::new(Body::new(plan, formal, feeds, dtypes))))
    };
    let op = match np.op_type.as_str() {
        "If" => {
            if n_inputs != 1 {
                return Err(format!(
                    "If reads one input (the condition), not {n_inputs}"
                ));
            }
            let then_branch = body("then_branch", 0, n_out)?;
            let else_branch = body("else_branch", 0, n_out)?;
            ControlOp::If {
                then_branch,
                else_branch,
            }
        }
        "Loop" => {
            if n_inputs < 2 {
                return Err("Loop reads a trip count and a condition (either may be empty)".into());
            }
            let carried = n_inputs - 2;
            if n_out < carried {
                return Err(format!(
                    "Loop carries {carried} values but has only {n_out} outputs"
                ));
            }
            ControlOp::Loop {
                body: body("body", 2 + carried, 1 + n_out)?,
            }
        }
        _ => {
            let attrs = scan_attrs(a, cx.opset, n_inputs, n_out)?;
            let formal = attrs.states + attrs.scans;
            ControlOp::Scan {
                body: body("body", formal, n_out)?,
                attrs,
            }
        }
    };
    Ok((Op::Control(op), implicit))
}

fn scan_attrs(a: &Attrs, opset: i64, n_inputs: usize, n_out: usize) -> Result<ScanAttrs, String> {
    let batched = opset < 9;
    let scans = a
        .int("num_scan_inputs")?
        .ok_or("Scan needs the attribute \"num_scan_inputs\"")?;
    let given = n_inputs - usize::from(batched && n_inputs > 0);
    let scans = usize::try_from(scans)
        .ok()
        .filter(|&m| (1..=given).contains(&m))
        .ok_or_else(|| {
            format!("num_scan_inputs is {scans}, not within 1..={given} (the inputs given)")
        })?;
    let states = given - scans;
    if n_out < states {
        return Err(format!(
            "Scan carries {states} states but has only {n_out} outputs"
        ));
    }
    let outs = n_out - states;
    let list = |name: &str, len: usize| -> Result<Vec<i64>, String> {
        match a.ints(name)? {
            None => Ok(vec![0; len]),
            Some(v) if v.len() == len => Ok(v),
            Some(v) => Err(format!("{name} has {} entries, not {len}", v.len())),
        }
    };
    let flags = |name: &str, len: usize| -> Result<Vec<bool>, String> {
        list(name, len)?
            .into_iter()
            .map(|d| match d {
                0 => Ok(false),
                1 => Ok(true),
                d => Err(format!("{name} holds {d}; a direction is 0 or 1")),
            })
            .collect()
    };
    let input_reverse = if batched {
        flags("directions", scans)?
    } else {
        flags("scan_input_directions", scans)?
    };
    let (input_axes, output_axes) = if batched {
        (vec![0; scans], vec![0; outs])
    } else {
        (
            list("scan_input_axes", scans)?,
            list("scan_output_axes", outs)?,
        )
    };
    let output_reverse = if batched {
        vec![false; outs]
    } else {
        flags("scan_output_directions", outs)?
    };
    Ok(ScanAttrs {
        states,
        scans,
        input_axes,
        input_reverse,
        output_axes,
        output_reverse,
        batched,
    })
}

/// One imported body.
struct Imported {
    /// Its inputs: the declared ones, then one per outer name it reads.
    graph: Graph,
    /// The outer names it reads.
    outer: Vec<String>,
    /// The element types its outputs declare.
    output_dtypes: Vec<Option<DType>>,
}

/// Imports one body under the graphs `outer`.
/// For each input of a Loop body, the constant it holds on every iteration, where it has one:
/// a carried value the body passes straight to its output, whose initial value is an outer
/// constant. paddle2onnx carries a decoder's weights through its Loop so; read as constants,
/// they fold and pack like any other weights.
fn invariant_carried(
    np: &NodeProto,
    gp: &GraphProto,
    outer: &[Outer<'_>],
) -> Vec<Option<Arc<Tensor>>> {
    (0..gp.input.len())
        .map(|k| {
            // Body inputs: the iteration, the condition, then the carried values, which the
            // body outputs after its condition and the node reads after its first two inputs.
            let passed = k >= 2 && gp.output.get(k - 1)?.name == gp.input[k].name;
            let initial = np.input.get(k).filter(|_| passed)?.as_str();
            let level = outer.iter().rev().find(|l| l.ids.contains_key(initial))?;
            level.constants.get(&level.ids[initial]).cloned()
        })
        .collect()
}

/// Imports a body; its inputs with a constant in `invariant` (by position) read that constant.
fn import_body(
    gp: &GraphProto,
    outer: &[Outer<'_>],
    invariant: &[Option<Arc<Tensor>>],
    cx: &Context<'_>,
) -> Result<Imported, ImportError> {
    let mut scope = Scope::new(outer);
    let cx = Context {
        opset: cx.opset,
        base_dir: cx.base_dir,
        depth: cx.depth + 1,
        buffer: None,
    };
    let mut g = Graph {
        opset: cx.opset,
        ..Default::default()
    };
    initializers(gp, &mut g, &mut scope, &cx)?;
    let elem = |vi: &crate::proto::ValueInfoProto| {
        vi.r#type
            .as_ref()
            .and_then(|t| t.tensor_type.as_ref())
            .map(|t| t.elem_type)
            .filter(|&c| c != 0)
    };
    let mut passed = HashMap::new();
    for (k, vi) in gp.input.iter().enumerate() {
        // Bodies often leave their inputs' types to inference; nothing checks them at run time.
        let dtype = match elem(vi) {
            None => DType::F32,
            Some(code) => DType::from_onnx(code).ok_or_else(|| {
                ImportError::Graph(format!(
                    "body input {:?} has unsupported element type {code}",
                    vi.name
                ))
            })?,
        };
        let v = g.add_value(&vi.name);
        // An invariant input stays a formal input, which the body passes on as its output
        // (a reference, where a constant output would be copied every iteration); to the
        // body's nodes its name means the constant.
        let named = match invariant.get(k).cloned().flatten() {
            Some(t) => {
                let c = g.add_value(&vi.name);
                g.constants.insert(c, t);
                passed.insert(vi.name.as_str(), v);
                c
            }
            None => v,
        };
        if scope.ids.insert(vi.name.clone(), named).is_some() {
            return Err(ImportError::Graph(format!(
                "body input {:?} is defined twice",
                vi.name
            )));
        }
        g.inputs.push(GraphInput {
            value: v,
            name: vi.name.clone(),
            dtype,
            dims: None,
        });
    }
    import_nodes(gp, &mut g, &mut scope, &cx)?;
    let mut dtypes = Vec::with_capacity(gp.output.len());
    for vi in &gp.output {
        let v = match passed.get(vi.name.as_str()) {
            Some(&v) => v,
            None => scope.resolve(&mut g, &vi.name).ok_or_else(|| {
                ImportError::Graph(format!("body output {:?} is never produced", vi.name))
            })?,
        };
        g.outputs.push(v);
        dtypes.push(elem(vi).and_then(DType::from_onnx));
    }
    let mut names = Vec::with_capacity(scope.implicit.len());
    for (name, v) in scope.implicit {
        g.inputs.push(GraphInput {
            value: v,
            name: name.clone(),
            dtype: DType::F32,
            dims: None,
        });
        names.push(name);
    }
    Ok(Imported {
        graph: g,
        outer: names,
        output_dtypes: dtypes,
    })
}
