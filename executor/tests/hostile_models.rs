//! Hostile models: memory bombs in constant subgraphs and behind request data, the two known
//! panics of the shape pass, and every crash structural fuzzing (`fuzz.rs`) found, each kept
//! as a model that must be refused with an error naming what is wrong.
//!
//! This test binary's allocator refuses any single allocation over 1 GiB (the process then
//! aborts: a loud failure that takes nothing from the machine) and records the largest one
//! each thread made, so a test can show that a bomb was priced, not allocated.

mod common;

use common::proto::{int_attr, ints_attr, string_attr, value_info};
use cotenant_executor::memory::MemoryBudget;
use cotenant_executor::proto::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    ValueInfoProto,
};
use cotenant_executor::zoo::{self, ZooOptions};
use cotenant_executor::{CpuBackend, Data, Model, RunError, Tensor};
use prost::Message;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

struct Capped;

const CAP: usize = 1 << 30;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = LARGEST.try_with(|c| c.set(c.get().max(size)));
}

// SAFETY: every call is passed on to the system allocator unchanged, or refused with null.
unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > CAP {
            return std::ptr::null_mut();
        }
        note(layout.size());
        // SAFETY: the caller's layout is passed on as it came.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > CAP {
            return std::ptr::null_mut();
        }
        note(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > CAP {
            return std::ptr::null_mut();
        }
        note(new_size);
        // SAFETY: `ptr` came from `System` with this layout.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Capped = Capped;

/// The largest single allocation this thread made while `f` ran.
fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|c| c.set(0));
    let out = f();
    (out, LARGEST.with(Cell::get))
}

fn node(op: &str, name: &str, inputs: &[&str], attrs: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![name.to_string()],
        name: name.into(),
        op_type: op.into(),
        attribute: attrs,
        ..Default::default()
    }
}

fn i64s(name: &str, dims: &[i64], v: &[i64]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: 7,
        int64_data: v.to_vec(),
        ..Default::default()
    }
}

fn f32s(name: &str, dims: &[i64]) -> TensorProto {
    let n: i64 = dims.iter().product();
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: 1,
        float_data: (0..n).map(|i| i as f32 * 0.5).collect(),
        ..Default::default()
    }
}

