//! Open Inference Protocol handlers: health, metadata, readiness and inference.
//!
//! An inference request is checked in order, each step before anything is allocated for the
//! next: the tenant and the caller's token, the declared lengths, then the body (read against
//! the in-flight budget and its deadline), then the JSON header against the model's signature,
//! and only then are tensors decoded. Decoding and encoding run on blocking threads, never on
//! the async workers, and the answer has a deadline too.

use super::budget::Reservation;
use super::codec::{self, InferRequest, Signature};
use super::error::ApiError;
use super::{AppState, MAX_BODY_BYTES, access, body};
use crate::registry::{Entry, State as TenantState, TensorMeta};
use axum::Json;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use cotenant_executor::runtime::{Completed, Rejected, Tenant};
use cotenant_executor::{OpError, RunError};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

type AppRef = State<Arc<AppState>>;
type ModelPath = Result<Path<String>, PathRejection>;
type VersionPath = Result<Path<(String, String)>, PathRejection>;

pub async fn live() -> StatusCode {
    StatusCode::OK
}

/// Whether the agent knows its tenants, has tried to load each, and is not stopping.
pub(super) fn agent_ready(app: &AppState) -> bool {
    use std::sync::atomic::Ordering;
    app.initialised.load(Ordering::Acquire)
        && !app.draining.load(Ordering::Acquire)
        && app.registry.settled()
}

pub async fn ready(State(app): AppRef) -> StatusCode {
    if agent_ready(&app) {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

/// The protocol extensions this agent serves, on REST and gRPC alike.
pub const EXTENSIONS: [&str; 3] = ["binary_tensor_data", "model_configuration", "statistics"];

pub async fn server_metadata() -> Json<Value> {
    Json(json!({
        "name": "cotenant",
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": EXTENSIONS,
    }))
}

pub async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no such endpoint")
}

/// A path that does not decode (bad percent-encoding, not UTF-8) is the client's error.
pub(super) fn path<T>(p: Result<Path<T>, PathRejection>) -> Result<T, ApiError> {
    p.map(|Path(v)| v)
        .map_err(|e| ApiError::bad_request(format!("bad request path: {}", e.body_text())))
}

/// The model a versioned path names, once its version is checked.
pub(super) fn versioned(p: VersionPath) -> Result<String, ApiError> {
    let (model, version) = path(p)?;
    check_version(&model, &version)?;
    Ok(model)
}

/// This agent serves one version of each model, "1"; any other version is unknown.
pub(super) fn check_version(model: &str, version: &str) -> Result<(), ApiError> {
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
    model: ModelPath,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let model = path(model)?;
    metadata(&app, &model, &headers)
}

fn metadata(app: &AppState, model: &str, headers: &HeaderMap) -> Result<Json<Value>, ApiError> {
    let entry = access::tenant(app, model, headers)?;
    let (inputs, outputs) = signature(&entry);
    Ok(Json(json!({
        "name": entry.name,
        "versions": ["1"],
        "platform": PLATFORM,
        "state": entry.state.word(),
        "inputs": inputs,
        "outputs": outputs,
    })))
}

/// What model metadata names as every tenant's platform.
pub const PLATFORM: &str = "onnx";

/// A tenant's inputs and outputs; none until it is Ready.
pub(super) fn signature(entry: &Entry) -> (&[TensorMeta], &[TensorMeta]) {
    match &entry.state {
        TenantState::Ready {
            inputs, outputs, ..
        } => (inputs, outputs),
        _ => (&[], &[]),
    }
}

pub async fn model_metadata_versioned(
    State(app): AppRef,
    p: VersionPath,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let model = versioned(p)?;
    metadata(&app, &model, &headers)
}

pub async fn model_ready(
    State(app): AppRef,
    model: ModelPath,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let model = path(model)?;
    readiness(&app, &model, &headers)
}

fn readiness(app: &AppState, model: &str, headers: &HeaderMap) -> Result<StatusCode, ApiError> {
    let entry = access::tenant(app, model, headers)?;
    Ok(match entry.state {
        TenantState::Ready { .. } => StatusCode::OK,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    })
}

pub async fn model_ready_versioned(
    State(app): AppRef,
    p: VersionPath,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let model = versioned(p)?;
    readiness(&app, &model, &headers)
}

pub async fn infer_versioned(
    State(app): AppRef,
    p: VersionPath,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let model = versioned(p)?;
    run(app, &model, headers, body).await
}

pub async fn infer(
    State(app): AppRef,
    model: ModelPath,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let model = path(model)?;
    run(app, &model, headers, body).await
}

/// The serving replica of a Ready tenant; other states say why there is none, without the
/// load error itself (which names where the model lives: it is in the tenant's status).
pub(super) fn serving(entry: &Entry, model: &str) -> Result<Arc<Tenant>, ApiError> {
    match &entry.state {
        TenantState::Ready { tenant, .. } => Ok(tenant.clone()),
        TenantState::Loading => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("model {model:?} is loading"),
        )
        .retry_after(1)),
        TenantState::Failed(_) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "model {model:?} failed to load; the reason is in the tenant's status and the agent's log"
            ),
        )),
    }
}

