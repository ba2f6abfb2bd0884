//! The serving runtime of one tenant replica: a bounded queue with admission control, a dynamic
//! batcher, and `instances` workers that each run batches of up to `batch` rows with their own
//! thread budget. Knobs change while serving without dropping queued requests. No HTTP here: the
//! agent submits requests and gets a callback.
//!
//! Requests share a batch only when the plan proves its batch separable (no sample sees
//! another's data). A panic while running a batch is contained to it: its requests get an
//! error, the instance is replaced, and the tenant's crash hook (`Tenant::on_crash`) hears
//! why.

mod admission;
mod batch;
pub mod cosched;
mod measure;
pub mod planner;
pub mod stats;

pub use admission::{BatchTimes, Overrun, predicted_latency};
pub use batch::{Rows, batchable, check, stack};
pub use cosched::{CoSchedule, Seat};
pub use measure::{Measurement, measure, measure_within};
pub use planner::Planner;
pub use stats::{ShedReason, Stats, WindowSummary};

use crate::device::{Device, Placed};
use crate::engine::Engine;
use crate::error::RunError;
use crate::plan::Model;
use crate::tensor::Tensor;
use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How a replica serves.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantConfig {
    /// For thread names and errors.
    pub name: String,
    /// Largest batch (rows) one instance runs.
    pub max_batch: usize,
    /// Concurrent instances.
    pub instances: usize,
    /// CPU threads each instance may use.
    pub threads_per_instance: usize,
    /// Requests that may wait; beyond it requests are shed.
    pub queue_capacity: usize,
    /// How long the batcher may hold a request waiting for a fuller batch.
    pub max_queue_delay: Duration,
    /// The latency objective: requests predicted to miss it are shed.
    pub slo: Duration,
    /// The percentile of requests that must meet `slo` (0–100).
    pub slo_percentile: f64,
    /// Rows one request may carry.
    pub max_request_rows: usize,
    /// Where the instances compute; each gets an engine of its own.
    pub device: Device,
}

/// Why a request was not queued.
#[derive(Debug, thiserror::Error)]
pub enum Rejected {
    #[error("invalid request: {0}")]
    Invalid(RunError),
    #[error("request of {rows} rows exceeds the limit of {limit}")]
    TooManyRows { rows: usize, limit: usize },
    #[error("queue full ({0} requests waiting)")]
    QueueFull(usize),
    #[error("predicted latency {predicted:?} (queueing and compute) exceeds the SLO {slo:?}")]
    WouldMissSlo { predicted: Duration, slo: Duration },
    #[error("the tenant is shutting down")]
    Closed,
}

/// What a finished request gets.
#[derive(Debug)]
pub struct Completed {
    pub outputs: Vec<(String, Tensor)>,
    pub queue_time: Duration,
    pub compute_time: Duration,
    /// Rows of the batch it ran in.
    pub batch_rows: usize,
}

/// Called once per accepted request, from a worker thread.
pub type Reply = Box<dyn FnOnce(Result<Completed, RunError>) + Send>;

struct Pending {
    rows: Rows,
    arrived: Instant,
    /// Admission's prediction of its latency, before the overrun factor, for the overrun to learn
    /// from; `None` when there was none or it came from batches run at other knobs.
    predicted: Option<Duration>,
    reply: Reply,
}

struct Queue {
    items: VecDeque<Pending>,
    queued_rows: usize,
    /// When each batch now running started.
    running: Vec<Instant>,
    closed: bool,
}

struct Knobs {
    max_batch: usize,
    instances: usize,
    max_queue_delay: Duration,
}

struct Shared {
    config: TenantConfig,
    model: Arc<Model>,
    /// The model on the device (on a GPU its weights, resident once for every instance), or why
    /// it could not be placed (every batch is then answered with that).
    placed: Result<Placed, String>,
    /// The device's co-schedule this replica's workers take seats in, if any.
    co: Option<Arc<CoSchedule>>,
    batchable: bool,
    queue: Mutex<Queue>,
    wake: Condvar,
    knobs: Mutex<Knobs>,
    /// Recent batch compute times, for admission.
    batch_times: Mutex<BatchTimes>,
    /// How far requests overran admission's predictions.
    overrun: Mutex<Overrun>,
    stats: Stats,
    /// Why the model crashed a worker, once it has.
    crashed: Mutex<Option<String>>,
    /// Told once, from the worker, when the model first crashes one.
    on_crash: Mutex<Option<CrashHook>>,
}

/// Called with the reason when a tenant's model crashes a worker (see [`Tenant::on_crash`]).
pub type CrashHook = Box<dyn FnOnce(String) + Send>;