/// A model of `nodes` over `initializer`, with graph inputs `inputs` and the last node's output
/// as its only output.
fn graph(
    nodes: Vec<NodeProto>,
    initializer: Vec<TensorProto>,
    inputs: Vec<ValueInfoProto>,
    opset: i64,
) -> Vec<u8> {
    let out = nodes
        .last()
        .map(|n| n.output[0].clone())
        .unwrap_or_default();
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: opset,
        }],
        graph: Some(GraphProto {
            node: nodes,
            initializer,
            input: inputs,
            output: vec![value_info(&out, 1, &[])],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

/// The node a run failure names, and why.
fn failed_node(e: &RunError) -> Option<(&str, String)> {
    match e {
        RunError::MemoryBudget { node, .. } => Some((node, e.to_string())),
        RunError::Node { node, source, .. } => Some((node, source.to_string())),
        _ => None,
    }
}

/// Constant subgraphs of a few hundred bytes to a few MiB that ask for 2 to 4 GiB each.
fn constant_bombs() -> Vec<(&'static str, Vec<u8>)> {
    let one = |op: &str, inputs: &[&str], attrs, inits, opset| {
        graph(vec![node(op, "bomb", inputs, attrs)], inits, vec![], opset)
    };
    let two_gib = [1 << 15, 1 << 14];
    vec![
        (
            "ConstantOfShape",
            one(
                "ConstantOfShape",
                &["shape"],
                vec![],
                vec![i64s("shape", &[2], &two_gib)],
                13,
            ),
        ),
        (
            "Tile",
            one(
                "Tile",
                &["x", "reps"],
                vec![],
                vec![f32s("x", &[4]), i64s("reps", &[1], &[1 << 28])],
                13,
            ),
        ),
        (
            "Expand",
            one(
                "Expand",
                &["x", "shape"],
                vec![],
                vec![f32s("x", &[1, 1]), i64s("shape", &[2], &[1 << 15, 1 << 15])],
                13,
            ),
        ),
        (
            "Range",
            one(
                "Range",
                &["start", "limit", "delta"],
                vec![],
                vec![
                    f32s("start", &[]),
                    TensorProto {
                        float_data: vec![6e8],
                        ..f32s("limit", &[])
                    },
                    TensorProto {
                        float_data: vec![1.0],
                        ..f32s("delta", &[])
                    },
                ],
                13,
            ),
        ),
        (
            "Pad",
            one(
                "Pad",
                &["x", "pads"],
                vec![],
                vec![
                    f32s("x", &[1, 1]),
                    i64s("pads", &[4], &[0, 0, 1 << 15, 1 << 14]),
                ],
                13,
            ),
        ),
        (
            "Resize",
            one(
                "Resize",
                &["x", "", "scales"],
                vec![],
                vec![
                    f32s("x", &[1, 1, 2, 2]),
                    TensorProto {
                        float_data: vec![1.0, 1.0, 16384.0, 16384.0],
                        ..f32s("scales", &[4])
                    },
                ],
                13,
            ),
        ),
        (
            "Concat",
            one(
                "Concat",
                &["x"; 1024],
                vec![int_attr("axis", 0)],
                vec![f32s("x", &[1 << 20])],
                13,
            ),
        ),
        (
            "Add",
            one(
                "Add",
                &["a", "b"],
                vec![],
                vec![f32s("a", &[1 << 15, 1]), f32s("b", &[1, 1 << 15])],
                13,
            ),
        ),
        (
            "MatMul",
            one(
                "MatMul",
                &["a", "b"],
                vec![],
                vec![f32s("a", &[1 << 15, 1]), f32s("b", &[1, 1 << 15])],
                13,
            ),
        ),
        (
            "Gather",
            one(
                "Gather",
                &["x", "idx"],
                vec![int_attr("axis", 0)],
                vec![
                    f32s("x", &[1, 1 << 16]),
                    i64s("idx", &[1 << 14], &[0; 1 << 14]),
                ],
                13,
            ),
        ),
        (
            "GatherND",
            one(
                "GatherND",
                &["x", "idx"],
                vec![],
                vec![
                    f32s("x", &[1, 1 << 16]),
                    i64s("idx", &[1 << 14, 1], &[0; 1 << 14]),
                ],
                13,
            ),
        ),
        (
            "OneHot",
            one(
                "OneHot",
                &["idx", "depth", "values"],
                vec![],
                vec![
                    f32s("idx", &[1 << 10]),
                    i64s("depth", &[], &[1 << 20]),
                    f32s("values", &[2]),
                ],
                11,
            ),
        ),
        (
            "DFT",
            one(
                "DFT",
                &["x", "length"],
                vec![int_attr("axis", 1)],
                vec![f32s("x", &[1, 4, 1]), i64s("length", &[], &[1 << 28])],
                17,
            ),
        ),
        (
            "MelWeightMatrix",
            one(
                "MelWeightMatrix",
                &["bins", "length", "rate", "low", "high"],
                vec![],
                vec![
                    i64s("bins", &[], &[1 << 14]),
                    i64s("length", &[], &[1 << 16]),
                    i64s("rate", &[], &[8000]),
                    f32s("low", &[]),
                    TensorProto {
                        float_data: vec![4000.0],
                        ..f32s("high", &[])
                    },
                ],
                17,
            ),
        ),
        (
            "Einsum",
            one(
                "Einsum",
                &["a", "b"],
                vec![string_attr("equation", "i,j->ij")],
                vec![f32s("a", &[1 << 15]), f32s("b", &[1 << 15])],
                12,
            ),
        ),
    ]
}

/// Each bomb imports without being evaluated (folding prices it first and leaves the node),
/// and a run under a memory budget fails naming the node, before allocating: no allocation
/// anywhere near the gigabytes asked for.
#[test]
fn constant_bombs_are_priced_not_evaluated() {
    let budget = 256 << 20;
    for (what, bytes) in constant_bombs() {
        let (model, largest) = largest_allocation(|| Model::from_bytes(&bytes));
        let mut model = model.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            largest < 80 << 20,
            "{what}: importing allocated {largest} bytes"
        );
        assert_eq!(model.plan.steps.len(), 1, "{what} was folded");
        model
            .plan
            .set_memory_budget(Arc::new(MemoryBudget::new(budget)));
        let (result, largest) = largest_allocation(|| model.plan.run(&CpuBackend::new(1), vec![]));
        let e = result.expect_err(what);
        assert!(
            largest < budget,
            "{what}: running allocated {largest} bytes"
        );
        let (node, why) = failed_node(&e).unwrap_or_else(|| panic!("{what}: {e}"));
        assert_eq!(node, "bomb", "{what}: {e}");
        assert!(
            matches!(e, RunError::MemoryBudget { limit, .. } if limit == budget),
            "{what}: {why}"
        );
        assert!(e.to_string().contains(&budget.to_string()), "{e}");
    }
}

/// The shape pass tracks the elements of small integer vectors; a Concat naming one such
/// vector a million times (3 MB of model) is neither copied per reference nor joined into a
/// 64-million-element vector.
#[test]
fn the_shape_pass_copies_nothing_per_reference() {
    let refs = vec!["v"; 1 << 20];
    let bytes = graph(
        vec![node("Concat", "bomb", &refs, vec![int_attr("axis", 0)])],
        vec![i64s("v", &[64], &[7; 64])],
        vec![],
        13,
    );
    let (model, largest) = largest_allocation(|| Model::from_bytes(&bytes));
    let model = model.expect("imports");
    assert_eq!(model.plan.steps.len(), 1, "a 512 MiB Concat is not folded");
    assert!(largest < 64 << 20, "importing allocated {largest} bytes");
}

/// Ops whose output size comes from the request's data are held to the budget at run time:
/// a hostile request fails with the budget error naming the node, a modest one runs.
#[test]
fn sizes_from_request_data_are_held_to_the_budget() {
    let ints_input = |name: &str, n: i64| value_info(name, 7, &[n]);
    type Inputs = Vec<(String, Tensor)>;
    let cases: Vec<(&str, Vec<u8>, Inputs, Inputs)> = vec![
        (
            "ConstantOfShape",
            graph(
                vec![node("ConstantOfShape", "bomb", &["shape"], vec![])],
                vec![],
                vec![ints_input("shape", 2)],
                13,
            ),
            vec![(
                "shape".into(),
                Tensor::i64(vec![2], vec![1 << 15, 1 << 15]).unwrap(),
            )],
            vec![("shape".into(), Tensor::i64(vec![2], vec![3, 5]).unwrap())],
        ),
        (
            "Tile",
            graph(
                vec![node("Tile", "bomb", &["x", "reps"], vec![])],
                vec![f32s("x", &[2, 2])],
                vec![ints_input("reps", 2)],
                13,
            ),
            vec![(
                "reps".into(),
                Tensor::i64(vec![2], vec![1 << 14, 1 << 14]).unwrap(),
            )],
            vec![("reps".into(), Tensor::i64(vec![2], vec![2, 3]).unwrap())],
        ),
        (
            "Expand",
            graph(
                vec![node("Expand", "bomb", &["x", "shape"], vec![])],
                vec![f32s("x", &[1, 1])],
                vec![ints_input("shape", 2)],
                13,
            ),
            vec![(
                "shape".into(),
                Tensor::i64(vec![2], vec![1 << 15, 1 << 15]).unwrap(),
            )],
            vec![("shape".into(), Tensor::i64(vec![2], vec![4, 4]).unwrap())],
        ),
        (
            "Resize",
            graph(
                vec![node("Resize", "bomb", &["x", "", "", "sizes"], vec![])],
                vec![f32s("x", &[1, 1, 2, 2])],
                vec![ints_input("sizes", 4)],
                13,
            ),
            vec![(
                "sizes".into(),
                Tensor::i64(vec![4], vec![1, 1, 1 << 15, 1 << 15]).unwrap(),
            )],
            vec![(
                "sizes".into(),
                Tensor::i64(vec![4], vec![1, 1, 4, 4]).unwrap(),
            )],
        ),
        (
            "OneHot",
            graph(
                vec![node("OneHot", "bomb", &["idx", "depth", "values"], vec![])],
                vec![f32s("idx", &[64]), f32s("values", &[2])],
                vec![ints_input("depth", 1)],
                11,
            ),
            vec![("depth".into(), Tensor::i64(vec![1], vec![1 << 24]).unwrap())],
            vec![("depth".into(), Tensor::i64(vec![1], vec![10]).unwrap())],
        ),
    ];
    let budget = 64 << 20;
    for (what, bytes, hostile, modest) in cases {
        let mut model = Model::from_bytes(&bytes).unwrap_or_else(|e| panic!("{what}: {e}"));
        model
            .plan
            .set_memory_budget(Arc::new(MemoryBudget::new(budget)));
        let backend = CpuBackend::new(1);
        let (result, largest) = largest_allocation(|| model.plan.run(&backend, hostile));
        let e = result.expect_err(what);
        assert!(largest < budget, "{what}: allocated {largest} bytes");
        assert!(
            matches!(&e, RunError::MemoryBudget { node, .. } if node == "bomb"),
            "{what}: {e}"
        );
        model
            .plan
            .run(&backend, modest)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(model.plan.memory_budget().map(|b| b.live()), Some(0));
    }
}

/// What a tenant needs at a large batch is worked out from runs at batch 1 and 2, never by
/// running the large batch; and it grows with the batch.
#[test]
fn the_memory_plan_at_a_large_batch_runs_no_large_batch() {
    let proto = zoo::build("squeezenet", &ZooOptions::default()).expect("zoo");
    let model = Model::from_bytes(&proto.encode_to_vec()).expect("imports");
    let one = model.plan.peak_activation_bytes(1).expect("batch 1");
    assert_eq!(model.plan.measured_peak_activation_bytes(1), Some(one));
    assert_eq!(model.plan.measured_peak_activation_bytes(2), None);
    let (big, largest) = largest_allocation(|| model.plan.peak_activation_bytes(512));
    let big = big.expect("batch 512");
    // Squeezenet holds about 6 MB of activations per image.
    assert!(big > 256 * one, "{big} vs {one} at batch 1");
    assert!(largest < 4 * one, "measuring allocated {largest} bytes");
    assert_eq!(model.plan.measured_peak_activation_bytes(512), Some(big));
}

/// A model that must fail with an error (at import or at run) mentioning `why`, not panic.
fn refused(what: &str, bytes: &[u8], inputs: Option<Vec<(String, Tensor)>>, why: &str) {
    let model = match Model::from_bytes(bytes) {
        Err(e) => {
            let e = e.to_string();
            assert!(
                e.contains(why),
                "{what}: refused at import for another reason: {e}"
            );
            return;
        }
        Ok(m) => m,
    };
    let inputs = inputs.unwrap_or_else(|| model.plan.example_inputs(1));
    let e = model
        .plan
        .run(&CpuBackend::new(1), inputs)
        .expect_err(what)
        .to_string();
    assert!(e.contains(why), "{what}: failed for another reason: {e}");
}

fn x_input(dims: &[i64]) -> Vec<ValueInfoProto> {
    vec![value_info("x", 1, dims)]
}

/// The two panics of the shape pass that were known: a Conv whose weight is a scalar, and a
/// Slice of a shape with empty `starts`.
#[test]
fn the_known_shape_pass_panics_are_errors() {
    let conv = graph(
        vec![node("Conv", "conv", &["x", "w"], vec![])],
        vec![f32s("w", &[])],
        x_input(&[-1, 3, 8, 8]),
        13,
    );
    refused("a Conv with a rank-0 weight", &conv, None, "does not match");
    let slice = graph(
        vec![
            node("Shape", "shape", &["x"], vec![]),
            node("Slice", "slice", &["shape", "starts", "ends"], vec![]),
            node("Reshape", "reshape", &["x", "slice"], vec![]),
        ],
        vec![i64s("starts", &[0], &[]), i64s("ends", &[0], &[])],
        x_input(&[-1, 3, 8, 8]),
        13,
    );
    // An empty Slice keeps the whole shape; the model is then valid and runs.
    let model = Model::from_bytes(&slice).expect("imports");
    let out = model
        .plan
        .run(&CpuBackend::new(1), model.plan.example_inputs(2))
        .expect("runs");
    assert_eq!(out[0].1.shape, vec![2, 3, 8, 8]);
}

/// Every crash structural fuzzing found (and the same overflows in neighbouring ops): a panic
/// inside an op, a kernel or the passes on a model that imports, each now an error naming the
/// problem, or a run giving an empty result where the model is valid.
#[test]
fn crashes_found_by_fuzzing_are_errors() {
    let one = |op: &str, inputs: &[&str], attrs: Vec<AttributeProto>, inits, dims: &[i64]| {
        graph(vec![node(op, "n", inputs, attrs)], inits, x_input(dims), 17)
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "LayerNormalization whose scale does not broadcast",
            one(
                "LayerNormalization",
                &["x", "scale"],
                vec![int_attr("axis", -1)],
                vec![f32s("scale", &[2, 3, 7])],
                &[-1, 3, 5],
            ),
            "broadcast",
        ),
        (
            "Conv with a stride of 2^40 (the direct convolution's phase planes)",
            one(
                "Conv",
                &["x", "w"],
                vec![ints_attr("strides", &[1, 1 << 40])],
                vec![f32s("w", &[4, 3, 3, 3])],
                &[-1, 3, 8, 8],
            ),
            "limit",
        ),
        (
            "Conv with a stride of i64::MAX (the im2col ranges)",
            one(
                "Conv",
                &["x", "w"],
                vec![ints_attr("strides", &[i64::MAX, 1])],
                vec![f32s("w", &[4, 3, 3, 3])],
                &[-1, 3, 8, 8],
            ),
            "limit",
        ),
        (
            "depthwise Conv with a stride of i64::MAX",
            one(
                "Conv",
                &["x", "w"],
                vec![ints_attr("strides", &[i64::MAX, 1]), int_attr("group", 3)],
                vec![f32s("w", &[3, 1, 3, 3])],
                &[-1, 3, 8, 8],
            ),
            "limit",
        ),
        (
            "MaxPool with pads past usize",
            one(
                "MaxPool",
                &["x"],
                vec![
                    ints_attr("kernel_shape", &[2, 2]),
                    ints_attr("pads", &[0, i64::MAX, 0, i64::MAX]),
                ],
                vec![],
                &[-1, 3, 8, 8],
            ),
            "limit",
        ),
        (
            "Conv with pads past usize",
            one(
                "Conv",
                &["x", "w"],
                vec![ints_attr("pads", &[0, i64::MAX, 0, i64::MAX])],
                vec![f32s("w", &[4, 3, 3, 3])],
                &[-1, 3, 8, 8],
            ),
            "limit",
        ),
        (
            "Conv with a kernel of no taps",
            one(
                "Conv",
                &["x", "w"],
                vec![],
                vec![f32s("w", &[4, 3, 0, 3])],
                &[-1, 3, 8, 8],
            ),
            "taps",
        ),
        (
            "Where with an empty output",
            graph(
                vec![
                    node("Cast", "c", &["x"], vec![int_attr("to", 9)]),
                    node("Where", "n", &["c", "x", "x"], vec![]),
                ],
                vec![],
                x_input(&[-1, 0, 3]),
                17,
            ),
            "",
        ),
        (
            "ReduceMean over axis 0 of a scalar",
            graph(
                vec![node(
                    "ReduceMean",
                    "n",
                    &["s"],
                    vec![ints_attr("axes", &[0])],
                )],
                vec![f32s("s", &[])],
                vec![],
                13,
            ),
            "scalar",
        ),
        (
            "Slice of a scalar",
            graph(
                vec![node("Slice", "n", &["s", "st", "en", "ax"], vec![])],
                vec![
                    f32s("s", &[]),
                    i64s("st", &[1], &[0]),
                    i64s("en", &[1], &[1]),
                    i64s("ax", &[1], &[0]),
                ],
                vec![],
                13,
            ),
            "scalar",
        ),
        (
            "Split into i64::MAX outputs",
            one(
                "Split",
                &["x"],
                vec![int_attr("num_outputs", i64::MAX)],
                vec![],
                &[-1, 4],
            ),
            "num_outputs",
        ),
        (
            "Pad of i64::MIN before and i64::MAX after",
            graph(
                vec![node(
                    "Pad",
                    "n",
                    &["s", "pads"],
                    vec![ints_attr("pads", &[i64::MIN, i64::MAX])],
                )],
                vec![f32s("s", &[2]), i64s("pads", &[2], &[i64::MIN, i64::MAX])],
                vec![],
                13,
            ),
            "",
        ),
        (
            "Range of int64 overflowing its step",
            graph(
                vec![node("Range", "n", &["a", "b", "d"], vec![])],
                vec![
                    i64s("a", &[], &[i64::MIN]),
                    i64s("b", &[], &[i64::MAX]),
                    i64s("d", &[], &[1 << 62]),
                ],
                vec![],
                13,
            ),
            "",
        ),
        (
            "Softmax of an empty tensor",
            one(
                "Softmax",
                &["x"],
                vec![int_attr("axis", 1)],
                vec![],
                &[-1, 0, 4],
            ),
            "",
        ),
        (
            "Reshape of an empty tensor to dimensions overflowing usize",
            one(
                "Reshape",
                &["x", "shape"],
                vec![int_attr("allowzero", 1)],
                vec![i64s("shape", &[3], &[1 << 40, 1 << 40, 0])],
                &[-1, 0],
            ),
            "exceeds",
        ),
        (
            "Concat of scalars",
            graph(
                vec![node("Concat", "n", &["s", "s"], vec![int_attr("axis", 0)])],
                vec![f32s("s", &[])],
                vec![],
                13,
            ),
            "scalar",
        ),
        (
            "Resize of an empty axis",
            one(
                "Resize",
                &["x", "", "", "sizes"],
                vec![],
                vec![i64s("sizes", &[3], &[1, 4, 4])],
                &[-1, 0, 2],
            ),
            "empty axis",
        ),
    ];
    for (what, bytes, why) in cases {
        // Some are valid models (empty outputs): those must run; the rest fail with `why`.
        match Model::from_bytes(&bytes) {
            Err(e) => assert!(e.to_string().contains(why), "{what}: {e}"),
            Ok(model) => match model
                .plan
                .run(&CpuBackend::new(1), model.plan.example_inputs(1))
            {
                Ok(_) => assert!(why.is_empty(), "{what} ran"),
                Err(e) => assert!(
                    !why.is_empty() && e.to_string().contains(why),
                    "{what}: {e}"
                ),
            },
        }
    }
}

