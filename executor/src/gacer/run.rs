//! Runs a tenant mix under a schedule. On the CPU: one worker thread per stream, each with its own
//! backend and share of the thread budget, running rounds (every tenant one batch) back to back;
//! GACER's pointers are waits between the workers, resized steps run their pieces one after
//! another on their worker. On a GPU: `device_run.rs`, the device doing the waiting. Reports per-tenant
//! latency and throughput, the last outputs, and optionally a trace of every step's start and
//! finish.

use super::plan::{PlanError, StepRef};
use super::resize::execute_in_pieces;
use super::schedule::{Schedule, stream_tasks};
use crate::backend::{Backend, CpuBackend};
use crate::device::Device;
use crate::error::RunError;
use crate::ops::Op;
use crate::plan::Model;
use crate::tensor::Tensor;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use thiserror::Error;

/// One tenant of a mix: a model and the batch it runs every round.
#[derive(Clone)]
pub struct TenantWork {
    pub name: String,
    pub model: Arc<Model>,
    pub inputs: Vec<(String, Tensor)>,
}

impl TenantWork {
    /// Rows of its batch (the first input's first dimension).
    pub fn rows(&self) -> usize {
        self.inputs
            .first()
            .and_then(|(_, t)| t.shape.first().copied())
            .unwrap_or(1)
    }
}

/// When a co-run ends.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Stop {
    /// After this many measured rounds per stream.
    Rounds(u64),
    /// Once each stream has measured for this long (rounds in flight finish).
    After(Duration),
}

#[derive(Clone, Debug, PartialEq)]
pub struct CoRunOptions {
    /// CPU threads for the whole mix; each stream gets an equal share (at least one).
    pub threads: usize,
    /// Rounds each stream runs before measuring.
    pub warmup_rounds: u64,
    pub stop: Stop,
    /// Record every step's start and finish.
    pub trace: bool,
    /// Where the streams compute.
    pub device: Device,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceKind {
    Start,
    Finish,
}

/// A step starting or finishing; the trace lists them in the order they happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    pub round: u64,
    pub step: StepRef,
    pub kind: TraceKind,
}

/// What one tenant saw.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantReport {
    pub name: String,
    pub rows_per_round: usize,
    /// Each measured batch's latency (its round's start to its last step), sorted.
    pub latencies_ms: Vec<f64>,
    /// Rows per second over its measured rounds.
    pub throughput: f64,
    /// Outputs of the last round it completed.
    pub outputs: Vec<(String, Tensor)>,
}

impl TenantReport {
    /// The `p`-th percentile latency (nearest rank); `NaN` when nothing was measured.
    pub fn percentile_ms(&self, p: f64) -> f64 {
        let n = self.latencies_ms.len();
        if n == 0 {
            return f64::NAN;
        }
        self.latencies_ms[(((p / 100.0) * (n - 1) as f64).round() as usize).min(n - 1)]
    }
}

/// What a co-run saw.
#[derive(Clone, Debug, PartialEq)]
pub struct CoRunReport {
    pub schedule: &'static str,
    pub tenants: Vec<TenantReport>,
    pub trace: Vec<TraceEvent>,
}

impl CoRunReport {
    /// Rows per second of all tenants together.
    pub fn throughput(&self) -> f64 {
        self.tenants.iter().map(|t| t.throughput).sum()
    }
}