struct Worker {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<()>,
}

/// One tenant replica being served.
pub struct Tenant {
    shared: Arc<Shared>,
    workers: Mutex<Vec<Worker>>,
    retired: Mutex<Vec<JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Tenant {
    /// Starts serving `model` with `config`, its workers issuing freely.
    pub fn start(model: Arc<Model>, config: TenantConfig) -> Tenant {
        Tenant::start_in(model, config, None)
    }

    /// Starts serving `model` with `config`; with `co`, every worker takes a seat in that
    /// co-schedule and runs its batches under it.
    pub fn start_in(
        model: Arc<Model>,
        config: TenantConfig,
        co: Option<Arc<CoSchedule>>,
    ) -> Tenant {
        let placed = config.device.place(&config.name, &model);
        Tenant::start_placed(model, placed, config, co)
    }

    /// Starts serving a model already placed on `config.device` (its weights resident there).
    pub fn start_on(placed: Placed, config: TenantConfig, co: Option<Arc<CoSchedule>>) -> Tenant {
        let model = placed.model().clone();
        Tenant::start_placed(model, Ok(placed), config, co)
    }

    fn start_placed(
        model: Arc<Model>,
        placed: Result<Placed, String>,
        config: TenantConfig,
        co: Option<Arc<CoSchedule>>,
    ) -> Tenant {
        let batchable = batchable(&model.plan);
        let knobs = Knobs {
            max_batch: if batchable {
                config.max_batch.max(1)
            } else {
                1
            },
            instances: config.instances.max(1),
            max_queue_delay: config.max_queue_delay,
        };
        let shared = Arc::new(Shared {
            placed,
            stats: Stats::new(config.slo),
            overrun: Mutex::new(Overrun::new(config.slo, config.slo_percentile)),
            config,
            model,
            co,
            batchable,
            queue: Mutex::new(Queue {
                items: VecDeque::new(),
                queued_rows: 0,
                running: Vec::new(),
                closed: false,
            }),
            wake: Condvar::new(),
            knobs: Mutex::new(knobs),
            batch_times: Mutex::new(BatchTimes::default()),
            crashed: Mutex::new(None),
            on_crash: Mutex::new(None),
        });
        let tenant = Tenant {
            shared,
            workers: Mutex::new(Vec::new()),
            retired: Mutex::new(Vec::new()),
        };
        tenant.resize_workers();
        tenant
    }

    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.shared.model
    }

    /// Where the instances compute.
    pub fn device(&self) -> &Device {
        &self.shared.config.device
    }

    /// Device bytes the replica holds: on a GPU its weights once plus its instances' arenas;
    /// 0 on the CPU or when it could not be placed.
    pub fn device_bytes(&self) -> u64 {
        self.shared.placed.as_ref().map_or(0, Placed::device_bytes)
    }

    /// Current (max batch, instances).
    pub fn knobs(&self) -> (usize, usize) {
        let k = lock(&self.shared.knobs);
        (k.max_batch, k.instances)
    }

    /// Whether requests are batched together along their first dimension.
    pub fn batchable(&self) -> bool {
        self.shared.batchable
    }

    /// Rows one request may carry.
    pub fn max_request_rows(&self) -> usize {
        self.shared.config.max_request_rows
    }

    /// Why requests are never batched together although the model's inputs have a batch
    /// dimension (see `passes::batch_refusal`); `None` when they are, or cannot be.
    pub fn batch_refusal(&self) -> Option<&str> {
        self.shared.model.plan.batch_refusal.as_deref()
    }

    /// Why the model crashed a worker, if it ever did.
    pub fn crashed(&self) -> Option<String> {
        lock(&self.shared.crashed).clone()
    }

    /// Calls `hook` with the reason the first time the model crashes a worker (at once, if it
    /// already has). The crashed batch's requests get an error and the worker is replaced
    /// either way; the hook is for whoever must mark the tenant failed.
    pub fn on_crash(&self, hook: CrashHook) {
        let crashed = lock(&self.shared.crashed).clone();
        match crashed {
            Some(why) => hook(why),
            None => *lock(&self.shared.on_crash) = Some(hook),
        }
    }

    /// Requests waiting.
    pub fn queue_depth(&self) -> usize {
        lock(&self.shared.queue).items.len()
    }

    /// What admission multiplies its latency predictions by: how far recent requests overran
    /// them, at the SLO's percentile (1 when they did not).
    pub fn admission_overrun(&self) -> f64 {
        lock(&self.shared.overrun).factor()
    }