/// A convolution over a batch of 0 (the direct convolution assumed work) gives an empty batch.
#[test]
fn a_batch_of_zero_runs_empty() {
    let conv = graph(
        vec![node("Conv", "conv", &["x", "w"], vec![])],
        vec![f32s("w", &[4, 3, 3, 3])],
        x_input(&[0, 3, 8, 8]),
        13,
    );
    let model = Model::from_bytes(&conv).expect("imports");
    let out = model
        .plan
        .run(&CpuBackend::new(1), model.plan.example_inputs(1))
        .expect("runs");
    assert_eq!(out[0].1.shape, vec![0, 4, 6, 6]);
    assert_eq!(out[0].1.data, Data::F32(vec![]));
}

/// Pools whose kernel and padding reach a billion taps a side over a tiny input (a few hundred
/// bytes of model) cost what they read: the 2-D average, the N-D average and LpPool run at
/// once, giving the values of the few taps that read the input; an average counting the
/// padding divides by all 2^90 taps of a 3-D window.
#[test]
fn pooling_windows_of_a_billion_taps_read_only_the_input() {
    let huge = 1i64 << 30;
    let halves = |n: usize, div: f64| (0..n).map(|i| (i as f64 * 0.5 / div) as f32).collect();
    for (op, rank, include_pad, want) in [
        ("AveragePool", 2, 0, halves(4, 1.0)),
        ("AveragePool", 2, 1, halves(4, 2f64.powi(60))),
        ("AveragePool", 3, 0, halves(8, 1.0)),
        ("AveragePool", 3, 1, halves(8, 2f64.powi(90))),
        ("LpPool", 2, 0, halves(4, 1.0)),
    ] {
        let spatial = vec![2i64; rank];
        let mut dims = vec![1, 1];
        dims.extend(&spatial);
        let model = graph(
            vec![
                node("Identity", "x", &["w"], vec![]),
                node(
                    op,
                    "pool",
                    &["x"],
                    vec![
                        ints_attr("kernel_shape", &vec![huge; rank]),
                        ints_attr("strides", &vec![huge; rank]),
                        ints_attr("pads", &vec![huge - 1; 2 * rank]),
                    ]
                    .into_iter()
                    .chain(
                        (op == "AveragePool").then(|| int_attr("count_include_pad", include_pad)),
                    )
                    .collect(),
                ),
            ],
            vec![f32s("w", &dims)],
            vec![],
            18,
        );
        let model = Model::from_bytes(&model).expect("imports");
        let out = model.plan.run(&CpuBackend::new(1), vec![]).expect("runs");
        assert_eq!(out[0].1.shape.len(), 2 + rank, "{op} over {rank} axes");
        assert_eq!(out[0].1.data, Data::F32(want), "{op} over {rank} axes");
    }
}

