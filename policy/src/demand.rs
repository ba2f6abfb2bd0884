//! What one tenant asks of the pool for placement: its replica count, each replica's device
//! memory, and the device share each replica keeps busy. The operator and the simulator both
//! compute it here, so placement sees the same load from both.
//!
//! The load of one replica is the share of the device it keeps busy when fully loaded
//! ([`LatencyModel::gpu_util`], 1 when the profile did not measure it) times how busy it is:
//! its part of the arrival rate over its throughput at the knobs, at most 1.

use crate::dnnscaler::LatencyModel;
use crate::knobs::Knobs;
use crate::placement::ReplicaDemand;

/// One tenant's demand on the pool.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Demand {
    pub replicas: u32,
    /// Device memory one replica needs at the knobs.
    pub memory_bytes: u64,
    /// Device share one replica keeps busy, in [0, 1].
    pub load: f64,
}

impl Demand {
    /// The demand as placement takes it, for `tenant`.
    pub fn for_tenant(self, tenant: String) -> ReplicaDemand {
        ReplicaDemand {
            tenant,
            replicas: self.replicas,
            memory_bytes: self.memory_bytes,
            load: self.load,
        }
    }
}

/// The demand of `replicas` replicas at `knobs` sharing `arrival_rate` (requests per second)
/// evenly. No arrivals (or a rate that is not a number) is no load; a replica whose predicted
/// throughput is not positive counts as fully busy.
pub fn demand(model: &LatencyModel, knobs: Knobs, arrival_rate: f64, replicas: u32) -> Demand {
    let busy = if replicas == 0 || !(arrival_rate.is_finite() && arrival_rate > 0.0) {
        0.0
    } else {
        let capacity = model.throughput(knobs) * replicas as f64;
        if capacity.is_finite() && capacity > 0.0 {
            (arrival_rate / capacity).min(1.0)
        } else {
            1.0
        }
    };
    Demand {
        replicas,
        memory_bytes: model.memory_bytes(knobs),
        load: model.gpu_util(knobs) * busy,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{Profile, ProfilePoint};

    fn model(gpu_util: Option<f64>) -> LatencyModel {
        let pt = |batch: u32, throughput: f64| ProfilePoint {
            batch,
            instances: 1,
            throughput,
            p99_ms: 10.0 * batch as f64,
            peak_activation_bytes: 1000 * batch as u64,
            gpu_util,
        };
        LatencyModel::from_profile(&Profile {
            model: "m".into(),
            weight_bytes: 10_000,
            points: vec![pt(1, 100.0), pt(8, 400.0)],
        })
    }

    #[test]
    fn load_is_the_share_of_capacity_used_without_a_measured_util() {
        let d = demand(&model(None), Knobs::new(8, 1), 400.0, 2);
        assert_eq!(d.replicas, 2);
        assert_eq!(d.memory_bytes, 10_000 + 8_000);
        assert!((d.load - 0.5).abs() < 1e-12, "{d:?}");
    }

    #[test]
    fn a_measured_util_scales_the_load() {
        let d = demand(&model(Some(0.4)), Knobs::new(8, 1), 400.0, 2);
        assert!((d.load - 0.2).abs() < 1e-12, "{d:?}");
    }

    #[test]
    fn an_overloaded_replica_is_at_most_its_full_share() {
        assert_eq!(demand(&model(None), Knobs::ONE, 1000.0, 1).load, 1.0);
        let d = demand(&model(Some(0.4)), Knobs::ONE, 1000.0, 1);
        assert!((d.load - 0.4).abs() < 1e-12, "{d:?}");
    }

    #[test]
    fn no_arrivals_or_no_replicas_is_no_load() {
        let m = model(None);
        for (rate, replicas) in [(0.0, 1), (-1.0, 1), (f64::NAN, 1), (100.0, 0)] {
            let d = demand(&m, Knobs::ONE, rate, replicas);
            assert_eq!(d.load, 0.0, "rate {rate} replicas {replicas}");
            assert_eq!(d.replicas, replicas);
        }
    }

    #[test]
    fn for_tenant_carries_every_field() {
        let d = demand(&model(None), Knobs::ONE, 50.0, 3);
        let r = d.for_tenant("t".into());
        assert_eq!(
            (r.tenant.as_str(), r.replicas, r.memory_bytes, r.load),
            ("t", 3, d.memory_bytes, d.load)
        );
    }
}
