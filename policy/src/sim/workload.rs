//! What the simulated cluster serves: tenants with a model, an SLO (which may change at given
//! times), bounds, and an arrival process.

use crate::knobs::Bounds;
use crate::slo::Slo;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Arrivals {
    Poisson {
        rate: f64,
    },
    /// Markov-modulated on/off: Poisson at `rate_on` or `rate_off`, phases of exponential length.
    OnOff {
        rate_on: f64,
        rate_off: f64,
        mean_on_s: f64,
        mean_off_s: f64,
    },
}

impl Arrivals {
    pub fn mean_rate(&self) -> f64 {
        match *self {
            Arrivals::Poisson { rate } => rate,
            Arrivals::OnOff {
                rate_on,
                rate_off,
                mean_on_s,
                mean_off_s,
            } => (rate_on * mean_on_s + rate_off * mean_off_s) / (mean_on_s + mean_off_s),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TenantSpec {
    pub tenant: String,
    /// A model of the profile table.
    pub model: String,
    pub slo: Slo,
    pub bounds: Bounds,
    pub arrivals: Arrivals,
    /// (time in s, new SLO), in time order.
    pub slo_changes: Vec<(f64, Slo)>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    pub tenants: Vec<TenantSpec>,
    pub duration_s: f64,
    /// Requests arriving before this are served but not measured.
    pub warmup_s: f64,
}
