//! `GpuPool`: a class of GPU agents, the way a StorageClass is a class of volumes.

use crate::common::Condition;
use k8s_openapi::api::core::v1::{
    Affinity, EnvVar, LocalObjectReference, ResourceRequirements, Toleration, Volume, VolumeMount,
};
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
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "self.minAgents <= self.maxAgents",
        "message": "minAgents must be less than or equal to maxAgents",
        "fieldPath": ".minAgents",
        "reason": "FieldValueInvalid"
    },
    {
        "rule": "!has(self.agent) || !has(self.agent.device) || self.agent.device != 'cuda' || self.template.gpusPerAgent >= 1",
        "message": "agent.device cuda needs a GPU: set template.gpusPerAgent to at least 1, or use device cpu for a CPU-only pool",
        "fieldPath": ".agent.device",
        "reason": "FieldValueInvalid"
    },
    {
        "rule": "!has(self.agent) || !has(self.agent.device) || self.agent.device != 'cpu' || self.template.gpusPerAgent == 0",
        "message": "agent.device cpu would hold GPUs it never uses: set template.gpusPerAgent to 0 for a CPU-only pool",
        "fieldPath": ".agent.device",
        "reason": "FieldValueInvalid"
    }
]))]
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
    /// How the agent program in those pods runs.
    #[serde(default, skip_serializing_if = "AgentSettings::is_default")]
    pub agent: AgentSettings,
}

fn default_max_agents() -> u32 {
    8
}
fn default_scale_down_delay() -> u32 {
    300
}

/// Environment variables the operator sets on every agent; a template may not set them.
pub const RESERVED_ENV: [&str; 8] = [
    "POD_NAME",
    "POD_NAMESPACE",
    "NODE_NAME",
    "POD_IP",
    "COTENANT_REPORT_READER",
    "COTENANT_REPORT_AUDIENCE",
    "COTENANT_MODEL_ROOTS",
    "COTENANT_TENANT_MEMORY_LIMIT",
];

/// Pod labels the operator sets on every agent (its NetworkPolicy, its watches and the pool's
/// garbage collection select on them); a template may not set them.
pub const RESERVED_LABELS: [&str; 3] = [
    "app.kubernetes.io/name",
    "app.kubernetes.io/managed-by",
    "cotenant.dev/pool",
];

/// The volume and mount path of the agent's scratch space, which the operator adds.
pub const SCRATCH_VOLUME: &str = "tmp";
pub const SCRATCH_PATH: &str = "/tmp";

/// The pod template for agents of a pool.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!has(self.volumeMounts) || self.volumeMounts.all(m, has(self.volumes) && self.volumes.exists(v, v.name == m.name))",
        "message": "every volumeMounts entry must name a volume in volumes",
        "fieldPath": ".volumeMounts",
        "reason": "FieldValueInvalid"
    },
    {
        "rule": "!has(self.modelMounts) || self.modelMounts.all(m, has(self.volumes) && self.volumes.exists(v, v.name == m.name))",
        "message": "every modelMounts entry must name a volume in volumes",
        "fieldPath": ".modelMounts",
        "reason": "FieldValueInvalid"
    }
]))]
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
    /// GPUs (`nvidia.com/gpu`) each agent pod requests: 1, or 0 for a CPU-only pool, whose agents
    /// request and tolerate no GPU and compute on the CPU. An agent computes on one GPU.
    #[serde(default = "default_gpus_per_agent")]
    #[schemars(range(min = 0, max = 1))]
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
    /// Node affinity, and pod (anti-)affinity, of agent pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Secrets in the agent namespace to pull the image with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// Labels added to agent pods (`app.kubernetes.io/name`, `app.kubernetes.io/managed-by` and
    /// `cotenant.dev/pool` are the operator's).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "!('app.kubernetes.io/name' in self) && !('app.kubernetes.io/managed-by' in self) && !('cotenant.dev/pool' in self)",
        "message": "podLabels may not set app.kubernetes.io/name, app.kubernetes.io/managed-by or cotenant.dev/pool: the operator selects agent pods by them",
        "reason": "FieldValueForbidden"
    }]))]
    pub pod_labels: BTreeMap<String, String>,
    /// Annotations added to agent pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_annotations: BTreeMap<String, String>,
    /// Environment variables of the agent container (for example `COTENANT_LOG`). The names the
    /// operator sets (the pod's identity, `COTENANT_REPORT_*`, `COTENANT_MODEL_ROOTS`,
    /// `COTENANT_TENANT_MEMORY_LIMIT`) are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), transform = bounded_item_strings)]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self.all(e, !(e.name in ['POD_NAME', 'POD_NAMESPACE', 'NODE_NAME', 'POD_IP', 'COTENANT_REPORT_READER', 'COTENANT_REPORT_AUDIENCE', 'COTENANT_MODEL_ROOTS', 'COTENANT_TENANT_MEMORY_LIMIT']))",
        "message": "env may not set POD_NAME, POD_NAMESPACE, NODE_NAME, POD_IP, COTENANT_REPORT_READER, COTENANT_REPORT_AUDIENCE, COTENANT_MODEL_ROOTS or COTENANT_TENANT_MEMORY_LIMIT: the operator sets them (agent settings go in spec.agent)",
        "reason": "FieldValueForbidden"
    }]))]
    pub env: Vec<EnvVar>,
    /// Volumes of agent pods: model volumes (a PersistentVolumeClaim, an NFS share, an image
    /// volume) and anything `volumeMounts` needs. `hostPath` is refused (agent pods meet the
    /// restricted Pod Security Standard), and so is the name `tmp` (the agent's scratch space).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), transform = bounded_item_strings)]
    #[schemars(extend("x-kubernetes-validations" = [
        {
            "rule": "self.all(v, !has(v.hostPath))",
            "message": "hostPath volumes are not allowed: agent pods meet the restricted Pod Security Standard",
            "reason": "FieldValueForbidden"
        },
        {
            "rule": "self.all(v, v.name != 'tmp')",
            "message": "the volume name tmp is the agent's scratch space, which the operator adds",
            "reason": "FieldValueInvalid"
        }
    ]))]
    pub volumes: Vec<Volume>,
    /// Volumes mounted in the agent container for its own use (certificates, configuration).
    /// Models are not read from them; see `modelMounts`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), transform = bounded_item_strings)]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self.all(m, m.mountPath != '/tmp')",
        "message": "/tmp is the agent's scratch space, which the operator mounts",
        "reason": "FieldValueInvalid"
    }]))]
    pub volume_mounts: Vec<VolumeMount>,
    /// Volumes holding models, mounted read-only: a tenant's `file:///` URI must name a file
    /// under one of these mount paths, and no other path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8), transform = bounded_item_strings)]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self.all(m, m.mountPath.startsWith('/') && m.mountPath != '/' && m.mountPath != '/tmp' && !m.mountPath.contains(':'))",
        "message": "a model mount path must be absolute, not / or /tmp, and without ':'",
        "reason": "FieldValueInvalid"
    }]))]
    pub model_mounts: Vec<VolumeMount>,
}

