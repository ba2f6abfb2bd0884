//! How tenants that share a device slow each other down in the simulator.
//!
//! A batch of tenant `A` that starts on an agent hosting other tenants takes its drawn service
//! time times
//!
//! ```text
//! share[A] · (1 + Σ over the other tenants' busy instances B of (pair[A][B] − 1))
//! ```
//!
//! `share` is what hosting any other tenant costs even while it idles (a CPU agent splits its
//! threads evenly between its tenants); `pair[A][B]` is `A`'s slowdown while one instance of `B`
//! runs beside it, at the same share. The factor is fixed when the batch starts. Missing
//! entries take the file's defaults.
//!
//! File format (`policy/data/*-interference*.json`):
//! ```json
//! { "source": "how it was measured", "device": "what on", "synthetic": false,
//!   "default_share": 1.0, "default_pair": 1.1,
//!   "share": [ { "model": "squeezenet", "factor": 1.8 } ],
//!   "pairs": [ { "victim": "squeezenet", "other": "resnet18", "factor": 1.2 } ] }
//! ```
//! Extra fields (the raw measurements the factors came from) are allowed and ignored.

use serde::{Deserialize, Serialize};
use std::path::Path;

use super::service::ServiceError;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShareFactor {
    pub model: String,
    pub factor: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PairFactor {
    pub victim: String,
    pub other: String,
    pub factor: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Interference {
    pub source: String,
    #[serde(default)]
    pub device: String,
    /// True when the factors are not measurements.
    #[serde(default)]
    pub synthetic: bool,
    #[serde(default = "one")]
    pub default_share: f64,
    #[serde(default = "one")]
    pub default_pair: f64,
    #[serde(default)]
    pub share: Vec<ShareFactor>,
    #[serde(default)]
    pub pairs: Vec<PairFactor>,
}

fn one() -> f64 {
    1.0
}

impl Interference {
    /// Tenants do not slow each other down.
    pub fn none() -> Interference {
        Interference {
            source: "none: tenants sharing a device do not slow each other down".into(),
            device: String::new(),
            synthetic: true,
            default_share: 1.0,
            default_pair: 1.0,
            share: Vec::new(),
            pairs: Vec::new(),
        }
    }

    pub fn load(path: &Path) -> Result<Interference, ServiceError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ServiceError::Io {
            path: shown.clone(),
            source,
        })?;
        Interference::parse(&text, &shown)
    }

    pub fn parse(text: &str, origin: &str) -> Result<Interference, ServiceError> {
        let i: Interference = serde_json::from_str(text).map_err(|source| ServiceError::Parse {
            path: origin.to_string(),
            source,
        })?;
        let ok = |x: f64| x.is_finite() && x > 0.0;
        let bad = |model: &str| ServiceError::Invalid {
            path: origin.to_string(),
            model: model.to_string(),
            reason: "interference factors must be positive and finite".into(),
        };
        if !ok(i.default_share) || !ok(i.default_pair) {
            return Err(bad(""));
        }
        if let Some(s) = i.share.iter().find(|s| !ok(s.factor)) {
            return Err(bad(&s.model));
        }
        if let Some(p) = i.pairs.iter().find(|p| !ok(p.factor)) {
            return Err(bad(&p.victim));
        }
        Ok(i)
    }

    pub fn share(&self, model: &str) -> f64 {
        self.share
            .iter()
            .find(|s| s.model == model)
            .map_or(self.default_share, |s| s.factor)
    }

    pub fn pair(&self, victim: &str, other: &str) -> f64 {
        self.pairs
            .iter()
            .find(|p| p.victim == victim && p.other == other)
            .map_or(self.default_pair, |p| p.factor)
    }

    /// The slowdown of a batch of `victim` on an agent that also hosts `others` (model, busy
    /// instances); 1 when it hosts nobody else.
    pub fn factor<'a>(
        &self,
        victim: &str,
        others: impl IntoIterator<Item = (&'a str, u32)>,
    ) -> f64 {
        let mut hosted = false;
        let mut extra = 0.0;
        for (model, busy) in others {
            hosted = true;
            extra += f64::from(busy) * (self.pair(victim, model) - 1.0);
        }
        if hosted {
            self.share(victim) * (1.0 + extra).max(0.0)
        } else {
            1.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factor_combines_share_and_busy_pairs() {
        let text = r#"{"source":"t","default_pair":1.5,
            "share":[{"model":"a","factor":2.0}],
            "pairs":[{"victim":"a","other":"b","factor":1.2}]}"#;
        let i = Interference::parse(text, "t").unwrap();
        assert_eq!(i.factor("a", []), 1.0);
        assert!((i.factor("a", [("b", 0)]) - 2.0).abs() < 1e-12);
        assert!((i.factor("a", [("b", 2)]) - 2.0 * 1.4).abs() < 1e-12);
        // Defaults for what the file does not name.
        assert!((i.factor("c", [("b", 1)]) - 1.5).abs() < 1e-12);
        assert_eq!(Interference::none().factor("a", [("b", 3)]), 1.0);
    }

    #[test]
    fn a_bad_factor_is_an_error() {
        let text = r#"{"source":"t","pairs":[{"victim":"a","other":"b","factor":-1}]}"#;
        let err = Interference::parse(text, "f.json").unwrap_err().to_string();
        assert!(err.contains("f.json") && err.contains("\"a\""), "{err}");
    }
}
