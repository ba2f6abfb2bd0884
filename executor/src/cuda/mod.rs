//! The CUDA backend (feature `cuda`): cudarc with dynamic loading, so the same binary runs on
//! machines with and without a GPU.
//!
//! | file | job |
//! |---|---|
//! | `probe.rs` | is there a device (never panics), and why not |
//! | `module.rs` | embed `kernels/cuda/*.cu`, compile with NVRTC for the device, PTX disk cache |
//! | `memory.rs` | per-tenant device memory: budget, size-class reuse, `OverBudget` |
//! | `shapes.rs` | pure geometry and op codes for the launchers (tested against the CPU ops) |
//! | `launch.rs` | one launcher per kernel, argument order of the `.cu` headers |
//! | `blas.rs` | row-major SGEMM on cuBLAS (operand swap), strided batched |
//! | `run.rs` | one op on the device: upload, launch, download |
//! | `backend.rs` | `CudaBackend`: which ops run where (`cuda_path`), CPU fallback |
//!
//! See `executor/CUDA.md` for what has and has not run on a GPU.

pub mod backend;
pub mod blas;
pub mod launch;
pub mod memory;
pub mod module;
pub mod probe;
pub mod run;
pub mod shapes;

pub use backend::{CudaBackend, CudaOptions, Kernel, cuda_path};
pub use memory::OverBudget;
pub use probe::{DeviceInfo, Unavailable, probe};

use crate::backend::{Backend, CpuBackend};

/// The CUDA backend on device 0 when one is usable, else the CPU backend; the string says
/// which and, for the CPU, why (one line, e.g. "no libcuda.so found (no NVIDIA driver)").
/// Constants are not registered through the trait object: callers that keep a `CudaBackend`
/// should call [`Backend::prepare`] with each plan.
pub fn backend_or_cpu(threads: usize) -> (Box<dyn Backend>, String) {
    let opts = CudaOptions {
        cpu_threads: threads,
        ..Default::default()
    };
    match CudaBackend::new(opts) {
        Ok(b) => {
            let why = format!(
                "cuda: {} ({}, {} MiB)",
                b.info().name,
                b.info().arch(),
                b.info().total_bytes >> 20
            );
            (Box::new(b), why)
        }
        Err(e) => (Box::new(CpuBackend::new(threads)), format!("cpu: {e}")),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn backend_or_cpu_always_gives_a_backend_and_a_reason() {
        let (b, why) = super::backend_or_cpu(1);
        assert!(!why.is_empty() && !why.contains('\n'));
        assert!(
            why.starts_with("cuda: ") || why.starts_with("cpu: "),
            "{why}"
        );
        // Whatever it is, it runs an op.
        let x = crate::Tensor::f32(vec![3], vec![-1.0, 0.0, 2.0]).unwrap();
        let out = b
            .execute(
                &crate::ops::Op::Unary(crate::ops::elementwise::Unary::Relu),
                &[Some(&x)],
            )
            .unwrap();
        assert_eq!(out[0].as_f32().unwrap(), &[0.0, 0.0, 2.0]);
        eprintln!("backend_or_cpu: {} — {why}", b.name());
    }
}
