//! The runtime against a small real model: batching gives the same numbers as running alone,
//! admission sheds when it must, and knobs change while requests are in flight.

use super::*;
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
        max_request_rows: 16,
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
    tenant.set_slo(Duration::from_nanos(1));
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
    tenant.set_slo(Duration::from_nanos(1));
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
