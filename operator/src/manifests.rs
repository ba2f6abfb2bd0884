//! The objects the operator creates: agent pods and their GpuAgents (from a pool's template),
//! and each tenant's Service and EndpointSlices.

use crate::decide::Route;
use cotenant_crds::{
    AgentDevice, AgentSchedule, GpuAgent, GpuAgentSpec, GpuPool, ModelTenant, RESERVED_ENV,
    RESERVED_LABELS, SCRATCH_PATH, SCRATCH_VOLUME,
};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, ObjectFieldSelector, Pod, PodSecurityContext, PodSpec, Probe,
    ResourceRequirements, SeccompProfile, SecurityContext, Service, ServicePort, ServiceSpec,
    Toleration, Volume, VolumeMount,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};
use std::collections::BTreeMap;

pub const POOL_LABEL: &str = "cotenant.dev/pool";
pub const TENANT_LABEL: &str = "cotenant.dev/tenant";
pub const MANAGED_BY: &str = "cotenant-operator";
/// Annotation on a GpuAgent that the operator is draining it.
pub const DRAINING: &str = "cotenant.dev/draining";
/// Annotation on an agent pod: the version of its pool's template and agent settings it was
/// made from ([`template_hash`]). A pod whose value differs from the pool's is replaced.
pub const TEMPLATE_HASH: &str = "cotenant.dev/template-hash";
/// The port agents serve the Open Inference Protocol on.
pub const HTTP_PORT: i32 = 8000;
/// The port agents serve the Open Inference Protocol over gRPC on.
pub const GRPC_PORT: i32 = 8001;
pub const ADMIN_PORT: i32 = 8002;
/// Memory limit of an agent container whose pool sets neither a memory limit nor a request.
pub const DEFAULT_AGENT_MEMORY_LIMIT: &str = "16Gi";
/// The agent's `--drain-seconds` when the pool does not set it.
const DEFAULT_DRAIN_SECONDS: u32 = 10;
/// The user the images run as (see the Dockerfile).
const NONROOT_UID: i64 = 65532;

/// `object` as the controlling owner, without `blockOwnerDeletion`: setting that needs
/// `update` on the owner's `finalizers` subresource where OwnerReferencesPermissionEnforcement
/// is on, a right the operator does not need otherwise (its own finalizer does the cleanup).
fn owner<K: Resource<DynamicType = ()>>(object: &K) -> Option<Vec<OwnerReference>> {
    object.controller_owner_ref(&()).map(|mut o| {
        o.block_owner_deletion = None;
        vec![o]
    })
}

/// `ip:port`, with brackets around an IPv6 address.
pub fn host_port(ip: &str, port: u16) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The agent container's resources: the template's, its GPUs (none in a CPU-only pool), and a
/// memory limit (the template's, else its memory request, else [`DEFAULT_AGENT_MEMORY_LIMIT`]),
/// so a tenant's model cannot take the node's memory.
fn agent_resources(pool: &GpuPool) -> ResourceRequirements {
    let t = &pool.spec.template;
    let mut resources: ResourceRequirements = t.resources.clone().unwrap_or_default();
    let gpus = (t.gpus_per_agent > 0).then(|| Quantity(t.gpus_per_agent.to_string()));
    let requests = resources.requests.get_or_insert_with(BTreeMap::new);
    requests.remove("nvidia.com/gpu");
    if let Some(gpus) = &gpus {
        requests.insert("nvidia.com/gpu".into(), gpus.clone());
    }
    let memory = requests
        .get("memory")
        .cloned()
        .unwrap_or_else(|| Quantity(DEFAULT_AGENT_MEMORY_LIMIT.into()));
    let limits = resources.limits.get_or_insert_with(BTreeMap::new);
    limits.remove("nvidia.com/gpu");
    if let Some(gpus) = gpus {
        limits.insert("nvidia.com/gpu".into(), gpus);
    }
    limits.entry("memory".into()).or_insert(memory);
    resources
}

