//! Properties of GACER over random small models and mixes: whatever the plan — searched or
//! random — every schedule computes exactly the outputs of the plain order, and every pointer
//! is honoured in the recorded trace.

use super::*;
use crate::tensor::{DType, Tensor};
use crate::zoo::Rng;
use crate::zoo::builder::{Builder, attr_int, attr_ints, value_info};
use crate::{Model, RunError};
use proptest::prelude::*;
use prost::Message;
use run::{TraceEvent, TraceKind};
use std::sync::Arc;
use std::time::Duration;

/// A layer of a random convolutional model.
#[derive(Clone, Debug)]
enum Layer {
    Conv {
        cout: usize,
        k3: bool,
    },
    BatchNorm,
    Relu,
    Clip,
    /// Adds the output of the last layer that had this shape.
    Residual,
    MaxPool,
}

/// A random small model: convolutional on [batch, c, 6, 6] or a MatMul stack on [batch, 3, f].
#[derive(Clone, Debug)]
enum Recipe {
    Cnn {
        c: usize,
        layers: Vec<Layer>,
        head: bool,
    },
    Mlp {
        f: usize,
        widths: Vec<usize>,
        softmax: bool,
    },
}

fn layer() -> impl Strategy<Value = Layer> {
    prop_oneof![
        (1usize..5, any::<bool>()).prop_map(|(cout, k3)| Layer::Conv { cout, k3 }),
        Just(Layer::BatchNorm),
        Just(Layer::Relu),
        Just(Layer::Clip),
        Just(Layer::Residual),
        Just(Layer::MaxPool),
    ]
}

fn recipe() -> impl Strategy<Value = Recipe> {
    prop_oneof![
        (
            1usize..4,
            prop::collection::vec(layer(), 1..6),
            any::<bool>()
        )
            .prop_map(|(c, layers, head)| Recipe::Cnn { c, layers, head }),
        (
            1usize..6,
            prop::collection::vec(1usize..6, 1..4),
            any::<bool>()
        )
            .prop_map(|(f, widths, softmax)| Recipe::Mlp { f, widths, softmax }),
    ]
}

fn build(r: &Recipe, seed: u64) -> Model {
    let mut b = Builder::new(seed, false);
    let (input, out, out_dims) = match r {
        Recipe::Cnn { c, layers, head } => {
            let (mut x, mut ch, mut hw) = ("input".to_string(), *c, 6usize);
            let mut marks: Vec<(String, usize, usize)> = vec![(x.clone(), ch, hw)];
            for l in layers {
                x = match l {
                    Layer::Conv { cout, k3 } => {
                        let k = if *k3 { 3 } else { 1 };
                        let w = b.normal("w", &[*cout, ch, k, k], 0.5);
                        let bias = b.normal("b", &[*cout], 0.1);
                        let p = (k / 2) as i64;
                        ch = *cout;
                        let attrs = vec![
                            attr_ints("kernel_shape", &[k as i64, k as i64]),
                            attr_ints("pads", &[p, p, p, p]),
                        ];
                        b.node("Conv", &[&x, &w, &bias], attrs)
                    }
                    Layer::BatchNorm => {
                        let g = b.weight("g", &[ch], |r| 0.5 + r.uniform());
                        let be = b.normal("be", &[ch], 0.1);
                        let m = b.normal("m", &[ch], 0.1);
                        let v = b.weight("v", &[ch], |r| 0.5 + r.uniform());
                        b.node("BatchNormalization", &[&x, &g, &be, &m, &v], vec![])
                    }
                    Layer::Relu => b.node("Relu", &[&x], vec![]),
                    Layer::Clip => {
                        let lo = b.const_f32("lo", -0.5);
                        let hi = b.const_f32("hi", 0.5);
                        b.node("Clip", &[&x, &lo, &hi], vec![])
                    }
                    Layer::Residual => match marks.iter().rev().find(|m| m.1 == ch && m.2 == hw) {
                        Some((y, _, _)) => {
                            let y = y.clone();
                            b.node("Add", &[&x, &y], vec![])
                        }
                        None => b.node("Relu", &[&x], vec![]),
                    },
                    Layer::MaxPool if hw >= 2 => {
                        hw /= 2;
                        let attrs = vec![
                            attr_ints("kernel_shape", &[2, 2]),
                            attr_ints("strides", &[2, 2]),
                        ];
                        b.node("MaxPool", &[&x], attrs)
                    }
                    Layer::MaxPool => b.node("Relu", &[&x], vec![]),
                };
                marks.push((x.clone(), ch, hw));
            }
            let input = value_info("input", DType::F32, &[None, Some(*c), Some(6), Some(6)]);
            if *head {
                let p = b.node("GlobalAveragePool", &[&x], vec![]);
                let f = b.node("Flatten", &[&p], vec![attr_int("axis", 1)]);
                let w = b.normal("fc_w", &[5, ch], 0.5);
                let bias = b.normal("fc_b", &[5], 0.1);
                let g = b.node("Gemm", &[&f, &w, &bias], vec![attr_int("transB", 1)]);
                (input, b.node("Softmax", &[&g], vec![]), vec![None, Some(5)])
            } else {
                (input, x, vec![None, Some(ch), Some(hw), Some(hw)])
            }
        }
        Recipe::Mlp { f, widths, softmax } => {
            let (mut x, mut width) = ("input".to_string(), *f);
            for &w in widths {
                let m = b.normal("w", &[width, w], 0.5);
                let bias = b.normal("b", &[w], 0.1);
                let y = b.node("MatMul", &[&x, &m], vec![]);
                let y = b.node("Add", &[&y, &bias], vec![]);
                x = b.node("Relu", &[&y], vec![]);
                width = w;
            }
            if *softmax {
                x = b.node("Softmax", &[&x], vec![]);
            }
            let input = value_info("input", DType::F32, &[None, Some(3), Some(*f)]);
            (input, x, vec![None, Some(3), Some(width)])
        }
    };
    b.node_rename_last(&out, "output");
    let proto = b.finish(
        "gacer_prop",
        13,
        vec![input],
        vec![value_info("output", DType::F32, &out_dims)],
    );
    Model::from_bytes_for(&proto.encode_to_vec(), crate::Target::Gpu)
        .expect("a generated model imports")
}

