//! Structural fuzzing of the importer, the passes and planning: zoo models with mutated
//! attributes, dimensions, element types, initializers, wiring and opsets, and one-node graphs
//! of every supported operator with hostile attributes and inputs, and If, Loop and Scan nodes
//! with fuzzed bodies. Each must import, plan and
//! run under a memory budget — on the CPU and on the simulated GPU (lowering, memory plan,
//! kernels) — or fail with an error; none may panic or allocate past the budget.
//! Crashes this found are kept as named regression tests in `hostile_models.rs`.

mod common;

use common::proto::{float_attr, int_attr, ints_attr, string_attr, value_info};
use cotenant_executor::device::Gpu;
use cotenant_executor::import::{ONNXRUNTIME_DOMAIN, ONNXRUNTIME_OPS};
use cotenant_executor::memory::MemoryBudget;
use cotenant_executor::ops::SUPPORTED_OPS;
use cotenant_executor::proto::{
    AttributeProto, DimValue, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    ValueInfoProto,
};
use cotenant_executor::zoo::{self, BertOptions, ZooOptions};
use cotenant_executor::{CpuBackend, Device, Model};
use proptest::prelude::*;
use prost::Message;
use std::sync::{Arc, OnceLock};

/// What every run may hold: far below what a bomb asks for, far above what these models need.
const BUDGET: usize = 64 << 20;

/// Integers that find the edges: zero, signs, powers of two past `u32` and `i64`, and the
/// small values shapes are made of.
const EDGES: &[i64] = &[
    0,
    1,
    -1,
    2,
    -2,
    3,
    4,
    7,
    64,
    1 << 20,
    1 << 31,
    1 << 40,
    i64::MAX,
    i64::MIN,
    i64::MAX / 2,
];

/// ONNX element types, supported and not (17 to 26: float8, float4, int4, int2).
const DTYPES: &[i32] = &[
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 99,
];

/// The element types of small quantized operands: uint8 and int8 (the most), float8 e4m3fn and
/// e5m2, uint4, int4, float4 e2m1, float8 e8m0, uint2 and int2.
const QUANTIZED: &[i32] = &[2, 3, 2, 3, 17, 19, 21, 22, 23, 24, 25, 26];

const OPSETS: &[i64] = &[1, 5, 6, 7, 9, 10, 11, 12, 13, 17, 18, 21, 27];

/// Imports, plans (under the budget) and runs at batch 1 and 2; any step may fail, none panic.
fn import_plan_run(bytes: &[u8]) {
    let Ok(mut m) = Model::from_bytes(bytes) else {
        return;
    };
    m.plan
        .set_memory_budget(Arc::new(MemoryBudget::new(BUDGET)));
    let _ = m.plan.peak_activation_bytes(8);
    let backend = CpuBackend::new(1);
    let _ = m.plan.run(&backend, m.plan.example_inputs(1));
    let _ = m.plan.run(&backend, m.plan.example_inputs(2));
    // The GPU path, on one simulated device shared by every case.
    static GPU: OnceLock<Device> = OnceLock::new();
    let gpu = GPU.get_or_init(|| Device::Gpu(Gpu::simulated(BUDGET as u64)));
    let m = Arc::new(m);
    if let Ok(mut engine) = gpu.place("fuzz", &m).and_then(|p| p.engine(1, None)) {
        let _ = engine.run(m.plan.example_inputs(1));
    }
}

/// The zoo models the mutations start from, small enough to run hundreds of times: CNN images
/// of 64x64 instead of 224x224, and a two-layer BERT.
fn seeds() -> &'static [ModelProto] {
    static SEEDS: OnceLock<Vec<ModelProto>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let o = ZooOptions {
            seed: 2,
            bert: BertOptions {
                layers: 2,
                hidden: 16,
                heads: 2,
                seq: 8,
                vocab: 20,
            },
        };
        ["squeezenet", "mobilenet_v2", "resnet18", "bert"]
            .into_iter()
            .map(|name| {
                let mut m = zoo::build(name, &o).expect("zoo model");
                if name != "bert" {
                    let input = &mut m.graph.as_mut().expect("graph").input[0];
                    let shape = input
                        .r#type
                        .as_mut()
                        .and_then(|t| t.tensor_type.as_mut())
                        .and_then(|t| t.shape.as_mut())
                        .expect("input shape");
                    for d in &mut shape.dim[2..] {
                        d.value = Some(DimValue::DimValue(64));
                    }
                }
                m
            })
            .collect()
    })
}

