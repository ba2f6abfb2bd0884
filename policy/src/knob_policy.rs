//! The per-tenant knob policies: DNNScaler (this crate's scaler), static knobs, and
//! Clipper-style AIMD batching. The agent's standalone mode runs one [`Controller`] per tenant,
//! and [`crate::sim`] compares the three. All of them share the replica, placement and pool
//! rules, and the two that move knobs read the same evidence (DNNScaler's [`Evidence`] rule:
//! measurements of the current knobs only, enough of them), so a difference in results comes
//! from the knobs alone.

use crate::dnnscaler::{
    Decision, Evidence, LatencyModel, ScalerConfig, ScalerState, choose_approach, step,
};
use crate::knobs::{Bounds, Knobs};
use crate::profile::Profile;
use crate::slo::{Slo, TenantObservation};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Strategy {
    DnnScaler(ScalerConfig),
    Static(Knobs),
    /// Additive increase of the batch by one per window under the SLO, ×`decrease` on a violation.
    Aimd {
        decrease: f64,
    },
}

impl Strategy {
    pub fn name(&self) -> String {
        match self {
            Strategy::DnnScaler(c) if *c == ScalerConfig::default() => "DNNScaler".into(),
            Strategy::DnnScaler(c) => format!(
                "DNNScaler (batch p99 ≤ {:.0}% of SLO)",
                100.0 * c.service_share
            ),
            Strategy::Static(k) => format!("static b={} m={}", k.batch, k.instances),
            Strategy::Aimd { decrease } => format!("Clipper AIMD (×{decrease})"),
        }
    }
}

/// One tenant's knob controller.
#[derive(Clone, Debug)]
pub enum Controller {
    Scaler(ScalerState),
    Static(Knobs),
    Aimd { knobs: Knobs, decrease: f64 },
}

impl Controller {
    pub fn new(strategy: Strategy, profile: &Profile, slo: &Slo, bounds: &Bounds) -> Controller {
        match strategy {
            Strategy::DnnScaler(config) => {
                let c = choose_approach(profile, slo, bounds);
                Controller::Scaler(ScalerState::new(c.approach, c.knobs, config))
            }
            Strategy::Static(k) => Controller::Static(bounds.clamp(k)),
            Strategy::Aimd { decrease } => Controller::Aimd {
                knobs: Knobs::ONE,
                decrease,
            },
        }
    }

    pub fn knobs(&self) -> Knobs {
        match self {
            Controller::Scaler(s) => s.knobs,
            Controller::Static(k) | Controller::Aimd { knobs: k, .. } => *k,
        }
    }

    pub fn approach(&self) -> String {
        match self {
            Controller::Scaler(s) => format!("{:?}", s.approach),
            Controller::Static(_) => "static".into(),
            Controller::Aimd { .. } => "AIMD".into(),
        }
    }

    /// The evidence a window must hold before this controller moves its knobs on it.
    pub fn evidence(&self) -> Evidence {
        match self {
            Controller::Scaler(s) => s.config.evidence,
            Controller::Static(_) | Controller::Aimd { .. } => Evidence::default(),
        }
    }

    /// Moves the knobs after one window; true when the controller asks for another replica.
    pub fn observe(
        &mut self,
        obs: &TenantObservation,
        slo: &Slo,
        bounds: &Bounds,
        model: &LatencyModel,
    ) -> bool {
        match self {
            Controller::Scaler(s) => step(s, obs, slo, bounds, model) == Decision::NeedReplicas,
            Controller::Static(_) => false,
            Controller::Aimd { knobs, decrease } => {
                if Evidence::default().admits(obs, *knobs) {
                    let b = if obs.latency_at_percentile_ms > slo.latency_ms {
                        (knobs.batch as f64 * *decrease).floor() as u32
                    } else {
                        knobs.batch + 1
                    };
                    *knobs = bounds.clamp(Knobs::new(b, 1));
                }
                false
            }
        }
    }
}