/// Where a pool's agents compute: the pool's choice, else the GPU when it requests one and the
/// CPU when it does not.
pub fn agent_device(pool: &GpuPool) -> AgentDevice {
    pool.spec
        .agent
        .device
        .unwrap_or(if pool.spec.template.gpus_per_agent > 0 {
            AgentDevice::Cuda
        } else {
            AgentDevice::Cpu
        })
}

/// The agent's command line from the pool's typed settings. A GPU pool's agent uses its GPU or
/// fails loudly (not Ready, with the reason), never the CPU instead, unless the pool says `auto`.
fn agent_args(pool: &GpuPool) -> Vec<String> {
    let settings = &pool.spec.agent;
    let mut args: Vec<String> = vec![
        "kubernetes".into(),
        "--log-json".into(),
        "--device".into(),
        agent_device(pool).flag().into(),
        "--schedule".into(),
        settings
            .schedule
            .unwrap_or(AgentSchedule::MultiStream)
            .flag()
            .into(),
    ];
    if let Some(threads) = settings.threads {
        args.extend(["--threads".into(), threads.to_string()]);
    }
    if settings.tf32 == Some(true) {
        args.push("--tf32".into());
    }
    if let Some(mib) = settings.device_memory_per_tenant_mib {
        args.extend(["--device-memory-per-tenant-mib".into(), mib.to_string()]);
    }
    if let Some(limit) = &settings.tenant_memory_limit {
        args.extend(["--tenant-memory-limit".into(), limit.clone()]);
    }
    if let Some(seconds) = settings.drain_seconds {
        args.extend(["--drain-seconds".into(), seconds.to_string()]);
    }
    for mount in &pool.spec.template.model_mounts {
        args.extend(["--model-root".into(), mount.mount_path.clone()]);
    }
    args
}

/// The agent's environment: its identity from the downward API, who may read `/report`, then
/// the template's variables (the names the operator sets are refused at admission, and dropped
/// here too).
fn agent_env(pool: &GpuPool, report_reader: &str, report_audience: &str) -> Vec<EnvVar> {
    let value = |name: &str, value: &str| EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    };
    let mut env = vec![
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        field_env("NODE_NAME", "spec.nodeName"),
        field_env("POD_IP", "status.podIP"),
        value("COTENANT_REPORT_READER", report_reader),
        value("COTENANT_REPORT_AUDIENCE", report_audience),
    ];
    env.extend(
        pool.spec
            .template
            .env
            .iter()
            .filter(|e| !RESERVED_ENV.contains(&e.name.as_str()))
            .cloned(),
    );
    env
}

/// The pod's volumes: the agent's scratch space, then the template's.
fn agent_volumes(pool: &GpuPool) -> Vec<Volume> {
    let mut volumes = vec![Volume {
        name: SCRATCH_VOLUME.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    }];
    volumes.extend(
        pool.spec
            .template
            .volumes
            .iter()
            .filter(|v| v.name != SCRATCH_VOLUME && v.host_path.is_none())
            .cloned(),
    );
    volumes
}

/// The container's mounts: scratch space on `/tmp`, the template's own mounts, and its model
/// mounts, always read-only.
fn agent_mounts(pool: &GpuPool) -> Vec<VolumeMount> {
    let t = &pool.spec.template;
    let mut mounts = vec![VolumeMount {
        name: SCRATCH_VOLUME.into(),
        mount_path: SCRATCH_PATH.into(),
        ..Default::default()
    }];
    mounts.extend(
        t.volume_mounts
            .iter()
            .filter(|m| m.mount_path != SCRATCH_PATH)
            .cloned(),
    );
    mounts.extend(t.model_mounts.iter().map(|m| VolumeMount {
        read_only: Some(true),
        ..m.clone()
    }));
    mounts
}

