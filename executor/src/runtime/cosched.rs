//! The replicas on one device sharing it while they serve: the three schedules of
//! [`Schedule`] applied to live batches (where [`crate::gacer::co_run`] applies them to closed
//! rounds). Every worker (instance) of every replica takes a [`Seat`]; a seat's index is its
//! stream in the GACER plan. Each batch then runs step by step through [`Seat::run`]:
//! - `sequential`: one step at a time across all seats;
//! - `multi-stream`: no coordination, every worker issues freely;
//! - `gacer`: each step in the plan's number of pieces, after the plan's pointers. A pointer
//!   holds its waiter only while the seat it names runs a batch that has not yet finished that
//!   step: an idle seat holds no one, and a seat starting its next batch releases the waiters
//!   of the last one. A plan that does not fit the seats (the mix changed and no plan for the
//!   new one is published yet) is not followed until one is; a plan takes over between batches.
//!
//! On a GPU the device does the waiting ([`Seat::run_on_device`]): a pointer is an event the
//! named seat's stream records after that step and the waiter's stream waits on before its
//! step — the most recent record issued, so an idle seat holds no one here either — and no host
//! thread waits for a pointer. Under `sequential` every seat's instance issues onto one shared
//! stream ([`CoSchedule::shared_stream`]), which runs one operator at a time.

use crate::backend::Backend;
use crate::error::RunError;
use crate::gacer::plan::{GacerPlan, StepRef};
use crate::gacer::resize::execute_in_pieces;
use crate::gacer::{PlanSlot, Schedule};
use crate::gpu::api::{DeviceApi, EventId, StreamId};
use crate::gpu::{Coordination, Instance};
use crate::ops::Op;
use crate::plan::{Model, Plan};
use crate::tensor::Tensor;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Longest a pointer holds a step. Pointers shape performance, never correctness, so a wait
/// that outlives this (a replica stalled mid-batch) lets the step go.
const POINTER_WAIT_LIMIT: Duration = Duration::from_secs(2);

/// A step starting or finishing, recorded when tracing is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepEvent {
    /// The seat's batch counter (1 for its first batch).
    pub batch: u64,
    pub step: StepRef,
    pub finished: bool,
}

struct SeatState {
    label: String,
    model: Arc<Model>,
    steps: usize,
    /// Rows of its last batch (1 before the first): the batch its profile is taken at.
    rows: usize,
    /// What one of its batches may take, queueing aside (from the replica's SLO).
    latency_bound: Option<Duration>,
    /// Batches started.
    batch: u64,
    /// Steps of the running batch finished; `None` while idle.
    done: Option<usize>,
}

#[derive(Default)]
struct State {
    seats: Vec<Option<SeatState>>,
    /// Sequential: a step is running.
    busy: bool,
    /// Steps running now, and the most ever at once.
    running: usize,
    peak_running: usize,
    /// Pointer waits cut short by `POINTER_WAIT_LIMIT`.
    pointer_timeouts: u64,
    trace: Option<Vec<StepEvent>>,
}

/// How the replicas on one device share it; see the module doc.
pub struct CoSchedule {
    schedule: Schedule,
    state: Mutex<State>,
    changed: Condvar,
    /// On a GPU: the events standing for pointer targets, and the sequential schedule's stream.
    device: Mutex<Option<DeviceSide>>,
}

struct DeviceSide {
    api: Arc<dyn DeviceApi>,
    events: std::collections::HashMap<StepRef, EventId>,
    stream: Option<StreamId>,
}

impl Drop for CoSchedule {
    fn drop(&mut self) {
        let side = self
            .device
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(d) = side {
            for (_, e) in d.events {
                d.api.free_event(e);
            }
            if let Some(s) = d.stream {
                d.api.free_stream(s);
            }
        }
    }
}

impl CoSchedule {
    pub fn new(schedule: Schedule) -> Arc<CoSchedule> {
        Arc::new(CoSchedule {
            schedule,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            device: Mutex::new(None),
        })
    }

    /// The same, recording every step's start and finish (tests, diagnostics).
    pub fn traced(schedule: Schedule) -> Arc<CoSchedule> {
        let co = CoSchedule::new(schedule);
        co.lock().trace = Some(Vec::new());
        co
    }

