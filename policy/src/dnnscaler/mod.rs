//! DNNScaler: the profiler rule that picks batching, multi-tenancy or both for a tenant, the
//! latency model built from its profile, and the feedback scaler that then moves the chosen knob
//! to hold tail latency in a band just under the SLO.

mod latency_model;
mod profiler;
mod scaler;

pub use latency_model::LatencyModel;
pub use profiler::{Approach, ApproachChoice, choose_approach};
pub use scaler::{Decision, Learned, ScalerConfig, ScalerState, step};
