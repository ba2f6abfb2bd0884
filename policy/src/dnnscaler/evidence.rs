//! Fresh evidence for the scaler. Every knob setting starts an epoch, and a step reads only
//! what was measured in the current one: the agents' window (and the simulator's) reaches back
//! to the later of `window_s` ago and the last knob change, never past it. A step also waits
//! until the epoch holds enough to judge the knobs by: `min_seconds` of it and
//! `min_completions` requests in the window, or, for a tenant too quiet to complete that many,
//! a whole window of the epoch. Until then the knobs hold, so one setting is judged once, by
//! its own measurements, and a shrink cannot be caused by the setting before it.
//!
//! An observation whose replicas do not all run the scaler's knobs yet (the new knobs have not
//! reached every agent) is no evidence about them either.

use crate::knobs::Knobs;
use crate::slo::TenantObservation;
use serde::{Deserialize, Serialize};

/// Which knobs an observation's measurements were taken with, and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Epoch {
    /// The knobs every replica in the observation ran with throughout its window.
    pub knobs: Knobs,
    /// Seconds since those knobs took effect, on the replica where that was latest.
    pub seconds: f64,
}

/// How much fresh evidence one scaler step needs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    /// The longest span an observation covers: the agents' window, in seconds.
    pub window_s: f64,
    /// Seconds of the current epoch before a step.
    pub min_seconds: f64,
    /// Requests completed in the epoch's window before a step (unless the window is whole).
    pub min_completions: u64,
}

impl Default for Evidence {
    fn default() -> Evidence {
        Evidence {
            window_s: 30.0,
            min_seconds: 2.0,
            min_completions: 20,
        }
    }
}

impl Evidence {
    /// Where the window starts at `now_s` when the knobs last changed at `epoch_start_s`.
    pub fn window_start(&self, now_s: f64, epoch_start_s: f64) -> f64 {
        epoch_start_s.max(now_s - self.window_s)
    }

    /// Whether `obs` is enough evidence about `knobs` for one step.
    pub fn admits(&self, obs: &TenantObservation, knobs: Knobs) -> bool {
        let Some(epoch) = obs.epoch else {
            return false;
        };
        // Spans are differences of clock readings: a span of exactly `s` may read a hair less.
        let lasted = |s: f64| epoch.seconds >= s * (1.0 - 1e-9);
        epoch.knobs == knobs
            && obs.has_signal()
            && lasted(self.min_seconds)
            && (obs.completed >= self.min_completions || lasted(self.window_s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(knobs: Knobs, seconds: f64, completed: u64) -> TenantObservation {
        TenantObservation {
            arrival_rate: 10.0,
            throughput: 10.0,
            latency_at_percentile_ms: 50.0,
            queue_depth: 0,
            completed,
            compute_at_percentile_ms: None,
            epoch: Some(Epoch { knobs, seconds }),
        }
    }

    #[test]
    fn a_step_waits_for_time_and_completions_since_the_knobs_changed() {
        let (e, k) = (Evidence::default(), Knobs::new(8, 1));
        assert!(e.admits(&obs(k, 2.0, 20), k));
        assert!(!e.admits(&obs(k, 1.9, 500), k), "too soon after the change");
        assert!(!e.admits(&obs(k, 10.0, 19), k), "too few completions");
        assert!(
            e.admits(&obs(k, 45.0, 3), k),
            "a whole window of a quiet tenant is all there will be"
        );
        assert!(!e.admits(&obs(k, 45.0, 0), k), "no completion, no latency");
        // Two ticks of 0.1 s apart read a hair under their nominal span.
        assert!(e.admits(&obs(k, (4.1 + 2.0) - 4.1, 20), k));
    }

    #[test]
    fn measurements_of_other_knobs_or_of_unknown_knobs_are_no_evidence() {
        let e = Evidence::default();
        let fresh = obs(Knobs::new(16, 1), 20.0, 1000);
        assert!(!e.admits(&fresh, Knobs::new(8, 1)));
        let unknown = TenantObservation {
            epoch: None,
            ..fresh
        };
        assert!(!e.admits(&unknown, Knobs::new(16, 1)));
    }

    #[test]
    fn the_window_reaches_back_to_the_knob_change_at_most() {
        let e = Evidence::default();
        assert_eq!(e.window_start(100.0, 95.0), 95.0);
        assert_eq!(e.window_start(100.0, 10.0), 70.0);
    }
}
