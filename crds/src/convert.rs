//! Translations between the API types and the policy's own types (`cotenant-policy`, which
//! knows nothing of Kubernetes), shared by the operator and the agent's standalone mode.

use crate::common::Knobs as SpecKnobs;
use crate::tenant::{
    Approach as SpecApproach, ChosenApproach, ModelTenantSpec, Profile as SpecProfile,
    ProfilePoint as SpecPoint, ScalerMemory,
};
use cotenant_policy::{
    Approach, ApproachPolicy, Bounds, Knobs, Learned, Profile, ProfilePoint, Slo,
};

/// The scaling bounds and the SLO of a tenant as the policy sees them.
pub fn bounds_and_slo(spec: &ModelTenantSpec) -> (Bounds, Slo) {
    let s = &spec.scaling;
    let bounds = Bounds {
        approach: match s.approach {
            SpecApproach::Auto => ApproachPolicy::Auto,
            SpecApproach::Batching => ApproachPolicy::Batching,
            SpecApproach::MultiTenancy => ApproachPolicy::MultiTenancy,
        },
        max_batch: s.max_batch_size,
        max_instances: s.max_instances,
        min_replicas: s.min_replicas,
        max_replicas: s.max_replicas,
    };
    let slo = Slo {
        latency_ms: spec.slo.latency_millis,
        percentile: spec.slo.percentile,
    };
    (bounds.sane(), slo)
}

pub fn knobs(k: &SpecKnobs) -> Knobs {
    Knobs::new(k.batch_size.max(1), k.instances.max(1))
}

pub fn spec_knobs(k: Knobs) -> SpecKnobs {
    SpecKnobs {
        batch_size: k.batch,
        instances: k.instances,
    }
}

pub fn approach(a: ChosenApproach) -> Approach {
    match a {
        ChosenApproach::Batching => Approach::Batching,
        ChosenApproach::MultiTenancy => Approach::MultiTenancy,
        ChosenApproach::Joint => Approach::Joint,
    }
}

pub fn chosen(a: Approach) -> ChosenApproach {
    match a {
        Approach::Batching => ChosenApproach::Batching,
        Approach::MultiTenancy => ChosenApproach::MultiTenancy,
        Approach::Joint => ChosenApproach::Joint,
    }
}

pub fn learned(m: &ScalerMemory) -> Learned {
    Learned {
        good: m.within_slo,
        bad: m.violated_at,
        slo_ms: m.slo_millis,
        arrival_rate: m.arrival_rate_per_second,
    }
}

pub fn scaler_memory(l: Learned) -> ScalerMemory {
    ScalerMemory {
        within_slo: l.good,
        violated_at: l.bad,
        slo_millis: l.slo_ms,
        arrival_rate_per_second: l.arrival_rate,
    }
}

/// The profile recorded in a tenant's status, when it is complete enough to decide from: it
/// has the point at (1, 1) and the weight size.
pub fn profile_from_status(model: &str, p: &SpecProfile) -> Option<Profile> {
    let weight_bytes = p.weight_bytes?;
    let points: Vec<ProfilePoint> = p
        .points
        .iter()
        .map(|q| ProfilePoint {
            batch: q.knobs.batch_size,
            instances: q.knobs.instances,
            throughput: q.throughput_per_second,
            p99_ms: q.latency_millis,
            peak_activation_bytes: q.peak_activation_bytes.unwrap_or(0),
            gpu_util: None,
        })
        .collect();
    let usable = points
        .iter()
        .any(|q| q.knobs() == Knobs::ONE && q.throughput > 0.0 && q.p99_ms > 0.0);
    usable.then(|| Profile {
        model: model.to_string(),
        weight_bytes,
        points,
    })
}

/// A measured profile of the model at `model_uri` as the tenant's status records it.
pub fn profile_to_status(p: &Profile, model_uri: &str, measured_at: String) -> SpecProfile {
    SpecProfile {
        points: p
            .points
            .iter()
            .map(|q| SpecPoint {
                knobs: spec_knobs(q.knobs()),
                throughput_per_second: q.throughput,
                latency_millis: q.p99_ms,
                peak_activation_bytes: Some(q.peak_activation_bytes),
            })
            .collect(),
        measured_at: Some(measured_at),
        weight_bytes: Some(p.weight_bytes),
        model_uri: Some(model_uri.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_survives_the_round_trip_through_the_status() {
        let p = Profile {
            model: "m".into(),
            weight_bytes: 1000,
            points: vec![
                ProfilePoint {
                    batch: 1,
                    instances: 1,
                    throughput: 10.0,
                    p99_ms: 5.0,
                    peak_activation_bytes: 64,
                    gpu_util: None,
                },
                ProfilePoint {
                    batch: 4,
                    instances: 1,
                    throughput: 30.0,
                    p99_ms: 9.0,
                    peak_activation_bytes: 256,
                    gpu_util: None,
                },
            ],
        };
        let status = profile_to_status(&p, "file:///m.onnx", "2026-12-02T00:00:00Z".into());
        assert_eq!(profile_from_status("m", &status), Some(p));
    }

    #[test]
    fn a_profile_without_the_single_point_is_not_used() {
        let status = SpecProfile {
            points: vec![SpecPoint {
                knobs: SpecKnobs {
                    batch_size: 4,
                    instances: 1,
                },
                throughput_per_second: 30.0,
                latency_millis: 9.0,
                peak_activation_bytes: None,
            }],
            measured_at: None,
            weight_bytes: Some(10),
            model_uri: None,
        };
        assert_eq!(profile_from_status("m", &status), None);
    }
}