    pub fn name(&self) -> &'static str {
        self.schedule.name()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The stream every seat on `api` issues onto under the sequential schedule (none under the
    /// others: each instance has its own).
    pub fn shared_stream(&self, api: &Arc<dyn DeviceApi>) -> Result<Option<StreamId>, RunError> {
        if !matches!(self.schedule, Schedule::Sequential) {
            return Ok(None);
        }
        let mut side = self.device.lock().unwrap_or_else(|e| e.into_inner());
        let d = side.get_or_insert_with(|| DeviceSide {
            api: api.clone(),
            events: Default::default(),
            stream: None,
        });
        if d.stream.is_none() {
            d.stream = Some(
                api.new_stream()
                    .map_err(|e| RunError::Device(e.to_string()))?,
            );
        }
        Ok(d.stream)
    }

    /// The event standing for `step` on the device, made on first use.
    fn event(&self, api: &Arc<dyn DeviceApi>, step: StepRef) -> Result<EventId, RunError> {
        let mut side = self.device.lock().unwrap_or_else(|e| e.into_inner());
        let d = side.get_or_insert_with(|| DeviceSide {
            api: api.clone(),
            events: Default::default(),
            stream: None,
        });
        if let Some(e) = d.events.get(&step) {
            return Ok(*e);
        }
        let e = api
            .new_event(false)
            .map_err(|e| RunError::Device(e.to_string()))?;
        d.events.insert(step, e);
        Ok(e)
    }

    /// Takes the lowest free seat for a worker running `model`; `label` names the model (plans
    /// are searched and cached per mix of labels and batch sizes).
    pub fn join(self: &Arc<Self>, label: impl Into<String>, model: Arc<Model>) -> Seat {
        let mut st = self.lock();
        let seat = SeatState {
            label: label.into(),
            steps: model.plan.steps.len(),
            model,
            rows: 1,
            latency_bound: None,
            batch: 0,
            done: None,
        };
        let index = match st.seats.iter().position(Option::is_none) {
            Some(i) => {
                st.seats[i] = Some(seat);
                i
            }
            None => {
                st.seats.push(Some(seat));
                st.seats.len() - 1
            }
        };
        Seat {
            co: self.clone(),
            index,
        }
    }

    /// The seats in index order, as (label, steps) of each taken one: the mix a plan is for.
    pub fn seats(&self) -> Vec<Option<(String, usize)>> {
        self.lock()
            .seats
            .iter()
            .map(|s| s.as_ref().map(|s| (s.label.clone(), s.steps)))
            .collect()
    }

    /// What a planner needs of each seat: label, model and the rows of its last batch.
    pub(crate) fn seat_models(&self) -> Vec<Option<SeatModel>> {
        self.lock()
            .seats
            .iter()
            .map(|s| {
                s.as_ref().map(|s| SeatModel {
                    label: s.label.clone(),
                    model: s.model.clone(),
                    rows: s.rows,
                    latency_bound: s.latency_bound,
                })
            })
            .collect()
    }

    /// Where a new GACER plan is published (`None` for the other schedules).
    pub fn plan_slot(&self) -> Option<&Arc<PlanSlot>> {
        match &self.schedule {
            Schedule::Gacer(slot) => Some(slot),
            _ => None,
        }
    }

    /// The most steps that ever ran at once.
    pub fn peak_concurrent_steps(&self) -> usize {
        self.lock().peak_running
    }

    /// Pointer waits given up after `POINTER_WAIT_LIMIT` (a replica stalled mid-batch).
    pub fn pointer_timeouts(&self) -> u64 {
        self.lock().pointer_timeouts
    }

    /// Every step's start and finish so far (empty unless made with `traced`).
    pub fn trace(&self) -> Vec<StepEvent> {
        self.lock().trace.clone().unwrap_or_default()
    }

    /// The published plan, if it fits the seats as they are.
    pub(crate) fn fitting_plan(&self) -> Option<Arc<GacerPlan>> {
        let plan = self.plan_slot()?.current();
        let steps: Vec<usize> = self
            .lock()
            .seats
            .iter()
            .map(|s| s.as_ref().map_or(0, |s| s.steps))
            .collect();
        plan.validate(&steps).is_ok().then_some(plan)
    }

    /// Waits until `after` no longer holds a step (see the module doc).
    fn wait_for(&self, after: StepRef) {
        let deadline = Instant::now() + POINTER_WAIT_LIMIT;
        let mut st = self.lock();
        // The batch it holds for: the one running now (an idle seat holds no one).
        let batch = st
            .seats
            .get(after.tenant)
            .and_then(Option::as_ref)
            .filter(|s| s.done.is_some())
            .map(|s| s.batch);
        loop {
            let holds = match st.seats.get(after.tenant).and_then(Option::as_ref) {
                Some(s) => Some(s.batch) == batch && s.done.is_some_and(|d| d <= after.step),
                None => false,
            };
            let now = Instant::now();
            if !holds {
                return;
            }
            if now >= deadline {
                st.pointer_timeouts += 1;
                return;
            }
            st = self
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn record(st: &mut State, batch: u64, step: StepRef, finished: bool) {
        if let Some(t) = st.trace.as_mut() {
            t.push(StepEvent {
                batch,
                step,
                finished,
            });
        }
    }

    /// Marks `step` started, first waiting for the token under `sequential`.
    fn start_step(&self, step: StepRef) {
        let mut st = self.lock();
        if matches!(self.schedule, Schedule::Sequential) {
            while st.busy {
                st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            st.busy = true;
        }
        st.running += 1;
        st.peak_running = st.peak_running.max(st.running);
        let batch = seat_batch(&st, step.tenant);
        CoSchedule::record(&mut st, batch, step, false);
    }

    /// Marks `step` finished (or abandoned, with `ok` false) and wakes whoever waits on it.
    fn finish_step(&self, step: StepRef, ok: bool) {
        let mut st = self.lock();
        st.busy = false;
        st.running -= 1;
        let batch = seat_batch(&st, step.tenant);
        if ok && let Some(Some(s)) = st.seats.get_mut(step.tenant) {
            s.done = Some(step.step + 1);
        }
        if ok {
            CoSchedule::record(&mut st, batch, step, true);
        }
        drop(st);
        self.changed.notify_all();
    }

    /// Marks `seat` running a batch of that shape, or idle (`None`).
    fn set_running(&self, seat: usize, batch: Option<BatchShape>) {
        let mut st = self.lock();
        if let Some(Some(s)) = st.seats.get_mut(seat) {
            if let Some((rows, latency_bound)) = batch {
                s.rows = rows;
                s.latency_bound = latency_bound;
                s.batch += 1;
                s.done = Some(0);
            } else {
                s.done = None;
            }
        }
        drop(st);
        self.changed.notify_all();
    }
}

fn seat_batch(st: &State, seat: usize) -> u64 {
    st.seats
        .get(seat)
        .and_then(Option::as_ref)
        .map_or(0, |s| s.batch)
}

/// One worker's place in a [`CoSchedule`]; leaving it (drop) frees the index.
pub struct Seat {
    co: Arc<CoSchedule>,
    index: usize,
}

/// What the planner knows of a taken seat.
pub(crate) struct SeatModel {
    pub label: String,
    pub model: Arc<Model>,
    /// Rows of its last batch.
    pub rows: usize,
    pub latency_bound: Option<Duration>,
}

impl Seat {
    pub fn index(&self) -> usize {
        self.index
    }

    /// Runs one batch of `plan` on `backend`, step by step under the schedule; the outputs are
    /// exactly what `plan.run` gives. `latency_bound` is what the batch may take (the plan
    /// search keeps its predicted time under it; a change is a new mix for the planner).
    pub fn run(
        &self,
        plan: &Plan,
        backend: &dyn Backend,
        inputs: Vec<(String, Tensor)>,
        latency_bound: Option<Duration>,
    ) -> Result<Vec<(String, Tensor)>, RunError> {
        let rows = inputs
            .first()
            .and_then(|(_, t)| t.shape.first().copied())
            .unwrap_or(1);
        let mut values = plan.bind_inputs(inputs)?;
        let gacer = self.co.fitting_plan();
        let _running = Running::start(&self.co, self.index, (rows, latency_bound));
        let mut result = Ok(());
        backend.scope(&mut || {
            result = (0..plan.steps.len()).try_for_each(|s| {
                let step = StepRef {
                    tenant: self.index,
                    step: s,
                };
                let pieces = match &gacer {
                    Some(p) => {
                        p.waits_of(step).for_each(|w| self.co.wait_for(w));
                        p.splits[self.index][s].max(1)
                    }
                    None => 1,
                };
                let mut guard = StepGuard::start(&self.co, step);
                let exec = |op: &Op, refs: &[Option<&Tensor>]| {
                    execute_in_pieces(backend, op, refs, pieces)
                };
                let ran = plan.run_step(backend, &exec, &mut values, s);
                guard.ok = ran.is_ok();
                ran
            })
        });
        result?;
        plan.collect_outputs(&values)
    }
}

impl Seat {
    /// Runs one batch on a GPU instance under the schedule: every step issued onto the
    /// instance's stream at once, each in the plan's number of pieces, with the plan's pointers
    /// as event waits and records between the seats' streams. The host waits once, for the
    /// outputs.
    pub fn run_on_device(
        &self,
        instance: &mut Instance,
        inputs: Vec<(String, Tensor)>,
        latency_bound: Option<Duration>,
    ) -> Result<Vec<(String, Tensor)>, RunError> {
        let rows = inputs
            .first()
            .and_then(|(_, t)| t.shape.first().copied())
            .unwrap_or(1);
        let plan = self.co.fitting_plan();
        let api = instance.device().clone();
        // The events of this batch's pointers, looked up before anything is issued.
        let mut waits = std::collections::HashMap::new();
        let mut signals = std::collections::HashMap::new();
        if let Some(p) = &plan {
            for ptr in &p.pointers {
                if ptr.waiter.tenant == self.index {
                    let e = self.co.event(&api, ptr.after)?;
                    waits
                        .entry(ptr.waiter.step)
                        .or_insert_with(Vec::new)
                        .push(e);
                }
                if ptr.after.tenant == self.index {
                    signals.insert(ptr.after.step, self.co.event(&api, ptr.after)?);
                }
            }
        }
        let coord = SeatEvents {
            seat: self.index,
            plan: plan.as_deref(),
            waits,
            signals,
        };
        let _running = Running::start(&self.co, self.index, (rows, latency_bound));
        instance
            .run(inputs, &coord)
            .map_err(crate::engine::run_error)
    }
}

/// A seat's pointers and pieces as device events.
struct SeatEvents<'a> {
    seat: usize,
    plan: Option<&'a GacerPlan>,
    waits: std::collections::HashMap<usize, Vec<EventId>>,
    signals: std::collections::HashMap<usize, EventId>,
}

impl Coordination for SeatEvents<'_> {
    fn waits(&self, step: usize) -> Vec<EventId> {
        self.waits.get(&step).cloned().unwrap_or_default()
    }
    fn signal(&self, step: usize) -> Option<EventId> {
        self.signals.get(&step).copied()
    }
    fn pieces(&self, step: usize) -> usize {
        self.plan
            .and_then(|p| p.splits.get(self.seat)?.get(step).copied())
            .unwrap_or(1)
            .max(1)
    }
}

/// A seat's batch in flight; ends (the seat idle again) when dropped, a panic included.
/// Rows of a batch and its latency bound.
type BatchShape = (usize, Option<Duration>);

struct Running<'a> {
    co: &'a CoSchedule,
    seat: usize,
}

impl<'a> Running<'a> {
    fn start(co: &'a CoSchedule, seat: usize, batch: BatchShape) -> Running<'a> {
        co.set_running(seat, Some(batch));
        Running { co, seat }
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.co.set_running(self.seat, None);
    }
}

/// A step running; releases the token and wakes the waiters when dropped, a panic included.
struct StepGuard<'a> {
    co: &'a CoSchedule,
    step: StepRef,
    ok: bool,
}

impl<'a> StepGuard<'a> {
    fn start(co: &'a CoSchedule, step: StepRef) -> StepGuard<'a> {
        co.start_step(step);
        StepGuard {
            co,
            step,
            ok: false,
        }
    }
}

impl Drop for StepGuard<'_> {
    fn drop(&mut self) {
        self.co.finish_step(self.step, self.ok);
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut st = self.co.lock();
        if let Some(s) = st.seats.get_mut(self.index) {
            *s = None;
        }
        drop(st);
        self.co.changed.notify_all();
    }
}
