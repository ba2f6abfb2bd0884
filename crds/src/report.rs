//! The agent's `/report` body: what one agent says about each tenant replica it holds, served
//! to the operator alone and read by its scaler. The agent serialises these types and the
//! operator deserialises them, so every field is named once, here.
//!
//! The body carries [`REPORT_VERSION`], and a reader uses only a body of its own version
//! ([`AgentReport::from_slice`]). Within a version a field may be added (readers ignore fields
//! they do not know); renaming or removing a field, changing its meaning, or adding a state makes
//! a new version, with its own fixture in `crds/tests/fixtures/`.
//!
//! Every field is required, so a body without one does not parse rather than reading as absent;
//! only what depends on the agent's mode (`tenant`, `approach`, `profile`) may be left out. What
//! a replica measures exists only in [`State::Ready`], and a measurement that has no value yet is
//! written as null.

use crate::common::{Knobs, TenantRef};
use cotenant_policy::Profile;
use serde::{Deserialize, Deserializer, Serialize};
use std::collections::BTreeSet;

/// The version of the report body this build writes and reads.
pub const REPORT_VERSION: u32 = 2;

/// The audience of the ServiceAccount token the operator presents to `/report`, and that an
/// agent requires of it.
pub const REPORT_AUDIENCE: &str = "cotenant.dev/agent-report";

/// Counters and byte sizes saturate here when read: the API server stores integers as int64.
pub const MAX_COUNT: u64 = i64::MAX as u64;

/// The model name a tenant is served and reported under on an agent in Kubernetes mode:
/// `<namespace>.<name>`.
pub fn served_name(namespace: &str, name: &str) -> String {
    format!("{namespace}.{name}")
}

/// One agent's report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentReport {
    /// [`REPORT_VERSION`] of the agent that wrote it.
    pub version: u32,
    /// Every tenant replica the agent holds.
    pub tenants: Vec<TenantReport>,
}

/// One tenant replica as its agent reports it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantReport {
    /// The name clients use in `/v2/models/<name>`: [`served_name`] in Kubernetes mode, the
    /// configured name in standalone mode.
    pub name: String,
    /// Where the model came from.
    pub source: String,
    /// The latency target in milliseconds, at [`TenantReport::percentile`].
    #[serde(deserialize_with = "number")]
    pub slo_millis: f64,
    #[serde(deserialize_with = "number")]
    pub percentile: f64,
    /// The ModelTenant this replica serves (Kubernetes mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<TenantRef>,
    /// Whether the agent is measuring the profile points the operator asked for (the replica
    /// serves meanwhile).
    pub profiling: bool,
    /// The approach the agent's own scaler applies (standalone mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approach: Option<String>,
    /// The measured profile: the points the operator asked for (Kubernetes mode), or those the
    /// agent's own scaler chose from (standalone mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<Profile>,
    /// Where the replica is, and what it measured when it serves.
    #[serde(flatten)]
    pub state: State,
}

/// Where a replica is in its lifecycle, written as the body's `state` field.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state")]
#[expect(
    clippy::large_enum_variant,
    reason = "a report holds a few entries per agent; boxing would only add noise"
)]
pub enum State {
    /// Fetching and compiling the model.
    Loading,
    /// Serving requests.
    Ready(Serving),
    /// Could not be loaded, or crashed while serving.
    Failed {
        /// Why.
        error: String,
    },
}

/// What a serving replica runs with and measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Serving {
    /// The knobs it runs with now.
    pub knobs: Knobs,
    /// Seconds since `knobs` took effect (since the replica started, when they never changed).
    /// The window and the percentiles here reach back no further: they measure these knobs.
    #[serde(deserialize_with = "number")]
    pub since_knobs_changed_seconds: f64,
    /// Requests waiting for a batch.
    #[serde(deserialize_with = "count")]
    pub queue_depth: u64,
    /// What admission multiplies its latency predictions by (1 when they hold).
    #[serde(deserialize_with = "number")]
    pub admission_overrun: f64,
    /// End-to-end latency at the SLO's percentile over the window; null when no request
    /// finished in it.
    #[serde(deserialize_with = "nullable")]
    pub latency_at_percentile_millis: Option<f64>,
    /// Compute time (the request's batch, no queueing) at the SLO's percentile over the window;
    /// null when no request finished in it.
    #[serde(deserialize_with = "nullable")]
    pub compute_at_percentile_millis: Option<f64>,
    /// The recent requests, since the knobs last changed at most.
    pub window: Window,
    /// Bytes of the model's weights.
    #[serde(deserialize_with = "count")]
    pub weight_bytes: u64,
}