fn tenant(r: &Recipe, batch: usize, seed: u64) -> TenantWork {
    let model = Arc::new(build(r, seed));
    let inputs: Vec<(String, Tensor)> = model
        .plan
        .example_inputs(batch)
        .into_iter()
        .map(|(n, t)| {
            let mut rng = Rng::new(seed ^ 0xABCD);
            let v = (0..t.len()).map(|_| rng.normal()).collect();
            (n, Tensor::f32(t.shape.clone(), v).expect("same shape"))
        })
        .collect();
    TenantWork {
        name: format!("t{seed}"),
        model,
        inputs,
    }
}

fn mix() -> impl Strategy<Value = Vec<(Recipe, usize)>> {
    prop::collection::vec((recipe(), 1usize..5), 2..4)
}

fn options() -> CoRunOptions {
    CoRunOptions {
        threads: 2,
        warmup_rounds: 0,
        stop: Stop::Rounds(2),
        trace: true,
        device: crate::Device::Cpu,
    }
}

/// Checks a co-run against the plain order: same outputs bit for bit, and in the trace every
/// step of every round starts after its pointers' steps finished.
fn check(tenants: &[TenantWork], schedule: &Schedule, plan: Option<&GacerPlan>) {
    let report = co_run(tenants, schedule, &options()).expect("the co-run succeeds");
    for (i, (t, r)) in tenants.iter().zip(&report.tenants).enumerate() {
        let plain = t
            .model
            .plan
            .run(&crate::CpuBackend::new(1), t.inputs.clone())
            .expect("the plain order runs");
        if plan.is_some_and(|p| splits_a_matrix_product(p, i, t)) {
            assert_close(&r.outputs, &plain);
        } else {
            assert_eq!(r.outputs, plain, "{} under {}", t.name, report.schedule);
        }
        assert_eq!(r.latencies_ms.len(), 2);
    }
    let at = |e: TraceEvent| report.trace.iter().position(|x| *x == e);
    for p in plan.map_or(&[][..], |p| &p.pointers[..]) {
        for round in 0..2 {
            let start = at(TraceEvent {
                round,
                step: p.waiter,
                kind: TraceKind::Start,
            });
            let finish = at(TraceEvent {
                round,
                step: p.after,
                kind: TraceKind::Finish,
            });
            assert!(
                matches!((start, finish), (Some(s), Some(f)) if f < s),
                "pointer {p:?} round {round} not honoured"
            );
        }
    }
}

