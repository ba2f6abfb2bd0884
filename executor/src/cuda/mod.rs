//! The CUDA implementation of the device API (feature `cuda`): cudarc with dynamic loading, so the
//! same binary runs on machines with and without a GPU.
//!
//! | file | job |
//! |---|---|
//! | `probe.rs` | is there a device (never panics), and why not |
//! | `module.rs` | compile the kernels crate's `.cu` sources with NVRTC for the device, PTX disk cache |
//! | `device.rs` | `CudaDevice`: buffers, pinned staging, streams, events, copies, launches, cuBLAS |
//!
//! Everything above it (lowering, memory plan, instances, GACER) is in `crate::gpu` and runs on
//! the simulated device as well. See `executor/CUDA.md` for what has and has not run on a GPU.

pub mod device;
pub mod module;
pub mod probe;

pub use device::CudaDevice;
pub use probe::{DeviceInfo, Unavailable, probe};