/// A DFT a prime 100 003 samples long of a one-sample signal (zero-padded to that length):
/// the chirp convolution computes it at once where the direct sum takes 10^10 steps; every
/// bin of an impulse's spectrum is the impulse (to float32 accuracy: a float32 signal takes
/// onnxruntime's float32 Bluestein transform, 7e-6 off at this length).
#[test]
fn a_dft_of_prime_length_runs_at_once() {
    let length = 100_003;
    let signal = TensorProto {
        name: "s".into(),
        dims: vec![1, 1, 1],
        data_type: 1,
        float_data: vec![2.0],
        ..Default::default()
    };
    let model = graph(
        vec![
            node("Identity", "x", &["s"], vec![]),
            node("DFT", "dft", &["x", "n"], vec![int_attr("axis", 1)]),
        ],
        vec![signal, i64s("n", &[], &[length])],
        vec![],
        17,
    );
    let model = Model::from_bytes(&model).expect("imports");
    let out = model.plan.run(&CpuBackend::new(1), vec![]).expect("runs");
    assert_eq!(out[0].1.shape, vec![1, length as usize, 2]);
    let bins = out[0].1.as_f32().expect("f32");
    let worst = bins
        .chunks(2)
        .map(|b| (b[0] - 2.0).abs().max(b[1].abs()))
        .fold(0.0f32, f32::max);
    assert!(worst < 1e-4, "{worst}");
}

