//! A discrete-event cluster simulator that runs the same policy code as the operator (knob
//! controller, replicas, placement, pool) to compare policies at scales and on workloads no test
//! cluster has. The policies predict with the profile table; the simulated devices follow a
//! separate ground truth ([`World`]): measured service-time distributions and interference
//! between co-located tenants.

mod engine;
mod interference;
mod report;
mod rng;
mod service;
mod workload;

pub use engine::{SimConfig, World, simulate};
pub use interference::{Interference, PairFactor, ShareFactor};
pub use report::{SimReport, TenantReport};
pub use rng::Rng;
pub use service::{Dist, ServiceError, ServiceModel, ServicePoint, ServiceTimes};
pub use workload::{Arrivals, TenantSpec, Workload};
