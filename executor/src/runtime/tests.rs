//! The runtime against a small real model: batching gives the same numbers as running alone,
//! admission sheds when it must, and knobs change while requests are in flight.

use super::*;
use crate::backend::CpuBackend;
use crate::proto::ModelProto;
use crate::tensor::DType;
use crate::zoo::builder::{Builder, value_info};
use prost::Message;
use std::sync::mpsc;

/// y = relu(x · W) with a symbolic batch dimension.
fn model() -> Arc<Model> {
    let mut b = Builder::new(7, false);
    let w = b.normal("w", &[4, 3], 1.0);
    let y = b.node("MatMul", &["x", &w], vec![]);
    let out = b.node("Relu", &[&y], vec![]);
    b.node_rename_last(&out, "y");
    let proto: ModelProto = b.finish(
        "tiny",
        13,
        vec![value_info("x", DType::F32, &[None, Some(4)])],
        vec![value_info("y", DType::F32, &[None, Some(3)])],
    );
    Arc::new(Model::from_bytes(&proto.encode_to_vec()).expect("tiny model imports"))
}

fn config(max_batch: usize, instances: usize, delay_ms: u64) -> TenantConfig {
    TenantConfig {
        name: "tiny".into(),
        max_batch,
        instances,
        threads_per_instance: 1,
        queue_capacity: 64,
        max_queue_delay: Duration::from_millis(delay_ms),
        slo: Duration::from_secs(10),
        slo_percentile: 99.0,
        max_request_rows: 16,
        device: Device::Cpu,
    }
}

fn input(i: usize) -> Vec<(String, Tensor)> {
    let v: Vec<f32> = (0..4).map(|j| (i * 4 + j) as f32 * 0.1 - 0.5).collect();
    vec![("x".into(), Tensor::f32(vec![1, 4], v).expect("tensor"))]
}

type Outcome = Result<Completed, RunError>;

fn submit(tenant: &Tenant, i: usize) -> mpsc::Receiver<Outcome> {
    let (tx, rx) = mpsc::channel();
    tenant
        .submit(input(i), Box::new(move |r| drop(tx.send(r))))
        .expect("accepted");
    rx
}

fn alone(model: &Model, i: usize) -> Vec<f32> {
    let out = model.plan.run(&CpuBackend::new(1), input(i)).expect("runs");
    out[0].1.as_f32().expect("f32").to_vec()
}

#[test]
fn batched_results_equal_results_alone() {
    let model = model();
    let tenant = Tenant::start(model.clone(), config(8, 1, 200));
    let pending: Vec<_> = (0..8).map(|i| submit(&tenant, i)).collect();
    let mut max_rows = 0;
    for (i, rx) in pending.into_iter().enumerate() {
        let done = rx.recv().expect("reply").expect("ok");
        max_rows = max_rows.max(done.batch_rows);
        assert_eq!(done.outputs[0].0, "y");
        assert_eq!(done.outputs[0].1.shape, vec![1, 3]);
        assert_eq!(
            done.outputs[0].1.as_f32().expect("f32"),
            alone(&model, i).as_slice()
        );
    }
    assert!(max_rows > 1, "requests were never batched");
    let w = tenant.stats().window();
    assert_eq!(w.completions, 8);
    assert!(w.batch_sizes.iter().skip(1).any(|&n| n > 0));
}

#[test]
fn a_full_queue_sheds_and_nothing_accepted_is_lost() {
    let mut c = config(100, 1, 10_000);
    c.queue_capacity = 3;
    let tenant = Tenant::start(model(), c);
    let pending: Vec<_> = (0..3).map(|i| submit(&tenant, i)).collect();
    let refused = tenant.submit(input(9), Box::new(|_| {}));
    assert!(
        matches!(refused, Err(Rejected::QueueFull(3))),
        "{refused:?}"
    );
    assert_eq!(tenant.stats().window().shed, 1);
    // Shutdown drains what was accepted.
    tenant.shutdown();
    for rx in pending {
        assert!(rx.recv().expect("reply").is_ok());
    }
    assert!(matches!(
        tenant.submit(input(0), Box::new(|_| {})),
        Err(Rejected::Closed)
    ));
}

