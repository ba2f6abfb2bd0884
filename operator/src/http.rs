//! `/healthz` (the process serves), `/readyz` (its watches have synced) and `/metrics`.

use crate::context::Context;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use std::sync::Arc;

pub async fn serve(listener: tokio::net::TcpListener, context: Arc<Context>) {
    let app = axum::Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(context);
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "the metrics and health server stopped");
    }
}

async fn readyz(State(context): State<Arc<Context>>) -> impl IntoResponse {
    if context.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "watches have not synced yet",
        )
    }
}

async fn metrics(State(context): State<Arc<Context>>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &context.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            e.to_string(),
        ),
    }
}