/// The recent requests of one replica: the last 30 seconds at most, and none from before its
/// knobs last changed. A percentile is null when no request finished in it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Window {
    /// How long the window spans.
    #[serde(deserialize_with = "number")]
    pub seconds: f64,
    #[serde(deserialize_with = "number")]
    pub arrival_rate_per_second: f64,
    #[serde(deserialize_with = "number")]
    pub throughput_per_second: f64,
    #[serde(deserialize_with = "count")]
    pub completions: u64,
    #[serde(deserialize_with = "count")]
    pub errors: u64,
    /// Requests admission control refused.
    #[serde(deserialize_with = "count")]
    pub shed: u64,
    /// Fraction of completions within the SLO.
    #[serde(deserialize_with = "nullable")]
    pub slo_attainment: Option<f64>,
    #[serde(deserialize_with = "nullable")]
    pub queue_p99_millis: Option<f64>,
    #[serde(deserialize_with = "nullable")]
    pub compute_p50_millis: Option<f64>,
    #[serde(deserialize_with = "nullable")]
    pub compute_p99_millis: Option<f64>,
    #[serde(deserialize_with = "nullable")]
    pub latency_p50_millis: Option<f64>,
    #[serde(deserialize_with = "nullable")]
    pub latency_p95_millis: Option<f64>,
    #[serde(deserialize_with = "nullable")]
    pub latency_p99_millis: Option<f64>,
    /// Batches run, by rows: index 0 is 1 row, the last bin is "64 or more".
    #[serde(deserialize_with = "counts")]
    pub batch_sizes: Vec<u64>,
}

/// Why a report body cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// Written by an agent of another version: its fields may not mean what this reader thinks.
    #[error("{}", other_version(*found))]
    OtherVersion {
        /// The body's version; `None` when it has none.
        found: Option<u32>,
    },
    /// Not a report of this version: not JSON, a required field missing, a value of the wrong
    /// type, or an unknown state.
    #[error("not a version {REPORT_VERSION} report: {0}")]
    Malformed(#[from] serde_json::Error),
}

fn other_version(found: Option<u32>) -> String {
    match found {
        Some(v) => format!(
            "the agent writes report version {v}, this reader reads version {REPORT_VERSION}"
        ),
        None => format!(
            "the agent writes an unversioned report, this reader reads version {REPORT_VERSION}"
        ),
    }
}

impl AgentReport {
    /// A report of this build's version.
    pub fn new(tenants: Vec<TenantReport>) -> AgentReport {
        AgentReport {
            version: REPORT_VERSION,
            tenants,
        }
    }

    /// Parses a body of [`REPORT_VERSION`]; a body of any other version is refused before its
    /// fields are read.
    pub fn from_slice(body: &[u8]) -> Result<AgentReport, ReportError> {
        #[derive(Deserialize)]
        struct Versioned {
            #[serde(default)]
            version: Option<u32>,
        }
        let Versioned { version } = serde_json::from_slice(body)?;
        if version != Some(REPORT_VERSION) {
            return Err(ReportError::OtherVersion { found: version });
        }
        Ok(serde_json::from_slice(body)?)
    }

    /// The replica of tenant `uid` (Kubernetes mode).
    pub fn tenant(&self, uid: &str) -> Option<&TenantReport> {
        self.tenants
            .iter()
            .find(|t| t.tenant.as_ref().is_some_and(|r| r.uid == uid))
    }
}

impl TenantReport {
    /// What the replica measured, when it serves.
    pub fn serving(&self) -> Option<&Serving> {
        match &self.state {
            State::Ready(s) => Some(s),
            _ => None,
        }
    }