#[test]
fn a_tenant_slower_than_its_slo_still_serves_an_empty_queue() {
    let tenant = Tenant::start(model(), config(1, 1, 0));
    submit(&tenant, 0).recv().expect("reply").expect("ok");
    tenant.set_slo(Duration::from_nanos(1), 99.0);
    submit(&tenant, 1).recv().expect("reply").expect("ok");
}

#[test]
fn a_request_that_would_wait_past_the_slo_is_shed() {
    // Batches of up to 100 rows held for 10 s: requests queue behind the first one.
    let mut c = config(100, 1, 10_000);
    c.max_queue_delay = Duration::from_millis(0);
    let tenant = Tenant::start(model(), c);
    submit(&tenant, 0).recv().expect("reply").expect("ok");
    tenant.set_knobs(100, 1, Duration::from_secs(10));
    tenant.set_slo(Duration::from_nanos(1), 99.0);
    // Idle and empty: admitted even though one batch already exceeds the SLO.
    let first = submit(&tenant, 1);
    let refused = tenant.submit(input(2), Box::new(|_| {}));
    assert!(
        matches!(refused, Err(Rejected::WouldMissSlo { .. })),
        "{refused:?}"
    );
    assert_eq!(tenant.stats().window().shed, 1);
    tenant.shutdown();
    assert!(first.recv().expect("reply").is_ok());
}

#[test]
fn knobs_change_while_serving_without_losing_requests() {
    let model = model();
    let tenant = Tenant::start(model.clone(), config(2, 1, 1));
    let mut pending = Vec::new();
    for round in 0..6 {
        tenant.set_knobs(1 + round % 4, 1 + round % 3, Duration::from_millis(1));
        pending.extend((0..10).map(|i| (i, submit(&tenant, i))));
    }
    assert_eq!(tenant.knobs(), (2, 3));
    for (i, rx) in pending {
        let done = rx.recv().expect("reply").expect("ok");
        assert_eq!(
            done.outputs[0].1.as_f32().expect("f32"),
            alone(&model, i).as_slice()
        );
    }
}

#[test]
fn invalid_and_oversized_requests_are_refused_before_queueing() {
    let tenant = Tenant::start(model(), config(4, 1, 0));
    let wrong = vec![(
        "x".to_string(),
        Tensor::f32(vec![1, 5], vec![0.0; 5]).expect("t"),
    )];
    assert!(matches!(
        tenant.submit(wrong, Box::new(|_| {})),
        Err(Rejected::Invalid(_))
    ));
    let big = vec![(
        "x".to_string(),
        Tensor::f32(vec![17, 4], vec![0.0; 68]).expect("t"),
    )];
    assert!(matches!(
        tenant.submit(big, Box::new(|_| {})),
        Err(Rejected::TooManyRows {
            rows: 17,
            limit: 16
        })
    ));
    assert_eq!(tenant.queue_depth(), 0);
}

/// A chain of `layers` MatMul+Relu layers on [batch, 8]: a model of as many steps (the Relu
/// fuses into its MatMul).
fn chain(layers: usize, seed: u64) -> Arc<Model> {
    let mut b = Builder::new(seed, false);
    let mut v = "x".to_string();
    for _ in 0..layers {
        let w = b.normal("w", &[8, 8], 0.4);
        let y = b.node("MatMul", &[&v, &w], vec![]);
        v = b.node("Relu", &[&y], vec![]);
    }
    b.node_rename_last(&v, "y");
    let proto: ModelProto = b.finish(
        "chain",
        13,
        vec![value_info("x", DType::F32, &[None, Some(8)])],
        vec![value_info("y", DType::F32, &[None, Some(8)])],
    );
    let model = Model::from_bytes(&proto.encode_to_vec()).expect("chain imports");
    assert_eq!(model.plan.steps.len(), layers);
    Arc::new(model)
}

