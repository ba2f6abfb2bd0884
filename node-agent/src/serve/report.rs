//! `/report`: everything the operator's scaler needs about each tenant, for the operator alone;
//! the body is [`cotenant_crds::report::AgentReport`], which the operator reads. A request must
//! carry `Authorization: Bearer <token>`: in standalone mode the token this agent was given
//! (`--report-token-file`), in Kubernetes mode a ServiceAccount token of the operator that the
//! API server's TokenReview vouches for. Anything else gets 401.

use super::error::ApiError;
use super::{AppState, ReportAuth};
use crate::credentials::constant_time_eq;
use crate::registry::{Entry, Registry, State as TenantState};
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use cotenant_crds::Knobs;
use cotenant_crds::report::{AgentReport, Serving, State as Reported, TenantReport, Window};
use std::sync::Arc;
use std::time::Duration;

pub async fn render(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
) -> Result<Json<AgentReport>, ApiError> {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let Some(presented) = presented.map(str::trim).filter(|t| !t.is_empty()) else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "the report is for the operator only: no bearer token",
        ));
    };
    match &app.report_auth {
        ReportAuth::Token(Some(expected))
            if constant_time_eq(expected.as_bytes(), presented.as_bytes()) => {}
        ReportAuth::Token(_) => {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "the report is for the operator only",
            ));
        }
        ReportAuth::TokenReview(reviewer) => {
            if let Err(why) = reviewer.check(presented).await {
                return Err(ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    format!("the report is for the operator only: {why}"),
                ));
            }
        }
    }
    Ok(Json(report(&app.registry)))
}

/// The report of every tenant `registry` holds.
pub fn report(registry: &Registry) -> AgentReport {
    AgentReport::new(registry.all().iter().map(|e| tenant(e)).collect())
}

