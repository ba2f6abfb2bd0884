//! The HTTP surface of the agent: the Open Inference Protocol (KServe v2 REST), Prometheus
//! metrics and the operator's report. Handlers only translate; queueing, batching and admission
//! live in the executor's runtime.

mod codec;
mod error;
pub mod metrics;
mod oip;
pub mod report;

pub use codec::wire_name;

use crate::registry::Registry;
use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// Largest request body (JSON header plus binary tensors) the agent reads: 64 MiB.
pub const MAX_BODY_BYTES: usize = 64 << 20;

/// Shared by every handler.
pub struct AppState {
    pub registry: Arc<Registry>,
    /// Who may read `/report`.
    pub report_auth: ReportAuth,
    /// Whether the agent knows its tenants (Kubernetes mode: its GpuAgent has been read);
    /// `/v2/health/ready` waits for it.
    pub initialised: AtomicBool,
}

/// How `/report` checks the bearer token it is given.
pub enum ReportAuth {
    /// Standalone: the token this agent was given; `None` refuses every report request.
    Token(Option<String>),
    /// Kubernetes: the API server's TokenReview says whose token it is.
    TokenReview(Arc<crate::kubernetes::auth::Reviewer>),
}

/// The Open Inference Protocol routes plus `/metrics` and `/report` (standalone mode).
pub fn router(state: Arc<AppState>) -> Router {
    oip_routes()
        .route("/report", get(report::render))
        .fallback(oip::not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn(refuse_declared_oversize))
        .with_state(state)
}

/// The Open Inference Protocol routes plus `/metrics`, without `/report` (Kubernetes mode's
/// inference listener).
pub fn inference_router(state: Arc<AppState>) -> Router {
    oip_routes()
        .fallback(oip::not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn(refuse_declared_oversize))
        .with_state(state)
}

/// A body whose declared length exceeds [`MAX_BODY_BYTES`] gets 413 before any of it is read,
/// so a client that waits for an early answer sends none of it (one without a declared length
/// is cut off at the limit while being read, by `DefaultBodyLimit`).
async fn refuse_declared_oversize(request: Request, next: Next) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        let message = format!("request body exceeds {MAX_BODY_BYTES} bytes");
        return error::ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, message).into_response();
    }
    next.run(request).await
}

/// `/metrics` and `/report` (Kubernetes mode's admin listener).
pub fn admin_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics::render))
        .route("/report", get(report::render))
        .fallback(oip::not_found)
        .with_state(state)
}

fn oip_routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v2", get(oip::server_metadata))
        .route("/v2/health/live", get(oip::live))
        .route("/v2/health/ready", get(oip::ready))
        .route("/v2/models/{model}", get(oip::model_metadata))
        .route(
            "/v2/models/{model}/versions/{version}",
            get(oip::model_metadata_versioned),
        )
        .route("/v2/models/{model}/ready", get(oip::model_ready))
        .route(
            "/v2/models/{model}/versions/{version}/ready",
            get(oip::model_ready_versioned),
        )
        .route("/v2/models/{model}/infer", post(oip::infer))
        .route(
            "/v2/models/{model}/versions/{version}/infer",
            post(oip::infer_versioned),
        )
        .route("/metrics", get(metrics::render))
}