    /// Why the replica failed, when it did.
    pub fn error(&self) -> Option<&str> {
        match &self.state {
            State::Failed { error } => Some(error),
            _ => None,
        }
    }
}

/// Every field path in a report body, array elements merged under `[]`, each tenant under its
/// name: `tenants[team.bert].window.completions`, `tenants[team.bert].profile.points[].batch`.
/// Tests compare a body an agent writes with the committed fixture by these paths.
pub fn field_paths(body: &serde_json::Value) -> BTreeSet<String> {
    fn walk(v: &serde_json::Value, at: &str, out: &mut BTreeSet<String>) {
        match v {
            serde_json::Value::Object(fields) => {
                for (k, v) in fields {
                    let at = if at.is_empty() {
                        k.clone()
                    } else {
                        format!("{at}.{k}")
                    };
                    out.insert(at.clone());
                    walk(v, &at, out);
                }
            }
            serde_json::Value::Array(items) => {
                for item in items {
                    walk(item, &format!("{at}[]"), out);
                }
            }
            _ => {}
        }
    }
    let mut out = BTreeSet::new();
    for (k, v) in body.as_object().into_iter().flatten() {
        out.insert(k.clone());
        if k != "tenants" {
            walk(v, k, &mut out);
        }
    }
    for t in body["tenants"].as_array().into_iter().flatten() {
        let name = t["name"].as_str().unwrap_or("?");
        walk(t, &format!("tenants[{name}]"), &mut out);
    }
    out
}

/// A count as any JSON number: negative is 0, fractions are cut, anything above [`MAX_COUNT`]
/// is `MAX_COUNT`.
fn saturate(n: &serde_json::Number) -> u64 {
    match (n.as_u64(), n.as_i64(), n.as_f64()) {
        (Some(u), _, _) => u.min(MAX_COUNT),
        (None, Some(_), _) => 0,
        (None, None, Some(f)) if f >= MAX_COUNT as f64 => MAX_COUNT,
        (None, None, Some(f)) if f > 0.0 => f as u64,
        _ => 0,
    }
}

fn count<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    serde_json::Number::deserialize(d).map(|n| saturate(&n))
}

fn counts<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u64>, D::Error> {
    Vec::<serde_json::Number>::deserialize(d).map(|v| v.iter().map(saturate).collect())
}

/// A number that must be present; null, which is how JSON writes a number that is not finite,
/// reads as NaN.
fn number<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Option::<f64>::deserialize(d).map(|x| x.unwrap_or(f64::NAN))
}