/// One mutation: a kind and two numbers that pick what and how.
type Mutation = (u8, u64, u64);

fn edge(k: u64) -> i64 {
    EDGES[k as usize % EDGES.len()]
}

/// The names of every value defined before node `n` (initializers, inputs, earlier outputs).
fn defined_before(g: &GraphProto, n: usize) -> Vec<String> {
    let mut names: Vec<String> = g.initializer.iter().map(|t| t.name.clone()).collect();
    names.extend(g.input.iter().map(|i| i.name.clone()));
    for node in &g.node[..n] {
        names.extend(node.output.iter().cloned());
    }
    names
}

/// Attribute names the supported ops read.
const ATTRS: &[&str] = &[
    "K",
    "N",
    "bits",
    "block_size",
    "num_heads",
    "qkv_hidden_sizes",
    "unidirectional",
    "transBatchA",
    "channels_last",
    "opset",
    "axis",
    "axes",
    "perm",
    "pads",
    "kernel_shape",
    "strides",
    "dilations",
    "group",
    "to",
    "starts",
    "ends",
    "split",
    "num_outputs",
    "keepdims",
    "broadcast",
    "transA",
    "transB",
    "allowzero",
    "start",
    "end",
    "output_padding",
    "output_shape",
    "ceil_mode",
    "size",
    "noop_with_empty_axes",
    "k",
    "largest",
    "sorted",
    "select_last_index",
    "batch_dims",
    "exclusive",
    "reverse",
    "upper",
    "fmod",
    "blocksize",
    "center_point_box",
    "num_groups",
    "block_size",
    "output_dtype",
    "precision",
    "saturate",
    "round_mode",
    "stash_type",
    "is_causal",
    "q_num_heads",
    "kv_num_heads",
    "qk_matmul_output_mode",
    "softmax_precision",
    "interleaved",
    "num_heads",
    "rotary_embedding_dim",
    "is_packed_batching",
    "do_rotary",
    "local_window_size",
    "smooth_softmax",
    "ignore_index",
    "p",
    "auto_pad",
    "storage_order",
    "count_include_pad",
    "batch_axis",
    "time_axis",
    "dtype",
    "direction",
    "epsilon",
    "alpha",
    "mode",
    "reduction",
    "align_corners",
    "padding_mode",
    "hidden_size",
    "layout",
    "linear_before_reset",
    "input_forget",
    "clip",
    "activations",
    "antialias",
    "exclude_outside",
    "inverse",
    "onesided",
    "output_datatype",
    "output_height",
    "output_width",
    "sampling_ratio",
    "offset_group",
];

/// Floats that find the edges of coordinate arithmetic: signed zeros, the grid's -1 and 1,
/// halves (rounding ties), far outside, and the non-finite.
const FLOAT_EDGES: &[f32] = &[
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.5,
    -1.5,
    3.0,
    1e-30,
    1e30,
    -1e30,
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
];

