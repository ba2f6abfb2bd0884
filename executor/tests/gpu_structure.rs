//! The structure of the GPU path, on the simulated device (it runs everywhere): for every zoo
//! model, a batch is exactly one copy up per input, one copy down per output and one host wait,
//! with no step falling back to the host; for a three-tenant GACER mix, the streams wait on each
//! other exactly where the plan has a pointer, resized steps are launches over parts of one
//! buffer, and every output equals the CPU backend's.

use cotenant_executor::device::Gpu;
use cotenant_executor::gacer::run::TraceKind;
use cotenant_executor::gacer::{
    CoRunOptions, GacerPlan, Schedule, StepRef, Stop, SyncPointer, TenantWork, co_run,
};
use cotenant_executor::gpu::api::{DeviceApi, EventId, StreamId};
use cotenant_executor::gpu::{
    Alone, Budget, Call, Instance, Recorder, SimDevice, StepKind, Weights,
};
use cotenant_executor::proto::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, attribute_type,
};
use cotenant_executor::tensor_proto::encode_tensor;
use cotenant_executor::zoo::{self, ZooOptions};
use cotenant_executor::{CpuBackend, Device, Model, Target, Tensor};
use prost::Message;
use std::collections::HashMap;
use std::sync::Arc;

mod common;

use common::proto::value_info;

fn zoo_model(name: &str) -> Arc<Model> {
    let bytes = zoo::build(name, &ZooOptions::default())
        .expect("zoo model builds")
        .encode_to_vec();
    Arc::new(Model::from_bytes_for(&bytes, Target::Gpu).expect("zoo model imports"))
}

fn inputs(m: &Model, batch: usize, seed: u64) -> Vec<(String, Tensor)> {
    let mut rng = zoo::Rng::new(seed);
    m.plan
        .example_inputs(batch)
        .into_iter()
        .map(|(n, t)| {
            let t = match t.dtype() {
                // Token ids: any id below the vocabulary.
                cotenant_executor::DType::I64 => Tensor::i64(
                    t.shape.clone(),
                    (0..t.len())
                        .map(|_| (rng.next_u64() % 1000) as i64)
                        .collect(),
                ),
                _ => Tensor::f32(
                    t.shape.clone(),
                    (0..t.len()).map(|_| rng.normal()).collect(),
                ),
            };
            (n, t.expect("same shape"))
        })
        .collect()
}

/// Largest difference relative to the reference's magnitude (at least 1).
fn rel_diff(a: &Tensor, b: &Tensor) -> f32 {
    let (a, b) = (a.as_f32().expect("f32"), b.as_f32().expect("f32"));
    let scale = b.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
        / scale
}

fn recorded_device() -> (Arc<Recorder>, Arc<dyn DeviceApi>) {
    let sim: Arc<dyn DeviceApi> = Arc::new(SimDevice::h200());
    let rec = Arc::new(Recorder::new(sim));
    let api: Arc<dyn DeviceApi> = rec.clone();
    (rec, api)
}

fn count(calls: &[Call], f: impl Fn(&Call) -> bool) -> usize {
    calls.iter().filter(|c| f(c)).count()
}