/// Whether the plan resizes a Gemm or MatMul of this tenant (then sums may be reordered).
fn splits_a_matrix_product(plan: &GacerPlan, tenant: usize, t: &TenantWork) -> bool {
    t.model
        .plan
        .steps
        .iter()
        .zip(&plan.splits[tenant])
        .any(|(s, &k)| k > 1 && resize::reorders_sums(&s.op))
}

/// Same names and shapes, values within fp32 rounding of the plain order's.
fn assert_close(got: &[(String, Tensor)], want: &[(String, Tensor)]) {
    assert_eq!(got.len(), want.len());
    for ((gn, g), (wn, w)) in got.iter().zip(want) {
        assert_eq!((gn, &g.shape), (wn, &w.shape));
        let (g, w) = (g.as_f32().expect("f32"), w.as_f32().expect("f32"));
        let scale = w.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
        for (a, b) in g.iter().zip(w) {
            assert!((a - b).abs() <= 1e-5 * scale, "{gn}: {a} vs {b}");
        }
    }
}

/// A random valid plan: random split factors and pointers, dropping any pointer that would
/// close a cycle.
fn random_plan(counts: &[usize], seed: u64) -> GacerPlan {
    let mut rng = Rng::new(seed);
    let mut plan = GacerPlan::unregulated(counts);
    for s in plan.splits.iter_mut().flatten() {
        *s = 1 + (rng.next_u64() % 4) as usize;
    }
    for _ in 0..8 {
        let pick = |rng: &mut Rng| {
            let tenant = (rng.next_u64() as usize) % counts.len();
            StepRef {
                tenant,
                step: (rng.next_u64() as usize) % counts[tenant].max(1),
            }
        };
        let (waiter, after) = (pick(&mut rng), pick(&mut rng));
        if waiter.tenant == after.tenant {
            continue;
        }
        plan.pointers.push(SyncPointer { waiter, after });
        if plan.validate(counts).is_err() {
            plan.pointers.pop();
        }
    }
    plan
}

