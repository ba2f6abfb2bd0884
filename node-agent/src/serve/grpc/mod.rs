//! The Open Inference Protocol over gRPC: Triton's `inference.GRPCInferenceService` (liveness,
//! readiness, metadata, ModelInfer, ModelConfig, ModelStatistics) on its own HTTP/2 listener.
//! A call goes through what a REST request does: the tenant's tokens (`authorization` metadata),
//! the in-flight budget while its message arrives and once its tensors are decoded, admission and
//! the answer deadline. Errors carry the gRPC codes Triton uses for the same failures (see
//! [`status`]); calls Triton has and this agent does not answer UNIMPLEMENTED.

mod tensors;

/// The messages and service generated from `proto/` (Triton's definitions, names included).
#[allow(clippy::enum_variant_names)]
pub mod pb {
    tonic::include_proto!("inference");
}

use super::error::ApiError;
use super::oip::{self, EXTENSIONS, PLATFORM};
use super::triton::{self, ModelConfig, ModelStatistics};
use super::{AppState, MAX_BODY_BYTES, access, body};
use crate::registry::{Entry, State as TenantState, TensorMeta};
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use pb::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};
use std::sync::Arc;
use tokio::time::Instant;
use tonic::{Code, Status};

/// Bytes of gRPC framing before a message: a compression flag and a 4-byte length.
const FRAME_HEADER: usize = 5;

/// The gRPC listener's router.
pub fn router(app: Arc<AppState>) -> Router {
    let service = GrpcInferenceServiceServer::new(Service { app: app.clone() })
        .max_decoding_message_size(MAX_BODY_BYTES)
        .max_encoding_message_size(usize::MAX);
    Router::new()
        .route_service("/inference.GRPCInferenceService/{*method}", service)
        .fallback(|| async { Status::unimplemented("no such service").into_http::<Body>() })
        .layer(middleware::from_fn_with_state(app, within_budget))
}

/// Reads a call's whole body against the agent's in-flight budget and the body deadline before
/// tonic decodes it, and holds that reservation until the call is answered: memory grows with
/// the bytes that arrive, and past the budget a call gets UNAVAILABLE instead of room.
async fn within_budget(State(app): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    let mut reservation = app.budget.open_unattributed();
    let bytes = match body::read(
        body,
        None,
        MAX_BODY_BYTES + FRAME_HEADER,
        started + app.limits.body_timeout,
        &mut reservation,
    )
    .await
    {
        Ok(bytes) => bytes,
        Err(e) => return status(e).into_http(),
    };
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    drop(reservation);
    response
}

/// The gRPC status of a refused or failed call, as Triton maps its errors: a bad request is
/// INVALID_ARGUMENT, an unknown model NOT_FOUND, a missing or wrong token UNAUTHENTICATED, and
/// back-pressure (a full queue, a predicted SLO miss, the in-flight budget, a model not ready)
/// UNAVAILABLE, which clients retry.
pub fn status(e: ApiError) -> Status {
    let code = match e.status {
        StatusCode::BAD_REQUEST => Code::InvalidArgument,
        StatusCode::UNAUTHORIZED => Code::Unauthenticated,
        StatusCode::NOT_FOUND => Code::NotFound,
        StatusCode::REQUEST_TIMEOUT => Code::DeadlineExceeded,
        StatusCode::PAYLOAD_TOO_LARGE => Code::ResourceExhausted,
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => Code::Unavailable,
        StatusCode::INTERNAL_SERVER_ERROR => Code::Internal,
        _ => Code::Unknown,
    };
    let mut status = Status::new(code, e.message);
    if let Some(seconds) = e.retry_after
        && let Ok(value) = seconds.to_string().parse()
    {
        status.metadata_mut().insert("retry-after", value);
    }
    status
}

fn tensor_metadata(tensors: &[TensorMeta]) -> Vec<pb::model_metadata_response::TensorMetadata> {
    tensors
        .iter()
        .map(|t| pb::model_metadata_response::TensorMetadata {
            name: t.name.clone(),
            datatype: t.datatype.clone(),
            shape: t.shape.clone(),
        })
        .collect()
}

struct Service {
    app: Arc<AppState>,
}

impl Service {
    /// The tenant a call names, if the caller may use it and the version is its one.
    fn tenant(
        &self,
        headers: &HeaderMap,
        model: &str,
        version: &str,
    ) -> Result<Arc<Entry>, Status> {
        if !version.is_empty() {
            oip::check_version(model, version).map_err(status)?;
        }
        access::tenant(&self.app, model, headers).map_err(status)
    }
}

type Answer<T> = Result<tonic::Response<T>, Status>;

#[tonic::async_trait]
impl GrpcInferenceService for Service {
    async fn server_live(
        &self,
        _: tonic::Request<pb::ServerLiveRequest>,
    ) -> Answer<pb::ServerLiveResponse> {
        Ok(tonic::Response::new(pb::ServerLiveResponse { live: true }))
    }

