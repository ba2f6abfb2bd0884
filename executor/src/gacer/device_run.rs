//! A tenant mix co-run on a GPU: one instance per tenant, each on its own stream (one shared
//! stream under `sequential`), rounds (every tenant one batch) issued from one host thread. The
//! steps of a round are issued step by step across the tenants in an order that respects the
//! plan's pointers, so every event wait names the record of the same round; then the host waits
//! once per tenant, for its outputs. Pointers are event waits, resized steps are launches over
//! sub-ranges; no host thread waits for a pointer.

use super::plan::{GacerPlan, StepRef};
use super::run::{
    CoRunError, CoRunOptions, CoRunReport, Stop, TenantReport, TenantWork, TraceEvent, TraceKind,
};
use super::schedule::Schedule;
use crate::device::Gpu;
use crate::engine::run_error;
use crate::error::RunError;
use crate::gpu::api::EventId;
use crate::gpu::{Budget, Coordination, Instance, Weights};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// One tenant's pointers and pieces for a round.
struct Round<'a> {
    tenant: usize,
    plan: Option<&'a GacerPlan>,
    events: &'a HashMap<StepRef, EventId>,
}

impl Coordination for Round<'_> {
    fn waits(&self, step: usize) -> Vec<EventId> {
        let me = StepRef {
            tenant: self.tenant,
            step,
        };
        self.plan.map_or_else(Vec::new, |p| {
            p.waits_of(me)
                .filter_map(|after| self.events.get(&after).copied())
                .collect()
        })
    }
    fn signal(&self, step: usize) -> Option<EventId> {
        self.events
            .get(&StepRef {
                tenant: self.tenant,
                step,
            })
            .copied()
    }
    fn pieces(&self, step: usize) -> usize {
        self.plan
            .and_then(|p| p.splits.get(self.tenant)?.get(step).copied())
            .unwrap_or(1)
            .max(1)
    }
}

