//! The simulator's ground truth for how long a batch takes: measured service-time distributions
//! per (model, batch, instances), kept apart from the [`LatencyModel`](crate::LatencyModel) the
//! scaler predicts with, so that a simulation does not grade the scaler against its own
//! predictions.
//!
//! File format (`policy/data/*-service-times.json`, one object):
//! ```json
//! { "source": "how it was measured", "device": "what it ran on",
//!   "models": [ { "model": "squeezenet",
//!                 "points": [ { "batch": 1, "instances": 1, "mean_ms": 4.9, "p50_ms": 4.7,
//!                               "p95_ms": 6.0, "p99_ms": 7.5, "samples_ms": [] } ] } ] }
//! ```
//! Each point is the time of one batch on one instance while `instances` instances run together
//! (no queueing). A draw at a measured point comes from that point's distribution: its recorded
//! samples when there are any; else the piecewise-linear quantile function through p50, p95 and
//! p99 whose mean is `mean_ms`; else (a profile table, which has only the mean and p99) a shifted
//! exponential with that mean and p99.
//!
//! At knobs that were not measured, the distribution of the nearest measured point is scaled to
//! a mean interpolated linearly along the batch within each measured instance count, then
//! between instance counts. Past the largest measured batch or instance count the time grows in
//! proportion (no further gain), and below the smallest it stays at the smallest's: the truth is
//! never extrapolated optimistically.

use crate::knobs::Knobs;
use crate::profile::ProfileTable;
use serde::{Deserialize, Serialize};
use std::path::Path;

