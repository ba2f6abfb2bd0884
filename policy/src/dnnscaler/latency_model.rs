//! Predicts one replica's batch time, throughput, memory and device share at knobs that were not
//! measured, from the few profiled points (the reference work used two).
//!
//! Batch size is interpolated along the measured points at one instance; instances scale the
//! single-instance value by a contention factor interpolated along the measured points at batch
//! one. A measured point with both knobs above one (a joint point) calibrates that product: the
//! ratio of what it measured to what the product predicts there scales every other prediction
//! with both knobs above one, since batches and instances compete for the same device and their
//! gains do not simply multiply. A measured point is always returned exactly. Beyond the last
//! point the curve goes on with its last slope; with a single point it assumes no gain at all
//! (time grows linearly with the batch, instances serialise), so an unprofiled knob is never
//! predicted optimistically.

use crate::knobs::{Bounds, Knobs};
use crate::profile::{Profile, ProfilePoint};

#[derive(Clone, Debug, PartialEq)]
pub struct LatencyModel {
    weight_bytes: u64,
    /// (batch, p99 ms, mean batch ms, activation bytes, util) at one instance.
    by_batch: Vec<[f64; 5]>,
    /// (instances, p99 factor, mean-time factor, util factor) at batch one, relative to (1,1).
    by_instances: Vec<[f64; 4]>,
    /// (p99, mean time, util) measured at a joint point over the product's prediction there.
    joint: [f64; 3],
    exact: Vec<ProfilePoint>,
}

/// Mean time of one batch on one instance implied by a point's throughput.
fn mean_batch_ms(p: &ProfilePoint) -> f64 {
    p.batch as f64 * p.instances as f64 * 1000.0 / p.throughput
}

/// Piecewise-linear through `pts` sorted by x (column 0), column `col`; `single` extrapolates a
/// curve with only one point; past the ends the nearest segment's slope continues (never
/// decreasing past the last point, never below the first point's value before it).
fn interp(pts: &[[f64; 5]], col: usize, x: f64, single: impl Fn(f64, f64) -> f64) -> f64 {
    match pts {
        [] => f64::NAN,
        [p] => single(p[col], x / p[0]),
        _ => {
            let i = pts
                .iter()
                .position(|p| p[0] >= x)
                .unwrap_or(pts.len() - 1)
                .max(1);
            let (a, b) = (pts[i - 1], pts[i]);
            let slope = (b[col] - a[col]) / (b[0] - a[0]);
            if x <= pts[0][0] {
                return pts[0][col];
            }
            let slope = if x > b[0] { slope.max(0.0) } else { slope };
            a[col] + slope * (x - a[0])
        }
    }
}

impl LatencyModel {
    pub fn from_profile(profile: &Profile) -> LatencyModel {
        let base = profile
            .points
            .iter()
            .find(|p| p.knobs() == Knobs::ONE)
            .or_else(|| profile.points.first())
            .copied();
        let mut by_batch: Vec<[f64; 5]> = profile
            .points
            .iter()
            .filter(|p| p.instances == 1)
            .map(|p| {
                [
                    p.batch as f64,
                    p.p99_ms,
                    mean_batch_ms(p),
                    p.peak_activation_bytes as f64,
                    p.gpu_util.unwrap_or(f64::NAN),
                ]
            })
            .collect();
        by_batch.sort_by(|a, b| a[0].total_cmp(&b[0]));
        let mut by_instances: Vec<[f64; 4]> = match base {
            Some(b0) => profile
                .points
                .iter()
                .filter(|p| p.batch == 1)
                .map(|p| {
                    [
                        p.instances as f64,
                        p.p99_ms / b0.p99_ms,
                        mean_batch_ms(p) / mean_batch_ms(&b0),
                        p.gpu_util.unwrap_or(f64::NAN) / b0.gpu_util.unwrap_or(f64::NAN),
                    ]
                })
                .collect(),
            None => Vec::new(),
        };
        by_instances.sort_by(|a, b| a[0].total_cmp(&b[0]));
        if by_instances.is_empty() {
            by_instances.push([1.0, 1.0, 1.0, 1.0]);
        }
        let mut model = LatencyModel {
            weight_bytes: profile.weight_bytes,
            by_batch,
            by_instances,
            joint: [1.0; 3],
            exact: profile.points.clone(),
        };
        // The joint point with the most work in flight calibrates the product.
        let joint = profile
            .points
            .iter()
            .filter(|p| p.batch > 1 && p.instances > 1)
            .max_by_key(|p| p.knobs().concurrency());
        if let Some(p) = joint {
            let k = p.knobs();
            let measured = [p.p99_ms, mean_batch_ms(p), p.gpu_util.unwrap_or(f64::NAN)];
            let ratios: Vec<f64> = (0..3)
                .map(|col| measured[col] / model.product(k, col))
                .collect();
            for (factor, ratio) in model.joint.iter_mut().zip(ratios) {
                if ratio.is_finite() && ratio > 0.0 {
                    *factor = ratio;
                }
            }
        }
        model
    }

