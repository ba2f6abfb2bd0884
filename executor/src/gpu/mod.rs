//! Device-resident execution on a GPU, written once against [`api::DeviceApi`] and run on either
//! implementation: CUDA (`crate::cuda`, feature `cuda`) or the simulated device ([`sim`]) that
//! runs the same work on the CPU with the same asynchronous semantics, so the structure of the
//! GPU path is tested on every machine.
//!
//! | file | job |
//! |---|---|
//! | `api.rs` | the device API: buffers, pinned staging, streams, events, copies, launches, SGEMM |
//! | `sim/` | the simulated device: a queue per stream, events, kernels as CPU functions |

pub mod api;
pub mod sim;

pub use api::{DeviceApi, DeviceError};
pub use sim::SimDevice;