/// Every zoo model at batch 2: no host fallback; from the second batch on, one copy up per input
/// into the arena, one copy down per output, one host wait, no upload, no wait on another stream;
/// all work on the instance's own stream; outputs equal to the CPU backend's.
#[test]
fn every_zoo_model_runs_a_batch_with_one_copy_each_way_and_one_host_wait() {
    for name in zoo::NAMES {
        let model = zoo_model(name);
        let batch = inputs(&model, 2, 3);
        let want = model
            .plan
            .run(&CpuBackend::new(2), batch.clone())
            .expect("the CPU runs it");
        let (rec, api) = recorded_device();
        let budget = Budget::new(*name, u64::MAX);
        let weights =
            Weights::upload(api.clone(), &model.plan.constants, &budget).expect("weights");
        let mut inst = Instance::new(api, model.clone(), weights, budget, None).expect("instance");
        let shapes: Vec<Vec<usize>> = batch.iter().map(|(_, t)| t.shape.clone()).collect();
        let layout = inst.layout(&shapes).expect("layout");
        assert_eq!(
            layout.fallbacks(&model.plan),
            vec![],
            "{name}: host fallbacks"
        );
        inst.run(batch.clone(), &Alone).expect("first batch");
        rec.take();
        let got = inst.run(batch.clone(), &Alone).expect("second batch");
        let calls = rec.take();
        for ((n, g), (_, w)) in got.iter().zip(&want) {
            let d = rel_diff(g, w);
            assert!(d <= 1e-5, "{name} {n}: differs from the CPU by {d}");
        }
        let ups = count(&calls, |c| matches!(c, Call::CopyHtoD { .. }));
        let downs = count(&calls, |c| matches!(c, Call::CopyDtoH { .. }));
        let syncs = count(&calls, |c| matches!(c, Call::Sync { .. }));
        let uploads = count(&calls, |c| matches!(c, Call::Upload { .. }));
        let waits = count(&calls, |c| matches!(c, Call::Wait { .. }));
        let work = count(&calls, |c| {
            matches!(c, Call::Launch { .. } | Call::Gemm { .. })
        });
        assert_eq!(
            (ups, downs, syncs, uploads, waits),
            (batch.len(), want.len(), 1, 0, 0),
            "{name}: (copies up, copies down, host waits, uploads, waits)"
        );
        // Every op of the batch is on the device, and the host waits only at the end.
        let device_steps = layout
            .kinds
            .iter()
            .filter(|k| **k == StepKind::Device)
            .count();
        assert!(
            work >= device_steps,
            "{name}: {work} launches for {device_steps} steps"
        );
        assert!(matches!(calls.last(), Some(Call::Sync { .. })), "{name}");
        let streams: std::collections::HashSet<StreamId> =
            calls.iter().filter_map(Call::stream).collect();
        assert_eq!(streams.len(), 1, "{name}: one stream");
        eprintln!(
            "{name}: {work} launches, {} steps, arena {} MiB",
            model.plan.steps.len(),
            inst.arena_bytes() >> 20
        );
    }
}

/// What one round of a mix issued on each stream, with every call attributed to the step it
/// belongs to (work items counted from each step's lowering).
struct StreamLog {
    /// (call, step it precedes or belongs to).
    calls: Vec<(Call, usize)>,
}

/// Splits the calls of one stream by step, knowing how many work items each step issues.
fn attribute(calls: &[Call], work_per_step: &[usize]) -> StreamLog {
    let mut out = Vec::new();
    let (mut step, mut done_in_step) = (0usize, 0usize);
    // Skip steps without work (host or alias) so a call lands on the next step with work.
    let skip = |step: &mut usize, done: &mut usize| {
        while *step < work_per_step.len() && *done >= work_per_step[*step] {
            *step += 1;
            *done = 0;
        }
    };
    skip(&mut step, &mut done_in_step);
    for c in calls {
        match c {
            Call::Launch { .. } | Call::Gemm { .. } => {
                out.push((c.clone(), step));
                done_in_step += 1;
                if done_in_step >= work_per_step.get(step).copied().unwrap_or(0) {
                    // A record right after the step's last work item belongs to that step.
                    out.push((
                        Call::Sync {
                            event: EventId(u32::MAX),
                        },
                        step,
                    ));
                    step += 1;
                    done_in_step = 0;
                    skip(&mut step, &mut done_in_step);
                }
            }
            other => out.push((other.clone(), step)),
        }
    }
    StreamLog { calls: out }
}

