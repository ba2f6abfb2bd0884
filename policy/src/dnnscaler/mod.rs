//! DNNScaler: the profiler rule that picks batching, multi-tenancy or both for a tenant, the
//! latency model built from its profile, the feedback scaler that then moves the chosen knob
//! to hold tail latency in a band just under the SLO, and the rule for when a step has fresh
//! enough evidence to move it.

mod evidence;
mod latency_model;
mod profiler;
mod scaler;

pub use evidence::{Epoch, Evidence};
pub use latency_model::LatencyModel;
pub use profiler::{Approach, ApproachChoice, choose_approach};
pub use scaler::{Decision, Learned, ScalerConfig, ScalerState, step};