/// LRN with a window of two million channels over a request of a million channels (4 MB):
/// one pass of running sums, not 10^12 steps; every value's window covers every channel.
#[test]
fn an_lrn_window_wider_than_the_channels_costs_one_pass() {
    let c = 1_000_000;
    let model = graph(
        vec![node(
            "LRN",
            "lrn",
            &["x"],
            vec![int_attr("size", 2 * c as i64 + 1)],
        )],
        vec![],
        x_input(&[1, c as i64, 1]),
        13,
    );
    let model = Model::from_bytes(&model).expect("imports");
    let x = Tensor::f32(vec![1, c, 1], vec![1.0; c]).unwrap();
    let out = model
        .plan
        .run(&CpuBackend::new(1), vec![("x".into(), x)])
        .expect("runs");
    // Defaults alpha 1e-4, beta 0.75, bias 1: x / (1 + 1e-4 / size · c)^0.75.
    let want = (1.0 + 1e-4 / (2 * c + 1) as f64 * c as f64).powf(-0.75) as f32;
    let got = out[0].1.as_f32().expect("f32");
    assert!(
        got.iter().all(|g| (g - want).abs() < 1e-6),
        "{} against {want}",
        got[0]
    );
}

/// Indices, counts and thresholds that come with a request are checked against the tensors
/// they address: each hostile request fails with an error naming the problem, never a read or
/// write out of bounds or an allocation of what it asks for.
#[test]
fn indices_and_counts_from_requests_are_checked() {
    let ints_input = |name: &str, dims: &[i64]| value_info(name, 7, dims);
    let int_tensor = |dims: &[usize], v: &[i64]| Tensor::i64(dims.to_vec(), v.to_vec()).unwrap();
    let x = || {
        (
            "x".to_string(),
            Tensor::f32(vec![2, 3], vec![0.5; 6]).unwrap(),
        )
    };
    type Case = (&'static str, Vec<u8>, Vec<(String, Tensor)>, &'static str);
    let with_x = |op: &str, others: &[&str], attrs, extra: Vec<ValueInfoProto>, opset| {
        let mut inputs = vec!["x"];
        inputs.extend(others);
        let mut decl = x_input(&[2, 3]);
        decl.extend(extra);
        graph(vec![node(op, "n", &inputs, attrs)], vec![], decl, opset)
    };
    let cases: Vec<Case> = vec![
        (
            "GatherElements past the axis",
            with_x(
                "GatherElements",
                &["i"],
                vec![int_attr("axis", 1)],
                vec![ints_input("i", &[2, 1])],
                13,
            ),
            vec![x(), ("i".into(), int_tensor(&[2, 1], &[0, 3]))],
            "out of range",
        ),
        (
            "GatherElements at i64::MIN",
            with_x(
                "GatherElements",
                &["i"],
                vec![],
                vec![ints_input("i", &[1, 1])],
                13,
            ),
            vec![x(), ("i".into(), int_tensor(&[1, 1], &[i64::MIN]))],
            "out of range",
        ),
        (
            "GatherND past the first axis",
            with_x(
                "GatherND",
                &["i"],
                vec![],
                vec![ints_input("i", &[1, 2])],
                13,
            ),
            vec![x(), ("i".into(), int_tensor(&[1, 2], &[-3, 0]))],
            "out of range",
        ),
        (
            "ScatterElements past the axis",
            with_x(
                "ScatterElements",
                &["i", "x"],
                vec![int_attr("axis", 0)],
                vec![ints_input("i", &[2, 3])],
                18,
            ),
            vec![x(), ("i".into(), int_tensor(&[2, 3], &[0, 1, 2, 0, 1, 2]))],
            "out of range",
        ),
        (
            "ScatterND past the first axis",
            with_x(
                "ScatterND",
                &["i", "u"],
                vec![],
                vec![ints_input("i", &[1, 1]), value_info("u", 1, &[1, 3])],
                18,
            ),
            vec![
                x(),
                ("i".into(), int_tensor(&[1, 1], &[i64::MAX])),
                ("u".into(), Tensor::f32(vec![1, 3], vec![1.0; 3]).unwrap()),
            ],
            "out of range",
        ),
        (
            "TopK of a huge k",
            with_x("TopK", &["k"], vec![], vec![ints_input("k", &[1])], 11),
            vec![x(), ("k".into(), int_tensor(&[1], &[1 << 40]))],
            "outside 0..=3",
        ),
        (
            "TopK of a negative k",
            with_x("TopK", &["k"], vec![], vec![ints_input("k", &[1])], 11),
            vec![x(), ("k".into(), int_tensor(&[1], &[-1]))],
            "outside 0..=3",
        ),
        (
            "OneHot of a negative depth",
            graph(
                vec![node("OneHot", "n", &["i", "d", "v"], vec![])],
                vec![f32s("v", &[2])],
                vec![ints_input("i", &[2]), ints_input("d", &[])],
                11,
            ),
            vec![
                ("i".into(), int_tensor(&[2], &[0, 1])),
                ("d".into(), int_tensor(&[], &[-4])),
            ],
            "not positive",
        ),
        (
            "CumSum along an axis the input lacks",
            with_x("CumSum", &["a"], vec![], vec![ints_input("a", &[])], 14),
            vec![x(), ("a".into(), int_tensor(&[], &[2]))],
            "out of range",
        ),
        (
            "Trilu with a k of several values",
            with_x("Trilu", &["k"], vec![], vec![ints_input("k", &[2])], 14),
            vec![x(), ("k".into(), int_tensor(&[2], &[0, 1]))],
            "one value",
        ),
        (
            "NonMaxSuppression with an IoU threshold past 1",
            graph(
                vec![node(
                    "NonMaxSuppression",
                    "n",
                    &["b", "s", "m", "iou"],
                    vec![],
                )],
                vec![i64s("m", &[1], &[i64::MAX])],
                vec![
                    value_info("b", 1, &[1, 2, 4]),
                    value_info("s", 1, &[1, 1, 2]),
                    value_info("iou", 1, &[1]),
                ],
                11,
            ),
            vec![
                (
                    "b".into(),
                    Tensor::f32(vec![1, 2, 4], vec![0.0; 8]).unwrap(),
                ),
                (
                    "s".into(),
                    Tensor::f32(vec![1, 1, 2], vec![0.0; 2]).unwrap(),
                ),
                ("iou".into(), Tensor::f32(vec![1], vec![7.0]).unwrap()),
            ],
            "outside [0, 1]",
        ),
        (
            "NonMaxSuppression of boxes that are not [B, N, 4]",
            graph(
                vec![node("NonMaxSuppression", "n", &["b", "s"], vec![])],
                vec![],
                vec![
                    value_info("b", 1, &[1, 2, 3]),
                    value_info("s", 1, &[1, 1, 2]),
                ],
                11,
            ),
            vec![
                (
                    "b".into(),
                    Tensor::f32(vec![1, 2, 3], vec![0.0; 6]).unwrap(),
                ),
                (
                    "s".into(),
                    Tensor::f32(vec![1, 1, 2], vec![0.0; 2]).unwrap(),
                ),
            ],
            "[B, N, 4]",
        ),
    ];
    for (what, bytes, inputs, why) in cases {
        let (_, largest) = largest_allocation(|| refused(what, &bytes, Some(inputs), why));
        assert!(largest < 1 << 20, "{what}: allocated {largest} bytes");
    }
    // Attributes no opset allows are import errors naming them.
    let bad_attrs: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "ScatterND with reduction max before opset 18",
            with_x(
                "ScatterND",
                &["x", "x"],
                vec![string_attr("reduction", "max")],
                vec![],
                16,
            ),
            "opset 18",
        ),
        (
            "ScatterElements with an unknown reduction",
            with_x(
                "ScatterElements",
                &["x", "x"],
                vec![string_attr("reduction", "xor")],
                vec![],
                18,
            ),
            "reduction",
        ),
        (
            "Einsum with a label only in the output",
            with_x(
                "Einsum",
                &[],
                vec![string_attr("equation", "ij->k")],
                vec![],
                12,
            ),
            "no operand",
        ),
        (
            "DepthToSpace of a zero block",
            with_x(
                "DepthToSpace",
                &[],
                vec![int_attr("blocksize", 0)],
                vec![],
                13,
            ),
            "blocksize",
        ),
        (
            "GroupNormalization of no groups",
            with_x(
                "GroupNormalization",
                &["x", "x"],
                vec![int_attr("num_groups", 0)],
                vec![],
                21,
            ),
            "num_groups",
        ),
        (
            "Mod with fmod 2",
            with_x("Mod", &["x"], vec![int_attr("fmod", 2)], vec![], 13),
            "fmod",
        ),
    ];
    for (what, bytes, why) in bad_attrs {
        let e = Model::from_bytes(&bytes)
            .err()
            .unwrap_or_else(|| panic!("{what} imported"));
        assert!(
            e.to_string().contains(why) && e.to_string().contains("\"n\""),
            "{what}: {e}"
        );
    }
}