#[tracing::instrument(name = "infer", skip_all, fields(model = %model, protocol = "http"))]
async fn run(
    app: Arc<AppState>,
    model: &str,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let entry = access::tenant(&app, model, &headers)?;
    let tenant = serving(&entry, model)?;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    let header_len = codec::header_length(
        headers
            .get("inference-header-content-length")
            .map(HeaderValue::as_bytes),
        declared,
    )?;
    let mut reservation = app.budget.open(&entry.name);
    let body = body::read(
        body,
        declared,
        MAX_BODY_BYTES,
        started + app.limits.body_timeout,
        &mut reservation,
    )
    .await?;

    let (decoded, held) =
        decode_blocking(entry.clone(), reservation, move |signature, reservation| {
            // The room reserved with the body becomes exactly the decoded tensors' bytes; once the
            // body is gone, only those stay reserved.
            let body_bytes = body.capacity() as u64;
            let decoded = codec::decode_request(&body, header_len, signature, |tensors| {
                reservation.resize(body_bytes + tensors)
            });
            drop(body);
            reservation.shrink(body_bytes);
            decoded
        })
        .await?;
    let InferRequest {
        id,
        inputs,
        outputs,
        all_binary,
    } = decoded?;

    let completed = answer(&app, &entry, &tenant, inputs, held, started).await?;

    let name = entry.name.clone();
    let (bytes, header_len) = tokio::task::spawn_blocking(move || {
        codec::encode_response(
            &name,
            id.as_deref(),
            &completed.outputs,
            &outputs,
            all_binary,
        )
    })
    .await
    .map_err(|e| internal("encoding", &e))?
    .map_err(|e| internal("encoding", &e))?;
    let mut response = (StatusCode::OK, bytes).into_response();
    let headers = response.headers_mut();
    match header_len {
        None => {
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
        Some(len) => {
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            headers.insert("inference-header-content-length", HeaderValue::from(len));
        }
    }
    Ok(response)
}

/// Runs `decode` on a blocking thread with the Ready tenant's signature and the request's
/// reservation, and hands the reservation back with what it decoded.
pub(super) async fn decode_blocking<T: Send + 'static>(
    entry: Arc<Entry>,
    mut reservation: Reservation,
    decode: impl FnOnce(&Signature, &mut Reservation) -> Result<T, ApiError> + Send + 'static,
) -> Result<(Result<T, ApiError>, Reservation), ApiError> {
    tokio::task::spawn_blocking(move || {
        let TenantState::Ready {
            tenant, outputs, ..
        } = &entry.state
        else {
            let refused = Err(ApiError::bad_request("the model is not ready"));
            return (refused, reservation);
        };
        let signature = Signature {
            inputs: &tenant.model().plan.inputs,
            outputs,
        };
        let decoded = decode(&signature, &mut reservation);
        (decoded, reservation)
    })
    .await
    .map_err(|e| internal("decoding", &e))
}

/// Queues `inputs` on `tenant` and waits for the answer until the request's deadline (at least
/// twice the tenant's SLO after `started`). `held` (the inputs' bytes) stays reserved until the
/// tenant has run them, even past the deadline.
pub(super) async fn answer(
    app: &AppState,
    entry: &Entry,
    tenant: &Arc<Tenant>,
    inputs: Vec<(String, cotenant_executor::Tensor)>,
    held: Reservation,
    started: Instant,
) -> Result<Completed, ApiError> {
    let (tx, rx) = tokio::sync::oneshot::channel::<Result<Completed, RunError>>();
    let tenant = current_replica(app, entry, tenant);
    tenant
        .submit(
            inputs,
            Box::new(move |result| {
                drop(held);
                drop(tx.send(result));
            }),
        )
        .map_err(rejected)?;
    let slo = Duration::from_secs_f64(entry.slo_millis.max(0.0) / 1e3);
    let wait = app.limits.answer_timeout.max(slo.saturating_mul(2));
    match tokio::time::timeout_at(started + wait, rx).await {
        Err(_) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("no answer within {} s", wait.as_secs()),
        )
        .retry_after(1)),
        Ok(Err(_)) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the tenant stopped before answering",
        )),
        Ok(Ok(result)) => result.map_err(|e| run_failed(&entry.name, e)),
    }
}

/// The replica to queue on: the one the request resolved, unless the tenant has been given a
/// new replica since (a new model, new knobs) that takes the same inputs. A replica being
/// replaced takes no new requests, and reading and decoding a request can take long enough to
/// meet a swap.
fn current_replica(app: &AppState, entry: &Entry, resolved: &Arc<Tenant>) -> Arc<Tenant> {
    let now = app.registry.resolve(&entry.name).ok();
    let same_inputs = |tenant: &Tenant| {
        let (a, b) = (&tenant.model().plan.inputs, &resolved.model().plan.inputs);
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| x.name == y.name && x.dtype == y.dtype && x.dims == y.dims)
    };
    match now.as_deref().map(|e| &e.state) {
        Some(TenantState::Ready { tenant, .. }) if same_inputs(tenant) => tenant.clone(),
        _ => resolved.clone(),
    }
}

/// A failure of the agent itself: logged in full, answered without detail.
pub(super) fn internal(what: &str, e: &dyn std::fmt::Display) -> ApiError {
    tracing::error!(error = %e, "{what} a request failed");
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("{what} the request failed inside the agent"),
    )
}

/// A request that ran and failed: the device's fault is 503 (the instance cannot serve now; the
/// detail goes to the log), anything else is the request's (400).
fn run_failed(tenant: &str, e: RunError) -> ApiError {
    let device = matches!(
        e,
        RunError::Device(_)
            | RunError::Node {
                source: OpError::Device(_),
                ..
            }
    );
    if device {
        tracing::warn!(tenant, error = %e, "the device failed a request");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the device could not run this request now; retry",
        )
        .retry_after(1)
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
    let error = ApiError::new(status, r.to_string());
    match r {
        // A replica stopping: another one (here or on another agent) is about to take over.
        Rejected::Closed => error.retry_after(1),
        _ => error,
    }
}
