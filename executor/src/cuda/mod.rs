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