    /// The batch curve times the instance factor, for column 0 (p99), 1 (mean time) or 2
    /// (util).
    fn product(&self, k: Knobs, col: usize) -> f64 {
        let (batch_col, instance_col) = [(1, 1), (2, 2), (4, 3)][col];
        self.batch_col(k.batch, batch_col) * self.instance_factor(k.instances, instance_col)
    }

    /// [`Self::product`], scaled by the joint point's ratio where both knobs are above one.
    fn calibrated(&self, k: Knobs, col: usize) -> f64 {
        let joint = if k.batch > 1 && k.instances > 1 {
            self.joint[col]
        } else {
            1.0
        };
        self.product(k, col) * joint
    }

    fn exact(&self, k: Knobs) -> Option<&ProfilePoint> {
        self.exact.iter().find(|p| p.knobs() == k)
    }

    fn batch_col(&self, batch: u32, col: usize) -> f64 {
        interp(&self.by_batch, col, batch.max(1) as f64, |y, r| match col {
            // One point: no batching gain, activations grow with the batch.
            1..=3 => y * r,
            _ => y,
        })
    }

    fn instance_factor(&self, instances: u32, col: usize) -> f64 {
        let pts: Vec<[f64; 5]> = self
            .by_instances
            .iter()
            .map(|p| [p[0], p[1], p[2], p[3], 0.0])
            .collect();
        // One point: instances serialise, each batch waits for the others.
        interp(&pts, col, instances.max(1) as f64, |y, r| y * r).max(1.0)
    }

    /// p99 time of one batch execution (no queueing) at `k`.
    pub fn p99_ms(&self, k: Knobs) -> f64 {
        if let Some(p) = self.exact(k) {
            return p.p99_ms.max(mean_batch_ms(p));
        }
        self.calibrated(k, 0).max(self.service_ms(k))
    }

    /// Mean time of one batch execution at `k` (each instance, under the others' contention).
    pub fn service_ms(&self, k: Knobs) -> f64 {
        if let Some(p) = self.exact(k) {
            return mean_batch_ms(p);
        }
        self.calibrated(k, 1)
    }

    /// Samples per second one replica completes at `k` when always busy.
    pub fn throughput(&self, k: Knobs) -> f64 {
        if let Some(p) = self.exact(k) {
            return p.throughput;
        }
        k.concurrency() as f64 * 1000.0 / self.service_ms(k)
    }

    /// Device memory one replica needs at `k`: shared weights plus each instance's activations.
    /// `bounds` with the batch and instance maxima lowered to the largest knobs whose replica
    /// fits in `limit` bytes: the batch at `instances` instances, the instances at batch one.
    /// A knob the memory cannot hold is never worth growing to, since no agent could run the
    /// replica. At least one of each, so the tenant keeps a setting to run at.
    pub fn within_memory(&self, bounds: Bounds, instances: u32, limit: u64) -> Bounds {
        let b = bounds.sane();
        let fits = |k: Knobs| self.memory_bytes(k) <= limit;
        let largest = |max: u32, knobs: &dyn Fn(u32) -> Knobs| {
            (1..=max)
                .take_while(|&n| fits(knobs(n)))
                .last()
                .unwrap_or(1)
        };
        Bounds {
            max_batch: largest(b.max_batch, &|n| Knobs::new(n, instances.max(1))),
            max_instances: largest(b.max_instances, &|n| Knobs::new(1, n)),
            ..b
        }
    }

