//! Triton's model configuration and statistics extensions, built from what a tenant is now:
//! its signature, whether requests are batched, its knobs and device, and its measurements since
//! it started. REST (`/v2/models/{m}/config`, `/v2/models/{m}/stats`, `/v2/models/stats`) and
//! gRPC (ModelConfig, ModelStatistics) answer from the same values, so Triton's clients and
//! `perf_analyzer` read a cotenant tenant as they read a Triton model.
//!
//! What the statistics do not measure is sent as zero: the time of failed requests, and the time
//! of input and output handling apart from compute (`compute_infer` holds all of a request's
//! compute; `compute_input` and `compute_output` count the same requests with no time, since
//! Triton's clients require the three counts to agree). Per-batch-size timings are not kept
//! (`batch_stats` is empty), nor is a response cache (zero hits and misses).

use super::error::ApiError;
use super::oip::{self, PLATFORM, path};
use super::{AppState, access};
use crate::registry::{Entry, State as TenantState};
use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use serde_json::{Value, json};
use std::sync::Arc;

/// One tensor of a model configuration: Triton's `data_type` and `dims` (without the batch
/// dimension when the model batches; `-1` for a variable dimension).
#[derive(Clone, Debug, PartialEq)]
pub struct TensorConfig {
    pub name: String,
    /// The protocol's datatype name (`FP32`); Triton's enum is `TYPE_` followed by it.
    pub datatype: String,
    pub dims: Vec<i64>,
}

/// A tenant as Triton's model configuration describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub name: String,
    /// Rows one request may carry when requests are batched along their first dimension; 0
    /// when they are not, and the dims are then the whole shape.
    pub max_batch_size: usize,
    pub inputs: Vec<TensorConfig>,
    pub outputs: Vec<TensorConfig>,
    /// The batch the instances run now, when batching.
    pub preferred_batch_size: Option<usize>,
    /// Instances serving now, and whether on a GPU.
    pub instances: usize,
    pub gpu: bool,
}

/// Triton's `TYPE_` name of a protocol datatype.
pub fn type_name(datatype: &str) -> String {
    format!(
        "TYPE_{}",
        if datatype == "BYTES" {
            "STRING"
        } else {
            datatype
        }
    )
}

impl ModelConfig {
    /// The configuration of a Ready tenant; others have no signature yet (503).
    pub fn of(entry: &Entry) -> Result<ModelConfig, ApiError> {
        let tenant = oip::serving(entry, &entry.name)?;
        let (inputs, outputs) = oip::signature(entry);
        let batching = tenant.batchable();
        let strip = |t: &crate::registry::TensorMeta| TensorConfig {
            name: t.name.clone(),
            datatype: t.datatype.clone(),
            dims: if batching && !t.shape.is_empty() {
                t.shape[1..].to_vec()
            } else {
                t.shape.clone()
            },
        };
        let (max_batch, instances) = tenant.knobs();
        Ok(ModelConfig {
            name: entry.name.clone(),
            max_batch_size: if batching {
                tenant.max_request_rows()
            } else {
                0
            },
            inputs: inputs.iter().map(strip).collect(),
            outputs: outputs.iter().map(strip).collect(),
            preferred_batch_size: batching.then_some(max_batch),
            instances,
            gpu: tenant.device().is_gpu(),
        })
    }

    /// Triton's JSON form (`GET /v2/models/{m}/config`).
    pub fn to_json(&self) -> Value {
        let tensors = |ts: &[TensorConfig], input: bool| -> Vec<Value> {
            ts.iter()
                .map(|t| {
                    let mut v = json!({
                        "name": t.name,
                        "data_type": type_name(&t.datatype),
                        "dims": t.dims,
                    });
                    if input {
                        v["format"] = json!("FORMAT_NONE");
                    }
                    v
                })
                .collect()
        };
        let mut config = json!({
            "name": self.name,
            "platform": PLATFORM,
            "backend": "cotenant",
            "version_policy": {"latest": {"num_versions": 1}},
            "max_batch_size": self.max_batch_size,
            "input": tensors(&self.inputs, true),
            "output": tensors(&self.outputs, false),
            "instance_group": [{
                "name": self.name,
                "kind": if self.gpu { "KIND_GPU" } else { "KIND_CPU" },
                "count": self.instances,
                "gpus": if self.gpu { vec![0] } else { vec![] },
            }],
        });
        if let Some(preferred) = self.preferred_batch_size {
            config["dynamic_batching"] = json!({"preferred_batch_size": [preferred]});
        }
        config
    }
}

/// A duration statistic: how many and their total nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Duration {
    pub count: u64,
    pub ns: u64,
}

