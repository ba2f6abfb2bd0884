//! `ModelTenant`: one model with a latency SLO that cotenant serves and scales.

use crate::common::{Condition, Knobs, ModelSource, Slo};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A model served with a latency SLO. The operator places its replicas on the agents of `pool`,
/// chooses between batching and co-located instances from a profile of the model (DNNScaler), and
/// keeps moving those knobs and the replica count so the observed latency stays within the SLO.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "cotenant.dev",
    version = "v1alpha1",
    kind = "ModelTenant",
    doc = "A model served with a latency SLO; cotenant places, batches and replicates it to hold the SLO at the least GPU cost.",
    selectable = ".spec.pool",
    namespaced,
    shortname = "mt",
    category = "cotenant",
    status = "ModelTenantStatus",
    printcolumn = r#"{"name":"SLO(ms)","type":"number","jsonPath":".spec.slo.latencyMillis","description":"Latency target in milliseconds"}"#,
    printcolumn = r#"{"name":"P99(ms)","type":"number","jsonPath":".status.observed.latencyMillis","description":"Observed latency at the SLO percentile in milliseconds"}"#,
    printcolumn = r#"{"name":"Throughput","type":"number","jsonPath":".status.observed.throughputPerSecond","description":"Completed inferences per second over all replicas"}"#,
    printcolumn = r#"{"name":"Approach","type":"string","jsonPath":".status.approach","description":"Batching, MultiTenancy or Joint, as chosen by DNNScaler"}"#,
    printcolumn = r#"{"name":"Batch","type":"integer","jsonPath":".status.knobs.batchSize","description":"Batch size per instance"}"#,
    printcolumn = r#"{"name":"Instances","type":"integer","jsonPath":".status.knobs.instances","description":"Co-located instances per replica"}"#,
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".status.readyReplicas","description":"Replicas ready to serve"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status","description":"Whether the tenant serves within its SLO"}"#,
    printcolumn = r#"{"name":"Percentile","type":"number","jsonPath":".spec.slo.percentile","priority":1,"description":"The SLO percentile"}"#,
    printcolumn = r#"{"name":"Attainment","type":"number","jsonPath":".status.observed.sloAttainment","priority":1,"description":"Fraction of recent requests within the latency target"}"#,
    printcolumn = r#"{"name":"Pool","type":"string","jsonPath":".spec.pool","priority":1,"description":"GpuPool the tenant runs on"}"#,
    printcolumn = r#"{"name":"Endpoint","type":"string","jsonPath":".status.endpoint","priority":1,"description":"Where clients send inference requests"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!self.model.uri.startsWith('file://') || self.model.uri.startsWith('file:///')",
        "message": "a relative file:// path is for standalone mode only: in a cluster name an absolute path under the pool's model volume (file:///...), an http(s):// URL or an s3://, gs:// or az:// object",
        "fieldPath": ".model.uri",
        "reason": "FieldValueInvalid"
    },
    {
        "rule": "self.model.uri.startsWith('file://') || has(self.model.sha256)",
        "message": "an http(s)://, s3://, gs:// or az:// model needs spec.model.sha256: the agent checks every download against it",
        "fieldPath": ".model.sha256",
        "reason": "FieldValueRequired"
    },
    {
        "rule": "!has(self.model.credentialsSecret) || self.model.uri.matches('^(s3|gs|az)://')",
        "message": "spec.model.credentialsSecret is for s3://, gs:// and az:// models only",
        "fieldPath": ".model.credentialsSecret",
        "reason": "FieldValueForbidden"
    }
]))]
pub struct ModelTenantSpec {
    /// The model to serve.
    pub model: ModelSource,
    /// The latency objective the operator holds the tenant to.
    pub slo: Slo,
    /// How the operator may scale the tenant.
    #[serde(default)]
    pub scaling: Scaling,
    /// Name of the GpuPool whose agents run this tenant.
    #[serde(default = "default_pool")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub pool: String,
    /// Who may call the tenant. Without it any client that reaches an agent may call it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<Credentials>,
}

/// Bearer tokens a caller must present (`Authorization: Bearer <token>`) on every request to the
/// tenant: inference, metadata and readiness.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Credentials {
    /// A Secret in the tenant's namespace holding the tokens.
    pub secret_ref: TokenSecretRef,
}

/// Where in a Secret the tokens are: one per line of one key's value, each at least 32
/// characters (several lines let a new token be rolled out before the old one is removed).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenSecretRef {
    /// Name of the Secret.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub name: String,
    /// Key of the Secret's data holding the tokens (default `token`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[-._a-zA-Z0-9]+$"))]
    pub key: Option<String>,
}

impl TokenSecretRef {
    /// The key that holds the tokens.
    pub fn key(&self) -> &str {
        self.key.as_deref().unwrap_or(DEFAULT_TOKEN_KEY)
    }
}

/// The Secret key read when `credentials.secretRef.key` is not set.
pub const DEFAULT_TOKEN_KEY: &str = "token";

fn default_pool() -> String {
    "default".to_string()
}