/// Bounds the `name` and `mountPath` of a list's items (a volume's name is a DNS label, a
/// mount path a file path), which Kubernetes' own schemas leave unbounded: the API server prices
/// CEL rules by the longest string they may meet, and the rules above compare these.
fn bounded_item_strings(schema: &mut schemars::Schema) {
    let Some(properties) = schema
        .get_mut("items")
        .and_then(|items| items.get_mut("properties"))
        .and_then(|p| p.as_object_mut())
    else {
        return;
    };
    for (key, max) in [("name", 253), ("mountPath", 4096)] {
        if let Some(field) = properties.get_mut(key).and_then(|f| f.as_object_mut()) {
            field.insert("maxLength".into(), max.into());
        }
    }
}

/// How the agent program of a pool runs: what the operator passes to every agent it creates.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentSettings {
    /// How the tenants of an agent share its device: `multi-stream` (every instance issues
    /// freely), `sequential` (one operator at a time across tenants) or `gacer` (operators
    /// resized and ordered by a searched plan).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<AgentSchedule>,
    /// Where tenants compute: `cuda` (the GPU, or the pod is not Ready with the reason), `cpu`, or
    /// `auto` (the GPU when usable, else the CPU). Default: `cuda` when the pool requests GPUs,
    /// else `cpu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<AgentDevice>,
    /// CPU threads an agent's tenants share, in [1, 1024]. Default: the CPUs the container may
    /// use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub threads: Option<u32>,
    /// TF32 tensor-core math for matrix products on the GPU (faster, about 1e-3 relative error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tf32: Option<bool>,
    /// Device memory each tenant may hold on the GPU, in MiB: its weights once (shared by its
    /// instances) plus every instance's activations. Default: no cap.
    #[serde(
        default,
        rename = "deviceMemoryPerTenantMiB",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1, max = 16777216))]
    pub device_memory_per_tenant_mib: Option<u64>,
    /// Host memory one tenant's model may hold (weights plus the activations of its largest
    /// batch), as bytes or with a suffix (`512Mi`, `4Gi`). Default: 4Gi.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[1-9][0-9]{0,15}(Ki|Mi|Gi|Ti|k|M|G|T)?$"))]
    pub tenant_memory_limit: Option<String>,
    /// Seconds an agent keeps serving after it is told to stop, while it reports itself not
    /// ready, so its tenants' endpoints drop it before it stops accepting; in [0, 300]. The pod's
    /// termination grace period is this plus 20 s (at least 30 s). Default: 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 300))]
    pub drain_seconds: Option<u32>,
}

impl AgentSettings {
    fn is_default(&self) -> bool {
        self == &AgentSettings::default()
    }
}

/// How the tenants of an agent share its device.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum AgentSchedule {
    /// Every instance issues freely.
    #[serde(rename = "multi-stream")]
    MultiStream,
    /// One operator at a time across tenants.
    #[serde(rename = "sequential")]
    Sequential,
    /// Operators resized and ordered by a searched GACER plan.
    #[serde(rename = "gacer")]
    Gacer,
}

impl AgentSchedule {
    /// The agent's `--schedule` value.
    pub fn flag(self) -> &'static str {
        match self {
            AgentSchedule::MultiStream => "multi-stream",
            AgentSchedule::Sequential => "sequential",
            AgentSchedule::Gacer => "gacer",
        }
    }
}

/// Where an agent's tenants compute.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum AgentDevice {
    /// The GPU, or not Ready with the reason.
    #[serde(rename = "cuda")]
    Cuda,
    /// The CPU.
    #[serde(rename = "cpu")]
    Cpu,
    /// The GPU when usable, else the CPU.
    #[serde(rename = "auto")]
    Auto,
}

impl AgentDevice {
    /// The agent's `--device` value.
    pub fn flag(self) -> &'static str {
        match self {
            AgentDevice::Cuda => "cuda",
            AgentDevice::Cpu => "cpu",
            AgentDevice::Auto => "auto",
        }
    }
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
