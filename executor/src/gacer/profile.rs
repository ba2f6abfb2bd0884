//! Per-operator profiles GACER's cost model works from: for each plan step at a batch size, its
//! time alone and its launch footprint (blocks, threads, shared memory, registers), which against
//! a device's shape gives the share of the device the operator occupies.
//!
//! Times are measured where the tenants run: with host timers on the CPU backend, with events on
//! a GPU. On a GPU the footprint is the real launch (grid and block from the lowering, registers
//! and shared memory from the compiled kernel); cuBLAS's launches are estimated from the
//! product's size. On the CPU it is estimated from the operator's output size.

use super::resize::{self, split_rows};
use crate::backend::Backend;
use crate::error::RunError;
use crate::gpu::api::{Gemm, KernelAttributes, Launch};
use crate::gpu::lower::Work;
use crate::gpu::{Coordination, Instance, StepKind};
use crate::ops::Op;
use crate::plan::Plan;
use crate::tensor::Tensor;
use std::cell::RefCell;
use std::time::{Duration, Instant};

/// The parallel resources of a device, as a launch sees them.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceShape {
    pub name: String,
    /// Streaming multiprocessors (GPU) or cores (CPU).
    pub units: usize,
    pub max_threads_per_unit: usize,
    pub max_blocks_per_unit: usize,
    pub shared_mem_per_unit: usize,
    pub registers_per_unit: usize,
    /// Units one stream can hold at once: every SM on a GPU, its thread budget on the CPU.
    pub units_per_stream: usize,
    /// What one extra launch costs (a resized operator launches once per piece).
    pub launch_overhead: Duration,
}

impl DeviceShape {
    /// An NVIDIA H200 (Hopper, 132 SMs).
    pub fn h200() -> DeviceShape {
        DeviceShape::gpu("H200", 132)
    }

    /// An NVIDIA GPU of `multiprocessors` SMs with Hopper's per-SM limits (Ampere's differ only
    /// in shared memory, which the footprint estimate rarely binds on).
    pub fn gpu(name: &str, multiprocessors: usize) -> DeviceShape {
        let sms = multiprocessors.max(1);
        DeviceShape {
            name: name.to_string(),
            units: sms,
            max_threads_per_unit: 2048,
            max_blocks_per_unit: 32,
            shared_mem_per_unit: 228 * 1024,
            registers_per_unit: 65536,
            units_per_stream: sms,
            launch_overhead: Duration::from_micros(5),
        }
    }

    /// A CPU of `cores` cores where each stream (worker) runs with `threads_per_stream` threads:
    /// a block is one core's worth of work, so an operator occupies at most its stream's threads.
    pub fn cpu(cores: usize, threads_per_stream: usize) -> DeviceShape {
        let cores = cores.max(1);
        DeviceShape {
            name: format!("cpu({cores} cores, {threads_per_stream} threads per stream)"),
            units: cores,
            max_threads_per_unit: LaunchFootprint::THREADS,
            max_blocks_per_unit: 1,
            shared_mem_per_unit: usize::MAX,
            registers_per_unit: usize::MAX,
            units_per_stream: threads_per_stream.clamp(1, cores),
            launch_overhead: Duration::from_micros(20),
        }
    }
}

/// The size of one kernel launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchFootprint {
    pub blocks: usize,
    pub threads_per_block: usize,
    pub shared_mem_per_block: usize,
    pub registers_per_thread: usize,
}

impl LaunchFootprint {
    const THREADS: usize = 256;
    /// Output elements one block of a tiled matrix kernel (Conv, Gemm, MatMul) computes.
    const TILE: usize = 64 * 64;

    /// The launch a straightforward CUDA kernel for `op` would make for `out_elems` outputs:
    /// 64x64 output tiles staged through shared memory for matrix products, one thread per
    /// element otherwise.
    pub fn estimate(op: &Op, out_elems: usize) -> LaunchFootprint {
        let tiled = matches!(
            op,
            Op::Conv(_)
                | Op::PointwiseDepthwise(_)
                | Op::ConvTranspose(_)
                | Op::Gemm(_)
                | Op::MatMul { .. }
        );
        if tiled {
            LaunchFootprint {
                blocks: out_elems.div_ceil(Self::TILE).max(1),
                threads_per_block: Self::THREADS,
                shared_mem_per_block: 2 * 64 * 16 * 4,
                registers_per_thread: 64,
            }
        } else {
            LaunchFootprint {
                blocks: out_elems.div_ceil(Self::THREADS).max(1),
                threads_per_block: Self::THREADS,
                shared_mem_per_block: 0,
                registers_per_thread: 32,
            }
        }
    }