fn tenant(e: &Entry) -> TenantReport {
    let state = match &e.state {
        TenantState::Loading => Reported::Loading,
        TenantState::Failed(reason) => Reported::Failed {
            error: reason.clone(),
        },
        TenantState::Ready { tenant, .. } => {
            let (batch, instances) = tenant.knobs();
            let stats = tenant.stats();
            let w = stats.window();
            let millis = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1e3);
            Reported::Ready(Serving {
                knobs: Knobs {
                    batch_size: u32::try_from(batch).unwrap_or(u32::MAX),
                    instances: u32::try_from(instances).unwrap_or(u32::MAX),
                },
                since_knobs_changed_seconds: w.epoch_secs,
                queue_depth: tenant.queue_depth() as u64,
                admission_overrun: tenant.admission_overrun(),
                latency_at_percentile_millis: millis(stats.latency_percentile(e.percentile)),
                compute_at_percentile_millis: millis(stats.compute_percentile(e.percentile)),
                window: Window {
                    seconds: w.window_secs,
                    arrival_rate_per_second: w.arrival_rate_per_sec,
                    throughput_per_second: w.throughput_per_sec,
                    completions: w.completions,
                    errors: w.errors,
                    shed: w.shed,
                    slo_attainment: w.slo_attainment,
                    queue_p99_millis: w.queue_p99_ms,
                    compute_p50_millis: w.compute_p50_ms,
                    compute_p99_millis: w.compute_p99_ms,
                    latency_p50_millis: w.latency_p50_ms,
                    latency_p95_millis: w.latency_p95_ms,
                    latency_p99_millis: w.latency_p99_ms,
                    batch_sizes: w.batch_sizes,
                },
                weight_bytes: tenant.model().plan.weight_bytes() as u64,
            })
        }
    };
    TenantReport {
        name: e.name.clone(),
        source: e.source.clone(),
        slo_millis: e.slo_millis,
        percentile: e.percentile,
        tenant: e.tenant_ref.clone(),
        profiling: e.profiling,
        approach: e.scaling.as_ref().map(|s| s.approach.clone()),
        // The points the operator asked for (Kubernetes mode), else those this agent's own
        // scaler chose from (standalone mode).
        profile: e
            .profile
            .clone()
            .or_else(|| e.scaling.as_ref().map(|s| s.profile.clone())),
        state,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load;
    use crate::registry::Scaling;
    use cotenant_crds::TenantRef;
    use cotenant_crds::report::{REPORT_VERSION, field_paths, served_name};
    use cotenant_executor::Device;
    use cotenant_policy::{Profile, ProfilePoint};
    use serde_json::Value;
    use std::path::PathBuf;

    /// A Ready state with a real model loaded on the CPU.
    fn ready(name: &str) -> TenantState {
        let config = load::config(name, Duration::from_secs(5), 99.0, 4, 1, 1, &Device::Cpu);
        let sizing = load::Sizing {
            memory_limit: 1 << 30,
            largest_batch: 4,
        };
        let model = load::tests::batch_normalising_model();
        let loaded = load::start(&model, config, sizing, None).expect("loads");
        TenantState::Ready {
            tenant: loaded.tenant,
            inputs: loaded.inputs,
            outputs: loaded.outputs,
        }
    }

    fn profile(model: &str) -> Profile {
        let point = |batch, instances| ProfilePoint {
            batch,
            instances,
            throughput: 10.0,
            p99_ms: 5.0,
            peak_activation_bytes: 64,
            gpu_util: None,
        };
        Profile {
            model: model.into(),
            weight_bytes: 0,
            points: vec![point(1, 1), point(1, 2)],
        }
    }

    /// In Kubernetes mode: the replica of ModelTenant `team/<name>`.
    fn assigned(name: &str, state: TenantState) -> Entry {
        let mut e = Entry::loading(
            &served_name("team", name),
            &format!("file:///models/team/{name}.onnx"),
            50.0,
            99.0,
        );
        e.state = state;
        e.tenant_ref = Some(TenantRef {
            namespace: "team".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        });
        e
    }

    /// What agents of each mode and state write, as `crds/tests/fixtures/report-v2.json` holds
    /// them: a field this agent writes that the fixture lacks, or one the fixture has that this
    /// agent leaves out, fails here. The crds test checks the fixture against the types, and the
    /// operator's against what it decides from.
    #[test]
    fn the_report_of_real_tenants_has_the_fields_of_the_committed_fixture() {
        let registry = Registry::default();
        let mut bert = assigned("bert", ready("team.bert"));
        bert.profile = Some(profile("team.bert"));
        registry.put(bert);
        registry.put(assigned("resnet", TenantState::Loading));
        registry.put(assigned(
            "broken",
            TenantState::Failed("not a usable ONNX model: no graph".into()),
        ));
        let mut standalone =
            Entry::loading("mobilenet", "file:///models/mobilenet.onnx", 20.0, 99.0);
        standalone.state = ready("mobilenet");
        standalone.scaling = Some(Scaling {
            approach: "MultiTenancy".into(),
            profile: profile("mobilenet"),
        });
        registry.put(standalone);

        let written = report(&registry);
        let body = serde_json::to_vec(&written).expect("serialise");
        let read = AgentReport::from_slice(&body).expect("the operator reads it");
        assert_eq!(read.tenants.len(), 4);
        assert!(
            read.tenant("uid-bert")
                .is_some_and(|t| t.serving().is_some())
        );

        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!(
            "../crds/tests/fixtures/report-v{REPORT_VERSION}.json"
        ));
        let fixture: Value =
            serde_json::from_slice(&std::fs::read(&path).expect("the fixture")).expect("JSON");
        let agent: Value = serde_json::from_slice(&body).expect("JSON");
        let (want, have) = (field_paths(&fixture), field_paths(&agent));
        let missing: Vec<_> = want.difference(&have).collect();
        let extra: Vec<_> = have.difference(&want).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "the agent leaves out {missing:?} and writes {extra:?}, unlike {}",
            path.display()
        );
    }
}