/// A digest of what an agent pod is made from: the pool's template and agent settings.
pub fn template_hash(pool: &GpuPool) -> String {
    use sha2::{Digest, Sha256};
    let made_from = serde_json::json!({ "template": pool.spec.template, "agent": pool.spec.agent });
    let digest = Sha256::digest(made_from.to_string().as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// The pod's annotations: the template's, then the version of the template it is made from.
fn agent_annotations(pool: &GpuPool) -> BTreeMap<String, String> {
    let mut all = pool.spec.template.pod_annotations.clone();
    all.insert(TEMPLATE_HASH.into(), template_hash(pool));
    all
}

/// The pod's labels: the template's, then the operator's, which win.
fn agent_labels(pool: &GpuPool) -> BTreeMap<String, String> {
    let pool_name = pool.name_any();
    let mut all: BTreeMap<String, String> = pool
        .spec
        .template
        .pod_labels
        .iter()
        .filter(|(k, _)| !RESERVED_LABELS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    all.extend(labels(&[
        ("app.kubernetes.io/name", "cotenant-agent"),
        ("app.kubernetes.io/managed-by", MANAGED_BY),
        (POOL_LABEL, &pool_name),
    ]));
    all
}

/// An agent pod of `pool` named `name`, owned by the pool so deleting the pool removes it.
/// `report_reader` is the operator's ServiceAccount user name, the only reader of `/report`,
/// with tokens for `report_audience`. It meets the `restricted` Pod Security Standard.
pub fn agent_pod(pool: &GpuPool, name: &str, report_reader: &str, report_audience: &str) -> Pod {
    let t = &pool.spec.template;
    let runtime_default = || {
        Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..Default::default()
        })
    };
    let probe = |path: &str, period: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("http".into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        ..Default::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(pool.spec.agent_namespace.clone()),
            labels: Some(agent_labels(pool)),
            annotations: Some(agent_annotations(pool)),
            owner_references: owner(pool),
            ..Default::default()
        },
        spec: Some(PodSpec {
            service_account_name: Some(t.service_account_name.clone()),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(NONROOT_UID),
                run_as_group: Some(NONROOT_UID),
                seccomp_profile: runtime_default(),
                ..Default::default()
            }),
            // The root filesystem is read-only: scratch space (downloads, the PTX cache) is here.
            volumes: Some(agent_volumes(pool)),
            node_selector: (!t.node_selector.is_empty()).then(|| t.node_selector.clone()),
            tolerations: Some(if t.gpus_per_agent > 0 {
                gpu_tolerations(&t.tolerations)
            } else {
                t.tolerations.clone()
            }),
            affinity: t.affinity.clone(),
            image_pull_secrets: (!t.image_pull_secrets.is_empty())
                .then(|| t.image_pull_secrets.clone()),
            runtime_class_name: t.runtime_class_name.clone(),
            priority_class_name: t.priority_class_name.clone(),
            // Time to drain, then to finish the requests accepted meanwhile.
            termination_grace_period_seconds: Some(
                (i64::from(
                    pool.spec
                        .agent
                        .drain_seconds
                        .unwrap_or(DEFAULT_DRAIN_SECONDS),
                ) + 20)
                    .max(30),
            ),
            containers: vec![Container {
                name: "agent".into(),
                image: Some(t.image.clone()),
                image_pull_policy: t.image_pull_policy.map(|p| format!("{p:?}")),
                args: Some(agent_args(pool)),
                env: Some(agent_env(pool, report_reader, report_audience)),
                ports: Some(vec![
                    ContainerPort {
                        name: Some("http".into()),
                        container_port: HTTP_PORT,
                        ..Default::default()
                    },
                    ContainerPort {
                        name: Some("grpc".into()),
                        container_port: GRPC_PORT,
                        ..Default::default()
                    },
                    ContainerPort {
                        name: Some("admin".into()),
                        container_port: ADMIN_PORT,
                        ..Default::default()
                    },
                ]),
                resources: Some(agent_resources(pool)),
                readiness_probe: Some(probe("/v2/health/ready", 5)),
                liveness_probe: Some(probe("/v2/health/live", 10)),
                security_context: Some(SecurityContext {
                    run_as_non_root: Some(true),
                    allow_privilege_escalation: Some(false),
                    privileged: Some(false),
                    read_only_root_filesystem: Some(true),
                    capabilities: Some(Capabilities {
                        drop: Some(vec!["ALL".into()]),
                        ..Default::default()
                    }),
                    seccomp_profile: runtime_default(),
                    ..Default::default()
                }),
                volume_mounts: Some(agent_mounts(pool)),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

/// The template's tolerations plus the `nvidia.com/gpu` taint GPU node pools carry: an agent
/// asks for a GPU, so it must be allowed where GPUs are (what the ExtendedResourceToleration
/// admission plugin would add).
fn gpu_tolerations(template: &[Toleration]) -> Vec<Toleration> {
    let mut all = template.to_vec();
    if !all
        .iter()
        .any(|t| t.key.as_deref() == Some("nvidia.com/gpu"))
    {
        all.push(Toleration {
            key: Some("nvidia.com/gpu".into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        });
    }
    all
}

/// The GpuAgent of an agent pod, owned by the pod so it goes when the pod goes.
pub fn gpu_agent(pool: &GpuPool, pod: &Pod) -> GpuAgent {
    let mut agent = GpuAgent::new(
        &pod.name_any(),
        GpuAgentSpec {
            pool: pool.name_any(),
            assignments: Vec::new(),
        },
    );
    agent.metadata.namespace = pod.namespace();
    agent.metadata.labels = Some(labels(&[
        ("app.kubernetes.io/managed-by", MANAGED_BY),
        (POOL_LABEL, &pool.name_any()),
    ]));
    agent.metadata.owner_references = owner(pod);
    agent
}

/// The Service clients use for `tenant`: no selector; the operator keeps its EndpointSlices.
pub fn service(tenant: &ModelTenant) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(tenant.name_any()),
            namespace: tenant.namespace(),
            labels: Some(labels(&[
                ("app.kubernetes.io/managed-by", MANAGED_BY),
                (TENANT_LABEL, &tenant.name_any()),
            ])),
            owner_references: owner(tenant),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            ports: Some(vec![
                ServicePort {
                    name: Some("http".into()),
                    port: HTTP_PORT,
                    target_port: Some(IntOrString::Int(HTTP_PORT)),
                    protocol: Some("TCP".into()),
                    app_protocol: Some("http".into()),
                    ..Default::default()
                },
                ServicePort {
                    name: Some("grpc".into()),
                    port: GRPC_PORT,
                    target_port: Some(IntOrString::Int(GRPC_PORT)),
                    protocol: Some("TCP".into()),
                    app_protocol: Some("grpc".into()),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }),
        status: None,
    }
}

/// The EndpointSlices of `tenant`: one per pair of ports its agents serve on (all agents use
/// the same ports in a cluster; host-process agents in tests differ), named `<tenant>-<port>`,
/// or `<tenant>-<port>-<grpc port>` for agents that serve gRPC too.
pub fn endpoint_slices(tenant: &ModelTenant, routes: &[Route]) -> Vec<EndpointSlice> {
    let mut by_ports: BTreeMap<(u16, Option<u16>), Vec<&Route>> = BTreeMap::new();
    for r in routes {
        by_ports.entry((r.port, r.grpc_port)).or_default().push(r);
    }
    by_ports
        .into_iter()
        .map(|((port, grpc_port), routes)| {
            let name = match grpc_port {
                Some(grpc) => format!("{}-{port}-{grpc}", tenant.name_any()),
                None => format!("{}-{port}", tenant.name_any()),
            };
            let endpoint_port = |name: &str, port: u16, app_protocol: &str| EndpointPort {
                name: Some(name.into()),
                port: Some(port.into()),
                protocol: Some("TCP".into()),
                app_protocol: Some(app_protocol.into()),
            };
            let mut ports = vec![endpoint_port("http", port, "http")];
            ports.extend(grpc_port.map(|grpc| endpoint_port("grpc", grpc, "grpc")));
            let v6 = routes.iter().any(|r| r.host.contains(':'));
            EndpointSlice {
                metadata: ObjectMeta {
                    name: Some(name),
                    namespace: tenant.namespace(),
                    labels: Some(labels(&[
                        ("kubernetes.io/service-name", &tenant.name_any()),
                        ("endpointslice.kubernetes.io/managed-by", "cotenant.dev"),
                        (TENANT_LABEL, &tenant.name_any()),
                    ])),
                    owner_references: owner(tenant),
                    ..Default::default()
                },
                address_type: if v6 { "IPv6" } else { "IPv4" }.into(),
                endpoints: routes
                    .iter()
                    .filter(|r| r.host.contains(':') == v6)
                    .map(|r| Endpoint {
                        addresses: vec![r.host.clone()],
                        conditions: Some(EndpointConditions {
                            ready: Some(true),
                            serving: Some(true),
                            terminating: Some(false),
                        }),
                        node_name: r.node.clone(),
                        ..Default::default()
                    })
                    .collect(),
                ports: Some(ports),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(template: serde_json::Value) -> GpuPool {
        let spec = serde_json::from_value(serde_json::json!({
            "agentNamespace": "agents", "template": template
        }))
        .expect("pool");
        let mut pool = GpuPool::new("gpus", spec);
        pool.metadata.uid = Some("pool-uid".into());
        pool
    }

    fn container(pod: &Pod) -> &Container {
        &pod.spec.as_ref().expect("spec").containers[0]
    }

    #[test]
    fn an_agent_pod_meets_the_restricted_pod_security_standard() {
        let pod = agent_pod(&pool(serde_json::json!({"image": "a"})), "a-1", "r", "aud");
        let spec = pod.spec.as_ref().expect("spec");
        let pod_security = spec.security_context.as_ref().expect("pod securityContext");
        assert_eq!(pod_security.run_as_non_root, Some(true));
        assert_eq!(
            pod_security
                .seccomp_profile
                .as_ref()
                .map(|p| p.type_.as_str()),
            Some("RuntimeDefault")
        );
        let security = container(&pod)
            .security_context
            .as_ref()
            .expect("securityContext");
        assert_eq!(security.allow_privilege_escalation, Some(false));
        assert_eq!(security.run_as_non_root, Some(true));
        assert_eq!(security.privileged, Some(false));
        assert_eq!(
            security.capabilities.as_ref().and_then(|c| c.drop.clone()),
            Some(vec!["ALL".to_string()])
        );
        assert_eq!(
            security.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
            Some("RuntimeDefault")
        );
        assert!(spec.host_network.is_none() && spec.host_pid.is_none() && spec.host_ipc.is_none());
        for volume in spec.volumes.iter().flatten() {
            assert!(volume.host_path.is_none(), "{volume:?}");
        }
    }

    fn memory_limit(template: serde_json::Value) -> Option<String> {
        let pod = agent_pod(&pool(template), "a-1", "r", "aud");
        let resources = container(&pod).resources.clone().expect("resources");
        resources
            .limits
            .and_then(|l| l.get("memory").map(|q| q.0.clone()))
    }

    #[test]
    fn an_agent_always_has_a_memory_limit() {
        assert_eq!(
            memory_limit(serde_json::json!({"image": "a"})).as_deref(),
            Some(DEFAULT_AGENT_MEMORY_LIMIT)
        );
        let requested =
            serde_json::json!({"image": "a", "resources": {"requests": {"memory": "8Gi"}}});
        assert_eq!(memory_limit(requested).as_deref(), Some("8Gi"));
        let limited = serde_json::json!({"image": "a", "resources": {
            "requests": {"memory": "8Gi"}, "limits": {"memory": "24Gi"}}});
        assert_eq!(memory_limit(limited).as_deref(), Some("24Gi"));
    }

    fn args(pod: &Pod) -> Vec<String> {
        container(pod).args.clone().expect("args")
    }

    #[test]
    fn a_pool_without_gpus_makes_cpu_agents_that_ask_for_none() {
        let pod = agent_pod(
            &pool(serde_json::json!({"image": "a", "gpusPerAgent": 0})),
            "a-1",
            "r",
            "aud",
        );
        let resources = container(&pod).resources.clone().expect("resources");
        for list in [resources.requests, resources.limits].into_iter().flatten() {
            assert!(!list.contains_key("nvidia.com/gpu"), "{list:?}");
        }
        let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.clone());
        assert_eq!(tolerations, Some(vec![]), "no GPU taint is tolerated");
        assert_eq!(args(&pod)[2..4], ["--device", "cpu"]);
        // A GPU pool's agents use their GPU or fail loudly.
        let gpu = agent_pod(&pool(serde_json::json!({"image": "a"})), "a-1", "r", "aud");
        assert_eq!(args(&gpu)[2..4], ["--device", "cuda"]);
        let limits = container(&gpu).resources.clone().and_then(|r| r.limits);
        assert_eq!(
            limits.and_then(|l| l.get("nvidia.com/gpu").cloned()),
            Some(Quantity("1".into()))
        );
    }

    #[test]
    fn typed_agent_settings_become_the_agents_flags() {
        let mut p = pool(serde_json::json!({"image": "a", "modelMounts": [
            {"name": "models", "mountPath": "/models"}]}));
        p.spec.agent = serde_json::from_value(serde_json::json!({
            "schedule": "gacer", "device": "auto", "threads": 6, "tf32": true,
            "deviceMemoryPerTenantMiB": 2048, "tenantMemoryLimit": "8Gi", "drainSeconds": 40
        }))
        .expect("settings");
        let pod = agent_pod(&p, "a-1", "r", "aud");
        assert_eq!(
            args(&pod).join(" "),
            "kubernetes --log-json --device auto --schedule gacer --threads 6 --tf32 \
             --device-memory-per-tenant-mib 2048 --tenant-memory-limit 8Gi --drain-seconds 40 \
             --model-root /models"
        );
        let grace = pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds);
        assert_eq!(grace, Some(60), "time to drain and to finish");
        let mounts = container(&pod).volume_mounts.clone().expect("mounts");
        let models = mounts
            .iter()
            .find(|m| m.name == "models")
            .expect("model mount");
        assert_eq!(models.read_only, Some(true), "models are mounted read-only");
        let defaults = agent_pod(&pool(serde_json::json!({"image": "a"})), "a-1", "r", "aud");
        assert_eq!(
            args(&defaults).join(" "),
            "kubernetes --log-json --device cuda --schedule multi-stream"
        );
    }

    #[test]
    fn a_template_cannot_take_what_the_operator_sets() {
        // Admission refuses these; the operator does not rely on it.
        let p = pool(serde_json::json!({
            "image": "a",
            "env": [{"name": "POD_IP", "value": "169.254.169.254"},
                    {"name": "COTENANT_MODEL_ROOTS", "value": "/"},
                    {"name": "COTENANT_LOG", "value": "debug"}],
            "podLabels": {"cotenant.dev/pool": "other", "team": "vision"},
            "volumes": [{"name": "tmp", "emptyDir": {}},
                        {"name": "host", "hostPath": {"path": "/"}},
                        {"name": "models", "persistentVolumeClaim": {"claimName": "m"}}],
            "imagePullSecrets": [{"name": "registry"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "gpu", "operator": "In", "values": ["h200"]}]}]}}}
        }));
        let pod = agent_pod(&p, "a-1", "r", "aud");
        let env = container(&pod).env.clone().expect("env");
        let named = |n: &str| env.iter().filter(|e| e.name == n).collect::<Vec<_>>();
        assert!(named("POD_IP")[0].value_from.is_some(), "{env:?}");
        assert_eq!(named("POD_IP").len(), 1);
        assert!(named("COTENANT_MODEL_ROOTS").is_empty());
        assert_eq!(named("COTENANT_LOG")[0].value.as_deref(), Some("debug"));
        let labels = pod.metadata.labels.clone().expect("labels");
        assert_eq!(labels[POOL_LABEL], "gpus");
        assert_eq!(labels["team"], "vision");
        let spec = pod.spec.as_ref().expect("spec");
        let volumes: Vec<&str> = spec
            .volumes
            .iter()
            .flatten()
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(volumes, ["tmp", "models"]);
        assert!(spec.volumes.iter().flatten().all(|v| v.host_path.is_none()));
        assert_eq!(spec.image_pull_secrets.as_ref().map(Vec::len), Some(1));
        assert!(spec.affinity.is_some());
    }

    #[test]
    fn tenants_are_reachable_over_grpc_too() {
        let tenant: ModelTenant = serde_json::from_value(serde_json::json!({
            "apiVersion": "cotenant.dev/v1alpha1", "kind": "ModelTenant",
            "metadata": {"name": "resnet", "namespace": "team", "uid": "u"},
            "spec": {"model": {"uri": "file:///m/r.onnx"},
                     "slo": {"latencyMillis": 50.0, "percentile": 99.0}}
        }))
        .expect("tenant");
        let ports = service(&tenant).spec.and_then(|s| s.ports).expect("ports");
        let grpc = ports.iter().find(|p| p.name.as_deref() == Some("grpc"));
        assert_eq!(
            grpc.map(|p| (p.port, p.app_protocol.as_deref())),
            Some((GRPC_PORT, Some("grpc")))
        );
        let route = |host: &str, grpc_port| Route {
            host: host.into(),
            port: 8000,
            grpc_port,
            node: None,
            agent: host.into(),
        };
        let slices = endpoint_slices(
            &tenant,
            &[route("10.0.0.1", Some(8001)), route("10.0.0.2", None)],
        );
        let summary: Vec<(String, Vec<(String, i32)>)> = slices
            .iter()
            .map(|s| {
                let ports = s.ports.iter().flatten();
                (
                    s.name_any(),
                    ports
                        .map(|p| (p.name.clone().unwrap_or_default(), p.port.unwrap_or(0)))
                        .collect(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                ("resnet-8000".to_string(), vec![("http".to_string(), 8000)]),
                (
                    "resnet-8000-8001".to_string(),
                    vec![("http".to_string(), 8000), ("grpc".to_string(), 8001)]
                ),
            ]
        );
    }

    #[test]
    fn a_pod_records_the_version_of_the_template_it_was_made_from() {
        let mut p = pool(serde_json::json!({"image": "a"}));
        let before = template_hash(&p);
        let pod = agent_pod(&p, "a-1", "r", "aud");
        let annotations = pod.metadata.annotations.clone().expect("annotations");
        assert_eq!(annotations.get(TEMPLATE_HASH), Some(&before));
        p.spec.agent.threads = Some(4);
        assert_ne!(template_hash(&p), before, "agent settings are part of it");
        p.spec.agent.threads = None;
        p.spec.max_agents += 1;
        assert_eq!(template_hash(&p), before, "the pool's size is not");
    }

    #[test]
    fn owner_references_do_not_block_owner_deletion() {
        let pool = pool(serde_json::json!({"image": "a"}));
        let pod = agent_pod(&pool, "a-1", "r", "aud");
        let refs = pod.metadata.owner_references.clone().expect("owned");
        assert_eq!(refs[0].uid, "pool-uid");
        assert_eq!(refs[0].controller, Some(true));
        assert_eq!(refs[0].block_owner_deletion, None);
    }
}