/// Why a co-run failed.
#[derive(Debug, Error)]
pub enum CoRunError {
    #[error("tenant {tenant}: {source}")]
    Run { tenant: String, source: RunError },
    #[error("the GACER plan does not fit the mix: {0}")]
    Plan(#[from] PlanError),
    #[error("a stream worker panicked")]
    Panicked,
}

/// Which rounds of which steps have finished, for the event waits.
struct Progress {
    state: Mutex<ProgressState>,
    changed: Condvar,
}

struct ProgressState {
    /// `done[tenant][step]`: rounds of that step finished.
    done: Vec<Vec<u64>>,
    /// Tenants whose stream has stopped for good.
    exited: Vec<bool>,
}

impl Progress {
    fn new(step_counts: &[usize]) -> Progress {
        Progress {
            state: Mutex::new(ProgressState {
                done: step_counts.iter().map(|&n| vec![0; n]).collect(),
                exited: vec![false; step_counts.len()],
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ProgressState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn finished(&self, s: StepRef, round: u64) {
        self.lock().done[s.tenant][s.step] = round + 1;
        self.changed.notify_all();
    }

    /// Waits until `s` has finished `round`; false if its stream stopped before that.
    fn wait(&self, s: StepRef, round: u64) -> bool {
        let mut st = self.lock();
        loop {
            if st.done[s.tenant][s.step] > round {
                return true;
            }
            if st.exited[s.tenant] {
                return false;
            }
            st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn exit(&self, tenants: &[usize]) {
        let mut st = self.lock();
        for &t in tenants {
            st.exited[t] = true;
        }
        drop(st);
        self.changed.notify_all();
    }
}

/// What one stream measured for each of its tenants.
struct StreamOut {
    latencies_ms: Vec<Vec<f64>>,
    outputs: Vec<Vec<(String, Tensor)>>,
    rounds: Vec<u64>,
    window: Duration,
}

/// Everything a stream worker reads.
struct Shared<'a> {
    tenants: &'a [TenantWork],
    schedule: &'a Schedule,
    opts: &'a CoRunOptions,
    step_counts: Vec<usize>,
    progress: Progress,
    trace: Mutex<Vec<TraceEvent>>,
}

impl Shared<'_> {
    fn record(&self, round: u64, step: StepRef, kind: TraceKind) {
        if self.opts.trace {
            let mut t = self.trace.lock().unwrap_or_else(|e| e.into_inner());
            t.push(TraceEvent { round, step, kind });
        }
    }
}

/// Runs the mix under `schedule` until `opts.stop`.
pub fn co_run(
    tenants: &[TenantWork],
    schedule: &Schedule,
    opts: &CoRunOptions,
) -> Result<CoRunReport, CoRunError> {
    let step_counts: Vec<usize> = tenants.iter().map(|t| t.model.plan.steps.len()).collect();
    if let Schedule::Gacer(slot) = schedule {
        slot.current().validate(&step_counts)?;
    }
    if let Device::Gpu(gpu) = &opts.device {
        return super::device_run::co_run_on_gpu(gpu, tenants, schedule, opts);
    }
    let streams = schedule.streams(tenants.len());
    let threads = (opts.threads / streams.len().max(1)).max(1);
    let shared = Shared {
        tenants,
        schedule,
        opts,
        step_counts,
        progress: Progress::new(
            &tenants
                .iter()
                .map(|t| t.model.plan.steps.len())
                .collect::<Vec<_>>(),
        ),
        trace: Mutex::new(Vec::new()),
    };
    let outs: Vec<Result<StreamOut, CoRunError>> = std::thread::scope(|s| {
        let handles: Vec<_> = streams
            .iter()
            .enumerate()
            .map(|(i, members)| {
                let shared = &shared;
                std::thread::Builder::new()
                    .name(format!("cotenant-stream-{i}"))
                    .spawn_scoped(s, move || {
                        let mut out = Err(CoRunError::Panicked);
                        let backend = stream_backend(threads);
                        backend.scope(&mut || out = run_stream(shared, backend.as_ref(), members));
                        shared.progress.exit(members);
                        out
                    })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join().unwrap_or(Err(CoRunError::Panicked)),
                Err(_) => Err(CoRunError::Panicked),
            })
            .collect()
    });
    let mut reports: Vec<Option<TenantReport>> = vec![None; tenants.len()];
    for (members, out) in streams.iter().zip(outs) {
        let out = out?;
        for (k, &t) in members.iter().enumerate() {
            let mut latencies_ms = out.latencies_ms[k].clone();
            latencies_ms.sort_by(f64::total_cmp);
            let rows = tenants[t].rows();
            reports[t] = Some(TenantReport {
                name: tenants[t].name.clone(),
                rows_per_round: rows,
                throughput: (out.rounds[k] as usize * rows) as f64
                    / out.window.as_secs_f64().max(1e-9),
                latencies_ms,
                outputs: out.outputs[k].clone(),
            });
        }
    }
    let trace = shared.trace.into_inner().unwrap_or_else(|e| e.into_inner());
    Ok(CoRunReport {
        schedule: schedule.name(),
        tenants: reports.into_iter().flatten().collect(),
        trace,
    })
}

/// Stream `i`'s CPU backend with its share of the threads.
fn stream_backend(threads: usize) -> Box<dyn Backend> {
    Box::new(CpuBackend::new(threads))
}

/// One stream's loop over rounds; stops at `opts.stop`, or early when a step it waits for
/// belongs to a stream that has stopped (that round is then not counted).
fn run_stream(
    sh: &Shared<'_>,
    backend: &dyn Backend,
    members: &[usize],
) -> Result<StreamOut, CoRunError> {
    let n = members.len();
    let mut out = StreamOut {
        latencies_ms: vec![Vec::new(); n],
        outputs: vec![Vec::new(); n],
        rounds: vec![0; n],
        window: Duration::ZERO,
    };
    let mut measured_from: Option<Instant> = None;
    for round in 0u64.. {
        let measuring = round >= sh.opts.warmup_rounds;
        let stop = match sh.opts.stop {
            Stop::Rounds(r) => round >= sh.opts.warmup_rounds + r,
            Stop::After(d) => measured_from.is_some_and(|t0| t0.elapsed() >= d),
        };
        if stop {
            break;
        }
        let plan = match sh.schedule {
            Schedule::Gacer(slot) => {
                let p = slot.for_round(round);
                p.validate(&sh.step_counts)?;
                Some(p)
            }
            _ => None,
        };
        let tasks = stream_tasks(members, &sh.step_counts, plan.as_deref());
        let started = Instant::now();
        if measuring && measured_from.is_none() {
            measured_from = Some(started);
        }
        let mut values = Vec::with_capacity(n);
        for &t in members {
            let w = &sh.tenants[t];
            let v = w
                .model
                .plan
                .bind_inputs(w.inputs.clone())
                .map_err(|source| CoRunError::Run {
                    tenant: w.name.clone(),
                    source,
                })?;
            values.push(v);
        }
        for task in &tasks {
            if !task.waits.iter().all(|&w| sh.progress.wait(w, round)) {
                return Ok(close(out, measured_from));
            }
            let t = task.step.tenant;
            let k = members.iter().position(|&m| m == t).unwrap_or(0);
            let w = &sh.tenants[t];
            sh.record(round, task.step, TraceKind::Start);
            let exec = |op: &Op, refs: &[Option<&Tensor>]| {
                execute_in_pieces(backend, op, refs, task.pieces)
            };
            w.model
                .plan
                .run_step(backend, &exec, &mut values[k], task.step.step)
                .map_err(|source| CoRunError::Run {
                    tenant: w.name.clone(),
                    source,
                })?;
            sh.record(round, task.step, TraceKind::Finish);
            if task.signals {
                sh.progress.finished(task.step, round);
            }
            if task.step.step + 1 == sh.step_counts[t] {
                out.outputs[k] =
                    w.model
                        .plan
                        .collect_outputs(&values[k])
                        .map_err(|source| CoRunError::Run {
                            tenant: w.name.clone(),
                            source,
                        })?;
                if measuring {
                    out.latencies_ms[k].push(started.elapsed().as_secs_f64() * 1e3);
                    out.rounds[k] += 1;
                }
            }
        }
    }
    Ok(close(out, measured_from))
}

fn close(mut out: StreamOut, measured_from: Option<Instant>) -> StreamOut {
    out.window = measured_from.map_or(Duration::ZERO, |t| t.elapsed());
    out
}