fn chain_input(rows: usize, i: usize) -> Vec<(String, Tensor)> {
    let v: Vec<f32> = (0..rows * 8)
        .map(|j| ((i * 7 + j) % 13) as f32 * 0.1 - 0.6)
        .collect();
    vec![("x".into(), Tensor::f32(vec![rows, 8], v).expect("tensor"))]
}

fn close(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= 1e-5 * (1.0 + y.abs()))
}

#[test]
fn every_co_schedule_serves_the_plain_outputs() {
    use crate::gacer::Schedule;
    use crate::gacer::plan::{GacerPlan, StepRef, SyncPointer};
    let (a, b) = (chain(12, 1), model());
    let (na, nb) = (a.plan.steps.len(), b.plan.steps.len());
    // Seats 0 and 1 are a's two instances, 2 and 3 b's: b waits for a's third step, and a's
    // matrix products run in two pieces.
    let mut plan = GacerPlan::unregulated(&[na, na, nb, nb]);
    plan.splits[0].iter_mut().for_each(|k| *k = 2);
    plan.pointers.push(SyncPointer {
        waiter: StepRef { tenant: 2, step: 0 },
        after: StepRef { tenant: 0, step: 2 },
    });
    for schedule in [
        Schedule::Sequential,
        Schedule::MultiStream,
        Schedule::gacer(plan),
    ] {
        let name = schedule.name();
        let co = CoSchedule::new(schedule);
        let cfg = |n: &str| TenantConfig {
            name: n.into(),
            ..config(4, 2, 1)
        };
        let ta = Tenant::start_in(a.clone(), cfg("a"), Some(co.clone()));
        // b's seats after a's, so the plan's seat order holds.
        while co.seats().len() < 2 {
            std::thread::yield_now();
        }
        let tb = Tenant::start_in(b.clone(), cfg("b"), Some(co.clone()));
        let mut pending = Vec::new();
        for i in 0..24 {
            let (tx, rx) = mpsc::channel();
            let (tenant, input) = if i % 2 == 0 {
                (&ta, chain_input(1, i))
            } else {
                (&tb, input(i))
            };
            tenant
                .submit(input, Box::new(move |r| drop(tx.send(r))))
                .expect("accepted");
            pending.push((i, rx));
        }
        for (i, rx) in pending {
            let got = rx.recv().expect("replied").expect("ran");
            let got = got.outputs[0].1.as_f32().expect("f32").to_vec();
            let want = if i % 2 == 0 {
                let out = a
                    .plan
                    .run(&CpuBackend::new(1), chain_input(1, i))
                    .expect("runs");
                out[0].1.as_f32().expect("f32").to_vec()
            } else {
                alone(&b, i)
            };
            assert!(
                close(&got, &want),
                "{name} request {i}: {got:?} vs {want:?}"
            );
        }
        if name == "sequential" {
            assert_eq!(
                co.peak_concurrent_steps(),
                1,
                "sequential ran steps at once"
            );
        }
        assert_eq!(co.pointer_timeouts(), 0, "{name}");
        ta.shutdown();
        tb.shutdown();
        assert!(co.seats().iter().all(Option::is_none), "{name}: seats left");
    }
}

