//! The committed report fixture is the wire contract between agent and operator: the types read
//! it and write it back unchanged, and it holds every field the types have. The agent's test
//! (`node-agent/src/serve/report.rs`) writes the same fields from real tenants, and the
//! operator's (`operator/src/report.rs`) decides from it.

use cotenant_crds::report::{
    AgentReport, REPORT_VERSION, Serving, State, TenantReport, Window, field_paths,
};
use cotenant_crds::{Knobs, TenantRef};
use cotenant_policy::{Profile, ProfilePoint};
use serde_json::Value;
use std::path::PathBuf;

fn fixture() -> (PathBuf, Vec<u8>) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/fixtures/report-v{REPORT_VERSION}.json"));
    let body = std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}: a new report version needs its fixture",
            path.display()
        )
    });
    (path, body)
}

/// Strict: a field the types do not know is dropped on the way through and shows here, as
/// does one they write under another name or fill with a default.
#[test]
fn the_fixture_reads_and_writes_back_unchanged() {
    let (path, body) = fixture();
    let report =
        AgentReport::from_slice(&body).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(report.version, REPORT_VERSION);
    let committed: Value = serde_json::from_slice(&body).expect("JSON");
    let written = serde_json::to_value(&report).expect("serialise");
    let (fixture_only, types_only): (Vec<_>, Vec<_>) = {
        let (f, t) = (field_paths(&committed), field_paths(&written));
        (
            f.difference(&t).cloned().collect(),
            t.difference(&f).cloned().collect(),
        )
    };
    assert!(
        fixture_only.is_empty() && types_only.is_empty(),
        "{}: fields only in the fixture: {fixture_only:?}; only in the types: {types_only:?}",
        path.display()
    );
    assert_eq!(
        written,
        committed,
        "{}: a value changed on the way through the types",
        path.display()
    );
}

/// Every field the types can write, each Option filled in the state it belongs to: a field added
/// to the types fails to compile here, then fails the test below until the fixture holds it.
fn everything() -> AgentReport {
    let profile = Profile {
        model: "m".into(),
        weight_bytes: 1,
        points: vec![ProfilePoint {
            batch: 1,
            instances: 1,
            throughput: 1.0,
            p99_ms: 1.0,
            peak_activation_bytes: 1,
            gpu_util: None,
        }],
    };
    let tenant = |name: &str, state: State| TenantReport {
        name: name.into(),
        source: "file:///m.onnx".into(),
        slo_millis: 1.0,
        percentile: 99.0,
        tenant: Some(TenantRef {
            namespace: "team".into(),
            name: name.into(),
            uid: "u".into(),
        }),
        profiling: false,
        approach: None,
        profile: None,
        state,
    };
    let serving = Serving {
        knobs: Knobs::default(),
        since_knobs_changed_seconds: 1.0,
        queue_depth: 0,
        admission_overrun: 1.0,
        latency_at_percentile_millis: Some(1.0),
        compute_at_percentile_millis: Some(1.0),
        window: Window {
            seconds: 30.0,
            arrival_rate_per_second: 1.0,
            throughput_per_second: 1.0,
            completions: 1,
            errors: 0,
            shed: 0,
            slo_attainment: Some(1.0),
            queue_p99_millis: Some(1.0),
            compute_p50_millis: Some(1.0),
            compute_p99_millis: Some(1.0),
            latency_p50_millis: Some(1.0),
            latency_p95_millis: Some(1.0),
            latency_p99_millis: Some(1.0),
            batch_sizes: vec![1],
        },
        weight_bytes: 1,
    };
    let ready = TenantReport {
        approach: Some("Batching".into()),
        profile: Some(profile),
        ..tenant("ready", State::Ready(serving))
    };
    AgentReport::new(vec![
        ready,
        tenant("loading", State::Loading),
        tenant(
            "failed",
            State::Failed {
                error: "why".into(),
            },
        ),
    ])
}

/// A field path with the tenant's name replaced by its state: what the fixture must cover.
fn by_state(body: &Value) -> std::collections::BTreeSet<String> {
    let state_of: Vec<(String, String)> = body["tenants"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            (
                format!("tenants[{}]", t["name"].as_str().unwrap_or("?")),
                format!("tenants[{}]", t["state"].as_str().unwrap_or("?")),
            )
        })
        .collect();
    field_paths(body)
        .into_iter()
        .map(|p| {
            state_of
                .iter()
                .find(|(name, _)| p.starts_with(name.as_str()))
                .map_or(p.clone(), |(name, state)| {
                    p.replacen(name.as_str(), state, 1)
                })
        })
        .collect()
}

#[test]
fn the_fixture_holds_every_field_in_every_state() {
    let (path, body) = fixture();
    let committed: Value = serde_json::from_slice(&body).expect("JSON");
    let possible = by_state(&serde_json::to_value(everything()).expect("serialise"));
    let covered = by_state(&committed);
    let missing: Vec<_> = possible.difference(&covered).collect();
    assert!(
        missing.is_empty(),
        "{} lacks {missing:?}: add them to the fixture",
        path.display()
    );
}

/// A report of the version before is refused as such, before any of its fields is read: its
/// window reached back past the last knob change.
#[test]
fn the_fixture_of_the_version_before_is_refused() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!(
        "tests/fixtures/report-v{}.json",
        REPORT_VERSION - 1
    ));
    let body = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let e = AgentReport::from_slice(&body).expect_err("another version");
    assert!(
        matches!(e, cotenant_crds::report::ReportError::OtherVersion { found: Some(v) } if v == REPORT_VERSION - 1),
        "{e}"
    );
}