use super::rng::Rng;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServicePoint {
    pub batch: u32,
    pub instances: u32,
    pub mean_ms: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p50_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p95_ms: Option<f64>,
    pub p99_ms: f64,
    /// Recorded batch times, when kept; they take precedence over the percentiles.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub samples_ms: Vec<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServiceModel {
    pub model: String,
    pub points: Vec<ServicePoint>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServiceTimes {
    pub source: String,
    #[serde(default)]
    pub device: String,
    pub models: Vec<ServiceModel>,
}

/// One batch-time distribution, ready to draw from.
#[derive(Clone, Debug, PartialEq)]
pub enum Dist {
    /// Sorted samples; a draw picks one uniformly and interpolates between neighbours.
    Samples(Vec<f64>),
    /// Knots (u, ms) of a piecewise-linear quantile function over u in [0, 1].
    Quantiles(Vec<[f64; 2]>),
    /// `shift` plus an exponential of mean `mean_exp`.
    ShiftedExp { shift: f64, mean_exp: f64 },
}

impl Dist {
    fn from_point(p: &ServicePoint) -> Dist {
        if !p.samples_ms.is_empty() {
            let mut s = p.samples_ms.clone();
            s.sort_by(f64::total_cmp);
            return Dist::Samples(s);
        }
        let mean = p.mean_ms.max(1e-9);
        match (p.p50_ms, p.p95_ms) {
            (Some(p50), Some(p95)) => {
                let p95 = p95.max(p50);
                let p99 = p.p99_ms.max(p95);
                // The tail past p99 goes on with the p95→p99 slope.
                let max = p99 + 0.25 * (p99 - p95);
                // The bottom knot is set so that the mean is the measured one.
                let upper =
                    0.45 * (p50 + p95) / 2.0 + 0.04 * (p95 + p99) / 2.0 + 0.01 * (p99 + max) / 2.0;
                let q0 = ((mean - upper) / 0.25 - p50).clamp(0.0, p50);
                Dist::Quantiles(vec![
                    [0.0, q0],
                    [0.5, p50],
                    [0.95, p95],
                    [0.99, p99],
                    [1.0, max],
                ])
            }
            _ => {
                // p99 of Exp(mean) is mean·ln 100.
                let p99 = p.p99_ms.max(mean);
                let c = ((p99 / mean - 1.0) / (100f64.ln() - 1.0)).clamp(0.0, 1.0);
                Dist::ShiftedExp {
                    shift: mean * (1.0 - c),
                    mean_exp: mean * c,
                }
            }
        }
    }

    /// The value at quantile `u` in [0, 1].
    pub fn quantile(&self, u: f64) -> f64 {
        let u = u.clamp(0.0, 1.0);
        match self {
            Dist::Samples(s) => {
                let x = u * (s.len() - 1) as f64;
                let i = (x.floor() as usize).min(s.len() - 1);
                let j = (i + 1).min(s.len() - 1);
                s[i] + (s[j] - s[i]) * (x - i as f64)
            }
            Dist::Quantiles(k) => {
                let i = k
                    .iter()
                    .position(|q| q[0] >= u)
                    .unwrap_or(k.len() - 1)
                    .max(1);
                let (a, b) = (k[i - 1], k[i]);
                a[1] + (b[1] - a[1]) * (u - a[0]) / (b[0] - a[0]).max(1e-12)
            }
            Dist::ShiftedExp { shift, mean_exp } => shift - mean_exp * (1.0 - u).max(1e-300).ln(),
        }
    }

    pub fn mean(&self) -> f64 {
        match self {
            Dist::Samples(s) => s.iter().sum::<f64>() / s.len() as f64,
            Dist::Quantiles(k) => k
                .windows(2)
                .map(|w| (w[1][0] - w[0][0]) * (w[0][1] + w[1][1]) / 2.0)
                .sum(),
            Dist::ShiftedExp { shift, mean_exp } => shift + mean_exp,
        }
    }

    fn scaled(self, f: f64) -> Dist {
        match self {
            Dist::Samples(s) => Dist::Samples(s.into_iter().map(|x| x * f).collect()),
            Dist::Quantiles(k) => Dist::Quantiles(k.into_iter().map(|[u, x]| [u, x * f]).collect()),
            Dist::ShiftedExp { shift, mean_exp } => Dist::ShiftedExp {
                shift: shift * f,
                mean_exp: mean_exp * f,
            },
        }
    }

    pub fn draw(&self, rng: &mut Rng) -> f64 {
        // `unit` is in (0, 1], so u is in [0, 1): the exponential's tail stays finite.
        self.quantile(1.0 - rng.unit())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("reading {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing {path}: {source}")]
    Parse {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}, model {model:?}: {reason}")]
    Invalid {
        path: String,
        model: String,
        reason: String,
    },
}

/// Piecewise-linear through (x, y) sorted by x; past the last point y grows in proportion to x
/// (no further gain), before the first it stays at the first.
fn along(pts: &[(f64, f64)], x: f64) -> f64 {
    let first = pts[0];
    let last = pts[pts.len() - 1];
    if x <= first.0 {
        return first.1;
    }
    if x >= last.0 {
        return last.1 * x / last.0;
    }
    let i = pts.iter().position(|p| p.0 >= x).unwrap_or(pts.len() - 1);
    let (a, b) = (pts[i - 1], pts[i]);
    a.1 + (b.1 - a.1) * (x - a.0) / (b.0 - a.0)
}

impl ServiceModel {
    /// Mean batch time at `k`, interpolated over the measured grid.
    fn mean_ms(&self, k: Knobs) -> f64 {
        let mut rows: Vec<u32> = self.points.iter().map(|p| p.instances).collect();
        rows.sort_unstable();
        rows.dedup();
        let by_row: Vec<(f64, f64)> = rows
            .iter()
            .map(|&m| {
                let mut pts: Vec<(f64, f64)> = self
                    .points
                    .iter()
                    .filter(|p| p.instances == m)
                    .map(|p| (p.batch as f64, p.mean_ms))
                    .collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                (m as f64, along(&pts, k.batch.max(1) as f64))
            })
            .collect();
        along(&by_row, k.instances.max(1) as f64)
    }

    /// The batch-time distribution at `k`.
    pub fn dist(&self, k: Knobs) -> Dist {
        if let Some(p) = self
            .points
            .iter()
            .find(|p| p.batch == k.batch && p.instances == k.instances)
        {
            return Dist::from_point(p);
        }
        // The nearest measured point's shape, at the interpolated mean.
        let d = |p: &ServicePoint| {
            (f64::from(p.batch).ln() - f64::from(k.batch.max(1)).ln()).abs()
                + (f64::from(p.instances).ln() - f64::from(k.instances.max(1)).ln()).abs()
        };
        let near = self
            .points
            .iter()
            .min_by(|a, b| d(a).total_cmp(&d(b)))
            .expect("validated: every model has points");
        let shape = Dist::from_point(near);
        let f = self.mean_ms(k) / shape.mean().max(1e-12);
        shape.scaled(f)
    }
}

impl ServiceTimes {
    pub fn load(path: &Path) -> Result<ServiceTimes, ServiceError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ServiceError::Io {
            path: shown.clone(),
            source,
        })?;
        ServiceTimes::parse(&text, &shown)
    }

    pub fn parse(text: &str, origin: &str) -> Result<ServiceTimes, ServiceError> {
        let t: ServiceTimes = serde_json::from_str(text).map_err(|source| ServiceError::Parse {
            path: origin.to_string(),
            source,
        })?;
        for m in &t.models {
            let bad = |reason: &str| ServiceError::Invalid {
                path: origin.to_string(),
                model: m.model.clone(),
                reason: reason.to_string(),
            };
            if m.points.is_empty() {
                return Err(bad("has no points"));
            }
            for p in &m.points {
                let positive = |x: f64| x.is_finite() && x > 0.0;
                if p.batch == 0 || p.instances == 0 {
                    return Err(bad("batch and instances must be at least 1"));
                }
                if !positive(p.mean_ms) || !positive(p.p99_ms) {
                    return Err(bad("mean_ms and p99_ms must be positive and finite"));
                }
                if p.samples_ms.iter().any(|&s| !(s.is_finite() && s >= 0.0)) {
                    return Err(bad("samples_ms must be finite and not negative"));
                }
            }
        }
        Ok(t)
    }

    /// The truth taken from a profile table's own points (mean from the throughput, and the
    /// p99): for tables, like the synthetic GPU one, that have no separate measurement.
    pub fn from_profile_table(table: &ProfileTable) -> ServiceTimes {
        ServiceTimes {
            source: format!("the profile table's points ({})", table.source),
            device: table.device.clone(),
            models: table
                .models
                .iter()
                .map(|m| ServiceModel {
                    model: m.model.clone(),
                    points: m
                        .points
                        .iter()
                        .map(|p| ServicePoint {
                            batch: p.batch,
                            instances: p.instances,
                            mean_ms: f64::from(p.batch) * f64::from(p.instances) * 1000.0
                                / p.throughput,
                            p50_ms: None,
                            p95_ms: None,
                            p99_ms: p.p99_ms,
                            samples_ms: Vec::new(),
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    pub fn get(&self, model: &str) -> Option<&ServiceModel> {
        self.models.iter().find(|m| m.model == model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pt(batch: u32, instances: u32, mean: f64) -> ServicePoint {
        ServicePoint {
            batch,
            instances,
            mean_ms: mean,
            p50_ms: Some(mean * 0.95),
            p95_ms: Some(mean * 1.2),
            p99_ms: mean * 1.5,
            samples_ms: Vec::new(),
        }
    }

    fn model() -> ServiceModel {
        ServiceModel {
            model: "m".into(),
            points: vec![pt(1, 1, 10.0), pt(4, 1, 20.0), pt(1, 2, 15.0)],
        }
    }

    #[test]
    fn percentile_draws_match_the_measured_point() {
        let d = model().dist(Knobs::ONE);
        let mut rng = Rng::new(3);
        let mut s: Vec<f64> = (0..200_000).map(|_| d.draw(&mut rng)).collect();
        s.sort_by(f64::total_cmp);
        let mean = s.iter().sum::<f64>() / s.len() as f64;
        let q = |p: f64| s[(p * (s.len() - 1) as f64) as usize];
        assert!((mean - 10.0).abs() < 0.1, "{mean}");
        assert!((q(0.5) - 9.5).abs() < 0.1, "{}", q(0.5));
        assert!((q(0.95) - 12.0).abs() < 0.1, "{}", q(0.95));
        assert!((q(0.99) - 15.0).abs() < 0.15, "{}", q(0.99));
    }

    #[test]
    fn samples_take_precedence() {
        let mut p = pt(1, 1, 10.0);
        p.samples_ms = vec![3.0, 1.0, 2.0];
        let d = Dist::from_point(&p);
        assert_eq!(d.quantile(0.0), 1.0);
        assert_eq!(d.quantile(1.0), 3.0);
        assert!((d.mean() - 2.0).abs() < 1e-12);
    }

    #[test]
    fn unmeasured_knobs_interpolate_and_never_extrapolate_a_gain() {
        let m = model();
        assert!((m.dist(Knobs::new(2, 1)).mean() - 40.0 / 3.0).abs() < 1e-9);
        // Past the last batch: in proportion.
        assert!((m.dist(Knobs::new(8, 1)).mean() - 40.0).abs() < 1e-9);
        // Past the last instance count: in proportion, on top of the batch.
        assert!((m.dist(Knobs::new(1, 4)).mean() - 30.0).abs() < 1e-9);
        // A batch not measured at 2 instances: the row's only point.
        assert!((m.dist(Knobs::new(4, 2)).mean() - 60.0).abs() < 1e-9);
    }

    #[test]
    fn a_profile_table_gives_its_own_mean_and_p99() {
        let text = r#"{"source":"t","models":[{"model":"m","weight_bytes":1,
            "points":[{"batch":2,"instances":1,"throughput":100.0,"p99_ms":40.0},
                      {"batch":1,"instances":1,"throughput":100.0,"p99_ms":20.0}]}]}"#;
        let table = ProfileTable::parse(text, "t").unwrap();
        let s = ServiceTimes::from_profile_table(&table);
        let d = s.get("m").unwrap().dist(Knobs::new(2, 1));
        assert!((d.mean() - 20.0).abs() < 1e-9);
        assert!((d.quantile(0.99) - 40.0).abs() < 1e-6);
    }

    #[test]
    fn bad_files_are_named() {
        let err = ServiceTimes::parse(
            r#"{"source":"x","models":[{"model":"m","points":[]}]}"#,
            "f.json",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("f.json") && err.contains("\"m\""), "{err}");
    }
}
