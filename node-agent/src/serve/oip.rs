//! Open Inference Protocol handlers: health, metadata, readiness and inference.

use super::codec::{self, InferRequest};
use super::error::ApiError;
use super::{AppState, MAX_BODY_BYTES};
use crate::registry::{Entry, State as TenantState};
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use cotenant_executor::runtime::{Completed, Rejected};
use cotenant_executor::{OpError, RunError};
use serde_json::{Value, json};
use std::sync::Arc;

type AppRef = State<Arc<AppState>>;

pub async fn live() -> StatusCode {
    StatusCode::OK
}

pub async fn ready(State(app): AppRef) -> StatusCode {
    if app.initialised.load(std::sync::atomic::Ordering::Acquire) && app.registry.settled() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

pub async fn server_metadata() -> Json<Value> {
    Json(json!({
        "name": "cotenant",
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": ["binary_tensor_data", "model_repository", "statistics"],
    }))
}

pub async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no such endpoint")
}

/// The tenant a request names. One that left this agent moments ago is 503 (a client's route to
/// it is stale and will follow), one never held here 404.
fn entry(app: &AppState, model: &str) -> Result<Arc<Entry>, ApiError> {
    app.registry.resolve(model).map_err(|message| {
        match app.registry.departed(model) {
            Some(ago) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "model {model:?} moved off this agent {:.0} s ago; retry, the route is being updated",
                    ago.as_secs_f64()
                ),
            ),
            None => ApiError::new(StatusCode::NOT_FOUND, message),
        }
    })
}

/// This agent serves one version of each model, "1"; any other version is unknown.
fn check_version(model: &str, version: &str) -> Result<(), ApiError> {
    if version == "1" {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("model {model:?} has no version {version:?} (only \"1\")"),
        ))
    }
}

pub async fn model_metadata(
    State(app): AppRef,
    Path(model): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let entry = entry(&app, &model)?;
    let (inputs, outputs) = match &entry.state {
        TenantState::Ready {
            inputs, outputs, ..
        } => (json!(inputs), json!(outputs)),
        _ => (json!([]), json!([])),
    };
    Ok(Json(json!({
        "name": entry.name,
        "versions": ["1"],
        "platform": "onnx",
        "state": entry.state.word(),
        "inputs": inputs,
        "outputs": outputs,
    })))
}

pub async fn model_metadata_versioned(
    state: AppRef,
    Path((model, version)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    check_version(&model, &version)?;
    model_metadata(state, Path(model)).await
}

pub async fn model_ready(
    State(app): AppRef,
    Path(model): Path<String>,
) -> Result<StatusCode, ApiError> {
    let entry = entry(&app, &model)?;
    Ok(match entry.state {
        TenantState::Ready { .. } => StatusCode::OK,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    })
}

pub async fn model_ready_versioned(
    state: AppRef,
    Path((model, version)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    check_version(&model, &version)?;
    model_ready(state, Path(model)).await
}

pub async fn infer_versioned(
    state: AppRef,
    Path((model, version)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    check_version(&model, &version)?;
    infer(state, Path(model), headers, body).await
}

pub async fn infer(
    State(app): AppRef,
    Path(model): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(|e| {
        let status = e.status();
        let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
            format!("request body exceeds {MAX_BODY_BYTES} bytes")
        } else {
            e.body_text()
        };
        ApiError::new(status, message)
    })?;
    let entry = entry(&app, &model)?;
    let (tenant, outputs_meta) = match &entry.state {
        TenantState::Ready {
            tenant, outputs, ..
        } => (tenant.clone(), outputs),
        TenantState::Loading => {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("model {model:?} is loading"),
            ));
        }
        TenantState::Failed(reason) => {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("model {model:?} failed to load: {reason}"),
            ));
        }
    };
    let header_len = headers
        .get("inference-header-content-length")
        .map(|v| v.to_str().unwrap_or("invalid"));
    let (json_part, binary_part) = codec::split_body(&body, header_len)?;
    let plan_inputs = &tenant.model().plan.inputs;
    let request = codec::decode_request(json_part, binary_part, |name| {
        plan_inputs.iter().find(|i| i.name == name).map(|i| i.dtype)
    })?;
    for (name, _) in &request.outputs {
        if !outputs_meta.iter().any(|o| &o.name == name) {
            return Err(ApiError::bad_request(format!(
                "unknown output {name:?}; the model's outputs are {:?}",
                outputs_meta.iter().map(|o| &o.name).collect::<Vec<_>>()
            )));
        }
    }
    let InferRequest {
        id,
        inputs,
        outputs,
        all_binary,
    } = request;

    let (tx, rx) = tokio::sync::oneshot::channel::<Result<Completed, RunError>>();
    tenant
        .submit(inputs, Box::new(move |result| drop(tx.send(result))))
        .map_err(rejected)?;
    let completed = rx
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the tenant stopped before answering",
            )
        })?
        .map_err(run_failed)?;
    Ok(respond(&entry.name, id, completed, &outputs, all_binary))
}

/// A request that ran and failed: the device's fault is 503 (the instance cannot serve now),
/// anything else is the request's (400).
fn run_failed(e: RunError) -> ApiError {
    let device = matches!(
        e,
        RunError::Device(_)
            | RunError::Node {
                source: OpError::Device(_),
                ..
            }
    );
    if device {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
    } else {
        ApiError::bad_request(e.to_string())
    }
}

fn rejected(r: Rejected) -> ApiError {
    let status = match &r {
        Rejected::Invalid(_) | Rejected::TooManyRows { .. } => StatusCode::BAD_REQUEST,
        Rejected::QueueFull(_) | Rejected::WouldMissSlo { .. } => StatusCode::TOO_MANY_REQUESTS,
        Rejected::Closed => StatusCode::SERVICE_UNAVAILABLE,
    };
    ApiError::new(status, r.to_string())
}

fn respond(
    model: &str,
    id: Option<String>,
    completed: Completed,
    requested: &[(String, bool)],
    all_binary: bool,
) -> Response {
    let mut outputs = Vec::new();
    let mut tail: Vec<u8> = Vec::new();
    for (name, tensor) in &completed.outputs {
        let binary = if requested.is_empty() {
            all_binary
        } else {
            match requested.iter().find(|(n, _)| n == name) {
                Some((_, binary)) => *binary || all_binary,
                None => continue,
            }
        };
        let (json, bytes) = codec::encode_output(name, tensor, binary);
        outputs.push(json);
        if let Some(bytes) = bytes {
            tail.extend(bytes);
        }
    }
    let mut body = json!({ "model_name": model, "model_version": "1", "outputs": outputs });
    if let Some(id) = id {
        body["id"] = json!(id);
    }
    let header = body.to_string().into_bytes();
    if tail.is_empty() {
        return (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            header,
        )
            .into_response();
    }
    let header_len = header.len();
    let mut bytes = header;
    bytes.extend(tail);
    let mut response = (StatusCode::OK, bytes).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(
        "inference-header-content-length",
        HeaderValue::from(header_len),
    );
    response
}