    /// Changes the knobs while serving; queued requests stay queued. A change starts a new
    /// epoch of the tenant's window ([`Stats::start_epoch`]): it measures the new knobs only.
    pub fn set_knobs(&self, max_batch: usize, instances: usize, max_queue_delay: Duration) {
        let changed = {
            let mut k = lock(&self.shared.knobs);
            let before = (k.max_batch, k.instances);
            k.max_batch = if self.shared.batchable {
                max_batch.max(1)
            } else {
                1
            };
            k.instances = instances.max(1);
            k.max_queue_delay = max_queue_delay;
            (k.max_batch, k.instances) != before
        };
        if changed {
            lock(&self.shared.batch_times).knobs_changed();
            self.shared.stats.start_epoch();
        }
        self.resize_workers();
        self.shared.wake.notify_all();
    }

    /// A new objective: `percentile` (0–100) of requests within `slo`.
    pub fn set_slo(&self, slo: Duration, percentile: f64) {
        self.shared.stats.set_slo(slo);
        lock(&self.shared.overrun).set_slo(slo, percentile);
    }

    fn resize_workers(&self) {
        let want = lock(&self.shared.knobs).instances;
        let mut workers = lock(&self.workers);
        while workers.len() > want {
            if let Some(w) = workers.pop() {
                w.stop.store(true, Ordering::Relaxed);
                lock(&self.retired).push(w.handle);
            }
        }
        while workers.len() < want {
            let stop = Arc::new(AtomicBool::new(false));
            let shared = self.shared.clone();
            let flag = stop.clone();
            let name = format!("{}-{}", self.shared.config.name, workers.len());
            let spawned = std::thread::Builder::new()
                .name(name)
                .spawn(move || worker_loop(&shared, &flag));
            match spawned {
                Ok(handle) => workers.push(Worker { stop, handle }),
                // Out of threads: serve with what exists rather than fail the tenant.
                Err(_) => break,
            }
        }
        drop(workers);
        self.shared.wake.notify_all();
    }

    /// Checks and queues a request; `reply` is called once it has run. Admission control sheds
    /// it when the queue is full or when its predicted latency, scaled by how far recent requests
    /// overran their predictions at the SLO's percentile, exceeds the SLO.
    pub fn submit(&self, inputs: Vec<(String, Tensor)>, reply: Reply) -> Result<(), Rejected> {
        let shared = &self.shared;
        shared.stats.arrival();
        let rows = check(&shared.model.plan.inputs, inputs, shared.batchable).map_err(|e| {
            shared.stats.error();
            Rejected::Invalid(e)
        })?;
        if rows.rows > shared.config.max_request_rows {
            shared.stats.error();
            return Err(Rejected::TooManyRows {
                rows: rows.rows,
                limit: shared.config.max_request_rows,
            });
        }
        let (max_batch, instances) = self.knobs();
        let slo = shared.stats.slo();
        let (per_batch, settled) = {
            let times = lock(&shared.batch_times);
            (times.estimate(), times.settled())
        };
        let overrun = lock(&shared.overrun).factor();
        let mut queue = lock(&shared.queue);
        if queue.closed {
            shared.stats.shed(ShedReason::NotReady);
            return Err(Rejected::Closed);
        }
        if queue.items.len() >= shared.config.queue_capacity {
            shared.stats.shed(ShedReason::QueueFull);
            return Err(Rejected::QueueFull(queue.items.len()));
        }
        // An idle instance with nothing queued always takes the request, so a tenant slower than
        // its SLO still serves and keeps being measured.
        let idle = queue.items.is_empty() && queue.running.len() < instances;
        let now = Instant::now();
        let predicted = per_batch.map(|per_batch| {
            let running: Vec<Duration> = queue.running.iter().map(|s| now - *s).collect();
            predicted_latency(
                per_batch,
                &running,
                queue.queued_rows,
                rows.rows,
                max_batch,
                instances,
            )
        });
        if let Some(predicted) = predicted.filter(|_| !idle) {
            let predicted = Duration::try_from_secs_f64(predicted.as_secs_f64() * overrun)
                .unwrap_or(Duration::MAX);
            if predicted > slo {
                shared.stats.shed(ShedReason::WouldMissSlo);
                return Err(Rejected::WouldMissSlo { predicted, slo });
            }
        }
        queue.queued_rows += rows.rows;
        queue.items.push_back(Pending {
            rows,
            arrived: now,
            predicted: predicted.filter(|_| settled),
            reply,
        });
        drop(queue);
        shared.wake.notify_one();
        Ok(())
    }

