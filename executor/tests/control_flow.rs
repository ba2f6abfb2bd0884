//! If, Loop and Scan on hand-built models: branches and bodies that read outer values, nested
//! bodies, and the hostile cases (mismatched branches, runaway loops, growing loop-carried
//! values, nesting past the limit, the GPU backend). The ONNX node tests cover the operators'
//! semantics (`conformance.rs`); Silero VAD, a real model with If, is among the third-party
//! models (`tests/third_party`).

mod common;

use common::proto::{int_attr, unshaped, value_info};
use cotenant_executor::device::Gpu;
use cotenant_executor::memory::MemoryBudget;
use cotenant_executor::ops::Op;
use cotenant_executor::ops::control::ControlOp;
use cotenant_executor::proto::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    attribute_type,
};
use cotenant_executor::{CpuBackend, Data, Device, Model, Tensor};
use prost::Message;
use std::sync::Arc;

fn node(op: &str, inputs: &[&str], outputs: &[&str], attrs: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        name: format!("{op}_{}", outputs.first().copied().unwrap_or("")),
        op_type: op.into(),
        attribute: attrs,
        ..Default::default()
    }
}

fn graph_attr(name: &str, g: GraphProto) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::GRAPH,
        g: Some(Box::new(g)),
        ..Default::default()
    }
}

fn f32s(name: &str, dims: &[i64], v: &[f32]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: 1,
        float_data: v.to_vec(),
        ..Default::default()
    }
}

/// A body: `nodes` computing `outputs` from the inputs `inputs` (name, element type).
fn body(nodes: Vec<NodeProto>, inputs: &[(&str, i32)], outputs: &[&str]) -> GraphProto {
    GraphProto {
        node: nodes,
        input: inputs.iter().map(|(n, e)| unshaped(n, *e)).collect(),
        output: outputs.iter().map(|n| unshaped(n, 1)).collect(),
        ..Default::default()
    }
}