/// Bounds within which the operator scales a tenant.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self.minReplicas <= self.maxReplicas",
    "message": "minReplicas must be less than or equal to maxReplicas",
    "fieldPath": ".minReplicas",
    "reason": "FieldValueInvalid"
}]))]
pub struct Scaling {
    /// How throughput is scaled within one replica: `Auto` lets DNNScaler choose from a profile,
    /// `Batching` grows the batch size of one instance, `MultiTenancy` runs more instances.
    #[serde(default)]
    pub approach: Approach,
    /// Largest batch size the scaler may choose, in [1, 1024].
    #[serde(default = "default_max_batch_size")]
    #[schemars(range(min = 1, max = 1024))]
    pub max_batch_size: u32,
    /// Most co-located instances per replica the scaler may choose, in [1, 64].
    #[serde(default = "default_max_instances")]
    #[schemars(range(min = 1, max = 64))]
    pub max_instances: u32,
    /// Fewest replicas (each on its own agent), in [1, 1000].
    #[serde(default = "default_min_replicas")]
    #[schemars(range(min = 1, max = 1000))]
    pub min_replicas: u32,
    /// Most replicas, in [1, 1000]; must be at least minReplicas.
    #[serde(default = "default_max_replicas")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_replicas: u32,
}

fn default_max_batch_size() -> u32 {
    32
}
fn default_max_instances() -> u32 {
    4
}
fn default_min_replicas() -> u32 {
    1
}
fn default_max_replicas() -> u32 {
    4
}

impl Default for Scaling {
    fn default() -> Self {
        Scaling {
            approach: Approach::default(),
            max_batch_size: default_max_batch_size(),
            max_instances: default_max_instances(),
            min_replicas: default_min_replicas(),
            max_replicas: default_max_replicas(),
        }
    }
}

/// How throughput is scaled within one replica.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Approach {
    /// Profile the model and pick whichever approach gains more throughput.
    #[default]
    Auto,
    /// One instance, growing batch size.
    Batching,
    /// Several co-located instances at batch size 1.
    MultiTenancy,
}

/// What the operator observed and decided for a tenant.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelTenantStatus {
    /// Coarse lifecycle phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<TenantPhase>,
    /// The approach DNNScaler chose for this tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approach: Option<ChosenApproach>,
    /// The knobs every replica currently runs with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub knobs: Option<Knobs>,
    /// The profile that justified the approach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<Profile>,
    /// What DNNScaler learned about the knob it moves, kept so that a restarted operator does
    /// not probe again a setting that already violated the SLO.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaler: Option<ScalerMemory>,
    /// Replicas the operator wants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
    /// Replicas loaded and serving.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<u32>,
    /// Where each replica runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placements: Vec<ReplicaPlacement>,
    /// Load and latency over the recent window, summed over replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<Observed>,
    /// Where clients send inference requests (`<service>.<namespace>.svc:8000`, model name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Standard conditions: Ready, ModelLoaded, SLOMet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Coarse lifecycle of a tenant.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum TenantPhase {
    /// Accepted, not yet placed.
    Pending,
    /// Being measured to choose an approach.
    Profiling,
    /// Serving within its SLO.
    Serving,
    /// Serving, but outside its SLO or below its replica target.
    Degraded,
    /// Cannot be served; the Ready condition says why.
    Failed,
}

/// The approach DNNScaler applies.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ChosenApproach {
    /// One instance, batch size moves.
    Batching,
    /// Batch size 1, instance count moves.
    MultiTenancy,
    /// Several instances that each batch.
    Joint,
}

/// Throughput and latency measured at a few knob settings.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Profile {
    /// One entry per measured knob setting.
    #[serde(default)]
    pub points: Vec<ProfilePoint>,
    /// When the profile was taken (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_at: Option<String>,
    /// Bytes of the model's weights, which every instance shares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_bytes: Option<u64>,
    /// The model URI measured; a tenant whose `spec.model.uri` changes is profiled again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_uri: Option<String>,
}

/// Throughput and latency at one knob setting.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProfilePoint {
    /// The knobs measured.
    pub knobs: Knobs,
    /// Inferences per second at these knobs.
    pub throughput_per_second: f64,
    /// Latency at the SLO percentile in milliseconds.
    pub latency_millis: f64,
    /// Peak activation memory of one instance at this batch size, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_activation_bytes: Option<u64>,
}

/// DNNScaler's memory of the knob it moves (the batch size for Batching and Joint, the
/// instance count for MultiTenancy), valid for the SLO and load it was learned under.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScalerMemory {
    /// Largest value seen within the SLO (0: none yet).
    pub within_slo: u32,
    /// Smallest value whose own service time violated the SLO, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub violated_at: Option<u32>,
    /// The SLO latency in milliseconds this was learned under.
    pub slo_millis: f64,
    /// The per-replica arrival rate this was learned under; a large change makes it stale.
    pub arrival_rate_per_second: f64,
}

/// One replica of a tenant and where it runs.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaPlacement {
    /// Name of the GpuAgent hosting the replica.
    pub agent: String,
    /// Node of that agent, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Whether the replica is loaded and serving.
    pub ready: bool,
}

/// A summary of a tenant's load and latency, as measured over the window at `measuredAt`. It is
/// rewritten only when a value moves past the operator's thresholds (see the operator's
/// `decide::status`), so a steady tenant's status stays still; the live numbers are the agents'
/// Prometheus metrics.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Observed {
    /// When these values were measured (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_at: Option<String>,
    /// Requests arriving per second.
    pub arrival_rate_per_second: f64,
    /// Requests completed per second.
    pub throughput_per_second: f64,
    /// Latency at the SLO percentile in milliseconds, end to end at the agent.
    pub latency_millis: f64,
    /// Fraction of requests that met the latency target, in [0, 1].
    pub slo_attainment: f64,
}
