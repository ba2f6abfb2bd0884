//! `GpuPool`: a class of GPU agents, the way a StorageClass is a class of volumes.

use crate::common::Condition;
use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A pool of GPU agents. The operator creates agent pods from `template` in `agentNamespace`, one
/// GpuAgent per pod, between `minAgents` and `maxAgents`; agents that stay idle longer than
/// `scaleDownDelaySeconds` are drained and removed, which lets the cluster autoscaler remove nodes.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "cotenant.dev",
    version = "v1alpha1",
    kind = "GpuPool",
    doc = "A class of GPU agents: the pod template the operator creates agents from, and how far the pool may grow and shrink.",
    category = "cotenant",
    status = "GpuPoolStatus",
    printcolumn = r#"{"name":"Agents","type":"integer","jsonPath":".status.agents","description":"Agent pods that exist"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyAgents","description":"Agents serving"}"#,
    printcolumn = r#"{"name":"Pending","type":"integer","jsonPath":".status.pendingAgents","description":"Agent pods waiting for a node"}"#,
    printcolumn = r#"{"name":"Min","type":"integer","jsonPath":".spec.minAgents"}"#,
    printcolumn = r#"{"name":"Max","type":"integer","jsonPath":".spec.maxAgents"}"#,
    printcolumn = r#"{"name":"Namespace","type":"string","jsonPath":".spec.agentNamespace","priority":1,"description":"Namespace of the agents"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self.minAgents <= self.maxAgents",
    "message": "minAgents must be less than or equal to maxAgents",
    "fieldPath": ".minAgents",
    "reason": "FieldValueInvalid"
}]))]
pub struct GpuPoolSpec {
    /// Namespace in which the agent pods and their GpuAgent objects live.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub agent_namespace: String,
    /// Fewest agents kept running, even when idle, in [0, 10000].
    #[serde(default)]
    #[schemars(range(min = 0, max = 10000))]
    pub min_agents: u32,
    /// Most agents the pool may grow to, in [0, 10000]; must be at least minAgents.
    #[serde(default = "default_max_agents")]
    #[schemars(range(min = 0, max = 10000))]
    pub max_agents: u32,
    /// How long an agent must be idle before it is drained and removed, in seconds (at most a day).
    #[serde(default = "default_scale_down_delay")]
    #[schemars(range(min = 0, max = 86400))]
    pub scale_down_delay_seconds: u32,
    /// Memory of one GPU in MiB, used to plan placements before any agent has reported its device.
    #[serde(
        default,
        rename = "gpuMemoryMiB",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1, max = 16777216))]
    pub gpu_memory_mib: Option<u64>,
    /// How agent pods are made.
    pub template: AgentTemplate,
}

fn default_max_agents() -> u32 {
    8
}
fn default_scale_down_delay() -> u32 {
    300
}

/// The pod template for agents of a pool.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentTemplate {
    /// Container image of the agent.
    #[schemars(length(min = 1, max = 1024))]
    pub image: String,
    /// When to pull the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// ServiceAccount the agent pods run as.
    #[serde(default = "default_service_account")]
    #[schemars(length(min = 1, max = 253))]
    pub service_account_name: String,
    /// GPUs (`nvidia.com/gpu`) each agent pod requests, in [1, 16].
    #[serde(default = "default_gpus_per_agent")]
    #[schemars(range(min = 1, max = 16))]
    pub gpus_per_agent: u32,
    /// Node labels an agent pod requires, typically those of GPU nodes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Taints agent pods tolerate, typically the GPU nodes' taint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// RuntimeClass of agent pods (for example `nvidia`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class_name: Option<String>,
    /// PriorityClass of agent pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// CPU and memory of the agent container; the GPU request is added from gpusPerAgent. Every
    /// agent gets a memory limit, so no tenant's model can take the node's memory: `limits.memory`
    /// when set, else the memory request, else 16Gi.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

fn default_service_account() -> String {
    "cotenant-agent".to_string()
}
fn default_gpus_per_agent() -> u32 {
    1
}

/// Image pull policy of a container.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum PullPolicy {
    /// Pull on every start.
    Always,
    /// Pull when the node lacks the image.
    IfNotPresent,
    /// Never pull.
    Never,
}

/// What the operator observed of a pool.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuPoolStatus {
    /// Agent pods that exist.
    #[serde(default)]
    pub agents: u32,
    /// Agents that report themselves ready.
    #[serde(default)]
    pub ready_agents: u32,
    /// Agent pods waiting for a node (the cluster autoscaler's cue to add GPU nodes).
    #[serde(default)]
    pub pending_agents: u32,
    /// Standard conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