fn model(
    nodes: Vec<NodeProto>,
    initializer: Vec<TensorProto>,
    inputs: Vec<cotenant_executor::proto::ValueInfoProto>,
    outputs: &[&str],
) -> Vec<u8> {
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(GraphProto {
            node: nodes,
            initializer,
            input: inputs,
            output: outputs.iter().map(|n| unshaped(n, 1)).collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

fn run(m: &Model, inputs: Vec<(&str, Tensor)>) -> Result<Vec<Tensor>, String> {
    let inputs = inputs
        .into_iter()
        .map(|(n, t)| (n.to_string(), t))
        .collect();
    m.plan
        .run(&CpuBackend::new(1), inputs)
        .map(|o| o.into_iter().map(|(_, t)| t).collect())
        .map_err(|e| e.to_string())
}

fn flag(v: bool) -> Tensor {
    Tensor::new(vec![], Data::Bool(vec![v])).unwrap()
}

/// `y = If(c) then (x + w) * k else x - w`, where `w` is an initializer and `k` a value of the
/// outer graph read from a nested If inside the then branch.
fn branching() -> Vec<u8> {
    let inner = body(vec![node("Mul", &["s", "k"], &["t"], vec![])], &[], &["t"]);
    let then_branch = body(
        vec![
            node("Add", &["x", "w"], &["s"], vec![]),
            node(
                "If",
                &["c"],
                &["u"],
                vec![
                    graph_attr("then_branch", inner.clone()),
                    graph_attr("else_branch", inner),
                ],
            ),
        ],
        &[],
        &["u"],
    );
    let else_branch = body(vec![node("Sub", &["x", "w"], &["d"], vec![])], &[], &["d"]);
    model(
        vec![
            node("Mul", &["x", "two"], &["k"], vec![]),
            node(
                "If",
                &["c"],
                &["y"],
                vec![
                    graph_attr("then_branch", then_branch),
                    graph_attr("else_branch", else_branch),
                ],
            ),
        ],
        vec![f32s("w", &[2], &[1.0, 2.0]), f32s("two", &[], &[2.0])],
        vec![unshaped("c", 9), value_info("x", 1, &[2])],
        &["y"],
    )
}

#[test]
fn if_takes_the_branch_its_condition_names_and_reads_outer_values() {
    let m = Model::from_bytes(&branching()).unwrap();
    let x = || Tensor::f32(vec![2], vec![3.0, 5.0]).unwrap();
    let y = run(&m, vec![("c", flag(true)), ("x", x())]).unwrap();
    // (x + w) * 2x
    assert_eq!(y[0].as_f32().unwrap(), &[24.0, 70.0]);
    let y = run(&m, vec![("c", flag(false)), ("x", x())]).unwrap();
    assert_eq!(y[0].as_f32().unwrap(), &[2.0, 3.0]);
    // A condition of more than one element is an error, not a guess.
    let two = Tensor::new(vec![2], Data::Bool(vec![true, false])).unwrap();
    let e = run(&m, vec![("c", two), ("x", x())]).unwrap_err();
    assert!(e.contains("one element"), "{e}");
}

/// A branch reading an outer initializer gets it as a constant of its own: the body's passes
/// pack the MatMul's weights, and the node reads only its condition and the outer input.
#[test]
fn outer_initializers_are_constants_of_the_bodies_that_read_them() {
    let w: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 - 2.0).collect();
    let product = |out: &str| {
        body(
            vec![node("MatMul", &["x", "w"], &[out], vec![])],
            &[],
            &[out],
        )
    };
    let mut relu = product("p");
    relu.node.push(node("Relu", &["p"], &["r"], vec![]));
    relu.output = vec![unshaped("r", 1)];
    let bytes = model(
        vec![node(
            "If",
            &["c"],
            &["y"],
            vec![
                graph_attr("then_branch", product("q")),
                graph_attr("else_branch", relu),
            ],
        )],
        vec![f32s("w", &[4, 3], &w)],
        vec![unshaped("c", 9), value_info("x", 1, &[2, 4])],
        &["y"],
    );
    let m = Model::from_bytes(&bytes).unwrap();
    let step = m
        .plan
        .steps
        .iter()
        .find(|s| s.op.name() == "If")
        .expect("the If");
    assert_eq!(step.inputs.len(), 2, "the condition and x, not the weights");
    let Op::Control(ControlOp::If { then_branch, .. }) = &step.op else {
        panic!("an If op");
    };
    let names: Vec<String> = then_branch
        .0
        .plan
        .steps
        .iter()
        .map(|s| s.op.name())
        .collect();
    // Packed where the CPU runs the kernel that reads packed weights.
    let packed = cotenant_kernels::nhwc_conv::available();
    assert_eq!(names, [if packed { "MatMul(packed)" } else { "MatMul" }]);
    let xv: Vec<f32> = (0..8).map(|i| i as f32 - 3.0).collect();
    let want: Vec<f32> = (0..6)
        .map(|k| (0..4).map(|j| xv[k / 3 * 4 + j] * w[j * 3 + k % 3]).sum())
        .collect();
    let x = || Tensor::f32(vec![2, 4], xv.clone()).unwrap();
    let y = run(&m, vec![("c", flag(true)), ("x", x())]).unwrap();
    assert_eq!(y[0].as_f32().unwrap(), want.as_slice());
    let y = run(&m, vec![("c", flag(false)), ("x", x())]).unwrap();
    let relu: Vec<f32> = want.iter().map(|&v| v.max(0.0)).collect();
    assert_eq!(y[0].as_f32().unwrap(), relu.as_slice());
}

#[test]
fn if_branches_with_different_output_counts_are_an_import_error_naming_the_node() {
    let one = body(vec![node("Neg", &["x"], &["a"], vec![])], &[], &["a"]);
    let two = body(
        vec![
            node("Neg", &["x"], &["a"], vec![]),
            node("Abs", &["x"], &["b"], vec![]),
        ],
        &[],
        &["a", "b"],
    );
    let bytes = model(
        vec![node(
            "If",
            &["c"],
            &["y"],
            vec![
                graph_attr("then_branch", one),
                graph_attr("else_branch", two),
            ],
        )],
        vec![],
        vec![value_info("c", 9, &[]), value_info("x", 1, &[2])],
        &["y"],
    );
    let e = Model::from_bytes(&bytes).err().unwrap().to_string();
    assert!(
        e.contains("If_y") && e.contains("else_branch has 2 outputs"),
        "{e}"
    );
    // A body reading a name defined nowhere, and a missing branch, fail the same way.
    let stray = body(vec![node("Neg", &["nowhere"], &["a"], vec![])], &[], &["a"]);
    let bytes = model(
        vec![node(
            "If",
            &["c"],
            &["y"],
            vec![graph_attr("then_branch", stray)],
        )],
        vec![],
        vec![value_info("c", 9, &[]), value_info("x", 1, &[2])],
        &["y"],
    );
    let e = Model::from_bytes(&bytes).err().unwrap().to_string();
    assert!(e.contains("If_y") && e.contains("nowhere"), "{e}");
}

/// `Loop(m, cond)` carrying `acc` (doubled by Concat each iteration when `grow`, else plus `x`)
/// and stacking `acc` as a scan output; stops when `acc`'s first element passes `limit`.
fn looping(grow: bool, limit: f32) -> Vec<u8> {
    let step = if grow {
        node(
            "Concat",
            &["acc_in", "acc_in"],
            &["acc_out"],
            vec![int_attr("axis", 0)],
        )
    } else {
        node("Add", &["acc_in", "x"], &["acc_out"], vec![])
    };
    let b = body(
        vec![
            step,
            node(
                "ReduceMax",
                &["acc_out"],
                &["top"],
                vec![int_attr("keepdims", 0)],
            ),
            node("Less", &["top", "limit"], &["go"], vec![]),
            node("Identity", &["acc_out"], &["scan"], vec![]),
        ],
        &[("i", 7), ("c", 9), ("acc_in", 1)],
        &["go", "acc_out", "scan"],
    );
    let outputs: &[&str] = &["acc", "stack"];
    model(
        vec![node(
            "Loop",
            &["m", "", "x"],
            outputs,
            vec![graph_attr("body", b)],
        )],
        vec![f32s("limit", &[], &[limit])],
        vec![value_info("m", 7, &[]), value_info("x", 1, &[2])],
        outputs,
    )
}

#[test]
fn loop_carries_values_stacks_scan_outputs_and_stops_on_its_condition() {
    let m = Model::from_bytes(&looping(false, 7.0)).unwrap();
    let x = || Tensor::f32(vec![2], vec![1.0, 2.0]).unwrap();
    let trips = |n| Tensor::i64(vec![], vec![n]).unwrap();
    let out = run(&m, vec![("m", trips(10)), ("x", x())]).unwrap();
    // acc: [2,4], [3,6], [4,8] and then the condition (8 < 7) is false.
    assert_eq!(out[0].as_f32().unwrap(), &[4.0, 8.0]);
    assert_eq!(out[1].shape, vec![3, 2]);
    assert_eq!(out[1].as_f32().unwrap(), &[2.0, 4.0, 3.0, 6.0, 4.0, 8.0]);
    let out = run(&m, vec![("m", trips(1)), ("x", x())]).unwrap();
    assert_eq!(out[1].shape, vec![1, 2]);
    // No iteration: the carried value as it came, an empty stack.
    let out = run(&m, vec![("m", trips(0)), ("x", x())]).unwrap();
    assert_eq!(out[0].as_f32().unwrap(), &[1.0, 2.0]);
    assert_eq!(out[1].len(), 0);
}

/// paddle2onnx carries a decoder's weights through its Loops, each passed straight from the
/// body's input to its output: the body reads them as constants (its MatMul packed), the
/// node's output for them is the weights as they came, and a carried value the body changes
/// stays an input.
#[test]
fn weights_a_loop_passes_through_unchanged_are_constants_of_its_body() {
    let w: Vec<f32> = (0..4).map(|i| i as f32 - 1.5).collect();
    let b = body(
        vec![
            node("MatMul", &["h_in", "w_in"], &["p"], vec![]),
            node("Tanh", &["p"], &["h_out"], vec![]),
            node("Identity", &["c"], &["go"], vec![]),
        ],
        &[("i", 7), ("c", 9), ("h_in", 1), ("w_in", 1)],
        &["go", "h_out", "w_in"],
    );
    let outputs: &[&str] = &["h", "w_out"];
    let bytes = model(
        vec![node(
            "Loop",
            &["m", "", "h0", "w"],
            outputs,
            vec![graph_attr("body", b)],
        )],
        vec![f32s("w", &[2, 2], &w)],
        vec![value_info("m", 7, &[]), value_info("h0", 1, &[1, 2])],
        outputs,
    );
    let m = Model::from_bytes(&bytes).unwrap();
    let step = m
        .plan
        .steps
        .iter()
        .find(|s| s.op.name() == "Loop")
        .expect("the Loop");
    let Op::Control(ControlOp::Loop { body }) = &step.op else {
        panic!("a Loop op");
    };
    let names: Vec<String> = body.0.plan.steps.iter().map(|s| s.op.name()).collect();
    let packed = cotenant_kernels::nhwc_conv::available();
    let product = if packed { "MatMul(packed)" } else { "MatMul" };
    assert!(names.iter().any(|n| n.starts_with(product)), "{names:?}");
    let (mut h0, mut h1) = (0.5f32, -1.0f32);
    for _ in 0..3 {
        (h0, h1) = (
            (h0 * w[0] + h1 * w[2]).tanh(),
            (h0 * w[1] + h1 * w[3]).tanh(),
        );
    }
    let out = run(
        &m,
        vec![
            ("m", Tensor::i64(vec![], vec![3]).unwrap()),
            ("h0", Tensor::f32(vec![1, 2], vec![0.5, -1.0]).unwrap()),
        ],
    )
    .unwrap();
    let got = out[0].as_f32().unwrap();
    assert!(
        (got[0] - h0).abs() < 1e-6 && (got[1] - h1).abs() < 1e-6,
        "{got:?}"
    );
    assert_eq!(out[1].as_f32().unwrap(), w.as_slice());
}

#[test]
fn runaway_loops_fail_with_an_error() {
    // A condition that stays true and a trip count past the limit: stopped at the limit.
    let bytes = {
        let b = body(
            vec![
                node("Identity", &["c"], &["go"], vec![]),
                node("Neg", &["a"], &["b"], vec![]),
            ],
            &[("i", 7), ("c", 9), ("a", 1)],
            &["go", "b"],
        );
        model(
            vec![node(
                "Loop",
                &["m", "yes", "x"],
                &["y"],
                vec![graph_attr("body", b)],
            )],
            vec![TensorProto {
                name: "yes".into(),
                data_type: 9,
                int32_data: vec![1],
                ..Default::default()
            }],
            vec![value_info("m", 7, &[]), value_info("x", 1, &[2])],
            &["y"],
        )
    };
    let m = Model::from_bytes(&bytes).unwrap();
    let x = Tensor::f32(vec![2], vec![1.0, 2.0]).unwrap();
    let e = run(
        &m,
        vec![
            ("m", Tensor::i64(vec![], vec![i64::MAX]).unwrap()),
            ("x", x),
        ],
    )
    .unwrap_err();
    assert!(
        e.contains("Loop_y") && e.contains("did not stop within the 1048576 iterations"),
        "{e}"
    );
    // A carried value doubling every iteration: stopped by the memory budget long before it
    // exhausts memory (without one, by the executor's tensor limit, as any op is).
    let mut m = Model::from_bytes(&looping(true, f32::INFINITY)).unwrap();
    m.plan
        .set_memory_budget(Arc::new(MemoryBudget::new(1 << 20)));
    let x = Tensor::f32(vec![2], vec![1.0, 2.0]).unwrap();
    let e = run(
        &m,
        vec![
            ("m", Tensor::i64(vec![], vec![i64::MAX]).unwrap()),
            ("x", x),
        ],
    )
    .unwrap_err();
    assert!(e.contains("budget"), "{e}");
}

#[test]
fn scan_runs_its_body_over_the_sequence_axis() {
    // Running sum over axis 1 of x [2, 3], scanned backwards, stacked along axis 1.
    let b = body(
        vec![
            node("Add", &["sum_in", "xi"], &["sum_out"], vec![]),
            node("Identity", &["sum_out"], &["each"], vec![]),
        ],
        &[("sum_in", 1), ("xi", 1)],
        &["sum_out", "each"],
    );
    let ints = |name: &str, v: &[i64]| AttributeProto {
        name: name.into(),
        r#type: attribute_type::INTS,
        ints: v.to_vec(),
        ..Default::default()
    };
    let bytes = model(
        vec![node(
            "Scan",
            &["zero", "x"],
            &["total", "sums"],
            vec![
                graph_attr("body", b),
                int_attr("num_scan_inputs", 1),
                ints("scan_input_axes", &[1]),
                ints("scan_input_directions", &[1]),
                ints("scan_output_axes", &[1]),
            ],
        )],
        vec![f32s("zero", &[2], &[0.0, 0.0])],
        vec![value_info("x", 1, &[2, 3])],
        &["total", "sums"],
    );
    let m = Model::from_bytes(&bytes).unwrap();
    let x = Tensor::f32(vec![2, 3], vec![1.0, 2.0, 3.0, 10.0, 20.0, 30.0]).unwrap();
    let out = run(&m, vec![("x", x)]).unwrap();
    assert_eq!(out[0].as_f32().unwrap(), &[6.0, 60.0]);
    assert_eq!(out[1].shape, vec![2, 3]);
    assert_eq!(out[1].as_f32().unwrap(), &[3.0, 5.0, 6.0, 30.0, 50.0, 60.0]);
}

/// Found by `fuzz.rs`: a scanned input without the axis to scan along.
#[test]
fn a_scan_over_a_scalar_is_an_error() {
    let b = body(
        vec![node("Identity", &["xi"], &["o"], vec![])],
        &[("xi", 1)],
        &["o"],
    );
    let bytes = model(
        vec![node(
            "Scan",
            &["x"],
            &["y"],
            vec![graph_attr("body", b), int_attr("num_scan_inputs", 1)],
        )],
        vec![],
        vec![value_info("x", 1, &[])],
        &["y"],
    );
    let m = Model::from_bytes(&bytes).unwrap();
    let e = run(&m, vec![("x", Tensor::scalar_f32(1.0))]).unwrap_err();
    assert!(e.contains("no axis to scan along"), "{e}");
}

/// An If whose then branch is an If whose then branch ... `depth` deep; every else branch
/// negates `x` directly.
fn nested(depth: usize) -> Vec<u8> {
    let leaf = body(vec![node("Neg", &["x"], &["y"], vec![])], &[], &["y"]);
    let mut g = leaf.clone();
    for _ in 0..depth {
        let n = node(
            "If",
            &["c"],
            &["y"],
            vec![
                graph_attr("then_branch", g),
                graph_attr("else_branch", leaf.clone()),
            ],
        );
        g = body(vec![n], &[], &["y"]);
    }
    model(
        g.node,
        vec![],
        vec![value_info("c", 9, &[]), value_info("x", 1, &[2])],
        &["y"],
    )
}

#[test]
fn bodies_nest_up_to_a_limit() {
    let m = Model::from_bytes(&nested(16)).unwrap();
    let x = Tensor::f32(vec![2], vec![1.0, 2.0]).unwrap();
    let y = run(&m, vec![("c", flag(true)), ("x", x)]).unwrap();
    assert_eq!(y[0].as_f32().unwrap(), &[-1.0, -2.0]);
    let e = Model::from_bytes(&nested(17)).err().unwrap().to_string();
    assert!(e.contains("nest more than 16"), "{e}");
    // Far deeper than that, the protobuf decoder's own recursion limit refuses the bytes.
    assert!(Model::from_bytes(&nested(200)).is_err());
}

#[test]
fn the_gpu_backend_refuses_control_flow_it_cannot_size() {
    let m = Arc::new(Model::from_bytes(&branching()).unwrap());
    let gpu = Device::Gpu(Gpu::simulated(1 << 30));
    let e = gpu
        .place("if", &m)
        .and_then(|p| p.engine(1, None))
        .and_then(|mut engine| {
            let x = Tensor::f32(vec![2], vec![3.0, 5.0]).unwrap();
            engine
                .run(vec![("c".into(), flag(true)), ("x".into(), x)])
                .map_err(|e| e.to_string())
        })
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("If") && e.contains("no GPU path"), "{e}");
}
