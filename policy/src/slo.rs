//! The latency objective of a tenant and what the agents observe about it in one window.

use crate::dnnscaler::Epoch;
use serde::{Deserialize, Serialize};

/// A latency objective: `percentile` of request latency (queueing included) at most `latency_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Slo {
    pub latency_ms: f64,
    /// In (0, 100], e.g. 99.0.
    pub percentile: f64,
}

impl Slo {
    pub fn p99(latency_ms: f64) -> Slo {
        Slo {
            latency_ms,
            percentile: 99.0,
        }
    }
}

/// One report window of one tenant, summed over its replicas. The window reaches back no further
/// than the last knob change (see [`crate::Evidence`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TenantObservation {
    /// Requests arriving per second.
    pub arrival_rate: f64,
    /// Requests completed per second.
    pub throughput: f64,
    /// Observed latency at the SLO's percentile, from arrival to response (queueing counted).
    pub latency_at_percentile_ms: f64,
    /// Requests waiting at the end of the window, over all replicas.
    pub queue_depth: u32,
    /// Requests completed in the window; a window with none carries no latency signal.
    pub completed: u64,
    /// Observed compute time (the request's batch, no queueing) at the SLO's percentile, where
    /// the reporter measures it. It tells queueing from a batch that is itself too slow without
    /// trusting the latency model.
    #[serde(default)]
    pub compute_at_percentile_ms: Option<f64>,
    /// The knobs the window was measured with and how long they have run; `None` when its
    /// replicas ran different knobs, or the reporter does not say.
    #[serde(default)]
    pub epoch: Option<Epoch>,
}

impl TenantObservation {
    /// Whether the window says anything about latency.
    pub fn has_signal(&self) -> bool {
        self.completed > 0 && self.latency_at_percentile_ms.is_finite()
    }

    /// Whether requests arrive faster than they are served, so the queue, not the service time,
    /// dominates latency. 5% slack because both rates are noisy estimates over one window.
    pub fn overloaded(&self) -> bool {
        self.arrival_rate > self.throughput * 1.05 && self.queue_depth > 0
    }

    /// The observed compute time at the SLO's percentile, when it was measured.
    pub fn compute_ms(&self) -> Option<f64> {
        self.compute_at_percentile_ms
            .filter(|c| c.is_finite() && *c >= 0.0)
    }
}
