//! `CudaBackend`: the [`Backend`] of one tenant on one GPU. Ops with a CUDA path run on the
//! device (host tensors in and out per op; registered constants stay resident); every other op,
//! and every case a CUDA path declines, runs on the CPU backend, so any model runs.

use super::memory::DevicePool;
use super::module::Loaded;
use super::probe::{self, DeviceInfo, Unavailable};
use super::run::{self, Dev, Fail, Resident};
use crate::backend::{Backend, CpuBackend};
use crate::error::OpError;
use crate::ops::Op;
use crate::ops::shape::ShapeOp;
use crate::tensor::Tensor;
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaStream};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// Which device code an op runs (the families of kernels/cuda plus cuBLAS).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    Unary,
    Clip,
    Binary,
    Conv,
    BatchNorm,
    Gemm,
    MatMul,
    Pool,
    GlobalPool,
    Softmax,
    LayerNorm,
    Reduce,
    Transpose,
    Concat,
    Slice,
    Gather,
    Pad,
}

impl Kernel {
    /// The kernels (and cuBLAS calls) behind it.
    pub fn describe(self) -> &'static str {
        match self {
            Kernel::Unary => "ew_unary_f32",
            Kernel::Clip => "ew_unary_f32 (clip)",
            Kernel::Binary => "ew_binary_f32 / ew_scalar_f32 / ew_binary_bcast_f32",
            Kernel::Conv => {
                "cuBLAS (1x1) or im2col_nchw_f32 + cuBLAS strided batched, epilogue_bias_act_f32; \
                 depthwise_conv2d_nchw_f32; conv2d_direct_nchw_f32 (grouped)"
            }
            Kernel::BatchNorm => "epilogue_scale_shift_act_f32",
            Kernel::Gemm => "cuBLAS sgemm + epilogue_bias_act_f32",
            Kernel::MatMul => "cuBLAS sgemm / strided batched + epilogue_bias_act_f32",
            Kernel::Pool => "maxpool2d_nchw_f32 / avgpool2d_nchw_f32",
            Kernel::GlobalPool => "global_avgpool_nchw_f32 / global_maxpool_nchw_f32",
            Kernel::Softmax => "softmax_lastaxis_f32 / log_softmax_lastaxis_f32",
            Kernel::LayerNorm => "layernorm_lastaxis_f32",
            Kernel::Reduce => "reduce_axis_f32 / reduce_lastaxis_f32",
            Kernel::Transpose => "transpose2d_tiled_f32 / strided_copy_f32",
            Kernel::Concat => "strided_copy_f32",
            Kernel::Slice => "strided_copy_f32",
            Kernel::Gather => "gather_axis_i64_f32",
            Kernel::Pad => "pad_f32",
        }
    }
}

/// The CUDA path of an op, or None when it always runs on the CPU. At run time a path may still
/// decline a case (non-f32 data, a layout it does not cover) and hand it to the CPU.
pub fn cuda_path(op: &Op) -> Option<Kernel> {
    use crate::ops::elementwise::Unary;
    Some(match op {
        Op::Unary(Unary::Identity | Unary::Not) => return None,
        Op::Unary(_) => Kernel::Unary,
        Op::Clip { .. } => Kernel::Clip,
        Op::Binary(b) if super::shapes::binary_code(*b).is_some() => Kernel::Binary,
        Op::Conv(_) | Op::PointwiseDepthwise(_) => Kernel::Conv,
        Op::BatchNorm { .. } => Kernel::BatchNorm,
        Op::Gemm(_) => Kernel::Gemm,
        Op::MatMul { .. } => Kernel::MatMul,
        Op::Pool(_) => Kernel::Pool,
        Op::GlobalPool { .. } => Kernel::GlobalPool,
        Op::Softmax { .. } => Kernel::Softmax,
        Op::LayerNorm { .. } => Kernel::LayerNorm,
        Op::Reduce(_) => Kernel::Reduce,
        Op::Shape(ShapeOp::Transpose { .. }) => Kernel::Transpose,
        Op::Shape(ShapeOp::Concat { .. }) => Kernel::Concat,
        Op::Shape(ShapeOp::Slice { .. }) => Kernel::Slice,
        Op::Shape(ShapeOp::Gather { .. }) => Kernel::Gather,
        Op::Shape(ShapeOp::Pad { .. }) => Kernel::Pad,
        _ => return None,
    })
}