#[test]
fn a_three_tenant_gacer_mix_waits_exactly_at_its_pointers_and_resizes_in_place() {
    let names = ["resnet18", "mobilenet_v2", "bert"];
    let models: Vec<Arc<Model>> = names.iter().map(|n| zoo_model(n)).collect();
    let works: Vec<TenantWork> = names
        .iter()
        .zip(&models)
        .enumerate()
        .map(|(i, (n, m))| TenantWork {
            name: n.to_string(),
            model: m.clone(),
            inputs: inputs(m, 1, i as u64 + 5),
        })
        .collect();
    // Each tenant's work per step, whole and in two pieces, from its lowering.
    let probe: Arc<dyn DeviceApi> = Arc::new(SimDevice::h200());
    let mut kinds = Vec::new();
    let mut work_whole = Vec::new();
    let mut work_split = Vec::new();
    let mut splittable = Vec::new();
    for w in &works {
        let budget = Budget::new(w.name.clone(), u64::MAX);
        let weights =
            Weights::upload(probe.clone(), &w.model.plan.constants, &budget).expect("weights");
        let mut inst =
            Instance::new(probe.clone(), w.model.clone(), weights, budget, None).expect("instance");
        let shapes: Vec<Vec<usize>> = w.inputs.iter().map(|(_, t)| t.shape.clone()).collect();
        let layout = inst.layout(&shapes).expect("layout");
        let n = w.model.plan.steps.len();
        let count = |pieces: usize| -> Vec<usize> {
            (0..n)
                .map(|s| match layout.kinds[s] {
                    StepKind::Device => inst
                        .step_work(&layout, s, pieces)
                        .expect("lowers")
                        .iter()
                        .map(Vec::len)
                        .sum(),
                    _ => 0,
                })
                .collect()
        };
        work_whole.push(count(1));
        work_split.push(count(2));
        splittable.push(
            (0..n)
                .map(|s| layout.max_pieces[s] >= 2)
                .collect::<Vec<_>>(),
        );
        kinds.push(layout.kinds.clone());
    }
    // The plan: every resizable step in two pieces; pointers from each tenant's device steps at
    // a few places to the other tenants' device steps.
    let counts: Vec<usize> = models.iter().map(|m| m.plan.steps.len()).collect();
    let mut plan = GacerPlan::unregulated(&counts);
    for (t, can) in splittable.iter().enumerate() {
        for (s, &split) in can.iter().enumerate() {
            if split {
                plan.splits[t][s] = 2;
            }
        }
    }
    let device_steps = |t: usize| -> Vec<usize> {
        (0..counts[t])
            .filter(|&s| kinds[t][s] == StepKind::Device)
            .collect()
    };
    let (d0, d1, d2) = (device_steps(0), device_steps(1), device_steps(2));
    let ptr = |wt: usize, ws: usize, at: usize, as_: usize| SyncPointer {
        waiter: StepRef {
            tenant: wt,
            step: ws,
        },
        after: StepRef {
            tenant: at,
            step: as_,
        },
    };
    plan.pointers = vec![
        ptr(1, d1[3], 0, d0[2]),
        ptr(1, d1[d1.len() / 2], 0, d0[d0.len() / 2]),
        ptr(2, d2[2], 1, d1[4]),
        ptr(0, d0[d0.len() - 2], 2, d2[1]),
    ];
    plan.validate(&counts).expect("an acyclic plan");
    let (rec, api) = recorded_device();
    let gpu = Gpu {
        api: api.clone(),
        ..Gpu::simulated(u64::MAX)
    };
    let opts = CoRunOptions {
        threads: 2,
        warmup_rounds: 0,
        stop: Stop::Rounds(1),
        trace: true,
        device: Device::Gpu(gpu),
    };
    let report = co_run(&works, &Schedule::gacer(plan.clone()), &opts).expect("the mix runs");
    let calls = rec.take();
    // The device timeline honours every pointer: the waiter starts after its target finished.
    let at = |step: StepRef, kind: TraceKind| {
        report
            .trace
            .iter()
            .position(|e| e.step == step && e.kind == kind)
            .unwrap_or_else(|| panic!("{step:?} {kind:?} missing from the trace"))
    };
    for p in &plan.pointers {
        assert!(
            at(p.after, TraceKind::Finish) < at(p.waiter, TraceKind::Start),
            "{p:?} not honoured on the device"
        );
    }
    // Outputs equal each model's alone on the CPU.
    for (w, r) in works.iter().zip(&report.tenants) {
        let want = w
            .model
            .plan
            .run(&CpuBackend::new(2), w.inputs.clone())
            .expect("cpu");
        for ((n, g), (_, e)) in r.outputs.iter().zip(&want) {
            let d = rel_diff(g, e);
            assert!(d <= 1e-5, "{} {n}: differs from the CPU by {d}", w.name);
        }
    }
    // Streams in tenant order: the order of each tenant's first copy up.
    let mut streams: Vec<StreamId> = Vec::new();
    for c in &calls {
        if let Call::CopyHtoD { stream, .. } = c
            && !streams.contains(stream)
        {
            streams.push(*stream);
        }
    }
    assert_eq!(streams.len(), 3, "one stream per tenant");
    let per_stream: Vec<Vec<Call>> = streams
        .iter()
        .map(|s| {
            calls
                .iter()
                .filter(|c| c.stream() == Some(*s))
                .cloned()
                .collect()
        })
        .collect();
    // Work issued equals the plan's pieces, step by step.
    for t in 0..3 {
        let want: usize = (0..counts[t])
            .map(|s| {
                if plan.splits[t][s] == 2 {
                    work_split[t][s]
                } else {
                    work_whole[t][s]
                }
            })
            .sum();
        let got = count(&per_stream[t], |c| {
            matches!(c, Call::Launch { .. } | Call::Gemm { .. })
        });
        assert_eq!(got, want, "tenant {t}: work items");
    }
    let logs: Vec<StreamLog> = (0..3)
        .map(|t| {
            let per_step: Vec<usize> = (0..counts[t])
                .map(|s| {
                    if plan.splits[t][s] == 2 {
                        work_split[t][s]
                    } else {
                        work_whole[t][s]
                    }
                })
                .collect();
            attribute(&per_stream[t], &per_step)
        })
        .collect();
    // Each stream's waits: exactly the pointers whose waiter it is, before the waiter step, on
    // the event the target stream records right after the target step.
    // Events recorded right after a step's last work item (its timing end, its signal) belong to
    // that step.
    let mut recorded_after: HashMap<EventId, (usize, usize)> = HashMap::new();
    for (t, log) in logs.iter().enumerate() {
        let mut after: Option<usize> = None;
        for (c, step) in &log.calls {
            match c {
                Call::Sync { event } if event.0 == u32::MAX => after = Some(*step),
                Call::Record { event, .. } => {
                    if let Some(s) = after {
                        recorded_after.insert(*event, (t, s));
                    }
                }
                _ => after = None,
            }
        }
    }
    let mut waits_seen: Vec<SyncPointer> = Vec::new();
    for (t, log) in logs.iter().enumerate() {
        for (c, step) in &log.calls {
            if let Call::Wait { event, .. } = c {
                let (at, as_) = *recorded_after
                    .get(event)
                    .unwrap_or_else(|| panic!("tenant {t} waits on an event no step records"));
                waits_seen.push(ptr(t, *step, at, as_));
            }
        }
    }
    waits_seen.sort();
    let mut want = plan.pointers.clone();
    want.sort();
    assert_eq!(waits_seen, want, "waits are exactly the plan's pointers");
    // One copy up per input, one down per output, one host wait per tenant.
    assert_eq!(count(&calls, |c| matches!(c, Call::CopyHtoD { .. })), 3);
    assert_eq!(count(&calls, |c| matches!(c, Call::CopyDtoH { .. })), 3);
    assert_eq!(count(&calls, |c| matches!(c, Call::Sync { .. })), 3);
    // A resized matrix product's pieces write parts of one buffer, side by side.
    let mut checked = 0;
    for log in &logs {
        let mut gemms: HashMap<usize, Vec<(u64, u64)>> = HashMap::new();
        for (c, step) in &log.calls {
            if let Call::Gemm { gemm, .. } = c {
                gemms
                    .entry(*step)
                    .or_default()
                    .push((gemm.c.offset, gemm.c.buffer.0 as u64));
            }
        }
        for (_, pieces) in gemms {
            if pieces.len() == 2 {
                assert_eq!(pieces[0].1, pieces[1].1, "pieces in one buffer");
                assert_ne!(pieces[0].0, pieces[1].0, "pieces at different offsets");
                checked += 1;
            }
        }
    }
    assert!(checked > 10, "only {checked} resized products seen");
}