    /// Stops accepting, finishes every queued request, and joins the workers.
    pub fn shutdown(&self) {
        lock(&self.shared.queue).closed = true;
        self.shared.wake.notify_all();
        let workers: Vec<Worker> = lock(&self.workers).drain(..).collect();
        for w in workers {
            let _ = w.handle.join();
        }
        let retired: Vec<JoinHandle<()>> = lock(&self.retired).drain(..).collect();
        for h in retired {
            let _ = h.join();
        }
    }
}

impl Drop for Tenant {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Takes the next batch: the oldest request plus later ones with the same shapes, up to
/// `max_batch` rows, waiting up to the queue delay for a fuller batch. `None` when this worker
/// should exit. A non-empty batch is counted as running from the returned instant.
fn next_batch(shared: &Shared, stop: &AtomicBool) -> Option<(Vec<Pending>, Instant)> {
    let mut queue = lock(&shared.queue);
    loop {
        if stop.load(Ordering::Relaxed) || (queue.closed && queue.items.is_empty()) {
            return None;
        }
        if !queue.items.is_empty() {
            break;
        }
        queue = shared.wake.wait(queue).unwrap_or_else(|e| e.into_inner());
    }
    let (max_batch, delay) = {
        let k = lock(&shared.knobs);
        (k.max_batch, k.max_queue_delay)
    };
    if let Some(head) = queue.items.front() {
        let deadline = head.arrived + delay;
        while queue.queued_rows < max_batch && !queue.closed && !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            queue = shared
                .wake
                .wait_timeout(queue, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            if queue.items.is_empty() {
                // Another worker took them.
                return Some((Vec::new(), Instant::now()));
            }
        }
    }
    let mut taken = Vec::new();
    let Some(head) = queue.items.pop_front() else {
        return Some((taken, Instant::now()));
    };
    let mut rows = head.rows.rows;
    let mut i = 0;
    while i < queue.items.len() && rows < max_batch {
        let fits = rows + queue.items[i].rows.rows <= max_batch
            && queue.items[i].rows.key() == head.rows.key();
        if fits {
            if let Some(p) = queue.items.remove(i) {
                rows += p.rows.rows;
                taken.push(p);
            }
        } else {
            i += 1;
        }
    }
    taken.insert(0, head);
    queue.queued_rows -= rows;
    let started = Instant::now();
    queue.running.push(started);
    // Others may still be waiting for work.
    if !queue.items.is_empty() {
        shared.wake.notify_one();
    }
    Some((taken, started))
}

/// The engine of one more instance of the replica: on a GPU its own stream (the co-schedule's
/// shared one under `sequential`), arena and staging over the tenant's resident weights.
fn instance_engine(shared: &Shared) -> Result<Box<dyn Engine>, String> {
    let placed = shared.placed.as_ref().map_err(Clone::clone)?;
    let stream = match (&shared.co, shared.config.device.api()) {
        (Some(co), Some(api)) => co.shared_stream(api).map_err(|e| e.to_string())?,
        _ => None,
    };
    placed.engine(shared.config.threads_per_instance, stream)
}

/// One instance: takes batches and runs them, in its seat of the co-schedule if it has one. An
/// instance whose engine could not be made answers every batch with why.
struct Instance {
    engine: Result<Box<dyn Engine>, String>,
    seat: Option<Seat>,
}

impl Instance {
    fn new(shared: &Shared) -> Instance {
        let engine = instance_engine(shared);
        let seat = shared
            .co
            .as_ref()
            .map(|co| co.join(shared.config.name.clone(), shared.model.clone()));
        Instance { engine, seat }
    }
}

fn worker_loop(shared: &Shared, stop: &AtomicBool) {
    let mut inst = Instance::new(shared);
    while let Some((batch, started)) = next_batch(shared, stop) {
        if batch.is_empty() {
            continue;
        }
        let outcome = compute(shared, &mut inst, &batch);
        // Done before the replies go out, so a caller that resubmits sees the instance free.
        let mut queue = lock(&shared.queue);
        if let Some(i) = queue.running.iter().position(|s| *s == started) {
            queue.running.swap_remove(i);
        }
        drop(queue);
        reply(shared, &mut inst, batch, outcome);
    }
}

/// Test-only fault injection (feature `fault-injection`, always on in this crate's tests):
/// every batch of a named tenant panics, so that tests can watch a crash being contained
/// where no real model triggers one.
#[cfg(any(test, feature = "fault-injection"))]
pub mod faults {
    use std::sync::Mutex;

