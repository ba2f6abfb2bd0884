//! One tenant's decision round, as every driver runs it once the tenant has a profile: the
//! operator from its agents' reports, the simulator from its own events. The knob controller
//! steps on fresh evidence, then the replica rule sets the replica count from the arrival rate
//! and the throughput at the new knobs, then [`demand`] says what placement must find room for.
//! The drivers translate their inputs into [`Measured`] and the [`Outcome`] into their writes;
//! the agent's standalone mode, with one replica and no pool, runs the same [`Controller`].

use crate::demand::{Demand, demand};
use crate::dnnscaler::LatencyModel;
use crate::knob_policy::Controller;
use crate::knobs::{Bounds, Knobs};
use crate::replicas::{ReplicaConfig, ReplicaInput, ReplicaState};
use crate::slo::{Slo, TenantObservation};

/// Seconds between two knob steps of one tenant on fresh evidence: a step needs a new window.
pub const STEP_INTERVAL_S: f64 = 4.0;

/// What a tenant's replicas measured since the last round.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Measured {
    /// One replica's window: its share of the load and of the throughput, the worst replica's
    /// latency, and the epoch of the knobs it measured. `None`: nothing to step on (no window,
    /// or a driver that sets the replica count alone).
    pub per_replica: Option<TenantObservation>,
    /// Requests per second arriving at the tenant, over all its replicas.
    pub arrival_rate: f64,
}

/// How often the knobs may move, and the replica rule.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoundConfig {
    /// Seconds after a step on fresh evidence before the next step: a step needs a new window.
    pub step_interval_s: f64,
    pub replicas: ReplicaConfig,
}

/// What one round decided.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outcome {
    pub knobs_before: Knobs,
    pub knobs: Knobs,
    /// The controller found no knob that meets the SLO: at least one more replica.
    pub wants_more: bool,
    pub replicas_before: u32,
    pub replicas: u32,
    pub demand: Demand,
}

/// A profiled tenant under the policy: its knob controller, the latency model the controller
/// predicts with, and the replica rule's state.
#[derive(Clone, Debug)]
pub struct TenantRound {
    pub controller: Controller,
    pub model: LatencyModel,
    pub replicas: ReplicaState,
    /// When the last step on fresh evidence was taken.
    last_step_s: f64,
}

impl TenantRound {
    pub fn new(controller: Controller, model: LatencyModel, replicas: u32) -> TenantRound {
        TenantRound {
            controller,
            model,
            replicas: ReplicaState::new(replicas.max(1)),
            last_step_s: f64::NEG_INFINITY,
        }
    }

