//! The HTTP surface of the agent: the Open Inference Protocol (KServe v2 REST), Prometheus
//! metrics and the operator's report. Handlers only translate; queueing, batching and admission
//! live in the executor's runtime. In Kubernetes mode `/metrics` and `/report` are served on the
//! admin listener only, which the chart's NetworkPolicy closes to everyone but the operator and
//! the monitoring namespaces; standalone mode serves everything on its one listener.

mod access;
mod body;
pub mod budget;
mod codec;
mod connections;
mod error;
mod grpc;
pub mod metrics;
mod oip;
pub mod report;
mod triton;

pub use codec::wire_name;
pub use connections::{ConnectionLimits, Protocol, serve};
pub use grpc::router as grpc_router;

use crate::registry::Registry;
use axum::Router;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use budget::Budget;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// Largest request body (JSON header plus binary tensors) the agent reads: 64 MiB.
pub const MAX_BODY_BYTES: usize = 64 << 20;

/// How much of the agent requests may hold, and for how long.
#[derive(clap::Args, Debug, Clone)]
pub struct RequestArgs {
    /// Bytes of requests (bodies as they arrive, then decoded tensors until they have run) the
    /// whole agent holds at once; a request past it gets 503 with Retry-After.
    #[arg(long, default_value_t = budget::DEFAULT_AGENT_BYTES, value_parser = clap::value_parser!(u64).range(1 << 20..))]
    pub max_inflight_bytes: u64,
    /// The same for one tenant; a request past it gets 429 with Retry-After.
    #[arg(long, default_value_t = budget::DEFAULT_TENANT_BYTES, value_parser = clap::value_parser!(u64).range(1 << 20..))]
    pub max_inflight_bytes_per_tenant: u64,
    /// Seconds a client has, from the request's headers on, to send its whole body (408 after).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub body_timeout_seconds: u64,
    /// Seconds a request may wait for its answer, or twice its tenant's SLO when that is longer
    /// (503 after).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub answer_timeout_seconds: u64,
    /// Connections a listener holds open at once; more wait to be accepted.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_connections: u64,
    /// Seconds a connection has to send a request's headers, idle keep-alive included.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub header_timeout_seconds: u64,
}

impl RequestArgs {
    pub fn budget(&self) -> Arc<Budget> {
        Budget::new(self.max_inflight_bytes, self.max_inflight_bytes_per_tenant)
    }

    pub fn limits(&self) -> Limits {
        Limits {
            body_timeout: Duration::from_secs(self.body_timeout_seconds),
            answer_timeout: Duration::from_secs(self.answer_timeout_seconds),
        }
    }

    pub fn connections(&self) -> ConnectionLimits {
        ConnectionLimits {
            max_connections: usize::try_from(self.max_connections).unwrap_or(usize::MAX),
            header_timeout: Duration::from_secs(self.header_timeout_seconds),
        }
    }
}

/// Deadlines of a request.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// From its headers to the end of its body.
    pub body_timeout: Duration,
    /// From its headers to its answer (at least twice its tenant's SLO).
    pub answer_timeout: Duration,
}

/// Shared by every handler.
pub struct AppState {
    pub registry: Arc<Registry>,
    /// Who may read `/report`.
    pub report_auth: ReportAuth,
    /// Whether the agent knows its tenants (Kubernetes mode: its GpuAgent has been read);
    /// `/v2/health/ready` waits for it.
    pub initialised: AtomicBool,
    /// Whether the agent is stopping: not ready, so it leaves its tenants' endpoints, while it
    /// still serves whoever has not noticed yet.
    pub draining: AtomicBool,
    /// Bytes requests hold, per tenant and in all.
    pub budget: Arc<Budget>,
    pub limits: Limits,
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
        .route("/metrics", get(metrics::render))
        .route("/report", get(report::render))
        .fallback(oip::not_found)
        .layer(middleware::from_fn(refuse_declared_oversize))
        .with_state(state)
}

/// The Open Inference Protocol routes alone (Kubernetes mode's inference listener).
pub fn inference_router(state: Arc<AppState>) -> Router {
    oip_routes()
        .fallback(oip::not_found)
        .layer(middleware::from_fn(refuse_declared_oversize))
        .with_state(state)
}

/// A body whose declared length exceeds [`MAX_BODY_BYTES`] gets 413 before any of it is read,
/// so a client that waits for an early answer sends none of it (one without a declared length
/// is cut off at the limit while being read).
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
        .route("/v2/models/stats", get(triton::all_stats))
        .route("/v2/models/{model}/config", get(triton::config))
        .route(
            "/v2/models/{model}/versions/{version}/config",
            get(triton::config_versioned),
        )
        .route("/v2/models/{model}/stats", get(triton::stats))
        .route(
            "/v2/models/{model}/versions/{version}/stats",
            get(triton::stats_versioned),
        )
        .route("/v2/models/{model}/infer", post(oip::infer))
        .route(
            "/v2/models/{model}/versions/{version}/infer",
            post(oip::infer_versioned),
        )
}

#[cfg(test)]
mod tests;