    /// A real kernel launch: its grid and block, and what the compiled kernel needs per thread
    /// and block.
    pub fn of_launch(l: &Launch, a: KernelAttributes) -> LaunchFootprint {
        LaunchFootprint {
            blocks: l.blocks() as usize,
            threads_per_block: l.threads_per_block() as usize,
            shared_mem_per_block: a.shared_mem_per_block + l.shared_mem as usize,
            registers_per_thread: a.registers_per_thread,
        }
    }

    /// A cuBLAS SGEMM, which picks its own kernel: estimated as output tiles of 128 x 128, each a
    /// block of 256 threads with 128 registers and 48 KiB of shared memory, the usual shape of
    /// cuBLAS's fp32 kernels on Hopper and Ampere.
    pub fn of_gemm(g: &Gemm) -> LaunchFootprint {
        LaunchFootprint {
            blocks: (g.m.div_ceil(128) * g.n.div_ceil(128) * g.batch).max(1),
            threads_per_block: 256,
            shared_mem_per_block: 48 * 1024,
            registers_per_thread: 128,
        }
    }

    /// Threads it launches in all.
    fn threads(&self) -> usize {
        self.blocks * self.threads_per_block
    }

    /// One of `k` pieces of this launch.
    pub fn piece(&self, k: usize) -> LaunchFootprint {
        LaunchFootprint {
            blocks: self.blocks.div_ceil(k.max(1)).max(1),
            ..*self
        }
    }

    /// Blocks of this launch one unit holds at once (at least one).
    fn resident_per_unit(&self, d: &DeviceShape) -> usize {
        let by_threads = d.max_threads_per_unit / self.threads_per_block.max(1);
        let by_smem = d
            .shared_mem_per_unit
            .checked_div(self.shared_mem_per_block)
            .unwrap_or(usize::MAX);
        let regs = self.registers_per_thread * self.threads_per_block;
        let by_regs = d.registers_per_unit.checked_div(regs).unwrap_or(usize::MAX);
        d.max_blocks_per_unit
            .min(by_threads)
            .min(by_smem)
            .min(by_regs)
            .max(1)
    }

    /// Share of the device this launch occupies while it runs, in (0, 1].
    pub fn occupancy(&self, d: &DeviceShape) -> f64 {
        let per_unit = self.resident_per_unit(d);
        let capacity = d.units.max(1) * per_unit;
        let usable = d.units_per_stream.clamp(1, d.units.max(1)) * per_unit;
        self.blocks.min(usable) as f64 / capacity as f64
    }
}

/// One plan step at one batch size.
#[derive(Clone, Debug, PartialEq)]
pub struct StepProfile {
    /// The op's name, for reports.
    pub op: String,
    /// Time alone, median of the measured runs.
    pub time: Duration,
    pub footprint: LaunchFootprint,
    /// Rows the step can be resized along (`None`: it cannot be).
    pub split_rows: Option<usize>,
    /// Measured time of one piece when the step runs as `k` pieces, where it was measured.
    pub piece_times: Vec<(usize, Duration)>,
}

impl StepProfile {
    /// Time of one of `k` pieces: measured when available, else the whole time scaled by the
    /// piece's rows plus one launch.
    pub fn piece_time(&self, k: usize, d: &DeviceShape) -> Duration {
        if k <= 1 {
            return self.time;
        }
        if let Some((_, t)) = self.piece_times.iter().find(|(f, _)| *f == k) {
            return *t;
        }
        let rows = self.split_rows.unwrap_or(1).max(1) as f64;
        let piece_rows = (rows / k as f64).ceil();
        self.time.mul_f64(piece_rows / rows) + d.launch_overhead
    }

    /// Whether the step can run as `k` pieces.
    pub fn can_split(&self, k: usize) -> bool {
        k <= 1 || self.split_rows.is_some_and(|r| r >= k)
    }
}

/// Every step of one model at one batch size.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelProfile {
    /// Which model (the plan cache keys on it).
    pub model: String,
    pub batch: usize,
    pub steps: Vec<StepProfile>,
}

/// What one measured pass over the steps saw.
struct Pass {
    times: Vec<Duration>,
    out_elems: Vec<usize>,
    split_rows: Vec<Option<usize>>,
}

