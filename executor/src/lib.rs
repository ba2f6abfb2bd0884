//! The executor: ONNX import → graph IR → rewrite passes → memory plan → a flat plan that a backend
//! runs; the multi-tenant runtime and the GACER planner sit on top. No Kubernetes, no HTTP.
//!
//! ```text
//! bytes ─import─► Graph ─passes (fold, fuse, dce)─► Graph ─Plan::build─► Plan ─Backend::run─► outputs
//! ```

pub mod backend;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
pub mod engine;
pub mod error;
pub mod gacer;
pub mod gpu;
pub mod graph;
pub mod import;
pub mod memory;
pub mod npy;
pub mod ops;
pub mod passes;
pub mod plan;
pub mod proto;
pub mod runtime;
pub mod tensor;
pub mod tensor_proto;
pub mod zoo;

pub use backend::{Backend, CpuBackend};
pub use device::{Device, DeviceRequest, Placed};
pub use engine::Engine;
pub use error::{ImportError, OpError, RunError};
pub use plan::{Model, Plan, Target};
pub use tensor::{DType, Data, Tensor};
