//! Device-resident execution on a GPU, written once against [`api::DeviceApi`] and run on either
//! implementation: CUDA (`crate::cuda`, feature `cuda`) or the simulated device ([`sim`]) that
//! runs the same work on the CPU with the same asynchronous semantics, so the structure of the
//! GPU path is tested on every machine.
//!
//! | file | job |
//! |---|---|
//! | `api.rs` | the device API: buffers, pinned staging, streams, events, copies, launches, SGEMM |
//! | `sim/` | the simulated device: a queue per stream, events, kernels as CPU functions |
//! | `record.rs` | a device wrapper that records every call (structure tests, transfer counts) |
//! | `launch.rs` | launch shapes and kernel-argument builders |
//! | `blas.rs` | row-major products as cuBLAS's column-major SGEMM, over sub-ranges |
//! | `lower/` | one plan step → device work, by op family, in pieces over sub-ranges |
//! | `layout.rs` | the memory plan per input-shape signature: step kinds, arena offsets |
//! | `budget.rs` | a tenant's device bytes: weights once, plus each instance's arena |
//! | `weights.rs` | a model's constants uploaded once, shared by the tenant's instances |
//! | `instance.rs` | one instance: stream, arena, staging; runs a batch with one host wait |

pub mod api;
pub mod blas;
pub mod budget;
pub mod instance;
pub mod launch;
pub mod layout;
pub mod lower;
pub mod record;
pub mod sim;
pub mod weights;

pub use api::{DeviceApi, DeviceError};
pub use budget::{Budget, OverBudget};
pub use instance::{Alone, Coordination, GpuError, Instance, StepTimes};
pub use layout::{Layout, StepKind};
pub use record::{Call, Recorder};
pub use sim::SimDevice;
pub use weights::Weights;