#[test]
fn a_pointer_holds_only_while_its_target_runs_a_batch() {
    use crate::gacer::Schedule;
    use crate::gacer::plan::{GacerPlan, StepRef, SyncPointer};
    let (long, short) = (chain(40, 2), chain(4, 3));
    let last = long.plan.steps.len() - 1;
    let mut plan = GacerPlan::unregulated(&[long.plan.steps.len(), short.plan.steps.len()]);
    let (after, waiter) = (
        StepRef {
            tenant: 0,
            step: last,
        },
        StepRef { tenant: 1, step: 0 },
    );
    plan.pointers.push(SyncPointer { waiter, after });
    let co = CoSchedule::traced(Schedule::gacer(plan));
    let (sa, sb) = (
        co.join("long", long.clone()),
        co.join("short", short.clone()),
    );
    // The target idle: the waiter runs at once (a wait would end in a timeout).
    sb.run(&short.plan, &CpuBackend::new(1), chain_input(2, 0), None)
        .expect("runs");
    assert_eq!(co.pointer_timeouts(), 0);
    // The target running: the waiter's step 0 starts only after the target's last step.
    std::thread::scope(|s| {
        s.spawn(|| {
            sa.run(&long.plan, &CpuBackend::new(1), chain_input(64, 1), None)
                .expect("runs");
        });
        while !co.trace().iter().any(|e| e.step.tenant == 0) {
            std::thread::yield_now();
        }
        sb.run(&short.plan, &CpuBackend::new(1), chain_input(2, 2), None)
            .expect("runs");
    });
    let trace = co.trace();
    let at = |step: StepRef, finished: bool, batch: u64| {
        trace
            .iter()
            .position(|e| e.step == step && e.finished == finished && e.batch == batch)
            .expect("in the trace")
    };
    assert!(at(after, true, 1) < at(waiter, false, 2), "{trace:?}");
    assert_eq!(co.pointer_timeouts(), 0);
}

#[test]
fn the_planner_publishes_a_plan_for_the_seats_and_follows_the_mix() {
    use crate::gacer::Schedule;
    use crate::gacer::plan::GacerPlan;
    let co = CoSchedule::new(Schedule::gacer(GacerPlan::unregulated(&[])));
    let mut planner = Planner::new(co.clone(), &Device::Cpu, 2, 1);
    let models = [chain(6, 4), model(), chain(3, 5)];
    let cfg = |n: &str| TenantConfig {
        name: n.into(),
        ..config(4, 1, 1)
    };
    let mut tenants = Vec::new();
    for (i, m) in models.iter().enumerate() {
        tenants.push(Tenant::start_in(
            m.clone(),
            cfg(&format!("t{i}")),
            Some(co.clone()),
        ));
        while co.seats().len() <= i {
            std::thread::yield_now();
        }
    }
    // The search runs in the background: tick until it is published (bounded, not timed).
    let published = |planner: &mut Planner| {
        (0..500).any(|_| {
            let done = planner.tick().expect("profiles");
            if !done {
                std::thread::sleep(Duration::from_millis(10));
            }
            done
        })
    };
    assert!(published(&mut planner), "no plan for three seats");
    assert!(co.fitting_plan().is_some());
    assert!(
        !planner.tick().expect("ticks"),
        "the same mix is planned again"
    );
    // The middle replica leaves: its free seat is a tenant of no steps in the next plan.
    tenants.remove(1).shutdown();
    assert!(
        co.fitting_plan().is_none(),
        "a plan for the old mix still applies"
    );
    assert!(published(&mut planner), "no plan after a replica left");
    assert!(co.fitting_plan().is_some());
    // Serving follows it with the right numbers.
    let (tx, rx) = mpsc::channel();
    tenants[1]
        .submit(chain_input(1, 9), Box::new(move |r| drop(tx.send(r))))
        .expect("accepted");
    let got = rx.recv().expect("replied").expect("ran");
    let want = models[2]
        .plan
        .run(&CpuBackend::new(1), chain_input(1, 9))
        .expect("runs");
    let (got, want) = (
        got.outputs[0].1.as_f32().expect("f32"),
        want[0].1.as_f32().expect("f32"),
    );
    assert!(close(got, want), "{got:?} vs {want:?}");
    // A tighter SLO is a new latency bound for that seat's batches, so a new mix to plan for.
    assert!(!planner.tick().expect("ticks"), "nothing changed yet");
    tenants[0].set_slo(Duration::from_secs(2), 99.0);
    let (tx, rx) = mpsc::channel();
    tenants[0]
        .submit(chain_input(1, 3), Box::new(move |r| drop(tx.send(r))))
        .expect("accepted");
    rx.recv().expect("replied").expect("ran");
    let bounds: Vec<_> = co
        .seat_models()
        .into_iter()
        .map(|s| s.and_then(|s| s.latency_bound))
        .collect();
    assert!(bounds.contains(&Some(Duration::from_secs(1))), "{bounds:?}");
    assert!(published(&mut planner), "no plan after the SLO moved");
}