/// A one-node GridSample (or AffineGrid) graph: an input `[1, 2, dims...]` sampled at a grid
/// of edge values (or a grid made from a theta of edge values for that size).
fn sampling(
    dims: &[usize],
    points: &[usize],
    values: &[usize],
    attrs: Vec<AttributeProto>,
    affine: bool,
) -> ModelProto {
    let r = dims.len();
    let pick = |i: usize| match values.len() {
        0 => 0.0,
        n => FLOAT_EDGES[values[i % n] % FLOAT_EDGES.len()],
    };
    let floats = |name: &str, shape: Vec<i64>| {
        let n: i64 = shape.iter().product();
        TensorProto {
            name: name.into(),
            dims: shape,
            data_type: 1,
            float_data: (0..n as usize).map(pick).collect(),
            ..Default::default()
        }
    };
    let mut x_dims = vec![1, 2];
    x_dims.extend(dims.iter().map(|&d| d as i64));
    let (op, inputs, initializer) = if affine {
        let size = TensorProto {
            name: "size".into(),
            dims: vec![x_dims.len() as i64],
            data_type: 7,
            int64_data: x_dims.clone(),
            ..Default::default()
        };
        let theta = floats("theta", vec![1, r as i64, r as i64 + 1]);
        ("AffineGrid", vec!["theta", "size"], vec![theta, size])
    } else {
        let mut g = vec![1];
        g.extend((0..r).map(|i| points[i % points.len()] as i64));
        g.push(r as i64);
        ("GridSample", vec!["x", "grid"], vec![floats("grid", g)])
    };
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 22,
        }],
        graph: Some(GraphProto {
            node: vec![NodeProto {
                input: inputs.into_iter().map(String::from).collect(),
                output: vec!["y".into()],
                name: "n".into(),
                op_type: op.into(),
                attribute: attrs,
                ..Default::default()
            }],
            initializer,
            input: if affine {
                vec![]
            } else {
                vec![value_info("x", 1, &x_dims)]
            },
            output: vec![value_info("y", 1, &[])],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A one-node Resize graph: an input `[1, 2, dims...]` resized by scales or sizes of edge
/// values, with a region of interest of float edges, under `attrs`.
fn resizing(
    dims: &[usize],
    by_sizes: bool,
    targets: &[u64],
    roi: &[usize],
    attrs: Vec<AttributeProto>,
) -> ModelProto {
    let mut x_dims = vec![1, 2];
    x_dims.extend(dims.iter().map(|&d| d as i64));
    let r = x_dims.len();
    let target = |i: usize| targets.get(i % targets.len().max(1)).copied().unwrap_or(0);
    let roi = TensorProto {
        name: "roi".into(),
        dims: vec![roi.len() as i64],
        data_type: 1,
        float_data: roi
            .iter()
            .map(|&v| FLOAT_EDGES[v % FLOAT_EDGES.len()])
            .collect(),
        ..Default::default()
    };
    let amount = if by_sizes {
        TensorProto {
            name: "amount".into(),
            dims: vec![r as i64],
            data_type: 7,
            int64_data: (0..r).map(|i| edge(target(i)).clamp(-1, 64)).collect(),
            ..Default::default()
        }
    } else {
        TensorProto {
            name: "amount".into(),
            dims: vec![r as i64],
            data_type: 1,
            float_data: (0..r)
                .map(|i| [1.0, 0.5, 0.3, 2.0, 3.7, 1e-6, 0.0, -1.0][target(i) as usize % 8])
                .collect(),
            ..Default::default()
        }
    };
    let inputs = if by_sizes {
        vec!["x", "roi", "", "amount"]
    } else {
        vec!["x", "roi", "amount"]
    };
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 19,
        }],
        graph: Some(GraphProto {
            node: vec![NodeProto {
                input: inputs.into_iter().map(String::from).collect(),
                output: vec!["y".into()],
                name: "n".into(),
                op_type: "Resize".into(),
                attribute: attrs,
                ..Default::default()
            }],
            initializer: vec![roi, amount],
            input: vec![value_info("x", 1, &x_dims)],
            output: vec![value_info("y", 1, &[])],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn mutate(m: &mut ModelProto, muts: &[Mutation]) {
    for &(kind, a, b) in muts {
        if kind % 13 == 9 {
            let v = OPSETS[b as usize % OPSETS.len()];
            m.opset_import = vec![OperatorSetIdProto {
                domain: String::new(),
                version: v,
            }];
            continue;
        }
        let Some(g) = m.graph.as_mut() else { return };
        let nodes = g.node.len().max(1);
        let n = a as usize % nodes;
        match kind % 13 {
            // An existing attribute's value(s) set to an edge.
            0 => {
                if let Some(node) = g.node.get_mut(n)
                    && !node.attribute.is_empty()
                {
                    let k = (b >> 8) as usize % node.attribute.len();
                    let at = &mut node.attribute[k];
                    at.i = edge(b);
                    if !at.ints.is_empty() {
                        let i = (b >> 16) as usize % at.ints.len();
                        at.ints[i] = edge(b >> 24);
                    }
                    at.f = [0.0, -1.0, f32::NAN, f32::INFINITY, 1e30][b as usize % 5];
                }
            }
            1 => {
                if let Some(node) = g.node.get_mut(n)
                    && !node.attribute.is_empty()
                {
                    let k = b as usize % node.attribute.len();
                    node.attribute.remove(k);
                }
            }
            // An initializer's dimensions: one set to an edge, or the tensor made a scalar, or
            // one more axis of 1.
            2 => {
                let t = b as usize % g.initializer.len().max(1);
                if let Some(t) = g.initializer.get_mut(t) {
                    match (b >> 8) % 3 {
                        0 if !t.dims.is_empty() => {
                            let i = (b >> 16) as usize % t.dims.len();
                            t.dims[i] = edge(b >> 24);
                        }
                        1 => t.dims.clear(),
                        _ => t.dims.insert(0, 1),
                    }
                }
            }
            3 => {
                let t = b as usize % g.initializer.len().max(1);
                if let Some(t) = g.initializer.get_mut(t) {
                    t.data_type = DTYPES[(b >> 8) as usize % DTYPES.len()];
                }
            }
            4 => {
                let t = b as usize % g.initializer.len().max(1);
                if let Some(t) = g.initializer.get_mut(t) {
                    let keep = (b >> 8) as usize;
                    t.raw_data = t.raw_data.slice(..keep % (t.raw_data.len() + 1));
                    t.float_data.truncate(keep % (t.float_data.len() + 1));
                    t.int64_data.truncate(keep % (t.int64_data.len() + 1));
                }
            }
            // An input of a node rewired to another value defined before it, or omitted.
            5 => {
                let names = defined_before(g, n.min(g.node.len()));
                if let Some(node) = g.node.get_mut(n)
                    && !node.input.is_empty()
                {
                    let i = (b >> 32) as usize % node.input.len();
                    node.input[i] = if b % 7 == 0 || names.is_empty() {
                        String::new()
                    } else {
                        names[b as usize % names.len()].clone()
                    };
                }
            }
            6 => {
                if let Some(node) = g.node.get_mut(n) {
                    match b % 3 {
                        0 => {
                            node.input.pop();
                        }
                        1 => {
                            if let Some(first) = node.input.first().cloned() {
                                node.input.push(first);
                            }
                        }
                        _ => node.input.push(String::new()),
                    }
                }
            }
            // A graph input's dimension fixed to an edge, or made symbolic.
            7 => {
                let i = b as usize % g.input.len().max(1);
                if let Some(dims) = g
                    .input
                    .get_mut(i)
                    .and_then(|v| v.r#type.as_mut())
                    .and_then(|t| t.tensor_type.as_mut())
                    .and_then(|t| t.shape.as_mut())
                    && !dims.dim.is_empty()
                {
                    let d = (b >> 8) as usize % dims.dim.len();
                    dims.dim[d].value = Some(match (b >> 16) % 4 {
                        0 => DimValue::DimParam("batch".into()),
                        1 => DimValue::DimParam(String::new()),
                        _ => DimValue::DimValue(edge(b >> 24).clamp(-1, 9)),
                    });
                }
            }
            8 => {
                let i = b as usize % g.input.len().max(1);
                if let Some(t) = g
                    .input
                    .get_mut(i)
                    .and_then(|v| v.r#type.as_mut())
                    .and_then(|t| t.tensor_type.as_mut())
                {
                    t.elem_type = DTYPES[(b >> 8) as usize % DTYPES.len()];
                }
            }
            10 => {
                if let Some(node) = g.node.get_mut(n) {
                    node.op_type = SUPPORTED_OPS[b as usize % SUPPORTED_OPS.len()].into();
                }
            }
            11 => {
                if let Some(node) = g.node.get_mut(n) {
                    let name = ATTRS[b as usize % ATTRS.len()];
                    node.attribute.retain(|a| a.name != name);
                    node.attribute.push(if (b >> 8) % 2 == 0 {
                        int_attr(name, edge(b >> 16))
                    } else {
                        let len = (b >> 16) as usize % 5;
                        ints_attr(
                            name,
                            &(0..len)
                                .map(|i| edge(b >> (20 + 4 * i)))
                                .collect::<Vec<_>>(),
                        )
                    });
                }
            }
            // An initializer replaced by a small int64 vector of edges (a shape, repeats, pads).
            _ => {
                let t = b as usize % g.initializer.len().max(1);
                if let Some(t) = g.initializer.get_mut(t) {
                    let len = (b >> 8) as usize % 5;
                    let values: Vec<i64> = (0..len).map(|i| edge(b >> (12 + 4 * i))).collect();
                    *t = TensorProto {
                        name: t.name.clone(),
                        dims: vec![values.len() as i64],
                        data_type: 7,
                        int64_data: values,
                        ..Default::default()
                    };
                }
            }
        }
    }
}

/// An int64 initializer of edge values, a small float one or a small quantized one (8-bit,
/// or 4- and 2-bit packed, sometimes with a byte too many), as operand `i` of a one-node graph.
fn operand(name: &str, b: u64) -> TensorProto {
    if b % 4 == 3 {
        let dims: Vec<i64> = (0..(b >> 4) as usize % 4)
            .map(|i| ((b >> (8 + 2 * i)) % 3) as i64 + 1)
            .collect();
        let n: i64 = dims.iter().product();
        let data_type = QUANTIZED[(b >> 2) as usize % QUANTIZED.len()];
        let per = match data_type {
            21..=23 => 2,
            25 | 26 => 4,
            _ => 1,
        };
        let bytes = (n + per - 1) / per + i64::from((b >> 40).is_multiple_of(5));
        TensorProto {
            name: name.into(),
            dims,
            data_type,
            raw_data: (0..bytes)
                .map(|i| (i * 37 + (b >> 16) as i64) as u8)
                .collect::<Vec<u8>>()
                .into(),
            ..Default::default()
        }
    } else if b.is_multiple_of(2) {
        let len = (b >> 4) as usize % 5;
        let values: Vec<i64> = (0..len).map(|i| edge(b >> (8 + 5 * i))).collect();
        TensorProto {
            name: name.into(),
            dims: if (b >> 1).is_multiple_of(3) && len == 1 {
                vec![]
            } else {
                vec![len as i64]
            },
            data_type: 7,
            int64_data: values,
            ..Default::default()
        }
    } else {
        let dims: Vec<i64> = (0..(b >> 4) as usize % 4)
            .map(|i| ((b >> (8 + 2 * i)) % 3) as i64 + 1)
            .collect();
        let n: i64 = dims.iter().product();
        TensorProto {
            name: name.into(),
            dims,
            data_type: 1,
            float_data: (0..n).map(|i| i as f32 - 1.5).collect(),
            ..Default::default()
        }
    }
}

/// The graph input of a one-node graph: rank 0 to 5, small or empty dimensions, the first one
/// often the batch; float most of the time, sometimes float8, int4 or float4.
fn graph_input(k: u64) -> ValueInfoProto {
    let rank = (k % 6) as usize;
    let dims: Vec<i64> = (0..rank)
        .map(|i| match (k >> (4 + 3 * i)) % 8 {
            0 if i == 0 => -1,
            0 | 1 => 1,
            2 => 0,
            3 => 2,
            4 => 5,
            _ => 3,
        })
        .collect();
    let elem = [1, 1, 1, 7, 9, 6, 11, 2, 3, 17, 22, 23][(k >> 40) as usize % 12];
    value_info("x", elem, &dims)
}

/// A one-node graph of `op` reading the input `x` (see `graph_input`) and `extra` constant
/// operands, with `attrs`.
fn one_node(op: &str, x: u64, extra: &[u64], attrs: Vec<AttributeProto>, opset: i64) -> ModelProto {
    one_node_of("", op, x, extra, attrs, opset)
}

/// `one_node` of an operator of `domain`.
fn one_node_of(
    domain: &str,
    op: &str,
    x: u64,
    extra: &[u64],
    attrs: Vec<AttributeProto>,
    opset: i64,
) -> ModelProto {
    let mut inputs = vec!["x".to_string()];
    let mut initializer = Vec::new();
    for (i, &b) in extra.iter().enumerate() {
        let name = format!("c{i}");
        initializer.push(operand(&name, b));
        inputs.push(name);
    }
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: opset,
        }],
        graph: Some(GraphProto {
            node: vec![NodeProto {
                input: inputs,
                output: vec!["y".into(), "y2".into()],
                name: "n".into(),
                op_type: op.into(),
                domain: domain.into(),
                attribute: attrs,
                ..Default::default()
            }],
            initializer,
            input: vec![graph_input(x)],
            output: vec![value_info("y", 1, &[])],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Attribute `ATTRS[k]`, an edge integer or a list of them as `b` says.
fn hostile_attr(k: usize, b: u64) -> AttributeProto {
    if b.is_multiple_of(2) {
        int_attr(ATTRS[k], edge(b >> 8))
    } else {
        let len = (b >> 8) as usize % 5;
        ints_attr(
            ATTRS[k],
            &(0..len)
                .map(|i| edge(b >> (12 + 5 * i)))
                .collect::<Vec<_>>(),
        )
    }
}

/// onnxruntime's attention operators, of its domain.
const ATTENTION_OPS: &[&str] = &[
    "Attention",
    "MultiHeadAttention",
    "GroupQueryAttention",
    "RotaryEmbedding",
];

/// Scan's attributes (the first an INT, the others INTS).
const CONTROL_ATTRS: &[&str] = &[
    "num_scan_inputs",
    "scan_input_axes",
    "scan_input_directions",
    "scan_output_axes",
    "scan_output_directions",
];

/// Ops a fuzzed body chains: each reads the previous value (the first reads the body's first
/// input, or the outer `x` when it has none); Add also reads the outer `x`.
const BODY_OPS: &[&str] = &["Concat", "Neg", "Add", "Identity", "ReduceSum", "Cast"];

/// A graph attribute.
fn graph_attr(name: &str, g: GraphProto) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: 5,
        g: Some(Box::new(g)),
        ..Default::default()
    }
}

/// A body of `formal` inputs chaining `ops` (see `BODY_OPS`) into `outputs` outputs, with an If
/// of the same body inside it `nest` levels deep.
fn fuzz_body(ops: &[usize], formal: usize, outputs: usize, nest: usize) -> GraphProto {
    let input: Vec<ValueInfoProto> = (0..formal)
        .map(|i| value_info(&format!("b{i}"), [7, 9, 1][i.min(2)], &[]))
        .collect();
    let mut last = if formal > 0 {
        "b0".to_string()
    } else {
        "x".to_string()
    };
    let mut node = Vec::new();
    for (k, &op) in ops.iter().enumerate() {
        let op = BODY_OPS[op % BODY_OPS.len()];
        let out = format!("v{k}");
        let (inputs, attribute) = match op {
            "Concat" => (vec![last.clone(), last.clone()], vec![int_attr("axis", 0)]),
            "Add" => (vec![last.clone(), "x".into()], vec![]),
            "Cast" => (vec![last.clone()], vec![int_attr("to", 9)]),
            _ => (vec![last.clone()], vec![]),
        };
        node.push(NodeProto {
            input: inputs,
            output: vec![out.clone()],
            name: out.clone(),
            op_type: op.into(),
            attribute,
            ..Default::default()
        });
        last = out;
    }
    if nest > 0 {
        let inner = fuzz_body(ops, 0, 1, nest - 1);
        node.push(NodeProto {
            input: vec![last.clone()],
            output: vec!["nested".into()],
            name: "nested".into(),
            op_type: "If".into(),
            attribute: vec![
                graph_attr("then_branch", inner.clone()),
                graph_attr("else_branch", inner),
            ],
            ..Default::default()
        });
        last = "nested".into();
    }
    GraphProto {
        node,
        input,
        output: (0..outputs).map(|_| value_info(&last, 1, &[])).collect(),
        ..Default::default()
    }
}

/// A one-node If, Loop or Scan over the input `x` (see `graph_input`), with a fuzzed body.
#[allow(clippy::too_many_arguments)]
fn control_flow(
    kind: usize,
    x: u64,
    ops: &[usize],
    trip: u64,
    formal: usize,
    outputs: usize,
    nest: usize,
    attrs: Vec<AttributeProto>,
) -> ModelProto {
    let body = fuzz_body(ops, formal, outputs, nest);
    let (op, inputs, mut attribute) = match kind % 3 {
        0 => (
            "If",
            vec!["c".to_string()],
            vec![
                graph_attr("then_branch", body.clone()),
                graph_attr("else_branch", body),
            ],
        ),
        1 => (
            "Loop",
            ["m", "c"]
                .iter()
                .map(|s| s.to_string())
                .chain((2..formal).map(|_| "x".into()))
                .collect(),
            vec![graph_attr("body", body)],
        ),
        _ => (
            "Scan",
            vec!["x".to_string(); formal],
            vec![graph_attr("body", body)],
        ),
    };
    attribute.extend(attrs);
    attribute.push(int_attr(
        "num_scan_inputs",
        1 + (trip % formal.max(1) as u64) as i64,
    ));
    // A Loop's body also computes the condition.
    let node_outputs = if op == "Loop" {
        outputs.saturating_sub(1)
    } else {
        outputs
    };
    // Half the time a well-formed trip count and condition, else any operand.
    let initializer = if trip.is_multiple_of(2) {
        vec![
            TensorProto {
                name: "m".into(),
                data_type: 7,
                int64_data: vec![edge(trip >> 1)],
                ..Default::default()
            },
            TensorProto {
                name: "c".into(),
                data_type: 9,
                int32_data: vec![((trip >> 8) & 1) as i32],
                ..Default::default()
            },
        ]
    } else {
        vec![operand("m", trip >> 1), operand("c", trip >> 32)]
    };
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(GraphProto {
            node: vec![NodeProto {
                input: inputs,
                output: (0..node_outputs).map(|i| format!("y{i}")).collect(),
                name: "n".into(),
                op_type: op.into(),
                attribute,
                ..Default::default()
            }],
            initializer,
            input: vec![graph_input(x)],
            output: vec![value_info("y0", 1, &[])],
            ..Default::default()
        }),
        ..Default::default()
    }
}

proptest! {
    // No persistence file: every crash found is kept by hand, named, in `hostile_models.rs`.
    #![proptest_config(ProptestConfig {
        // More with COTENANT_FUZZ_CASES, for a longer hunt than CI's.
        cases: std::env::var("COTENANT_FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(160),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn mutated_zoo_models_never_panic(
        seed in 0usize..4,
        muts in proptest::collection::vec((any::<u8>(), any::<u64>(), any::<u64>()), 1..6),
    ) {
        let mut m = seeds()[seed].clone();
        mutate(&mut m, &muts);
        import_plan_run(&m.encode_to_vec());
    }

    #[test]
    fn hostile_single_operators_never_panic(
        op in 0usize..SUPPORTED_OPS.len(),
        x in any::<u64>(),
        extra in proptest::collection::vec(any::<u64>(), 0..5),
        attrs in proptest::collection::vec((0usize..ATTRS.len(), any::<u64>()), 0..4),
        opset in 0usize..OPSETS.len(),
    ) {
        let attrs = attrs.into_iter().map(|(k, b)| hostile_attr(k, b)).collect();
        let m = one_node(SUPPORTED_OPS[op], x, &extra, attrs, OPSETS[opset]);
        import_plan_run(&m.encode_to_vec());
    }

    #[test]
    fn hostile_onnxruntime_operators_never_panic(
        op in 0usize..ONNXRUNTIME_OPS.len(),
        x in any::<u64>(),
        extra in proptest::collection::vec(any::<u64>(), 0..9),
        attrs in proptest::collection::vec((0usize..ATTRS.len(), any::<u64>()), 0..4),
    ) {
        let attrs = attrs.into_iter().map(|(k, b)| hostile_attr(k, b)).collect();
        let m = one_node_of(ONNXRUNTIME_DOMAIN, ONNXRUNTIME_OPS[op], x, &extra, attrs, 17);
        import_plan_run(&m.encode_to_vec());
    }

    /// onnxruntime's attention operators with heads that divide, so that more cases get past
    /// import to run on the hostile operands.
    #[test]
    fn hostile_attention_operators_never_panic(
        op in 0usize..ATTENTION_OPS.len(),
        x in any::<u64>(),
        extra in proptest::collection::vec(any::<u64>(), 0..9),
        heads in 1i64..4,
        kv_heads in 1i64..3,
        attrs in proptest::collection::vec((0usize..ATTRS.len(), any::<u64>()), 0..3),
    ) {
        let mut attrs: Vec<_> = attrs.into_iter().map(|(k, b)| hostile_attr(k, b)).collect();
        attrs.push(int_attr("num_heads", heads));
        attrs.push(int_attr("kv_num_heads", kv_heads));
        let m = one_node_of(ONNXRUNTIME_DOMAIN, ATTENTION_OPS[op], x, &extra, attrs, 17);
        import_plan_run(&m.encode_to_vec());
    }

    #[test]
    fn hostile_control_flow_never_panics(
        kind in 0usize..3,
        x in any::<u64>(),
        ops in proptest::collection::vec(0usize..BODY_OPS.len(), 0..5),
        trip in any::<u64>(),
        formal in 0usize..5,
        outputs in 0usize..4,
        nest in 0usize..3,
        attrs in proptest::collection::vec((0usize..CONTROL_ATTRS.len(), any::<u64>()), 0..3),
    ) {
        let attrs = attrs
            .into_iter()
            .map(|(k, b)| {
                let len = (b >> 8) as usize % 4;
                match k {
                    0 => int_attr(CONTROL_ATTRS[k], edge(b)),
                    _ => ints_attr(CONTROL_ATTRS[k], &(0..len).map(|i| edge(b >> (12 + 5 * i))).collect::<Vec<_>>()),
                }
            })
            .collect();
        let m = control_flow(kind, x, &ops, trip, formal, outputs, nest, attrs);
        import_plan_run(&m.encode_to_vec());
    }

    #[test]
    fn hostile_sampling_grids_never_panic(
        dims in proptest::collection::vec(0usize..4, 0..5),
        points in proptest::collection::vec(0usize..3, 1..4),
        values in proptest::collection::vec(any::<usize>(), 0..48),
        mode in 0usize..4,
        padding in 0usize..4,
        align in 0i64..3,
        affine in any::<bool>(),
    ) {
        let attrs = vec![
            string_attr("mode", ["linear", "nearest", "cubic", "bicubic"][mode]),
            string_attr("padding_mode", ["zeros", "border", "reflection", "wrap"][padding]),
            int_attr("align_corners", align),
        ];
        let m = sampling(&dims, &points, &values, attrs, affine);
        import_plan_run(&m.encode_to_vec());
    }

    #[test]
    fn hostile_resizes_never_panic(
        dims in proptest::collection::vec(0usize..5, 0..4),
        by_sizes in any::<bool>(),
        targets in proptest::collection::vec(any::<u64>(), 0..6),
        roi in proptest::collection::vec(any::<usize>(), 0..10),
        mode in 0usize..4,
        coord in 0usize..8,
        policy in 0usize..4,
        flags in 0u8..16,
        a in 0usize..FLOAT_EDGES.len(),
    ) {
        let attrs = vec![
            string_attr("mode", ["nearest", "linear", "cubic", "bicubic"][mode]),
            string_attr(
                "coordinate_transformation_mode",
                [
                    "half_pixel",
                    "half_pixel_symmetric",
                    "pytorch_half_pixel",
                    "align_corners",
                    "asymmetric",
                    "tf_half_pixel_for_nn",
                    "tf_crop_and_resize",
                    "bogus",
                ][coord],
            ),
            string_attr(
                "keep_aspect_ratio_policy",
                ["stretch", "not_larger", "not_smaller", "bogus"][policy],
            ),
            int_attr("antialias", i64::from(flags & 1)),
            int_attr("exclude_outside", i64::from((flags >> 1) & 1)),
            float_attr("cubic_coeff_a", FLOAT_EDGES[a]),
            float_attr("extrapolation_value", FLOAT_EDGES[(a + 3) % FLOAT_EDGES.len()]),
        ];
        let m = resizing(&dims, by_sizes, &targets, &roi, attrs);
        import_plan_run(&m.encode_to_vec());
    }
}
