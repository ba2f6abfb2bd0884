//! Profiles: throughput and tail latency of one model measured at several knob settings, and the
//! JSON profile table file (`policy/profiles/*.json`) that ships them.
//!
//! File format (one object):
//! ```json
//! { "source": "how it was made", "device": "what it ran on",
//!   "models": [ { "model": "mobilenet_v2", "weight_bytes": 14000000,
//!                 "points": [ { "batch": 1, "instances": 1, "throughput": 120.0, "p99_ms": 9.1,
//!                               "peak_activation_bytes": 6000000, "gpu_util": 0.4 } ] } ] }
//! ```
//! `throughput` is samples per second for the whole replica, `p99_ms` the p99 time of one batch
//! execution (no queueing), `peak_activation_bytes` per instance at that batch, `gpu_util`
//! (optional) the busy share of the device. Every model needs a point at batch 1, instances 1.

use crate::knobs::Knobs;
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProfilePoint {
    pub batch: u32,
    pub instances: u32,
    pub throughput: f64,
    pub p99_ms: f64,
    #[serde(default)]
    pub peak_activation_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_util: Option<f64>,
}

impl ProfilePoint {
    pub fn knobs(&self) -> Knobs {
        Knobs::new(self.batch, self.instances)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    pub model: String,
    pub weight_bytes: u64,
    pub points: Vec<ProfilePoint>,
}

impl Profile {
    pub fn point(&self, knobs: Knobs) -> Option<&ProfilePoint> {
        self.points.iter().find(|p| p.knobs() == knobs)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProfileTable {
    pub source: String,
    #[serde(default)]
    pub device: String,
    pub models: Vec<Profile>,
}

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("reading profile file {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing profile file {path}: {source}")]
    Parse {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("profile file {path}, model {model:?}, field {field}: {reason}")]
    Invalid {
        path: String,
        model: String,
        field: String,
        reason: String,
    },
    #[error("profile file {path} has no model {model:?}")]
    UnknownModel { path: String, model: String },
}

impl ProfileTable {
    /// Reads and validates a profile file.
    pub fn load(path: &Path) -> Result<ProfileTable, ProfileError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Io {
            path: shown.clone(),
            source,
        })?;
        ProfileTable::parse(&text, &shown)
    }

    /// Parses and validates profile JSON; `origin` names the file in errors.
    pub fn parse(text: &str, origin: &str) -> Result<ProfileTable, ProfileError> {
        let table: ProfileTable =
            serde_json::from_str(text).map_err(|source| ProfileError::Parse {
                path: origin.to_string(),
                source,
            })?;
        table.validate(origin)?;
        Ok(table)
    }

    /// The profile of `model`.
    pub fn get(&self, model: &str, origin: &str) -> Result<&Profile, ProfileError> {
        self.models
            .iter()
            .find(|p| p.model == model)
            .ok_or_else(|| ProfileError::UnknownModel {
                path: origin.to_string(),
                model: model.to_string(),
            })
    }

    pub fn validate(&self, origin: &str) -> Result<(), ProfileError> {
        let bad = |model: &str, field: String, reason: &str| ProfileError::Invalid {
            path: origin.to_string(),
            model: model.to_string(),
            field,
            reason: reason.to_string(),
        };
        for (i, p) in self.models.iter().enumerate() {
            if p.model.trim().is_empty() {
                return Err(bad("", format!("models[{i}].model"), "is empty"));
            }
            if self.models[..i].iter().any(|q| q.model == p.model) {
                return Err(bad(&p.model, format!("models[{i}].model"), "appears twice"));
            }
            if p.point(Knobs::ONE).is_none() {
                return Err(bad(
                    &p.model,
                    format!("models[{i}].points"),
                    "needs a point at batch 1, instances 1",
                ));
            }
            for (j, pt) in p.points.iter().enumerate() {
                let f = |name: &str| format!("models[{i}].points[{j}].{name}");
                if pt.batch == 0 {
                    return Err(bad(&p.model, f("batch"), "must be at least 1"));
                }
                if pt.instances == 0 {
                    return Err(bad(&p.model, f("instances"), "must be at least 1"));
                }
                if !(pt.throughput.is_finite() && pt.throughput > 0.0) {
                    return Err(bad(
                        &p.model,
                        f("throughput"),
                        "must be positive and finite",
                    ));
                }
                if !(pt.p99_ms.is_finite() && pt.p99_ms > 0.0) {
                    return Err(bad(&p.model, f("p99_ms"), "must be positive and finite"));
                }
                if let Some(u) = pt.gpu_util
                    && !(0.0..=1.0).contains(&u)
                {
                    return Err(bad(&p.model, f("gpu_util"), "must be within [0, 1]"));
                }
                if p.points[..j].iter().any(|q| q.knobs() == pt.knobs()) {
                    return Err(bad(&p.model, f("batch"), "knobs measured twice"));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"source":"test","models":[{"model":"m","weight_bytes":10,
        "points":[{"batch":1,"instances":1,"throughput":100.0,"p99_ms":10.0}]}]}"#;

    #[test]
    fn parses_a_good_table() {
        let t = ProfileTable::parse(GOOD, "good.json").unwrap();
        assert_eq!(t.get("m", "good.json").unwrap().points.len(), 1);
        assert!(matches!(
            t.get("x", "good.json"),
            Err(ProfileError::UnknownModel { .. })
        ));
    }

    #[test]
    fn bad_field_is_named_with_file_and_model() {
        let text = GOOD.replace("\"p99_ms\":10.0", "\"p99_ms\":-1");
        let err = ProfileTable::parse(&text, "bad.json").unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("bad.json") && msg.contains("\"m\"") && msg.contains("p99_ms"),
            "{msg}"
        );
    }

    #[test]
    fn missing_base_point_and_bad_json_are_errors() {
        let text = GOOD.replace("\"batch\":1", "\"batch\":2");
        assert!(matches!(
            ProfileTable::parse(&text, "f"),
            Err(ProfileError::Invalid { .. })
        ));
        assert!(matches!(
            ProfileTable::parse("{", "f"),
            Err(ProfileError::Parse { .. })
        ));
        assert!(matches!(
            ProfileTable::load(Path::new("/nonexistent/p.json")),
            Err(ProfileError::Io { .. })
        ));
    }

    #[test]
    fn shipped_tables_are_valid() {
        for (name, text) in [
            (
                "cpu-measured.json",
                include_str!("../profiles/cpu-measured.json"),
            ),
            (
                "gpu-synthetic.json",
                include_str!("../profiles/gpu-synthetic.json"),
            ),
        ] {
            let t = ProfileTable::parse(text, name).unwrap();
            assert!(t.models.len() >= 3, "{name}");
            assert!(!t.source.is_empty(), "{name} says where it came from");
        }
    }
}