/// An instance whose device cannot serve (here a GPU on which its weights do not fit) answers
/// each request with a device error; the tenant does not crash, and a tenant on the CPU beside
/// it serves.
#[test]
fn an_instance_without_a_device_fails_its_requests_with_the_reason() {
    let broken = Tenant::start(
        model(),
        TenantConfig {
            device: Device::Gpu(crate::device::Gpu::simulated(0)),
            ..config(4, 2, 1)
        },
    );
    let fine = Tenant::start(model(), config(4, 1, 1));
    let m = model();
    for i in 0..3 {
        match submit(&broken, i).recv_timeout(Duration::from_secs(10)) {
            Ok(Err(RunError::Device(why))) => assert!(!why.is_empty()),
            other => panic!("expected a device error, got {other:?}"),
        }
        let out = submit(&fine, i).recv_timeout(Duration::from_secs(10));
        let out = out.expect("answered").expect("served");
        assert_eq!(out.outputs[0].1.as_f32().expect("f32"), alone(&m, i));
    }
    assert_eq!(broken.stats().totals().errors, 3);
}

/// y = x · W with 256 KiB of weights and small activations, planned for a GPU.
fn wide_gpu_model() -> Arc<Model> {
    let mut b = Builder::new(9, false);
    let w = b.normal("w", &[1024, 64], 0.1);
    let y = b.node("MatMul", &["x", &w], vec![]);
    b.node_rename_last(&y, "y");
    let proto: ModelProto = b.finish(
        "wide",
        13,
        vec![value_info("x", DType::F32, &[None, Some(1024)])],
        vec![value_info("y", DType::F32, &[None, Some(64)])],
    );
    let bytes = proto.encode_to_vec();
    Arc::new(Model::from_bytes_for(&bytes, crate::Target::Gpu).expect("wide model imports"))
}

/// On a (simulated) GPU, the instances of a replica share one copy of its weights: two instances
/// hold the weights once plus two small arenas, and every batch is computed on the device as the
/// CPU computes it. A budget too small for the weights fails the replica's requests with the
/// numbers while a CPU replica beside it serves.
#[test]
fn gpu_instances_share_one_copy_of_the_weights() {
    let m = wide_gpu_model();
    let x = |i: usize| {
        let v: Vec<f32> = (0..1024)
            .map(|j| ((i * 31 + j) % 17) as f32 * 0.1 - 0.8)
            .collect();
        vec![(
            "x".to_string(),
            Tensor::f32(vec![1, 1024], v).expect("tensor"),
        )]
    };
    let tenant = Tenant::start(
        m.clone(),
        TenantConfig {
            device: Device::Gpu(crate::device::Gpu::simulated(u64::MAX)),
            ..config(4, 2, 1)
        },
    );
    let pending: Vec<_> = (0..12)
        .map(|i| {
            let (tx, rx) = mpsc::channel();
            tenant
                .submit(x(i), Box::new(move |r| drop(tx.send(r))))
                .expect("accepted");
            rx
        })
        .collect();
    for (i, rx) in pending.into_iter().enumerate() {
        let done = rx.recv_timeout(Duration::from_secs(30)).expect("answered");
        let out = done.expect("served on the device");
        let want = m.plan.run(&CpuBackend::new(1), x(i)).expect("cpu");
        let (got, want) = (
            out.outputs[0].1.as_f32().expect("f32"),
            want[0].1.as_f32().expect("f32"),
        );
        assert!(
            got.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-4),
            "request {i}"
        );
    }
    let weights = 1024 * 64 * 4u64;
    let held = tenant.device_bytes();
    assert!(
        held > weights && held - weights < weights,
        "{held} bytes for {weights} of weights: one copy plus two arenas, not two copies"
    );
    let starved = Tenant::start(
        m.clone(),
        TenantConfig {
            device: Device::Gpu(crate::device::Gpu::simulated(weights / 2)),
            ..config(4, 1, 1)
        },
    );
    let (tx, rx) = mpsc::channel();
    starved
        .submit(x(0), Box::new(move |r| drop(tx.send(r))))
        .expect("accepted");
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(Err(RunError::Device(why))) => assert!(why.contains("over budget"), "{why}"),
        other => panic!("expected an over-budget device error, got {other:?}"),
    }
    let fine = Tenant::start(m, config(4, 1, 1));
    let (tx, rx) = mpsc::channel();
    fine.submit(x(1), Box::new(move |r| drop(tx.send(r))))
        .expect("accepted");
    assert!(
        rx.recv_timeout(Duration::from_secs(10))
            .expect("answered")
            .is_ok()
    );
}