    async fn server_ready(
        &self,
        _: tonic::Request<pb::ServerReadyRequest>,
    ) -> Answer<pb::ServerReadyResponse> {
        let ready = oip::agent_ready(&self.app);
        Ok(tonic::Response::new(pb::ServerReadyResponse { ready }))
    }

    async fn model_ready(
        &self,
        request: tonic::Request<pb::ModelReadyRequest>,
    ) -> Answer<pb::ModelReadyResponse> {
        let headers = request.metadata().clone().into_headers();
        let request = request.into_inner();
        let entry = self.tenant(&headers, &request.name, &request.version)?;
        let ready = matches!(entry.state, TenantState::Ready { .. });
        Ok(tonic::Response::new(pb::ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        _: tonic::Request<pb::ServerMetadataRequest>,
    ) -> Answer<pb::ServerMetadataResponse> {
        Ok(tonic::Response::new(pb::ServerMetadataResponse {
            name: "cotenant".to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            extensions: EXTENSIONS.iter().map(|e| e.to_string()).collect(),
        }))
    }

    async fn model_metadata(
        &self,
        request: tonic::Request<pb::ModelMetadataRequest>,
    ) -> Answer<pb::ModelMetadataResponse> {
        let headers = request.metadata().clone().into_headers();
        let request = request.into_inner();
        let entry = self.tenant(&headers, &request.name, &request.version)?;
        let (inputs, outputs) = oip::signature(&entry);
        Ok(tonic::Response::new(pb::ModelMetadataResponse {
            name: entry.name.clone(),
            versions: vec!["1".to_string()],
            platform: PLATFORM.to_string(),
            inputs: tensor_metadata(inputs),
            outputs: tensor_metadata(outputs),
        }))
    }

    #[tracing::instrument(
        name = "infer",
        skip_all,
        fields(model = %request.get_ref().model_name, protocol = "grpc")
    )]
    async fn model_infer(
        &self,
        request: tonic::Request<pb::ModelInferRequest>,
    ) -> Answer<pb::ModelInferResponse> {
        let started = Instant::now();
        let headers = request.metadata().clone().into_headers();
        let request = request.into_inner();
        let model = request.model_name.clone();
        let entry = self.tenant(&headers, &model, &request.model_version)?;
        let tenant = oip::serving(&entry, &model).map_err(status)?;

        let reservation = self.app.budget.open(&entry.name);
        let (decoded, held) =
            oip::decode_blocking(entry.clone(), reservation, move |signature, reservation| {
                let decoded = tensors::decode(&request, signature, |n| reservation.grow(n))?;
                Ok((decoded, request.id))
            })
            .await
            .map_err(status)?;
        let (decoded, id) = decoded.map_err(status)?;

        let completed = oip::answer(&self.app, &entry, &tenant, decoded.inputs, held, started)
            .await
            .map_err(status)?;
        let asked = decoded.outputs;
        let (outputs, raw_output_contents) =
            tokio::task::spawn_blocking(move || tensors::encode(completed.outputs, &asked))
                .await
                .map_err(|e| status(oip::internal("encoding", &e)))?;
        Ok(tonic::Response::new(pb::ModelInferResponse {
            model_name: entry.name.clone(),
            model_version: "1".to_string(),
            id,
            outputs,
            raw_output_contents,
            ..Default::default()
        }))
    }

    async fn model_config(
        &self,
        request: tonic::Request<pb::ModelConfigRequest>,
    ) -> Answer<pb::ModelConfigResponse> {
        let headers = request.metadata().clone().into_headers();
        let request = request.into_inner();
        let entry = self.tenant(&headers, &request.name, &request.version)?;
        let config = ModelConfig::of(&entry).map_err(status)?;
        Ok(tonic::Response::new(pb::ModelConfigResponse {
            config: Some(config_proto(&config)),
        }))
    }

    async fn model_statistics(
        &self,
        request: tonic::Request<pb::ModelStatisticsRequest>,
    ) -> Answer<pb::ModelStatisticsResponse> {
        let headers = request.metadata().clone().into_headers();
        let request = request.into_inner();
        let model = Some(request.name.as_str()).filter(|n| !n.is_empty());
        if let Some(model) = model
            && !request.version.is_empty()
        {
            oip::check_version(model, &request.version).map_err(status)?;
        }
        let stats = triton::statistics(&self.app, model, &headers).map_err(status)?;
        Ok(tonic::Response::new(pb::ModelStatisticsResponse {
            model_stats: stats.iter().map(statistics_proto).collect(),
        }))
    }
}

fn data_type(datatype: &str) -> i32 {
    pb::DataType::from_str_name(&triton::type_name(datatype)).unwrap_or(pb::DataType::TypeInvalid)
        as i32
}

