//! `GpuAgent`: the durable hand-off between the operator (spec) and one agent pod (status).

use crate::common::{Condition, Knobs, ModelSource, Slo, TenantRef};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most tenant replicas one agent holds: the API refuses a longer list of assignments, so the
/// operator places no more than this on an agent.
pub const MAX_ASSIGNMENTS: usize = 64;

/// One agent pod and the tenant replicas the operator assigned to it. The operator writes the
/// spec; the agent watches it, loads and unloads models to match, and writes the status when it
/// changes. The agent's liveness is its `coordination.k8s.io` Lease of the same name, renewed
/// the way a kubelet renews its node's.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "cotenant.dev",
    version = "v1alpha1",
    kind = "GpuAgent",
    doc = "One agent pod: the tenant replicas the operator assigned to it (spec) and what the agent reports (status).",
    selectable = ".spec.pool",
    namespaced,
    category = "cotenant",
    status = "GpuAgentStatus",
    printcolumn = r#"{"name":"Pool","type":"string","jsonPath":".spec.pool","description":"GpuPool of the agent"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".status.node","description":"Node the agent runs on"}"#,
    printcolumn = r#"{"name":"Tenants","type":"string","jsonPath":".spec.assignments[*].tenant.name","description":"Tenants assigned to the agent"}"#,
    printcolumn = r#"{"name":"Address","type":"string","jsonPath":".status.address","description":"Where the agent serves"}"#,
    printcolumn = r#"{"name":"Device","type":"string","jsonPath":".status.device.name","priority":1,"description":"The agent's accelerator"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GpuAgentSpec {
    /// GpuPool the agent belongs to.
    #[schemars(length(min = 1, max = 253))]
    pub pool: String,
    /// Tenant replicas this agent must serve; the operator, the only writer, keeps at most one per
    /// tenant.
    #[serde(default)]
    #[schemars(length(max = MAX_ASSIGNMENTS))]
    pub assignments: Vec<Assignment>,
}

/// One tenant replica on an agent.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Assignment {
    /// The tenant this replica serves.
    pub tenant: TenantRef,
    /// The model, resolved from the tenant.
    pub model: ModelSource,
    /// The tenant's SLO, which bounds batching delay and admission on the agent.
    pub slo: Slo,
    /// Batch size and instance count for this replica.
    pub knobs: Knobs,
    /// Ask the agent to measure the DNNScaler profile points up to this batch size and instance
    /// count, and report them; absent means no profiling is wanted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<Knobs>,
    /// Who may call this replica, resolved by the operator from the tenant's credentials Secret;
    /// absent means anyone may.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<CallerTokens>,
}

/// The bearer tokens a tenant accepts, as their SHA-256 digests (the tokens themselves never
/// leave the tenant's Secret).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CallerTokens {
    /// Lowercase hex SHA-256 of each accepted token; empty: no caller is accepted (the Secret
    /// could not be read or holds no usable token).
    #[serde(default)]
    #[schemars(length(max = 32), inner(regex(pattern = r"^[0-9a-f]{64}$")))]
    pub token_sha256: Vec<String>,
}

/// What an agent reports about itself.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuAgentStatus {
    /// `host:port` of the agent's Open Inference Protocol endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// `host:port` of the agent's Open Inference Protocol endpoint over gRPC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_address: Option<String>,
    /// `host:port` of the agent's admin endpoint: `/metrics`, and `/report`, which only the
    /// operator may read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_address: Option<String>,
    /// Node the agent runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The accelerator the agent executes on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<Device>,
    /// Every tenant the agent holds, with its state.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<LoadedTenant>,
    /// Standard conditions: Ready.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The metadata.generation of the spec the agent last reconciled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// An accelerator and its memory.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// Kind of backend: `cuda` or `cpu`.
    pub kind: DeviceKind,
    /// Device name, for example `NVIDIA H200`.
    pub name: String,
    /// Total device memory in bytes.
    pub memory_total_bytes: u64,
    /// Device memory in use by the agent in bytes.
    pub memory_used_bytes: u64,
}

/// Kind of execution backend.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum DeviceKind {
    /// An NVIDIA GPU through CUDA.
    #[serde(rename = "cuda")]
    Cuda,
    /// The CPU backend (no usable GPU).
    #[serde(rename = "cpu")]
    Cpu,
    /// The simulated GPU: the GPU path run on the CPU (`--device sim`, for tests).
    #[serde(rename = "sim")]
    Sim,
}

/// A tenant replica as the agent holds it.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoadedTenant {
    /// The tenant.
    pub tenant: TenantRef,
    /// Where the replica is in its lifecycle.
    pub state: ReplicaState,
    /// Knobs the replica runs with now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub knobs: Option<Knobs>,
    /// Bytes of weights on the device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_bytes: Option<u64>,
    /// Peak activation bytes at the current knobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activation_bytes: Option<u64>,
    /// Why the replica failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Lifecycle of a replica on an agent.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ReplicaState {
    /// Fetching and compiling the model.
    Loading,
    /// Measuring profile points.
    Profiling,
    /// Serving requests.
    Ready,
    /// Could not be loaded or crashed; see `error`.
    Failed,
    /// Draining in-flight requests before removal.
    Unloading,
}
