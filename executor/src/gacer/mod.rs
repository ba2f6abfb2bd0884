//! GACER: granularity-aware concurrency regulation of several tenants sharing one device.
//!
//! - [`profile`]: per-step time alone and launch footprint → occupancy of the device;
//! - [`resize`]: spatial regulation, an operator run as pieces along its rows;
//! - [`plan`]: a [`GacerPlan`] — split factors and [`SyncPointer`]s between tenants' streams;
//! - [`cost`]: the concurrency simulator that scores plans;
//! - [`search`]: greedy search with local improvement over splits and pointers;
//! - [`cache`]: plans per tenant mix, searched in the background, swapped between batches;
//! - [`schedule`] and [`run`]: the three interchangeable schedules (`sequential`,
//!   `multi-stream`, `gacer`) and the CPU workers that execute them; [`device_run`] executes
//!   them on a GPU with streams and events.
//!
//! A caller profiles each tenant's model, searches (or asks the cache for) a plan, and runs the
//! mix with [`co_run`] under any [`Schedule`].

pub mod cache;
pub mod cost;
pub mod device_run;
pub mod plan;
pub mod profile;
pub mod resize;
pub mod run;
pub mod schedule;
pub mod search;

#[cfg(test)]
mod tests;

pub use cache::{MixKey, PlanCache, PlanSlot};
pub use cost::CostModel;
pub use plan::{GacerPlan, PlanError, StepRef, SyncPointer};
pub use profile::{DeviceShape, LaunchFootprint, ModelProfile, StepProfile, profile_model};
pub use run::{CoRunError, CoRunOptions, CoRunReport, Stop, TenantReport, TenantWork, co_run};
pub use schedule::Schedule;
pub use search::{MixTenant, SearchOptions, search};
