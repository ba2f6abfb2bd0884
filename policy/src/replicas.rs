//! Replica count of one tenant: enough replicas, each at the throughput its knobs give within the
//! SLO, to carry the arrival rate plus headroom; bounded by min/max replicas. Scaling up is
//! immediate; scaling down waits until the lower count has been enough for `scale_down_after_s`,
//! then goes to the highest count wanted during that wait, so a dip does not flap replicas.

use crate::knobs::Bounds;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplicaConfig {
    /// Spare capacity kept above the arrival rate, e.g. 0.2 for 20%.
    pub headroom: f64,
    pub scale_down_after_s: f64,
}

impl Default for ReplicaConfig {
    fn default() -> ReplicaConfig {
        ReplicaConfig {
            headroom: 0.2,
            scale_down_after_s: 60.0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplicaInput {
    /// Requests per second arriving at the tenant.
    pub arrival_rate: f64,
    /// Requests per second one replica serves within the SLO at its current knobs.
    pub per_replica_throughput: f64,
    /// The scaler said no knob fixes a violation: at least one more replica than now.
    pub scaler_wants_more: bool,
}

/// What the replica rule remembers of one tenant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplicaState {
    pub replicas: u32,
    /// Since when fewer replicas would have been enough, and the most wanted since then.
    below_since: Option<(f64, u32)>,
}

/// Replicas needed for `arrival_rate` at `per_replica_throughput` with headroom (unbounded).
pub fn replicas_for(arrival_rate: f64, per_replica_throughput: f64, headroom: f64) -> u32 {
    if !(arrival_rate.is_finite() && arrival_rate > 0.0) {
        return 0;
    }
    if !(per_replica_throughput.is_finite() && per_replica_throughput > 0.0) {
        return u32::MAX;
    }
    let need = (arrival_rate * (1.0 + headroom.max(0.0)) / per_replica_throughput).ceil();
    if need >= u32::MAX as f64 {
        u32::MAX
    } else {
        need as u32
    }
}

impl ReplicaState {
    pub fn new(replicas: u32) -> ReplicaState {
        ReplicaState {
            replicas,
            below_since: None,
        }
    }

    /// The replica count to run from now on.
    pub fn decide(
        &mut self,
        input: &ReplicaInput,
        bounds: &Bounds,
        cfg: &ReplicaConfig,
        now_s: f64,
    ) -> u32 {
        let current = bounds.clamp_replicas(self.replicas);
        let mut want = replicas_for(
            input.arrival_rate,
            input.per_replica_throughput,
            cfg.headroom,
        );
        if input.scaler_wants_more {
            want = want.max(current.saturating_add(1));
        }
        let want = bounds.clamp_replicas(want);
        if want >= current {
            self.below_since = None;
            self.replicas = want;
            return want;
        }
        let (since, most) = match self.below_since {
            Some((since, most)) => (since, most.max(want)),
            None => (now_s, want),
        };
        if now_s - since >= cfg.scale_down_after_s {
            self.below_since = None;
            self.replicas = most;
        } else {
            self.below_since = Some((since, most));
            self.replicas = current;
        }
        self.replicas
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(rate: f64) -> ReplicaInput {
        ReplicaInput {
            arrival_rate: rate,
            per_replica_throughput: 100.0,
            scaler_wants_more: false,
        }
    }

    #[test]
    fn headroom_and_bounds() {
        assert_eq!(replicas_for(250.0, 100.0, 0.2), 3);
        assert_eq!(replicas_for(0.0, 100.0, 0.2), 0);
        assert_eq!(replicas_for(10.0, 0.0, 0.2), u32::MAX);
        let mut s = ReplicaState::new(1);
        let b = Bounds::default();
        assert_eq!(s.decide(&input(0.0), &b, &ReplicaConfig::default(), 0.0), 1);
        assert_eq!(
            s.decide(&input(1e9), &b, &ReplicaConfig::default(), 0.0),
            b.max_replicas
        );
    }

    #[test]
    fn scales_up_at_once_and_down_after_the_delay() {
        let (b, cfg) = (Bounds::default(), ReplicaConfig::default());
        let mut s = ReplicaState::new(1);
        assert_eq!(s.decide(&input(500.0), &b, &cfg, 0.0), 6);
        assert_eq!(s.decide(&input(100.0), &b, &cfg, 10.0), 6);
        assert_eq!(s.decide(&input(200.0), &b, &cfg, 40.0), 6);
        // 60 s after the dip began: down to the most wanted during it (200/s -> 3).
        assert_eq!(s.decide(&input(100.0), &b, &cfg, 70.0), 3);
    }

    #[test]
    fn scaler_request_adds_one() {
        let mut s = ReplicaState::new(2);
        let i = ReplicaInput {
            scaler_wants_more: true,
            ..input(10.0)
        };
        assert_eq!(
            s.decide(&i, &Bounds::default(), &ReplicaConfig::default(), 0.0),
            3
        );
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever the rates, throughputs, requests and bounds, the count is within the bounds,
        /// and it never drops before the scale-down delay has passed since it last rose.
        #[test]
        fn count_within_bounds_and_no_early_scale_down(
            start in 0u32..50,
            steps in prop::collection::vec(
                (-10.0f64..1e6, -1.0f64..1e4, any::<bool>(), 0u32..5, 0u32..40, 0.0f64..30.0),
                1..80,
            ),
        ) {
            let cfg = ReplicaConfig::default();
            let mut s = ReplicaState::new(start);
            let mut now = 0.0;
            let mut last = None::<(u32, f64)>;
            for (rate, tput, more, min, span, dt) in steps {
                now += dt;
                let b = Bounds { min_replicas: min, max_replicas: min + span, ..Bounds::default() };
                let input = ReplicaInput { arrival_rate: rate, per_replica_throughput: tput, scaler_wants_more: more };
                let n = s.decide(&input, &b, &cfg, now);
                prop_assert!(n >= b.sane().min_replicas && n <= b.sane().max_replicas, "{n} outside {b:?}");
                if let Some((prev, since)) = last
                    && n < prev
                    && n >= b.sane().min_replicas
                    && prev <= b.sane().max_replicas
                {
                    prop_assert!(now - since >= cfg.scale_down_after_s || n == b.sane().max_replicas,
                        "dropped {prev} -> {n} after {}s", now - since);
                }
                if last.is_none_or(|(prev, _)| n != prev) {
                    last = Some((n, now));
                }
            }
        }
    }
}
