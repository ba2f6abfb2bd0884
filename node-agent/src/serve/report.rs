//! `/report`: everything the operator's scaler needs about each tenant, as JSON, for the operator
//! alone. A request must carry `Authorization: Bearer <token>`: in standalone mode the token this
//! agent was given (`--report-token-file`), in Kubernetes mode a ServiceAccount token of the
//! operator that the API server's TokenReview vouches for. Anything else gets 401.

use super::error::ApiError;
use super::{AppState, ReportAuth};
use crate::credentials::constant_time_eq;
use crate::registry::State as TenantState;
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

pub async fn render(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
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
    let tenants: Vec<Value> = app
        .registry
        .all()
        .iter()
        .map(|e| {
            let mut t = json!({
                "name": e.name,
                "source": e.source,
                "state": e.state.word(),
                "sloMillis": e.slo_millis,
                "percentile": e.percentile,
            });
            if let Some(scaling) = &e.scaling {
                t["approach"] = json!(scaling.approach);
                t["profile"] = json!(scaling.profile);
            }
            if let Some(tenant) = &e.tenant_ref {
                t["tenant"] = json!({
                    "namespace": tenant.namespace,
                    "name": tenant.name,
                    "uid": tenant.uid,
                });
                t["profiling"] = json!(e.profiling);
            }
            if let Some(profile) = &e.profile {
                t["profile"] = json!(profile);
            }
            match &e.state {
                TenantState::Ready { tenant, .. } => {
                    let (batch, instances) = tenant.knobs();
                    let w = tenant.stats().window();
                    t["knobs"] = json!({ "batchSize": batch, "instances": instances });
                    t["queueDepth"] = json!(tenant.queue_depth());
                    t["admissionOverrun"] = json!(tenant.admission_overrun());
                    let millis = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1e3);
                    let stats = tenant.stats();
                    t["latencyAtPercentileMillis"] =
                        json!(millis(stats.latency_percentile(e.percentile)));
                    t["computeAtPercentileMillis"] =
                        json!(millis(stats.compute_percentile(e.percentile)));
                    t["window"] = json!({
                        "seconds": w.window_secs,
                        "arrivalRatePerSecond": w.arrival_rate_per_sec,
                        "throughputPerSecond": w.throughput_per_sec,
                        "completions": w.completions,
                        "errors": w.errors,
                        "shed": w.shed,
                        "sloAttainment": w.slo_attainment,
                        "queueP99Millis": w.queue_p99_ms,
                        "computeP50Millis": w.compute_p50_ms,
                        "computeP99Millis": w.compute_p99_ms,
                        "latencyP50Millis": w.latency_p50_ms,
                        "latencyP95Millis": w.latency_p95_ms,
                        "latencyP99Millis": w.latency_p99_ms,
                        "batchSizes": w.batch_sizes,
                    });
                    t["weightBytes"] = json!(tenant.model().plan.weight_bytes());
                }
                TenantState::Failed(reason) => t["error"] = json!(reason),
                TenantState::Loading => {}
            }
            t
        })
        .collect();
    Ok(Json(json!({ "tenants": tenants })))
}