/// A field that must be present and may be null. (Serde reads a missing `Option` as `None`
/// unless the field names its own deserializer.)
fn nullable<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    Option::<f64>::deserialize(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn ready() -> Value {
        json!({
            "name": "team.a", "source": "file:///models/a.onnx", "sloMillis": 50.0,
            "percentile": 99.0, "profiling": false, "state": "Ready",
            "tenant": {"namespace": "team", "name": "a", "uid": "u1"},
            "knobs": {"batchSize": 4, "instances": 1}, "sinceKnobsChangedSeconds": 42.0,
            "queueDepth": 0,
            "admissionOverrun": 1.0, "latencyAtPercentileMillis": 12.5,
            "computeAtPercentileMillis": null,
            "window": {"seconds": 30.0, "arrivalRatePerSecond": 3.0, "throughputPerSecond": 3.0,
                       "completions": 90, "errors": 0, "shed": 0, "sloAttainment": 1.0,
                       "queueP99Millis": 1.0, "computeP50Millis": 2.0, "computeP99Millis": 4.0,
                       "latencyP50Millis": 3.0, "latencyP95Millis": 5.0,
                       "latencyP99Millis": 6.0, "batchSizes": [90]},
            "weightBytes": 1000
        })
    }

    fn body(tenants: Vec<Value>) -> Vec<u8> {
        serde_json::to_vec(&json!({"version": REPORT_VERSION, "tenants": tenants})).expect("json")
    }

    #[test]
    fn the_state_carries_what_the_replica_measured() {
        let failed = json!({"name": "team.b", "source": "s", "sloMillis": 50.0, "percentile": 99.0,
                            "profiling": false, "state": "Failed", "error": "not ONNX"});
        let report = AgentReport::from_slice(&body(vec![ready(), failed])).expect("parses");
        let a = report.tenant("u1").expect("u1");
        let serving = a.serving().expect("serving");
        assert_eq!(serving.knobs.batch_size, 4);
        assert_eq!(serving.latency_at_percentile_millis, Some(12.5));
        assert_eq!(serving.compute_at_percentile_millis, None);
        assert_eq!(report.tenants[1].error(), Some("not ONNX"));
        assert_eq!(report.tenants[1].serving(), None);
    }

    #[test]
    fn a_missing_field_is_an_error_and_an_unknown_one_is_ignored() {
        for field in [
            "knobs",
            "sinceKnobsChangedSeconds",
            "window",
            "computeAtPercentileMillis",
            "profiling",
            "state",
        ] {
            let mut t = ready();
            t.as_object_mut().map(|o| o.remove(field));
            let e = AgentReport::from_slice(&body(vec![t])).expect_err(field);
            assert!(matches!(e, ReportError::Malformed(_)), "{field}: {e}");
        }
        let mut t = ready();
        t["window"]
            .as_object_mut()
            .map(|o| o.remove("latencyP99Millis"));
        assert!(AgentReport::from_slice(&body(vec![t])).is_err());
        let failed = json!({"name": "b", "source": "s", "sloMillis": 5.0, "percentile": 99.0,
                            "profiling": false, "state": "Failed"});
        assert!(AgentReport::from_slice(&body(vec![failed])).is_err());

        let mut t = ready();
        t["addedLater"] = json!({"x": 1});
        t["window"]["alsoAdded"] = json!(2);
        let report = AgentReport::from_slice(&body(vec![t])).expect("extra fields are ignored");
        assert!(report.tenants[0].serving().is_some());
    }

    #[test]
    fn a_report_of_another_version_is_refused_before_its_fields_are_read() {
        let other = json!({"version": REPORT_VERSION + 1, "tenants": [{"renamed": true}]});
        let e = AgentReport::from_slice(&serde_json::to_vec(&other).expect("json"))
            .expect_err("another version");
        assert!(
            matches!(e, ReportError::OtherVersion { found: Some(v) } if v == REPORT_VERSION + 1)
        );
        assert!(
            e.to_string()
                .contains(&format!("version {}", REPORT_VERSION + 1)),
            "{e}"
        );
        let e = AgentReport::from_slice(br#"{"tenants": []}"#).expect_err("unversioned");
        assert!(
            matches!(e, ReportError::OtherVersion { found: None }),
            "{e}"
        );
        assert!(e.to_string().contains("unversioned"), "{e}");
    }

    #[test]
    fn counts_saturate_and_a_number_that_is_not_finite_reads_as_nan() {
        let mut t = ready();
        t["queueDepth"] = json!(18446744073709551616.0);
        t["weightBytes"] = json!(-5);
        t["window"]["completions"] = json!(1e30);
        t["window"]["shed"] = json!(12.7);
        t["window"]["batchSizes"] = json!([-1, 3]);
        t["admissionOverrun"] = Value::Null;
        let report = AgentReport::from_slice(&body(vec![t])).expect("a hostile report parses");
        let s = report.tenants[0].serving().expect("serving");
        assert_eq!((s.queue_depth, s.weight_bytes), (MAX_COUNT, 0));
        assert_eq!((s.window.completions, s.window.shed), (MAX_COUNT, 12));
        assert_eq!(s.window.batch_sizes, vec![0, 3]);
        assert!(s.admission_overrun.is_nan());
    }

    #[test]
    fn the_state_is_written_as_a_word_beside_the_other_fields() {
        let t = TenantReport {
            name: "a".into(),
            source: "s".into(),
            slo_millis: 5.0,
            percentile: 99.0,
            tenant: None,
            profiling: false,
            approach: None,
            profile: None,
            state: State::Loading,
        };
        let v = serde_json::to_value(AgentReport::new(vec![t])).expect("json");
        assert_eq!(v["version"], json!(REPORT_VERSION));
        assert_eq!(v["tenants"][0]["state"], json!("Loading"));
        assert_eq!(served_name("team", "bert"), "team.bert");
    }
}
