//! GACER on real zoo architectures: a mix of squeezenet and mobilenet_v2 with every resizable
//! step split in two and pointers interleaving the two streams step by step computes what each
//! model computes alone — bit for bit unless a matrix product was resized, then within fp32
//! rounding — and the trace honours every pointer. So does the plan the search produces.

use cotenant_executor::gacer::resize::reorders_sums;
use cotenant_executor::gacer::run::{TraceEvent, TraceKind};
use cotenant_executor::gacer::{
    CoRunOptions, DeviceShape, GacerPlan, MixTenant, Schedule, SearchOptions, StepRef, Stop,
    SyncPointer, TenantWork, co_run, profile_model, search,
};
use cotenant_executor::zoo::{self, ZooOptions};
use cotenant_executor::{CpuBackend, Model, Target, Tensor};
use prost::Message;
use std::sync::Arc;

fn tenant(name: &str, batch: usize, seed: u64) -> TenantWork {
    let bytes = zoo::build(name, &ZooOptions::default())
        .expect("zoo model builds")
        .encode_to_vec();
    let model = Arc::new(Model::from_bytes_for(&bytes, Target::Gpu).expect("zoo model imports"));
    let mut rng = zoo::Rng::new(seed);
    let inputs = model
        .plan
        .example_inputs(batch)
        .into_iter()
        .map(|(n, t)| {
            let v = (0..t.len()).map(|_| rng.normal()).collect();
            (n, Tensor::f32(t.shape.clone(), v).expect("same shape"))
        })
        .collect();
    TenantWork {
        name: name.into(),
        model,
        inputs,
    }
}

#[test]
fn gacer_plan_on_a_zoo_mix_matches_the_plain_order() {
    let tenants = [tenant("squeezenet", 2, 1), tenant("mobilenet_v2", 2, 2)];
    let backend = CpuBackend::new(1);
    let mix: Vec<MixTenant> = tenants
        .iter()
        .map(|t| MixTenant {
            profile: Arc::new(
                profile_model(&t.name, &t.model.plan, &backend, &t.inputs, 1, &[2])
                    .expect("profiling runs"),
            ),
            latency_bound: None,
        })
        .collect();
    let counts: Vec<usize> = tenants.iter().map(|t| t.model.plan.steps.len()).collect();
    // Every resizable step in two pieces; each step of one tenant waits for the previous step
    // of the other, so the streams advance in lockstep.
    let mut plan = GacerPlan::unregulated(&counts);
    for (t, m) in mix.iter().enumerate() {
        for (s, sp) in m.profile.steps.iter().enumerate() {
            if sp.can_split(2) {
                plan.splits[t][s] = 2;
            }
        }
    }
    assert!(plan.splits.iter().flatten().any(|&k| k == 2));
    // The same without resizing the matrix products: then every output is bit for bit.
    let mut exact = plan.clone();
    for (t, w) in tenants.iter().enumerate() {
        for (s, step) in w.model.plan.steps.iter().enumerate() {
            if reorders_sums(&step.op) {
                exact.splits[t][s] = 1;
            }
        }
    }
    let shortest = counts.iter().copied().min().unwrap_or(0);
    for s in 1..shortest {
        for (waiter, after) in [(0, 1), (1, 0)] {
            plan.pointers.push(SyncPointer {
                waiter: StepRef {
                    tenant: waiter,
                    step: s,
                },
                after: StepRef {
                    tenant: after,
                    step: s - 1,
                },
            });
        }
    }
    let searched = search(&mix, &DeviceShape::h200(), &SearchOptions::default());
    let opts = CoRunOptions {
        threads: 2,
        warmup_rounds: 0,
        stop: Stop::Rounds(1),
        trace: true,
        device: cotenant_executor::Device::Cpu,
    };
    for plan in [exact, plan, searched] {
        plan.validate(&counts).expect("the plan is valid");
        let report = co_run(&tenants, &Schedule::gacer(plan.clone()), &opts).expect("runs");
        for (i, (t, r)) in tenants.iter().zip(&report.tenants).enumerate() {
            let plain = t.model.plan.run(&backend, t.inputs.clone()).expect("runs");
            let reordered = t
                .model
                .plan
                .steps
                .iter()
                .zip(&plan.splits[i])
                .any(|(s, &k)| k > 1 && reorders_sums(&s.op));
            if !reordered {
                assert_eq!(r.outputs, plain, "{}", t.name);
                continue;
            }
            let (got, want) = (&r.outputs[0].1, &plain[0].1);
            assert_eq!(got.shape, want.shape);
            let (got, want) = (got.as_f32().expect("f32"), want.as_f32().expect("f32"));
            let scale = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
            assert!(
                got.iter()
                    .zip(want)
                    .all(|(a, b)| (a - b).abs() <= 1e-5 * scale)
            );
        }
        let at = |step, kind| {
            report.trace.iter().position(|e| {
                *e == TraceEvent {
                    round: 0,
                    step,
                    kind,
                }
            })
        };
        for p in &plan.pointers {
            let (start, finish) = (
                at(p.waiter, TraceKind::Start),
                at(p.after, TraceKind::Finish),
            );
            assert!(
                matches!((start, finish), (Some(s), Some(f)) if f < s),
                "{p:?}"
            );
        }
    }
}