fn config_proto(c: &ModelConfig) -> pb::ModelConfig {
    use pb::model_config::SchedulingChoice;
    use pb::model_instance_group::Kind;
    use pb::model_version_policy::{Latest, PolicyChoice};
    pb::ModelConfig {
        name: c.name.clone(),
        platform: PLATFORM.to_string(),
        backend: "cotenant".to_string(),
        version_policy: Some(pb::ModelVersionPolicy {
            policy_choice: Some(PolicyChoice::Latest(Latest { num_versions: 1 })),
        }),
        max_batch_size: i32::try_from(c.max_batch_size).unwrap_or(i32::MAX),
        input: c
            .inputs
            .iter()
            .map(|t| pb::ModelInput {
                name: t.name.clone(),
                data_type: data_type(&t.datatype),
                format: pb::model_input::Format::None as i32,
                dims: t.dims.clone(),
            })
            .collect(),
        output: c
            .outputs
            .iter()
            .map(|t| pb::ModelOutput {
                name: t.name.clone(),
                data_type: data_type(&t.datatype),
                dims: t.dims.clone(),
            })
            .collect(),
        scheduling_choice: c.preferred_batch_size.map(|b| {
            SchedulingChoice::DynamicBatching(pb::ModelDynamicBatching {
                preferred_batch_size: vec![i32::try_from(b).unwrap_or(i32::MAX)],
                max_queue_delay_microseconds: 0,
            })
        }),
        instance_group: vec![pb::ModelInstanceGroup {
            name: c.name.clone(),
            kind: if c.gpu { Kind::Gpu } else { Kind::Cpu } as i32,
            count: i32::try_from(c.instances).unwrap_or(i32::MAX),
            gpus: if c.gpu { vec![0] } else { vec![] },
        }],
    }
}

fn statistics_proto(s: &ModelStatistics) -> pb::ModelStatistics {
    let d = |d: triton::Duration| {
        Some(pb::StatisticDuration {
            count: d.count,
            ns: d.ns,
        })
    };
    let zero = triton::Duration::default();
    pb::ModelStatistics {
        name: s.name.clone(),
        version: "1".to_string(),
        last_inference: s.last_inference,
        inference_count: s.inference_count,
        execution_count: s.execution_count,
        inference_stats: Some(pb::InferStatistics {
            success: d(s.success),
            fail: d(s.fail),
            queue: d(s.queue),
            compute_input: d(s.compute_input),
            compute_infer: d(s.compute_infer),
            compute_output: d(s.compute_output),
            cache_hit: d(zero),
            cache_miss: d(zero),
        }),
        batch_stats: vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_map_to_the_codes_triton_uses() {
        for (http, code) in [
            (StatusCode::BAD_REQUEST, Code::InvalidArgument),
            (StatusCode::UNAUTHORIZED, Code::Unauthenticated),
            (StatusCode::NOT_FOUND, Code::NotFound),
            (StatusCode::REQUEST_TIMEOUT, Code::DeadlineExceeded),
            (StatusCode::PAYLOAD_TOO_LARGE, Code::ResourceExhausted),
            (StatusCode::TOO_MANY_REQUESTS, Code::Unavailable),
            (StatusCode::SERVICE_UNAVAILABLE, Code::Unavailable),
            (StatusCode::INTERNAL_SERVER_ERROR, Code::Internal),
        ] {
            let s = status(ApiError::new(http, "why"));
            assert_eq!((s.code(), s.message()), (code, "why"), "{http}");
        }
        let busy = status(ApiError::new(StatusCode::TOO_MANY_REQUESTS, "later").retry_after(1));
        assert_eq!(busy.metadata().get("retry-after").unwrap(), "1");
    }

    #[test]
    fn the_configuration_names_triton_types_and_strips_the_batch_dimension() {
        let config = ModelConfig {
            name: "m".into(),
            max_batch_size: 8,
            inputs: vec![triton::TensorConfig {
                name: "x".into(),
                datatype: "INT64".into(),
                dims: vec![16],
            }],
            outputs: vec![triton::TensorConfig {
                name: "y".into(),
                datatype: "FP32".into(),
                dims: vec![-1, 4],
            }],
            preferred_batch_size: Some(4),
            instances: 2,
            gpu: true,
        };
        let proto = config_proto(&config);
        assert_eq!(proto.input[0].data_type, pb::DataType::TypeInt64 as i32);
        assert_eq!(proto.output[0].dims, [-1, 4]);
        assert_eq!(proto.max_batch_size, 8);
        assert_eq!(proto.instance_group[0].count, 2);
        let json = config.to_json();
        assert_eq!(json["input"][0]["data_type"], "TYPE_INT64");
        assert_eq!(json["instance_group"][0]["kind"], "KIND_GPU");
        assert_eq!(json["dynamic_batching"]["preferred_batch_size"][0], 4);
        assert_eq!(triton::type_name("BYTES"), "TYPE_STRING");
    }
}