/// Runs the plan step by step once, timing each step.
fn timed_pass(
    plan: &Plan,
    backend: &dyn Backend,
    inputs: Vec<(String, Tensor)>,
) -> Result<Pass, RunError> {
    let mut inputs = Some(inputs);
    let mut result: Result<Pass, RunError> = Err(RunError::MissingOutput("no pass ran".into()));
    backend.scope(&mut || {
        let seen = RefCell::new((0usize, None));
        let exec = |op: &Op, refs: &[Option<&Tensor>]| {
            let outs = backend.execute(op, refs)?;
            let elems = outs.iter().map(|t| t.len()).sum();
            let rows = split_rows(op, refs).filter(|_| outs.len() == 1);
            *seen.borrow_mut() = (elems, rows);
            Ok(outs)
        };
        result = steps_timed(
            plan,
            backend,
            &exec,
            &seen,
            inputs.take().unwrap_or_default(),
        );
    });
    result
}

fn steps_timed(
    plan: &Plan,
    backend: &dyn Backend,
    exec: &crate::plan::StepExec<'_>,
    seen: &RefCell<(usize, Option<usize>)>,
    inputs: Vec<(String, Tensor)>,
) -> Result<Pass, RunError> {
    let n = plan.steps.len();
    let mut pass = Pass {
        times: Vec::with_capacity(n),
        out_elems: Vec::with_capacity(n),
        split_rows: Vec::with_capacity(n),
    };
    let mut values = plan.bind_inputs(inputs)?;
    for i in 0..n {
        *seen.borrow_mut() = (0, None);
        let t0 = Instant::now();
        plan.run_step(backend, exec, &mut values, i)?;
        pass.times.push(t0.elapsed());
        let (elems, rows) = *seen.borrow();
        pass.out_elems.push(elems);
        pass.split_rows.push(rows);
    }
    Ok(pass)
}

/// Median of each step's time over `reps` passes (after one warm-up pass).
fn median_pass(
    plan: &Plan,
    backend: &dyn Backend,
    inputs: &[(String, Tensor)],
    reps: usize,
) -> Result<Pass, RunError> {
    let first = timed_pass(plan, backend, inputs.to_vec())?;
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); plan.steps.len()];
    for _ in 0..reps.max(1) {
        let p = timed_pass(plan, backend, inputs.to_vec())?;
        for (s, t) in samples.iter_mut().zip(p.times) {
            s.push(t);
        }
    }
    let times = samples
        .into_iter()
        .map(|mut s| {
            s.sort();
            s[s.len() / 2]
        })
        .collect();
    Ok(Pass { times, ..first })
}

/// Profiles `plan` on `backend` at the batch of `inputs` (their first dimension): each step's
/// time alone over `reps` runs and its footprint; for every factor in `factors` that divides the
/// batch, also the time of one piece, measured by running the model on that share of the rows.
pub fn profile_model(
    model: &str,
    plan: &Plan,
    backend: &dyn Backend,
    inputs: &[(String, Tensor)],
    reps: usize,
    factors: &[usize],
) -> Result<ModelProfile, RunError> {
    let batch = inputs
        .first()
        .and_then(|(_, t)| t.shape.first().copied())
        .unwrap_or(1);
    let whole = median_pass(plan, backend, inputs, reps)?;
    let mut steps: Vec<StepProfile> = (0..plan.steps.len())
        .map(|i| StepProfile {
            op: plan.steps[i].op.name(),
            time: whole.times[i],
            footprint: LaunchFootprint::estimate(&plan.steps[i].op, whole.out_elems[i]),
            split_rows: whole.split_rows[i],
            piece_times: vec![],
        })
        .collect();
    for &k in factors
        .iter()
        .filter(|&&k| k > 1 && batch.is_multiple_of(k))
    {
        let share = batch / k;
        let part: Vec<(String, Tensor)> = inputs
            .iter()
            .map(|(n, t)| Ok((n.clone(), resize::slice_rows(t, 0..share)?)))
            .collect::<Result<_, crate::error::OpError>>()
            .map_err(|source| RunError::Node {
                node: "(profile input)".into(),
                op: "Slice".into(),
                source,
            })?;
        let p = median_pass(plan, backend, &part, reps)?;
        for (i, s) in steps.iter_mut().enumerate() {
            // The piece is this smaller run's step only where the rows really scale with the batch.
            if s.split_rows
                .is_some_and(|r| r == k * p.split_rows[i].unwrap_or(0))
            {
                s.piece_times.push((k, p.times[i]));
            }
        }
    }
    Ok(ModelProfile {
        model: model.to_string(),
        batch,
        steps,
    })
}