/// A one-input model `x` [2, 6] → Relu → `op` (with constant `consts` as its later inputs).
fn relu_then(op: &str, consts: Vec<(&str, Tensor)>, attrs: Vec<AttributeProto>) -> Arc<Model> {
    let node = |op: &str, ins: Vec<String>, out: &str, attrs| NodeProto {
        input: ins,
        output: vec![out.into()],
        name: out.into(),
        op_type: op.into(),
        attribute: attrs,
        ..Default::default()
    };
    let mut ins = vec!["r".to_string()];
    ins.extend(consts.iter().map(|(n, _)| n.to_string()));
    let graph = GraphProto {
        node: vec![
            node("Relu", vec!["x".into()], "r", vec![]),
            node(op, ins, "y", attrs),
        ],
        initializer: consts.iter().map(|(n, t)| encode_tensor(n, t)).collect(),
        input: vec![value_info("x", 1, &[2, 6])],
        output: vec![value_info("y", 1, &[])],
        ..Default::default()
    };
    let bytes = ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 18,
        }],
        graph: Some(graph),
        ..Default::default()
    }
    .encode_to_vec();
    Arc::new(Model::from_bytes_for(&bytes, Target::Gpu).expect("imports"))
}

/// Operators with no device lowering (TopK, CumSum, Einsum, ...) run on the host between a copy
/// down and a copy up, and give the CPU's answer. NonZero's output size depends on the data,
/// which a memory plan made from shapes cannot know: a batch whose count differs from the
/// plan's fails with an error saying so, never a wrong answer.
#[test]
fn operators_without_a_device_lowering_run_on_the_host_between_copies() {
    let x = Tensor::f32(
        vec![2, 6],
        vec![3., -1., 2., 7., 0., 5., 1., 1., -2., 4., 9., 0.],
    )
    .unwrap();
    let k = Tensor::i64(vec![1], vec![3]).unwrap();
    let axis = Tensor::i64(vec![], vec![1]).unwrap();
    let cases = [
        ("TopK", relu_then("TopK", vec![("k", k)], vec![])),
        ("CumSum", relu_then("CumSum", vec![("axis", axis)], vec![])),
        (
            "Einsum",
            relu_then(
                "Einsum",
                vec![],
                vec![AttributeProto {
                    name: "equation".into(),
                    r#type: attribute_type::STRING,
                    s: b"ij->ji".to_vec(),
                    ..Default::default()
                }],
            ),
        ),
    ];
    let run_on_gpu = |model: &Arc<Model>, x: &Tensor| {
        let (_, api) = recorded_device();
        let budget = Budget::new("host ops", u64::MAX);
        let weights =
            Weights::upload(api.clone(), &model.plan.constants, &budget).expect("weights");
        let mut inst = Instance::new(api, model.clone(), weights, budget, None).expect("instance");
        let layout = inst.layout(&[vec![2, 6]]).expect("layout");
        let fallbacks: Vec<String> = layout
            .fallbacks(&model.plan)
            .into_iter()
            .map(|(_, op, _)| op)
            .collect();
        (fallbacks, inst.run(vec![("x".into(), x.clone())], &Alone))
    };
    for (op, model) in &cases {
        let want = model
            .plan
            .run(&CpuBackend::new(1), vec![("x".into(), x.clone())])
            .expect("the CPU runs it");
        let (fallbacks, got) = run_on_gpu(model, &x);
        assert_eq!(fallbacks, vec![op.to_string()], "{op}");
        let got = got.unwrap_or_else(|e| panic!("{op}: {e}"));
        assert_eq!(got[0].1, want[0].1, "{op}");
    }
    let non_zero = relu_then("NonZero", vec![], vec![]);
    let (fallbacks, got) = run_on_gpu(&non_zero, &x);
    assert_eq!(fallbacks, vec!["NonZero".to_string()]);
    let e = got
        .expect_err("a count the plan could not know")
        .to_string();
    assert!(e.contains("planned for"), "{e}");
}

/// The device kernels are f32 only: a plan that makes or reads float16/bfloat16 is refused with
/// an error naming the node, never run with the wrong element size.
#[test]
fn float16_is_refused_naming_the_node() {
    use cotenant_executor::gpu::layout;
    let to_half = relu_then("Cast", vec![], vec![common::proto::int_attr("to", 10)]);
    let half_bias = cotenant_executor::ops::elementwise::cast(
        &Tensor::f32(vec![6], vec![1.0; 6]).unwrap(),
        cotenant_executor::DType::BF16,
    );
    let reads_half = relu_then("Add", vec![("b", half_bias)], vec![]);
    for (model, how) in [(to_half, "makes"), (reads_half, "reads")] {
        let e = layout::build(&model.plan, &[vec![2, 6]])
            .err()
            .expect("refused")
            .to_string();
        assert!(
            e.contains("step y") && e.contains(how) && e.contains("float16/bfloat16"),
            "{e}"
        );
    }
}