    static PANICKING: Mutex<Vec<String>> = Mutex::new(Vec::new());

    /// From now on, every batch of tenant `name` panics (`false`: stops doing so).
    pub fn panic_in_batches_of(name: &str, on: bool) {
        let mut names = super::lock(&PANICKING);
        names.retain(|n| n != name);
        if on {
            names.push(name.to_string());
        }
    }

    pub(crate) fn check(name: &str) {
        if super::lock(&PANICKING).iter().any(|n| n == name) {
            panic!("injected fault: every batch of {name:?} panics");
        }
    }
}

/// One batch's outputs, and how long computing them took; `Err` with the panic's message when
/// the model crashed the instance.
type Outcome = Result<(Result<Vec<(String, Tensor)>, RunError>, Instant, Duration), String>;

fn compute(shared: &Shared, inst: &mut Instance, batch: &[Pending]) -> Outcome {
    let plan = &shared.model.plan;
    let names = plan.inputs.iter().map(|i| i.name.clone());
    let started = Instant::now();
    let refs: Vec<&Rows> = batch.iter().map(|p| &p.rows).collect();
    // A panic is contained to this batch: nothing it touched is shared with other batches but
    // the instance, which the caller replaces.
    let result = catch_unwind(AssertUnwindSafe(|| {
        #[cfg(any(test, feature = "fault-injection"))]
        faults::check(&shared.config.name);
        stack(&refs).and_then(|stacked| {
            let inputs = names.zip(stacked).collect();
            let engine = inst
                .engine
                .as_mut()
                .map_err(|why| RunError::Device(why.clone()))?;
            match &inst.seat {
                // Half the SLO for the batch itself, the other half for queueing and batching.
                Some(seat) => engine.run_seated(seat, inputs, Some(shared.stats.slo() / 2)),
                None => engine.run(inputs),
            }
        })
    }))
    .map_err(|panic| panic_message(panic.as_ref()))?;
    Ok((result, started, started.elapsed()))
}

/// What a panic said, when it said it with a string.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic without a message".into())
}

impl Shared {
    /// Records that the model crashed a worker and tells the hook, the first time.
    fn crashed(&self, why: &str) {
        let first = {
            let mut crashed = lock(&self.crashed);
            let first = crashed.is_none();
            crashed.get_or_insert_with(|| why.to_string());
            first
        };
        if first && let Some(hook) = lock(&self.on_crash).take() {
            hook(why.to_string());
        }
    }
}

fn reply(shared: &Shared, inst: &mut Instance, batch: Vec<Pending>, outcome: Outcome) {
    let rows: Vec<usize> = batch.iter().map(|p| p.rows.rows).collect();
    let total: usize = rows.iter().sum();
    match outcome {
        // The instance may be left in any state: a fresh one takes its place, and every request
        // of the batch is told (a 5xx: the tenant's fault, not the caller's).
        Err(why) => {
            *inst = Instance::new(shared);
            shared.crashed(&why);
            for pending in batch {
                shared.stats.error();
                (pending.reply)(Err(RunError::Device(format!(
                    "the model crashed while running this request's batch ({why}); its worker was replaced"
                ))));
            }
        }
        Ok((Ok(outputs), started, compute_time)) => {
            shared.stats.batch(total);
            lock(&shared.batch_times).record(compute_time);
            {
                let mut overrun = lock(&shared.overrun);
                let now = Instant::now();
                for pending in &batch {
                    if let Some(predicted) = pending.predicted {
                        let queue_time = started.saturating_duration_since(pending.arrived);
                        overrun.record(now, predicted, queue_time + compute_time);
                    }
                }
            }
            for (pending, outputs) in batch
                .into_iter()
                .zip(crate::tensor::split_rows(outputs, &rows))
            {
                let queue_time = started.saturating_duration_since(pending.arrived);
                shared.stats.completion(queue_time, compute_time);
                (pending.reply)(Ok(Completed {
                    outputs,
                    queue_time,
                    compute_time,
                    batch_rows: total,
                }));
            }
        }
        // One bad request must not fail its batch-mates: run each alone to find it.
        Ok((Err(_), ..)) if batch.len() > 1 => {
            for pending in batch {
                let alone = std::slice::from_ref(&pending);
                let outcome = compute(shared, inst, alone);
                reply(shared, inst, vec![pending], outcome);
            }
        }
        Ok((Err(e), ..)) => {
            shared.stats.error();
            if let Some(pending) = batch.into_iter().next() {
                (pending.reply)(Err(e));
            }
        }
    }
}

#[cfg(test)]
mod tests;