/// Runs every step in `k` pieces.
struct Pieces(usize);
impl Coordination for Pieces {
    fn pieces(&self, _: usize) -> usize {
        self.0
    }
}

/// Profiles a model on a GPU instance at the batch of `inputs`: each step's time alone from
/// timing events around it (median of `reps` runs after a warm-up), its footprint from the
/// launches it makes, how far it can be resized, and for every factor in `factors` the time of
/// one piece, measured by running every step in that many pieces.
pub fn profile_on_device(
    model: &str,
    instance: &mut Instance,
    inputs: &[(String, Tensor)],
    reps: usize,
    factors: &[usize],
) -> Result<ModelProfile, RunError> {
    let err = crate::engine::run_error;
    let batch = inputs
        .first()
        .and_then(|(_, t)| t.shape.first().copied())
        .unwrap_or(1);
    let times =
        |instance: &mut Instance, coord: &dyn Coordination| -> Result<Vec<Duration>, RunError> {
            instance.run_timed(inputs.to_vec(), coord).map_err(err)?;
            let mut samples: Vec<Vec<f32>> = Vec::new();
            for _ in 0..reps.max(1) {
                let (_, t) = instance.run_timed(inputs.to_vec(), coord).map_err(err)?;
                samples.resize(t.spans.len(), Vec::new());
                for (s, (a, b)) in samples.iter_mut().zip(t.spans) {
                    s.push((b - a).max(0.0));
                }
            }
            Ok(samples
                .into_iter()
                .map(|mut s| {
                    s.sort_by(f32::total_cmp);
                    Duration::from_secs_f64(f64::from(s[s.len() / 2]) / 1e3)
                })
                .collect())
        };
    let whole = times(instance, &Pieces(1))?;
    let shapes: Vec<Vec<usize>> = inputs.iter().map(|(_, t)| t.shape.clone()).collect();
    let layout = instance.layout(&shapes).map_err(err)?;
    let names: Vec<String> = instance
        .model()
        .plan
        .steps
        .iter()
        .map(|s| s.op.name())
        .collect();
    let mut steps = Vec::with_capacity(whole.len());
    for (si, time) in whole.iter().enumerate() {
        let work = match layout.kinds[si] {
            StepKind::Device => instance.step_work(&layout, si, 1).map_err(err)?,
            _ => Vec::new(),
        };
        let attrs = |l: &Launch| instance.kernel_attributes(l.kernel);
        let footprint = work
            .iter()
            .flatten()
            .map(|w| match w {
                Work::Launch(l) => LaunchFootprint::of_launch(l, attrs(l)),
                Work::Gemm(g) => LaunchFootprint::of_gemm(g),
            })
            .max_by_key(LaunchFootprint::threads)
            .unwrap_or(LaunchFootprint {
                blocks: 1,
                threads_per_block: 1,
                shared_mem_per_block: 0,
                registers_per_thread: 1,
            });
        steps.push(StepProfile {
            op: names[si].clone(),
            time: *time,
            footprint,
            split_rows: Some(layout.max_pieces[si]).filter(|&p| p > 1),
            piece_times: vec![],
        });
    }
    for &k in factors.iter().filter(|&&k| k > 1) {
        let split = times(instance, &Pieces(k))?;
        for (s, t) in steps.iter_mut().zip(split) {
            if s.can_split(k) {
                s.piece_times.push((k, t / k as u32));
            }
        }
    }
    Ok(ModelProfile {
        model: model.to_string(),
        batch,
        steps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn big_launch_fills_the_gpu_small_one_does_not() {
        let d = DeviceShape::h200();
        let conv = Op::MatMul {
            act: None,
            packed: None,
        };
        let big = LaunchFootprint::estimate(&conv, 64 * 64 * 10_000);
        let small = LaunchFootprint::estimate(&conv, 64 * 64 * 10);
        assert_eq!(big.occupancy(&d), 1.0);
        assert!(small.occupancy(&d) < 0.05);
        assert!(big.piece(4).blocks * 4 >= big.blocks);
    }

    #[test]
    fn a_cpu_stream_occupies_at_most_its_threads() {
        let d = DeviceShape::cpu(4, 1);
        let f = LaunchFootprint::estimate(
            &Op::MatMul {
                act: None,
                packed: None,
            },
            1 << 20,
        );
        assert_eq!(f.occupancy(&d), 0.25);
    }
}
