//! The profiler rule: from points measured at (b=1,m=1), (b=k,m=1) and (b=1,m=k) pick the approach
//! whose throughput gain over (1,1) is larger; offer `Joint` (m instances each batching b) when a
//! measured joint point beats both by [`JOINT_MARGIN`]. Only points within the bounds and whose
//! batch p99 alone fits the SLO count, since a gain the tenant may not use is no gain.

use crate::knobs::{ApproachPolicy, Bounds, Knobs};
use crate::profile::{Profile, ProfilePoint};
use crate::slo::Slo;
use serde::{Deserialize, Serialize};

/// Which knob the scaler moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Approach {
    /// One instance; the batch size moves.
    Batching,
    /// Batch one; the instance count moves.
    MultiTenancy,
    /// A fixed number of instances (from the winning joint point); the batch size moves.
    Joint,
}

/// The rule's answer and the evidence for it (written into the tenant's status).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApproachChoice {
    pub approach: Approach,
    /// Where the scaler starts: the best usable measured point of the chosen approach.
    pub knobs: Knobs,
    /// Throughput of the best usable point over throughput at (1,1); 1 when none was measured.
    pub gain_batching: f64,
    pub gain_multi_tenancy: f64,
    pub gain_joint: Option<f64>,
}

/// How much more throughput than the best single-knob point a joint point must show to be
/// chosen. Each instance of a joint replica holds a batch's activations, so it costs more memory
/// than the batching one; a gain within the profile's noise does not pay for that.
pub const JOINT_MARGIN: f64 = 1.25;

fn best<'a>(points: impl Iterator<Item = &'a ProfilePoint>) -> Option<&'a ProfilePoint> {
    points.max_by(|a, b| a.throughput.total_cmp(&b.throughput))
}

pub fn choose_approach(profile: &Profile, slo: &Slo, bounds: &Bounds) -> ApproachChoice {
    let bounds = bounds.sane();
    let usable = |p: &&ProfilePoint| bounds.contains(p.knobs()) && p.p99_ms <= slo.latency_ms;
    let base = profile.point(Knobs::ONE).map_or(f64::NAN, |p| p.throughput);
    let gain = |p: Option<&ProfilePoint>| match p {
        Some(p) if base.is_finite() && base > 0.0 => p.throughput / base,
        _ => 1.0,
    };
    let batching = best(
        profile
            .points
            .iter()
            .filter(usable)
            .filter(|p| p.instances == 1),
    );
    let multi = best(
        profile
            .points
            .iter()
            .filter(usable)
            .filter(|p| p.batch == 1),
    );
    let joint = best(
        profile
            .points
            .iter()
            .filter(usable)
            .filter(|p| p.batch > 1 && p.instances > 1),
    );
    let (gb, gm) = (gain(batching), gain(multi));
    let gj = joint.map(|p| gain(Some(p)));
    let start = |p: Option<&ProfilePoint>| p.map_or(Knobs::ONE, |p| p.knobs());
    let (approach, knobs) = match bounds.approach {
        ApproachPolicy::Batching => (Approach::Batching, start(batching)),
        ApproachPolicy::MultiTenancy => (Approach::MultiTenancy, start(multi)),
        ApproachPolicy::Auto => match gj {
            Some(g) if g > JOINT_MARGIN * gb.max(gm) => (Approach::Joint, start(joint)),
            // Ties go to batching: one instance holds one copy of the activations.
            _ if gb >= gm => (Approach::Batching, start(batching)),
            _ => (Approach::MultiTenancy, start(multi)),
        },
    };
    ApproachChoice {
        approach,
        knobs,
        gain_batching: gb,
        gain_multi_tenancy: gm,
        gain_joint: gj,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pt(batch: u32, instances: u32, throughput: f64, p99_ms: f64) -> ProfilePoint {
        ProfilePoint {
            batch,
            instances,
            throughput,
            p99_ms,
            peak_activation_bytes: 0,
            gpu_util: None,
        }
    }

    fn profile(points: Vec<ProfilePoint>) -> Profile {
        Profile {
            model: "m".into(),
            weight_bytes: 0,
            points,
        }
    }

    #[test]
    fn big_nets_batch_small_nets_multiplex() {
        let slo = Slo::p99(100.0);
        let big = profile(vec![
            pt(1, 1, 100.0, 10.0),
            pt(8, 1, 500.0, 16.0),
            pt(1, 4, 150.0, 27.0),
        ]);
        let c = choose_approach(&big, &slo, &Bounds::default());
        assert_eq!(
            (c.approach, c.knobs),
            (Approach::Batching, Knobs::new(8, 1))
        );
        assert!((c.gain_batching - 5.0).abs() < 1e-9);
        let small = profile(vec![
            pt(1, 1, 100.0, 10.0),
            pt(8, 1, 150.0, 53.0),
            pt(1, 4, 350.0, 12.0),
        ]);
        let c = choose_approach(&small, &slo, &Bounds::default());
        assert_eq!(
            (c.approach, c.knobs),
            (Approach::MultiTenancy, Knobs::new(1, 4))
        );
    }

    #[test]
    fn bounds_force_an_approach_and_joint_needs_to_beat_both() {
        let slo = Slo::p99(100.0);
        let p = profile(vec![
            pt(1, 1, 100.0, 10.0),
            pt(8, 1, 500.0, 16.0),
            pt(1, 4, 150.0, 27.0),
            pt(8, 2, 700.0, 23.0),
        ]);
        let c = choose_approach(&p, &slo, &Bounds::default());
        assert_eq!((c.approach, c.knobs), (Approach::Joint, Knobs::new(8, 2)));
        // A joint point within the margin of the best single knob is not worth its memory.
        let mut close = p.clone();
        close.points[3].throughput = 500.0 * JOINT_MARGIN;
        let c = choose_approach(&close, &slo, &Bounds::default());
        assert_eq!(
            (c.approach, c.knobs),
            (Approach::Batching, Knobs::new(8, 1))
        );
        let forced = Bounds {
            approach: ApproachPolicy::MultiTenancy,
            ..Bounds::default()
        };
        assert_eq!(
            choose_approach(&p, &slo, &forced).approach,
            Approach::MultiTenancy
        );
    }

    #[test]
    fn points_over_the_slo_or_bounds_do_not_count() {
        let p = profile(vec![
            pt(1, 1, 100.0, 10.0),
            pt(8, 1, 500.0, 60.0),
            pt(1, 4, 150.0, 20.0),
        ]);
        let c = choose_approach(&p, &Slo::p99(50.0), &Bounds::default());
        assert_eq!(c.approach, Approach::MultiTenancy);
        let narrow = Bounds {
            max_instances: 2,
            ..Bounds::default()
        };
        let c = choose_approach(&p, &Slo::p99(100.0), &narrow);
        assert_eq!(
            (c.approach, c.knobs),
            (Approach::Batching, Knobs::new(8, 1))
        );
    }

    #[test]
    fn the_synthetic_gpu_table_has_the_papers_shapes() {
        let text = include_str!("../../profiles/gpu-synthetic.json");
        let t = crate::profile::ProfileTable::parse(text, "gpu-synthetic.json").unwrap();
        let pick = |m: &str, slo: f64| {
            choose_approach(t.get(m, "t").unwrap(), &Slo::p99(slo), &Bounds::default()).approach
        };
        assert_eq!(pick("resnet50", 60.0), Approach::Batching);
        assert_eq!(pick("vgg16", 100.0), Approach::Batching);
        assert_eq!(pick("squeezenet", 8.0), Approach::MultiTenancy);
        assert_eq!(pick("mobilenet_v2", 30.0), Approach::Joint);
    }
}
