//! A discrete-event cluster simulator that runs the same policy code as the operator (knob
//! controller, replicas, placement, pool) against latency models from a profile table, to
//! compare policies at scales and on workloads no test cluster has.

mod engine;
mod report;
mod rng;
mod strategy;
mod workload;

pub use engine::{SimConfig, simulate};
pub use report::{SimReport, TenantReport};
pub use rng::Rng;
pub use strategy::{Controller, Strategy};
pub use workload::{Arrivals, TenantSpec, Workload};