    /// One round: a knob step on `measured` when it has a window with signal and the step
    /// interval has passed, then the replica count, then the demand on the pool.
    pub fn round(
        &mut self,
        measured: &Measured,
        slo: &Slo,
        bounds: &Bounds,
        cfg: &RoundConfig,
        now_s: f64,
    ) -> Outcome {
        let knobs_before = self.controller.knobs();
        let mut wants_more = false;
        if let Some(window) = measured.per_replica.filter(TenantObservation::has_signal)
            && now_s - self.last_step_s >= cfg.step_interval_s
        {
            // Only a step that reads fresh evidence waits for the next interval.
            if self.controller.evidence().admits(&window, knobs_before) {
                self.last_step_s = now_s;
            }
            wants_more = self.controller.observe(&window, slo, bounds, &self.model);
        }
        let knobs = bounds.clamp(self.controller.knobs());
        let replicas_before = self.replicas.replicas;
        let replicas = self
            .replicas
            .decide(
                &ReplicaInput {
                    arrival_rate: measured.arrival_rate,
                    per_replica_throughput: self.model.throughput(knobs),
                    scaler_wants_more: wants_more,
                },
                bounds,
                &cfg.replicas,
                now_s,
            )
            .max(1);
        Outcome {
            knobs_before,
            knobs,
            wants_more,
            replicas_before,
            replicas,
            demand: demand(&self.model, knobs, measured.arrival_rate, replicas),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dnnscaler::{Approach, Epoch, ScalerConfig, ScalerState};
    use crate::profile::{Profile, ProfilePoint};

    fn model() -> LatencyModel {
        let pt = |batch: u32, throughput: f64, p99_ms: f64| ProfilePoint {
            batch,
            instances: 1,
            throughput,
            p99_ms,
            peak_activation_bytes: 1000 * batch as u64,
            gpu_util: None,
        };
        LatencyModel::from_profile(&Profile {
            model: "m".into(),
            weight_bytes: 10_000,
            points: vec![pt(1, 100.0, 10.0), pt(4, 250.0, 16.0)],
        })
    }

    fn scaler(knobs: Knobs) -> TenantRound {
        let scaler = ScalerState::new(Approach::Batching, knobs, ScalerConfig::default());
        TenantRound::new(Controller::Scaler(scaler), model(), 1)
    }

    fn slo() -> Slo {
        Slo {
            latency_ms: 100.0,
            percentile: 99.0,
        }
    }

    fn cfg() -> RoundConfig {
        RoundConfig {
            step_interval_s: 4.0,
            replicas: ReplicaConfig::default(),
        }
    }

    fn window(knobs: Knobs, rate: f64, latency_ms: f64) -> TenantObservation {
        TenantObservation {
            arrival_rate: rate,
            throughput: rate,
            latency_at_percentile_ms: latency_ms,
            queue_depth: 0,
            completed: 1_000,
            compute_at_percentile_ms: Some(latency_ms / 2.0),
            epoch: Some(Epoch {
                knobs,
                seconds: 30.0,
            }),
        }
    }

    #[test]
    fn a_step_waits_for_the_interval_and_the_replicas_follow_the_load() {
        let bounds = Bounds::default();
        // Additive increase: one batch more per step under the SLO.
        let aimd = Controller::Aimd {
            knobs: Knobs::ONE,
            decrease: 0.9,
        };
        let mut r = TenantRound::new(aimd, model(), 1);
        let at = |knobs: Knobs| Measured {
            per_replica: Some(window(knobs, 50.0, 20.0)),
            arrival_rate: 50.0,
        };
        let first = r.round(&at(Knobs::ONE), &slo(), &bounds, &cfg(), 0.0);
        assert_eq!(
            (first.knobs_before, first.knobs),
            (Knobs::ONE, Knobs::new(2, 1))
        );
        // Within the step interval the knobs stay, whatever the window says.
        let second = r.round(&at(first.knobs), &slo(), &bounds, &cfg(), 1.0);
        assert_eq!(second.knobs, Knobs::new(2, 1));
        let third = r.round(&at(second.knobs), &slo(), &bounds, &cfg(), 4.0);
        assert_eq!(third.knobs, Knobs::new(3, 1));
        // Three times the load a replica serves at these knobs: more replicas, and the demand
        // counts them.
        let heavy = Measured {
            per_replica: None,
            arrival_rate: 3.0 * r.model.throughput(third.knobs),
        };
        let fourth = r.round(&heavy, &slo(), &bounds, &cfg(), 5.0);
        assert!(fourth.replicas >= 3, "{fourth:?}");
        assert_eq!(fourth.replicas_before, 1);
        assert_eq!(fourth.demand.replicas, fourth.replicas);
        assert!(fourth.demand.load > 0.0);
    }

    #[test]
    fn no_window_no_step_and_at_least_one_replica() {
        let bounds = Bounds::default();
        let mut r = scaler(Knobs::new(4, 1));
        let idle = Measured {
            per_replica: None,
            arrival_rate: 0.0,
        };
        let o = r.round(&idle, &slo(), &bounds, &cfg(), 0.0);
        assert_eq!(
            (o.knobs_before, o.knobs),
            (Knobs::new(4, 1), Knobs::new(4, 1))
        );
        assert!(!o.wants_more);
        assert_eq!(o.replicas, 1);
        assert_eq!(o.demand.load, 0.0);
    }
}