    pub fn memory_bytes(&self, k: Knobs) -> u64 {
        let act = self.batch_col(k.batch, 3).max(0.0);
        self.weight_bytes
            .saturating_add((act * k.instances.max(1) as f64).min(u64::MAX as f64 / 2.0) as u64)
    }

    /// Share of one device a fully loaded replica at `k` keeps busy, in (0, 1]; 1 when the
    /// profile did not say.
    pub fn gpu_util(&self, k: Knobs) -> f64 {
        let u = match self.exact(k).and_then(|p| p.gpu_util) {
            Some(u) => u,
            None => self.calibrated(k, 2),
        };
        if u.is_finite() && u > 0.0 {
            u.min(1.0)
        } else {
            1.0
        }
    }

    /// Largest batch in `1..=max_batch` whose predicted p99 at `instances` is within `limit_ms`,
    /// if any.
    pub fn largest_batch_within(
        &self,
        instances: u32,
        limit_ms: f64,
        max_batch: u32,
    ) -> Option<u32> {
        (1..=max_batch.max(1))
            .rev()
            .find(|&b| self.p99_ms(Knobs::new(b, instances)) <= limit_ms)
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
            peak_activation_bytes: 1000 * batch as u64,
            gpu_util: None,
        }
    }

    fn profile() -> Profile {
        Profile {
            model: "m".into(),
            weight_bytes: 10_000,
            points: vec![
                pt(1, 1, 100.0, 12.0),
                pt(8, 1, 400.0, 22.0),
                pt(1, 4, 250.0, 20.0),
            ],
        }
    }

    #[test]
    fn measured_points_come_back_exactly() {
        let m = LatencyModel::from_profile(&profile());
        assert_eq!(m.p99_ms(Knobs::new(8, 1)), 22.0);
        assert_eq!(m.throughput(Knobs::new(1, 4)), 250.0);
    }

    #[test]
    fn interpolates_between_and_extrapolates_past_points() {
        let m = LatencyModel::from_profile(&profile());
        let p4 = m.p99_ms(Knobs::new(4, 1));
        assert!(p4 > 12.0 && p4 < 22.0, "{p4}");
        let p16 = m.p99_ms(Knobs::new(16, 1));
        assert!(p16 > 22.0, "{p16}");
        // Joint knobs combine the batch curve with the instance contention factor.
        assert!(m.p99_ms(Knobs::new(8, 4)) > 22.0);
        assert!(m.throughput(Knobs::new(4, 1)) > 100.0);
    }

    /// Batches and instances that compete for one device gain less together than the product
    /// of their gains: a measured joint point scales the predictions at other joint knobs.
    #[test]
    fn a_joint_point_calibrates_the_other_joint_predictions() {
        let alone = LatencyModel::from_profile(&profile());
        let product = alone.throughput(Knobs::new(8, 4));
        let mut p = profile();
        // The product predicts 4 x 4 far above what it measured.
        let predicted = alone.throughput(Knobs::new(4, 4));
        p.points.push(pt(4, 4, predicted / 2.0, 40.0));
        let m = LatencyModel::from_profile(&p);
        assert_eq!(m.throughput(Knobs::new(4, 4)), predicted / 2.0);
        let calibrated = m.throughput(Knobs::new(8, 4));
        assert!(
            (calibrated - product / 2.0).abs() < 1e-9 * product,
            "{calibrated} vs {product}"
        );
        // Knobs with one instance or batch one keep their own curves.
        assert_eq!(
            m.throughput(Knobs::new(4, 1)),
            alone.throughput(Knobs::new(4, 1))
        );
        assert_eq!(
            m.throughput(Knobs::new(1, 3)),
            alone.throughput(Knobs::new(1, 3))
        );
        assert!(m.p99_ms(Knobs::new(8, 4)) > alone.p99_ms(Knobs::new(8, 4)));
    }

    #[test]
    fn one_point_predicts_no_gain() {
        let p = Profile {
            points: vec![pt(1, 1, 100.0, 12.0)],
            ..profile()
        };
        let m = LatencyModel::from_profile(&p);
        assert!((m.throughput(Knobs::new(4, 1)) - 100.0).abs() < 1e-6);
        assert!((m.throughput(Knobs::new(1, 3)) - 100.0).abs() < 1e-6);
    }

    /// Knobs whose replica would not fit the memory are outside the bounds: the batch at the
    /// instance count it runs with, the instances at batch one.
    #[test]
    fn bounds_within_memory_stop_below_what_does_not_fit() {
        let m = LatencyModel::from_profile(&profile());
        // 10,000 bytes of weights, 1,000 of activations per batch row per instance.
        let b = m.within_memory(Bounds::default(), 2, 10_000 + 16_000);
        assert_eq!((b.max_batch, b.max_instances), (8, 8));
        let b = m.within_memory(Bounds::default(), 1, 10_000 + 3_500);
        assert_eq!((b.max_batch, b.max_instances), (3, 3));
        // Nothing fits: one of each stays.
        let b = m.within_memory(Bounds::default(), 1, 0);
        assert_eq!((b.max_batch, b.max_instances), (1, 1));
        // The spec's own maxima stay where they are lower.
        let narrow = Bounds {
            max_batch: 2,
            ..Bounds::default()
        };
        assert_eq!(m.within_memory(narrow, 1, u64::MAX).max_batch, 2);
    }

    #[test]
    fn memory_counts_weights_once_and_activations_per_instance() {
        let m = LatencyModel::from_profile(&profile());
        assert_eq!(m.memory_bytes(Knobs::new(8, 1)), 10_000 + 8_000);
        assert_eq!(m.memory_bytes(Knobs::new(8, 2)), 10_000 + 16_000);
        assert_eq!(m.gpu_util(Knobs::ONE), 1.0);
    }

    #[test]
    fn largest_batch_within_a_limit() {
        let m = LatencyModel::from_profile(&profile());
        assert_eq!(m.largest_batch_within(1, 22.0, 64), Some(8));
        assert_eq!(m.largest_batch_within(1, 1.0, 64), None);
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use proptest::prelude::*;

    fn point() -> impl Strategy<Value = ProfilePoint> {
        (
            1u32..64,
            1u32..8,
            0.01f64..1e5,
            0.01f64..1e4,
            0u64..1 << 32,
            prop::option::of(0.0f64..=1.0),
        )
            .prop_map(|(batch, instances, throughput, p99_ms, act, gpu_util)| {
                ProfilePoint {
                    batch,
                    instances,
                    throughput,
                    p99_ms,
                    peak_activation_bytes: act,
                    gpu_util,
                }
            })
    }

    proptest! {
        /// Any profile that passes validation gives finite, positive predictions everywhere, so
        /// the scaler and the placement never see NaN or zero from the model.
        #[test]
        fn predictions_are_finite_and_positive(
            base in point(),
            others in prop::collection::vec(point(), 0..8),
            weight in 0u64..1 << 34,
        ) {
            let mut points = vec![ProfilePoint { batch: 1, instances: 1, ..base }];
            for p in others {
                if !points.iter().any(|q| q.knobs() == p.knobs()) {
                    points.push(p);
                }
            }
            let profile = Profile { model: "m".into(), weight_bytes: weight, points };
            let table = crate::profile::ProfileTable { source: "t".into(), device: String::new(), models: vec![profile] };
            prop_assume!(table.validate("t").is_ok());
            let m = LatencyModel::from_profile(&table.models[0]);
            for b in [1, 2, 3, 7, 16, 64, 200] {
                for i in [1, 2, 5, 8, 16] {
                    let k = Knobs::new(b, i);
                    for v in [m.p99_ms(k), m.service_ms(k), m.throughput(k), m.gpu_util(k)] {
                        prop_assert!(v.is_finite() && v > 0.0, "{k:?} -> {v}");
                    }
                    prop_assert!(m.p99_ms(k) >= m.service_ms(k) * 0.999_999);
                    prop_assert!(m.memory_bytes(k) >= weight);
                }
            }
        }
    }
}