/// How a [`CudaBackend`] is set up.
#[derive(Clone, Debug)]
pub struct CudaOptions {
    pub ordinal: usize,
    /// Name in errors and logs.
    pub tenant: String,
    /// Device bytes this tenant may hold (weights, activations, scratch).
    pub budget_bytes: u64,
    /// Threads of the CPU backend used for fallbacks.
    pub cpu_threads: usize,
    /// TF32 tensor-core math in cuBLAS (off: exact fp32).
    pub tf32: bool,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            ordinal: 0,
            tenant: "default".into(),
            budget_bytes: u64::MAX,
            cpu_threads: 1,
            tf32: false,
        }
    }
}

struct State {
    pool: DevicePool,
    weights: HashMap<usize, Resident>,
}

pub struct CudaBackend {
    info: DeviceInfo,
    opts: CudaOptions,
    _ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    kernels: Loaded,
    state: Mutex<State>,
    cpu: CpuBackend,
    fell_back: Mutex<HashSet<String>>,
}

impl CudaBackend {
    /// Probes the device, compiles (or loads cached) kernels, creates a stream and a cuBLAS
    /// handle. Never panics: every failure is an `Unavailable` with the reason.
    pub fn new(opts: CudaOptions) -> Result<CudaBackend, Unavailable> {
        let info = probe::probe_device(opts.ordinal)?;
        probe::nvrtc_present()?;
        probe::cublas_present()?;
        probe::guarded("starting CUDA", || {
            let ctx = CudaContext::new(opts.ordinal).map_err(|e| e.to_string())?;
            let stream = ctx.new_stream().map_err(|e| e.to_string())?;
            let blas = CudaBlas::new(stream.clone()).map_err(|e| format!("cuBLAS: {e:?}"))?;
            super::blas::set_tf32(&blas, opts.tf32)?;
            let kernels = Loaded::load(&ctx, &info.arch())?;
            tracing::debug!(
                "cuda: {} kernels for {} ({} compiled, {} from the PTX cache)",
                super::module::SOURCES.len(),
                info.arch(),
                kernels.compiled,
                kernels.cached
            );
            let pool = DevicePool::new(opts.tenant.clone(), opts.budget_bytes, stream.clone());
            Ok(CudaBackend {
                info: info.clone(),
                cpu: CpuBackend::new(opts.cpu_threads),
                opts: opts.clone(),
                _ctx: ctx,
                stream,
                blas,
                kernels,
                state: Mutex::new(State {
                    pool,
                    weights: HashMap::new(),
                }),
                fell_back: Mutex::new(HashSet::new()),
            })
        })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Uploads a plan's constants once; ops then read them in place. Keyed by the constant's
    /// address, which stays valid because the backend keeps a clone of each `Arc`. Returns the
    /// bytes now resident. Over budget: nothing more is uploaded and the error is returned.
    pub fn register_constants(&self, constants: &[Arc<Tensor>]) -> Result<u64, OpError> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let State { pool, weights } = &mut *st;
        for t in constants {
            let key = run::key_of(t);
            if weights.contains_key(&key) {
                continue;
            }
            match run::make_resident(&self.stream, pool, t) {
                Ok(Some(r)) => {
                    weights.insert(key, r);
                }
                Ok(None) => {}
                Err(f) => return Err(to_op_error(f)),
            }
        }
        Ok(weights.values().map(|r| r.bytes).sum())
    }

