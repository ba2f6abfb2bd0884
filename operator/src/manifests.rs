//! The objects the operator creates: agent pods and their GpuAgents (from a pool's template),
//! and each tenant's Service and EndpointSlices.

use crate::decide::Route;
use cotenant_crds::{GpuAgent, GpuAgentSpec, GpuPool, ModelTenant};
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
/// The port agents serve the Open Inference Protocol on.
pub const HTTP_PORT: i32 = 8000;
pub const ADMIN_PORT: i32 = 8002;
/// Memory limit of an agent container whose pool sets neither a memory limit nor a request.
pub const DEFAULT_AGENT_MEMORY_LIMIT: &str = "16Gi";
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

/// The agent container's resources: the template's, its GPUs, and a memory limit (the
/// template's, else its memory request, else [`DEFAULT_AGENT_MEMORY_LIMIT`]), so a tenant's
/// model cannot take the node's memory.
fn agent_resources(pool: &GpuPool) -> ResourceRequirements {
    let t = &pool.spec.template;
    let mut resources: ResourceRequirements = t.resources.clone().unwrap_or_default();
    let gpus = Quantity(t.gpus_per_agent.to_string());
    let requests = resources.requests.get_or_insert_with(BTreeMap::new);
    requests.insert("nvidia.com/gpu".into(), gpus.clone());
    let memory = requests
        .get("memory")
        .cloned()
        .unwrap_or_else(|| Quantity(DEFAULT_AGENT_MEMORY_LIMIT.into()));
    let limits = resources.limits.get_or_insert_with(BTreeMap::new);
    limits.insert("nvidia.com/gpu".into(), gpus);
    limits.entry("memory".into()).or_insert(memory);
    resources
}

/// An agent pod of `pool` named `name`, owned by the pool so deleting the pool removes it.
/// `report_reader` is the operator's ServiceAccount user name, the only reader of `/report`,
/// with tokens for `report_audience`. It meets the `restricted` Pod Security Standard.
pub fn agent_pod(pool: &GpuPool, name: &str, report_reader: &str, report_audience: &str) -> Pod {
    let t = &pool.spec.template;
    let pool_name = pool.name_any();
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
            labels: Some(labels(&[
                ("app.kubernetes.io/name", "cotenant-agent"),
                ("app.kubernetes.io/managed-by", MANAGED_BY),
                (POOL_LABEL, &pool_name),
            ])),
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
            volumes: Some(vec![Volume {
                name: "tmp".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            }]),
            node_selector: (!t.node_selector.is_empty()).then(|| t.node_selector.clone()),
            tolerations: Some(gpu_tolerations(&t.tolerations)),
            runtime_class_name: t.runtime_class_name.clone(),
            priority_class_name: t.priority_class_name.clone(),
            termination_grace_period_seconds: Some(30),
            containers: vec![Container {
                name: "agent".into(),
                image: Some(t.image.clone()),
                image_pull_policy: t.image_pull_policy.map(|p| format!("{p:?}")),
                // A GPU pool's agent uses its GPU or fails loudly, never the CPU instead.
                args: Some(vec![
                    "kubernetes".into(),
                    "--log-json".into(),
                    "--device".into(),
                    "cuda".into(),
                ]),
                env: Some(vec![
                    field_env("POD_NAME", "metadata.name"),
                    field_env("POD_NAMESPACE", "metadata.namespace"),
                    field_env("NODE_NAME", "spec.nodeName"),
                    field_env("POD_IP", "status.podIP"),
                    EnvVar {
                        name: "COTENANT_REPORT_READER".into(),
                        value: Some(report_reader.into()),
                        ..Default::default()
                    },
                    EnvVar {
                        name: "COTENANT_REPORT_AUDIENCE".into(),
                        value: Some(report_audience.into()),
                        ..Default::default()
                    },
                ]),
                ports: Some(vec![
                    ContainerPort {
                        name: Some("http".into()),
                        container_port: HTTP_PORT,
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
                volume_mounts: Some(vec![VolumeMount {
                    name: "tmp".into(),
                    mount_path: "/tmp".into(),
                    ..Default::default()
                }]),
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
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: HTTP_PORT,
                target_port: Some(IntOrString::Int(HTTP_PORT)),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// The EndpointSlices of `tenant`: one per port its agents serve on (all agents use the same
/// port in a cluster; host-process agents in tests differ), named `<tenant>-<port>`.
pub fn endpoint_slices(tenant: &ModelTenant, routes: &[Route]) -> Vec<EndpointSlice> {
    let mut by_port: BTreeMap<u16, Vec<&Route>> = BTreeMap::new();
    for r in routes {
        by_port.entry(r.port).or_default().push(r);
    }
    by_port
        .into_iter()
        .map(|(port, routes)| {
            let v6 = routes.iter().any(|r| r.host.contains(':'));
            EndpointSlice {
                metadata: ObjectMeta {
                    name: Some(format!("{}-{port}", tenant.name_any())),
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
                ports: Some(vec![EndpointPort {
                    name: Some("http".into()),
                    port: Some(port as i32),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                }]),
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