/// A model whose batches panic (an injected fault: no real model is known to trigger one)
/// fails the requests each crashed batch held, with a device error (a 5xx), tells the crash
/// hook once with the reason, and replaces the instance: once the fault is gone the same
/// tenant serves again, and a tenant beside it serves throughout.
#[test]
fn a_crashing_batch_fails_its_requests_and_the_instance_is_replaced() {
    let name = "crashing";
    let crashing = Tenant::start(
        model(),
        TenantConfig {
            name: name.into(),
            ..config(4, 2, 1)
        },
    );
    let fine = Tenant::start(model(), config(4, 1, 1));
    let (heard, hears) = mpsc::channel();
    crashing.on_crash(Box::new(move |why| drop(heard.send(why))));
    faults::panic_in_batches_of(name, true);
    let m = model();
    for i in 0..4 {
        match submit(&crashing, i).recv_timeout(Duration::from_secs(10)) {
            Ok(Err(RunError::Device(why))) => {
                assert!(
                    why.contains("crashed") && why.contains("injected fault"),
                    "{why}"
                )
            }
            other => panic!("expected the crash as a device error, got {other:?}"),
        }
        let out = submit(&fine, i).recv_timeout(Duration::from_secs(10));
        assert_eq!(
            out.expect("answered").expect("served").outputs[0]
                .1
                .as_f32()
                .expect("f32"),
            alone(&m, i)
        );
    }
    let why = hears.recv_timeout(Duration::from_secs(10)).expect("told");
    assert!(why.contains("injected fault"), "{why}");
    assert!(hears.try_recv().is_err(), "the hook is told once");
    assert!(crashing.crashed().is_some_and(|c| c == why));
    assert_eq!(crashing.stats().totals().errors, 4);
    // The replaced instances serve once the model stops crashing them.
    faults::panic_in_batches_of(name, false);
    let out = submit(&crashing, 5).recv_timeout(Duration::from_secs(10));
    assert_eq!(
        out.expect("answered").expect("served").outputs[0]
            .1
            .as_f32()
            .expect("f32"),
        alone(&m, 5)
    );
    // A hook set after the crash hears of it at once.
    let (late, hears_late) = mpsc::channel();
    crashing.on_crash(Box::new(move |why| drop(late.send(why))));
    assert!(hears_late.try_recv().is_ok_and(|w| w == why));
}

/// A real ONNX model over x: [batch, 4] built by `body` (which returns its output's name).
fn over_x(body: impl FnOnce(&mut Builder) -> String) -> Arc<Model> {
    let mut b = Builder::new(3, false);
    let y = body(&mut b);
    b.node_rename_last(&y, "y");
    let proto: ModelProto = b.finish(
        "mixing",
        13,
        vec![value_info("x", DType::F32, &[None, Some(4)])],
        vec![value_info("y", DType::F32, &[None, Some(4)])],
    );
    Arc::new(Model::from_bytes(&proto.encode_to_vec()).expect("imports"))
}

