//! Closed-loop measurement of a model at given knobs: `instances` threads, each with its share of
//! the thread budget, run batches of `batch` rows back to back. What the DNNScaler profiler and
//! the `bench` tool report.

use crate::device::Device;
use crate::error::RunError;
use crate::plan::Model;
use crate::tensor::Tensor;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// What one measurement saw.
#[derive(Clone, Debug, PartialEq)]
pub struct Measurement {
    /// Rows per second over all instances.
    pub throughput: f64,
    /// Every batch's latency in milliseconds, sorted.
    pub latencies_ms: Vec<f64>,
    pub elapsed: Duration,
}

impl Measurement {
    /// The `p`-th percentile batch latency (nearest rank), `NaN` when nothing ran.
    pub fn percentile_ms(&self, p: f64) -> f64 {
        let n = self.latencies_ms.len();
        if n == 0 {
            return f64::NAN;
        }
        let i = ((p / 100.0) * (n - 1) as f64).round() as usize;
        self.latencies_ms[i.min(n - 1)]
    }
}

/// Runs `inputs` (a batch of `batch` rows) on `instances` concurrent copies on `device`, each
/// with its share of `threads`, for `duration`, after `warmup` untimed runs each.
#[allow(clippy::too_many_arguments)]
pub fn measure(
    device: &Device,
    model: &Arc<Model>,
    inputs: &[(String, Tensor)],
    batch: usize,
    instances: usize,
    threads: usize,
    duration: Duration,
    warmup: usize,
) -> Result<Measurement, RunError> {
    let deadline = Instant::now() + duration.saturating_mul(4) + Duration::from_secs(600);
    measure_within(
        device, model, inputs, batch, instances, threads, duration, warmup, deadline,
    )
}

/// [`measure`], starting no run after `deadline`: each copy stops warming up and measuring
/// there, and one that has timed no run by then fails the measurement. A slow model at a large
/// batch costs at most one run past the deadline, never an unbounded profile.
#[allow(clippy::too_many_arguments)]
pub fn measure_within(
    device: &Device,
    model: &Arc<Model>,
    inputs: &[(String, Tensor)],
    batch: usize,
    instances: usize,
    threads: usize,
    duration: Duration,
    warmup: usize,
    deadline: Instant,
) -> Result<Measurement, RunError> {
    let instances = instances.max(1);
    let per_instance = (threads / instances).max(1);
    // The weights are placed once for all the instances, as a serving tenant's are.
    let placed = device.place("measure", model).map_err(RunError::Device)?;
    let placed = &placed;
    let ready = Barrier::new(instances + 1);
    let mut started = Instant::now();
    let results: Vec<Result<Vec<f64>, RunError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..instances)
            .map(|_| {
                let ready = &ready;
                s.spawn(move || -> Result<Vec<f64>, RunError> {
                    // Caught, so that a panicking model cannot leave the others at the barrier.
                    let warmed = catch_unwind(AssertUnwindSafe(|| {
                        let mut engine = placed
                            .engine(per_instance, None)
                            .map_err(RunError::Device)?;
                        for _ in 0..warmup {
                            if Instant::now() >= deadline {
                                break;
                            }
                            engine.run(inputs.to_vec())?;
                        }
                        Ok(engine)
                    }))
                    .unwrap_or_else(|panic| Err(crashed(panic.as_ref())));
                    // Every thread reaches the barrier, failed or not, so none waits forever.
                    ready.wait();
                    let mut engine = warmed?;
                    let until = deadline.min(Instant::now() + duration);
                    let mut latencies = Vec::new();
                    while Instant::now() < until
                        || (latencies.is_empty() && Instant::now() < deadline)
                    {
                        let t0 = Instant::now();
                        engine.run(inputs.to_vec())?;
                        latencies.push(t0.elapsed().as_secs_f64() * 1e3);
                    }
                    if latencies.is_empty() {
                        return Err(RunError::Deadline(format!(
                            "no batch of {batch} rows ran before the measurement's deadline"
                        )));
                    }
                    Ok(latencies)
                })
            })
            .collect();
        ready.wait();
        started = Instant::now();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|panic| Err(crashed(panic.as_ref())))
            })
            .collect()
    });
    let elapsed = started.elapsed();
    let mut latencies_ms = Vec::new();
    for r in results {
        latencies_ms.extend(r?);
    }
    latencies_ms.sort_by(f64::total_cmp);
    Ok(Measurement {
        throughput: (latencies_ms.len() * batch) as f64 / elapsed.as_secs_f64().max(1e-9),
        latencies_ms,
        elapsed,
    })
}

fn crashed(panic: &(dyn std::any::Any + Send)) -> RunError {
    RunError::Device(format!(
        "the model crashed a measuring instance: {}",
        super::panic_message(panic)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zoo::{self, ZooOptions};
    use prost::Message;

    /// A deadline already past stops the measurement before any timed run, with an error; a
    /// measurement within its deadline reports its runs.
    #[test]
    fn a_measurement_stops_at_its_deadline() {
        let proto = zoo::build("squeezenet", &ZooOptions::default()).expect("zoo");
        let model = Arc::new(Model::from_bytes(&proto.encode_to_vec()).expect("imports"));
        let inputs = model.plan.example_inputs(1);
        let late = Instant::now();
        let e = measure_within(
            &Device::Cpu,
            &model,
            &inputs,
            1,
            2,
            2,
            Duration::from_secs(3600),
            1000,
            late,
        )
        .expect_err("past its deadline");
        assert!(matches!(e, RunError::Deadline(_)), "{e}");
        let m = measure_within(
            &Device::Cpu,
            &model,
            &inputs,
            1,
            1,
            1,
            Duration::from_millis(1),
            0,
            Instant::now() + Duration::from_secs(600),
        )
        .expect("measures");
        assert!(!m.latencies_ms.is_empty());
    }
}