    /// Drops every resident constant (e.g. when the tenant's model is unloaded).
    pub fn forget_constants(&self) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let State { pool, weights } = &mut *st;
        for (_, r) in weights.drain() {
            pool.release_resident(r.bytes);
        }
        pool.trim();
    }

    /// (in use, cached, peak, budget) bytes of this tenant's device memory.
    pub fn memory(&self) -> (u64, u64, u64, u64) {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let a = &st.pool.acct;
        (a.in_use(), a.cached(), a.peak(), a.budget())
    }

    /// Waits for all work queued on this backend's stream.
    pub fn synchronize(&self) -> Result<(), OpError> {
        self.stream
            .synchronize()
            .map_err(|e| OpError::Device(format!("cuda: {e}")))
    }

    fn fallback(&self, op: &Op, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> {
        let name = op.name();
        let mut seen = self.fell_back.lock().unwrap_or_else(|e| e.into_inner());
        if !seen.contains(&name) {
            tracing::debug!("cuda: {name} runs on the CPU");
            seen.insert(name);
        }
        drop(seen);
        self.cpu.execute(op, inputs)
    }

    /// Op kinds that ran on the CPU so far (for reports).
    pub fn fallbacks(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .fell_back
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect();
        v.sort();
        v
    }

    /// Runs `op` on the device only: `Ok(None)` when its CUDA path declines the case (no CPU
    /// fallback). The device check uses it to know that a kernel really ran.
    pub fn execute_device(
        &self,
        op: &Op,
        inputs: &[Option<&Tensor>],
    ) -> Result<Option<Vec<Tensor>>, OpError> {
        if cuda_path(op).is_none() {
            return Ok(None);
        }
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let State { pool, weights } = &mut *st;
        let mut d = Dev {
            l: super::launch::Launcher {
                stream: &self.stream,
                kernels: &self.kernels,
            },
            blas: &self.blas,
            stream: &self.stream,
            pool,
            weights,
        };
        let res = run::run_op(&mut d, op, inputs);
        // Outputs are on the host now: nothing is live between ops.
        st.pool.acct.reset_live();
        match res {
            Ok(out) => Ok(Some(out)),
            Err(Fail::Decline) => Ok(None),
            Err(f) => Err(to_op_error(f)),
        }
    }

    pub fn options(&self) -> &CudaOptions {
        &self.opts
    }
}

fn to_op_error(f: Fail) -> OpError {
    match f {
        Fail::Decline => OpError::Unsupported("declined by the CUDA path".into()),
        // The message names the tenant and the sizes.
        Fail::OverBudget(o) => OpError::Device(o.to_string()),
        Fail::Device(s) => OpError::Device(format!("cuda: {s}")),
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> String {
        format!("cuda:{} ({})", self.info.ordinal, self.info.name)
    }

    fn scope(&self, f: &mut (dyn FnMut() + Send)) {
        // CPU fallbacks use the CPU backend's pool.
        self.cpu.scope(f)
    }

    fn execute(&self, op: &Op, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> {
        match self.execute_device(op, inputs)? {
            Some(out) => Ok(out),
            None => self.fallback(op, inputs),
        }
    }

    fn recycle(&self, t: Tensor) {
        self.cpu.recycle(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::elementwise::{Binary, Unary};

    /// Every op kind the importer knows, parsed with default attributes where it can be.
    fn sample_ops() -> Vec<(String, Op)> {
        let attrs = crate::ops::attrs::Attrs { list: &[] };
        let mut v = Vec::new();
        for name in crate::ops::SUPPORTED_OPS {
            if let Ok(Some(op)) = Op::parse(name, &attrs, 17, 3, 1) {
                v.push((name.to_string(), op));
            }
        }
        v
    }

    #[test]
    fn coverage_table() {
        let ops = sample_ops();
        assert!(ops.len() > 60, "most ops parse with default attributes");
        let mut on_gpu = 0;
        println!("| ONNX op | CUDA path |");
        println!("|---|---|");
        for (name, op) in &ops {
            let path = cuda_path(op);
            on_gpu += path.is_some() as usize;
            println!(
                "| {name} | {} |",
                path.map_or("CPU fallback".to_string(), |k| format!(
                    "{k:?}: {}",
                    k.describe()
                ))
            );
        }
        println!("{on_gpu} of {} parsed op kinds have a CUDA path", ops.len());
        // What the zoo models need most must be covered.
        for must in [
            Op::Conv(Default::default()),
            Op::Binary(Binary::Add),
            Op::Unary(Unary::Relu),
            Op::MatMul { act: None },
            Op::Softmax {
                axis: -1,
                log: false,
                legacy: false,
            },
            Op::LayerNorm {
                axis: -1,
                eps: 1e-5,
                stats: false,
            },
            Op::Shape(ShapeOp::Gather { axis: 0 }),
            Op::Shape(ShapeOp::Transpose { perm: None }),
            Op::GlobalPool { max: false },
        ] {
            assert!(cuda_path(&must).is_some(), "{must:?}");
        }
        assert_eq!(cuda_path(&Op::Unary(Unary::Identity)), None);
        assert_eq!(cuda_path(&Op::Binary(Binary::Equal)), None);
        assert_eq!(
            cuda_path(&Op::Shape(ShapeOp::Reshape { allowzero: false })),
            None
        );
    }
}