/// Models whose rows meet: each request would see the others' data if they shared a batch. The
/// runtime never batches them (every request runs alone and gets what it gets alone), and
/// says why; a per-row model beside them still batches.
#[test]
fn models_whose_rows_meet_never_batch_requests_together() {
    use crate::zoo::builder::{attr_int, attr_ints};
    let mixing: Vec<(&str, Arc<Model>)> = vec![
        // x minus the mean over the batch (a normalisation across requests).
        (
            "ReduceMean",
            over_x(|b| {
                let mean = b.node(
                    "ReduceMean",
                    &["x"],
                    vec![attr_ints("axes", &[0]), attr_int("keepdims", 1)],
                );
                b.node("Sub", &["x", &mean], vec![])
            }),
        ),
        // A softmax down the batch axis.
        (
            "Softmax",
            over_x(|b| b.node("Softmax", &["x"], vec![attr_int("axis", 0)])),
        ),
        // The batch folded into one row, mixed by a weight, and unfolded.
        (
            "Flatten",
            over_x(|b| {
                let flat = b.node("Flatten", &["x"], vec![attr_int("axis", 0)]);
                let w = b.normal("w", &[1, 1], 1.0);
                let mixed = b.node("Mul", &[&flat, &w], vec![]);
                let rolled = b.node("Add", &[&mixed, &flat], vec![]);
                let shape = b.const_i64("shape", &[-1, 4]);
                let back = b.node("Reshape", &[&rolled, &shape], vec![]);
                let total = b.node("ReduceSum", &[&flat], vec![attr_int("keepdims", 1)]);
                b.node("Add", &[&back, &total], vec![])
            }),
        ),
    ];
    let rows = |i: usize| -> Vec<(String, Tensor)> {
        let v: Vec<f32> = (0..4).map(|j| (i * 4 + j) as f32 - 3.0).collect();
        vec![("x".into(), Tensor::f32(vec![1, 4], v).expect("t"))]
    };
    for (what, model) in mixing {
        // Two requests stacked give each something other than it gets alone: the model does mix.
        let alone: Vec<Vec<f32>> = (0..2)
            .map(|i| {
                let out = model.plan.run(&CpuBackend::new(1), rows(i)).expect("runs");
                out[0].1.as_f32().expect("f32").to_vec()
            })
            .collect();
        let mut both = rows(0);
        both[0].1 = Tensor::cat_rows(&[&rows(0)[0].1, &rows(1)[0].1]).expect("cat");
        let together = model.plan.run(&CpuBackend::new(1), both).expect("runs");
        assert_ne!(
            &together[0].1.as_f32().expect("f32")[..4],
            alone[0].as_slice(),
            "{what}: the model must mix rows for this test to mean anything"
        );
        let tenant = Tenant::start(model.clone(), config(8, 1, 200));
        let why = tenant.batch_refusal().map(str::to_string);
        assert!(
            why.as_deref().is_some_and(|w| w.contains("node")),
            "{what}: {why:?}"
        );
        assert_eq!(tenant.knobs().0, 1, "{what}");
        tenant.set_knobs(8, 1, Duration::from_millis(200));
        assert_eq!(tenant.knobs().0, 1, "{what}: knobs cannot turn batching on");
        let pending: Vec<_> = (0..6)
            .map(|i| {
                let (tx, rx) = mpsc::channel();
                tenant
                    .submit(rows(i), Box::new(move |r| drop(tx.send(r))))
                    .expect("accepted");
                rx
            })
            .collect();
        for (i, rx) in pending.into_iter().enumerate() {
            let done = rx.recv().expect("reply").expect("ok");
            assert_eq!(done.batch_rows, 1, "{what}: request {i} shared a batch");
            let expected = model.plan.run(&CpuBackend::new(1), rows(i)).expect("runs");
            assert_eq!(
                done.outputs[0].1.as_f32().expect("f32"),
                expected[0].1.as_f32().expect("f32"),
                "{what}: request {i}"
            );
        }
    }
    // The per-row model beside them still batches.
    let tenant = Tenant::start(model(), config(8, 1, 200));
    assert_eq!(tenant.batch_refusal(), None);
    assert_eq!(tenant.knobs().0, 8);
}