/// A tenant's measurements since it started, as Triton's model statistics report them.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelStatistics {
    pub name: String,
    /// Milliseconds since the Unix epoch of the last finished request; 0 before the first.
    pub last_inference: u64,
    /// Rows inferred (each row of a batched request counts once).
    pub inference_count: u64,
    /// Batches run.
    pub execution_count: u64,
    pub success: Duration,
    pub fail: Duration,
    pub queue: Duration,
    pub compute_input: Duration,
    pub compute_infer: Duration,
    pub compute_output: Duration,
}

fn ns(secs: f64) -> u64 {
    // A float of seconds to whole nanoseconds, saturating.
    (secs * 1e9).clamp(0.0, u64::MAX as f64) as u64
}

impl ModelStatistics {
    /// A tenant's statistics; a tenant that is not Ready has served nothing here.
    pub fn of(entry: &Entry) -> ModelStatistics {
        let mut stats = ModelStatistics {
            name: entry.name.clone(),
            last_inference: 0,
            inference_count: 0,
            execution_count: 0,
            success: Duration::default(),
            fail: Duration::default(),
            queue: Duration::default(),
            compute_input: Duration::default(),
            compute_infer: Duration::default(),
            compute_output: Duration::default(),
        };
        let TenantState::Ready { tenant, .. } = &entry.state else {
            return stats;
        };
        let totals = tenant.stats().totals();
        stats.last_inference = tenant.stats().last_completion_ms().unwrap_or(0);
        stats.execution_count = totals.batch_sizes.iter().sum();
        stats.inference_count = totals.rows;
        let completions = totals.completions;
        stats.success = Duration {
            count: completions,
            ns: ns(totals.end_to_end.sum_secs()),
        };
        stats.fail = Duration {
            count: totals.errors,
            ns: 0,
        };
        stats.queue = Duration {
            count: completions,
            ns: ns(totals.queue.sum_secs()),
        };
        stats.compute_infer = Duration {
            count: completions,
            ns: ns(totals.compute.sum_secs()),
        };
        let untimed = Duration {
            count: completions,
            ns: 0,
        };
        stats.compute_input = untimed;
        stats.compute_output = untimed;
        stats
    }

    /// Triton's JSON form of one model's entry in `model_stats`.
    pub fn to_json(&self) -> Value {
        let d = |d: Duration| json!({"count": d.count, "ns": d.ns});
        let zero = Duration::default();
        json!({
            "name": self.name,
            "version": "1",
            "last_inference": self.last_inference,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": d(self.success),
                "fail": d(self.fail),
                "queue": d(self.queue),
                "compute_input": d(self.compute_input),
                "compute_infer": d(self.compute_infer),
                "compute_output": d(self.compute_output),
                "cache_hit": d(zero),
                "cache_miss": d(zero),
            },
            "batch_stats": [],
        })
    }
}

/// The statistics of `model`, or with `None` of every tenant the caller may use.
pub fn statistics(
    app: &AppState,
    model: Option<&str>,
    headers: &HeaderMap,
) -> Result<Vec<ModelStatistics>, ApiError> {
    match model {
        Some(model) => {
            let entry = access::tenant(app, model, headers)?;
            Ok(vec![ModelStatistics::of(&entry)])
        }
        None => Ok(app
            .registry
            .all()
            .iter()
            .filter(|e| e.tokens.as_ref().is_none_or(|t| t.admit(headers)))
            .map(|e| ModelStatistics::of(e))
            .collect()),
    }
}

type AppRef = State<Arc<AppState>>;

pub async fn config(
    State(app): AppRef,
    model: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    config_of(&app, &path(model)?, &headers)
}

pub async fn config_versioned(
    State(app): AppRef,
    p: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    config_of(&app, &oip::versioned(p)?, &headers)
}

fn config_of(app: &AppState, model: &str, headers: &HeaderMap) -> Result<Json<Value>, ApiError> {
    let entry = access::tenant(app, model, headers)?;
    Ok(Json(ModelConfig::of(&entry)?.to_json()))
}

fn stats_of(
    app: &AppState,
    model: Option<&str>,
    headers: &HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let stats = statistics(app, model, headers)?;
    Ok(Json(
        json!({"model_stats": stats.iter().map(ModelStatistics::to_json).collect::<Vec<_>>()}),
    ))
}

pub async fn stats(
    State(app): AppRef,
    model: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    stats_of(&app, Some(&path(model)?), &headers)
}

pub async fn stats_versioned(
    State(app): AppRef,
    p: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    stats_of(&app, Some(&oip::versioned(p)?), &headers)
}

pub async fn all_stats(State(app): AppRef, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    stats_of(&app, None, &headers)
}