/// A device so small that every operator of the tiny test models contends, so the search has
/// pointers and splits worth trying.
fn tiny_device() -> DeviceShape {
    DeviceShape {
        name: "tiny".into(),
        units: 2,
        max_threads_per_unit: 256,
        max_blocks_per_unit: 1,
        shared_mem_per_unit: usize::MAX,
        registers_per_unit: usize::MAX,
        units_per_stream: 2,
        launch_overhead: Duration::ZERO,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn every_schedule_computes_the_plain_outputs(m in mix(), seed in any::<u64>()) {
        let tenants: Vec<TenantWork> =
            m.iter().enumerate().map(|(i, (r, b))| tenant(r, *b, seed.wrapping_add(i as u64))).collect();
        let counts: Vec<usize> = tenants.iter().map(|t| t.model.plan.steps.len()).collect();
        check(&tenants, &Schedule::Sequential, None);
        check(&tenants, &Schedule::MultiStream, None);
        let plan = random_plan(&counts, seed);
        check(&tenants, &Schedule::gacer(plan.clone()), Some(&plan));
    }

    #[test]
    fn searched_plans_compute_the_plain_outputs(m in mix(), seed in any::<u64>()) {
        let tenants: Vec<TenantWork> =
            m.iter().enumerate().map(|(i, (r, b))| tenant(r, *b, seed.wrapping_add(i as u64))).collect();
        let backend = crate::CpuBackend::new(1);
        let mixed: Vec<MixTenant> = tenants
            .iter()
            .map(|t| MixTenant {
                profile: Arc::new(
                    profile_model(&t.name, &t.model.plan, &backend, &t.inputs, 1, &[2, 4])
                        .expect("profiling runs"),
                ),
                latency_bound: None,
            })
            .collect();
        let plan = search(&mixed, &tiny_device(), &SearchOptions::default());
        let counts: Vec<usize> = tenants.iter().map(|t| t.model.plan.steps.len()).collect();
        prop_assert_eq!(plan.validate(&counts), Ok(()));
        check(&tenants, &Schedule::gacer(plan.clone()), Some(&plan));
    }
}

/// Rounds in which every pointer of `plan` was honoured, per the trace.
/// A stream whose device cannot serve (a GPU on which no weights fit) ends the co-run with a
/// device error naming a tenant, under every schedule, and no stream waits forever on it.
#[test]
fn a_stream_without_a_device_fails_the_co_run_with_the_reason() {
    let r = Recipe::Mlp {
        f: 3,
        widths: vec![4, 2],
        softmax: false,
    };
    let tenants = [tenant(&r, 2, 1), tenant(&r, 1, 2)];
    let counts: Vec<usize> = tenants.iter().map(|t| t.model.plan.steps.len()).collect();
    let opts = CoRunOptions {
        device: crate::Device::Gpu(crate::device::Gpu::simulated(0)),
        ..options()
    };
    for schedule in [
        Schedule::Sequential,
        Schedule::MultiStream,
        Schedule::gacer(random_plan(&counts, 3)),
    ] {
        match co_run(&tenants, &schedule, &opts) {
            Err(CoRunError::Run {
                tenant,
                source: RunError::Device(why),
            }) => assert!(tenant.starts_with('t') && !why.is_empty()),
            Err(e) => panic!("{}: expected a device error, got {e}", schedule.name()),
            Ok(_) => panic!("{}: ran on a device that does not exist", schedule.name()),
        }
    }
}

fn honoured(trace: &[TraceEvent], plan: &GacerPlan, round: u64) -> bool {
    let at = |step, kind| {
        trace
            .iter()
            .position(|e| *e == TraceEvent { round, step, kind })
    };
    plan.pointers.iter().all(|p| {
        matches!(
            (at(p.waiter, TraceKind::Start), at(p.after, TraceKind::Finish)),
            (Some(s), Some(f)) if f < s
        )
    })
}

#[test]
fn a_plan_published_while_running_takes_over_between_rounds() {
    let cnn = Recipe::Cnn {
        c: 2,
        layers: vec![
            Layer::Conv { cout: 3, k3: true },
            Layer::Relu,
            Layer::MaxPool,
        ],
        head: true,
    };
    let mlp = Recipe::Mlp {
        f: 4,
        widths: vec![5, 3],
        softmax: true,
    };
    let tenants = vec![tenant(&cnn, 2, 1), tenant(&mlp, 3, 2)];
    let counts: Vec<usize> = tenants.iter().map(|t| t.model.plan.steps.len()).collect();
    let last = |t: usize| StepRef {
        tenant: t,
        step: counts[t] - 1,
    };
    let first = |t: usize| StepRef { tenant: t, step: 0 };
    // Before: tenant 1 starts after tenant 0 finished. After: the other way round, resized.
    let mut before = GacerPlan::unregulated(&counts);
    before.pointers.push(SyncPointer {
        waiter: first(1),
        after: last(0),
    });
    let mut after = GacerPlan::unregulated(&counts);
    after.pointers.push(SyncPointer {
        waiter: first(0),
        after: last(1),
    });
    after.splits.iter_mut().flatten().for_each(|k| *k = 2);
    let slot = Arc::new(PlanSlot::new(Arc::new(before.clone())));
    let rounds = 2000;
    let opts = CoRunOptions {
        stop: Stop::Rounds(rounds),
        ..options()
    };
    let schedule = Schedule::Gacer(slot.clone());
    let (report, from) = std::thread::scope(|s| {
        let run = s.spawn(|| co_run(&tenants, &schedule, &opts));
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while slot.started().is_none_or(|r| r < 1) && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        let from = slot.publish(Arc::new(after.clone()));
        let report = run.join().expect("no panic").expect("the co-run succeeds");
        (report, from)
    });
    assert!((1..rounds).contains(&from), "published at round {from}");
    for round in 0..rounds {
        let plan = if round < from { &before } else { &after };
        assert!(honoured(&report.trace, plan, round), "round {round}");
    }
    for (t, r) in tenants.iter().zip(&report.tenants) {
        let plain = t
            .model
            .plan
            .run(&crate::CpuBackend::new(1), t.inputs.clone())
            .expect("runs");
        assert_close(&r.outputs, &plain);
    }
}