/// Runs the mix on `gpu` under `schedule` until `opts.stop`.
pub fn co_run_on_gpu(
    gpu: &Gpu,
    tenants: &[TenantWork],
    schedule: &Schedule,
    opts: &CoRunOptions,
) -> Result<CoRunReport, CoRunError> {
    let api = gpu.api.clone();
    let failed = |t: &TenantWork, source: RunError| CoRunError::Run {
        tenant: t.name.clone(),
        source,
    };
    let shared_stream = match schedule {
        Schedule::Sequential => Some(
            api.new_stream()
                .map_err(|e| failed(&tenants[0], RunError::Device(e.to_string())))?,
        ),
        _ => None,
    };
    let mut instances = Vec::with_capacity(tenants.len());
    for t in tenants {
        let budget = Budget::new(t.name.clone(), gpu.memory_per_tenant);
        let weights = Weights::upload(api.clone(), &t.model.plan.constants, &budget)
            .map_err(|e| failed(t, RunError::Device(e.to_string())))?;
        let inst = Instance::new(api.clone(), t.model.clone(), weights, budget, shared_stream)
            .map_err(|e| failed(t, run_error(e)))?;
        instances.push(inst);
    }
    let step_counts: Vec<usize> = tenants.iter().map(|t| t.model.plan.steps.len()).collect();
    let mut events: HashMap<StepRef, EventId> = HashMap::new();
    let mut latencies: Vec<Vec<f64>> = vec![Vec::new(); tenants.len()];
    let mut outputs = vec![Vec::new(); tenants.len()];
    let mut trace = Vec::new();
    let mut measured_from: Option<Instant> = None;
    let mut rounds = 0u64;
    for round in 0u64.. {
        let stop = match opts.stop {
            Stop::Rounds(r) => round >= opts.warmup_rounds + r,
            Stop::After(d) => measured_from.is_some_and(|t0| t0.elapsed() >= d),
        };
        if stop {
            break;
        }
        let measuring = round >= opts.warmup_rounds;
        if measuring && measured_from.is_none() {
            measured_from = Some(Instant::now());
        }
        let plan = match schedule {
            Schedule::Gacer(slot) => {
                let p = slot.for_round(round);
                p.validate(&step_counts)?;
                Some(p)
            }
            _ => None,
        };
        if let Some(p) = &plan {
            for ptr in &p.pointers {
                if let std::collections::hash_map::Entry::Vacant(slot) = events.entry(ptr.after) {
                    let e = api.new_event(false).map_err(|e| CoRunError::Run {
                        tenant: tenants[ptr.after.tenant].name.clone(),
                        source: RunError::Device(e.to_string()),
                    })?;
                    slot.insert(e);
                }
            }
        }
        let timed = opts.trace;
        let mut batches = Vec::with_capacity(tenants.len());
        for (t, inst) in instances.iter_mut().enumerate() {
            let b = inst
                .begin(tenants[t].inputs.clone(), timed)
                .map_err(|e| failed(&tenants[t], run_error(e)))?;
            batches.push(b);
        }
        // Issue step by step across the tenants; a step whose pointers name steps not issued
        // yet this round waits its turn (the plan is acyclic, so every pass issues something).
        let empty = HashMap::new();
        let coords: Vec<Round<'_>> = (0..tenants.len())
            .map(|t| Round {
                tenant: t,
                plan: plan.as_deref(),
                events: if plan.is_some() { &events } else { &empty },
            })
            .collect();
        loop {
            let mut progressed = false;
            let mut left = false;
            for t in 0..tenants.len() {
                let next = batches[t].issued();
                if next >= step_counts[t] {
                    continue;
                }
                left = true;
                let me = StepRef {
                    tenant: t,
                    step: next,
                };
                let ready = plan.as_deref().is_none_or(|p| {
                    p.waits_of(me)
                        .all(|after| batches[after.tenant].issued() > after.step)
                });
                if ready {
                    instances[t]
                        .issue_step(&mut batches[t], &coords[t])
                        .map_err(|e| failed(&tenants[t], run_error(e)))?;
                    progressed = true;
                }
            }
            if !left {
                break;
            }
            if !progressed {
                return Err(CoRunError::Plan(super::plan::PlanError::Cycle));
            }
        }
        for (t, inst) in instances.iter_mut().enumerate() {
            inst.end(&mut batches[t])
                .map_err(|e| failed(&tenants[t], run_error(e)))?;
        }
        let mut spans = Vec::with_capacity(tenants.len());
        for (t, (inst, b)) in instances.iter_mut().zip(batches).enumerate() {
            let (out, times) = inst
                .finish(b)
                .map_err(|e| failed(&tenants[t], run_error(e)))?;
            outputs[t] = out;
            spans.push(times);
        }
        if measuring {
            rounds += 1;
            for (t, inst) in instances.iter().enumerate() {
                let ms = inst
                    .last_batch_ms()
                    .map_err(|e| failed(&tenants[t], run_error(e)))?;
                latencies[t].push(f64::from(ms));
            }
            if timed {
                trace.extend(
                    timeline(&instances, &spans, round).map_err(|e| failed(&tenants[0], e))?,
                );
            }
        }
    }
    let window = measured_from.map_or(Duration::ZERO, |t| t.elapsed());
    for e in events.into_values() {
        api.free_event(e);
    }
    drop(instances);
    if let Some(s) = shared_stream {
        api.free_stream(s);
    }
    let reports = tenants
        .iter()
        .zip(latencies)
        .zip(outputs)
        .map(|((t, mut l), out)| {
            l.sort_by(f64::total_cmp);
            TenantReport {
                name: t.name.clone(),
                rows_per_round: t.rows(),
                throughput: (rounds as usize * t.rows()) as f64 / window.as_secs_f64().max(1e-9),
                latencies_ms: l,
                outputs: out,
            }
        })
        .collect();
    Ok(CoRunReport {
        schedule: schedule.name(),
        tenants: reports,
        trace,
    })
}

/// Every step's start and finish of one round, in the order they happened on the device: each
/// tenant's step times are offset by when its batch started relative to tenant 0's.
fn timeline(
    instances: &[Instance],
    spans: &[crate::gpu::StepTimes],
    round: u64,
) -> Result<Vec<TraceEvent>, RunError> {
    let mut at: Vec<(f32, TraceEvent)> = Vec::new();
    for (t, (inst, times)) in instances.iter().zip(spans).enumerate() {
        let offset = instances[0]
            .started_after(inst)
            .map_err(|e| RunError::Device(e.to_string()))?;
        for (s, (a, b)) in times.spans.iter().enumerate() {
            let step = StepRef { tenant: t, step: s };
            at.push((
                offset + a,
                TraceEvent {
                    round,
                    step,
                    kind: TraceKind::Start,
                },
            ));
            at.push((
                offset + b,
                TraceEvent {
                    round,
                    step,
                    kind: TraceKind::Finish,
                },
            ));
        }
    }
    // Finishes before starts at the same instant: a step that ends as another begins did not
    // overlap it.
    at.sort_by(|x, y| {
        x.0.total_cmp(&y.0)
            .then((x.1.kind == TraceKind::Start).cmp(&(y.1.kind == TraceKind::Start)))
    });
    Ok(at.into_iter().map(|(_, e)| e).collect())
}
