//! `cotenant-fleet`: many agents in one process, for the operator's scale benchmark
//! (`cargo xtask bench scale`). For every agent pod that kwok runs in `--namespace`, it does
//! what `cotenant-agent` does towards the operator and the API server, and nothing else:
//!
//! - it serves `/report` on a port of its own (the pod's IP is this host's), with synthetic,
//!   self-consistent measurements (`model`), every assignment Ready at its knobs;
//! - it writes the GpuAgent status when the assignments change, never otherwise;
//! - it renews the agent's Lease every 10 s.
//!
//! It loads no model, serves no inference and does not authenticate the operator: it stands in
//! for agents only as the operator sees them. A control port takes agents down:
//! `POST /silence` with agent names, one per line, closes their ports and stops their Leases, as
//! hung agents would. `GET /agents` lists the agents it runs.

mod model;

use axum::Router;
use axum::extract::State;
use axum::routing::{get, post};
use cotenant_crds::conditions::set_condition;
use cotenant_crds::report::{AgentReport, State as ReplicaReport, TenantReport, served_name};
use cotenant_crds::{
    Device, DeviceKind, GpuAgent, GpuAgentStatus, Knobs, LoadedTenant, ReplicaState,
};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use model::Model;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const AGENT_LABEL: &str = "app.kubernetes.io/name=cotenant-agent";
const RENEW: Duration = Duration::from_secs(10);
/// API calls in flight at once, as one agent each makes its own.
const CONCURRENCY: usize = 16;

/// The inference ports the fleet's agents report, as an agent's defaults are.
const INFERENCE_PORT: u16 = 8000;
const GRPC_PORT: u16 = 8001;

struct Agent {
    port: u16,
    server: tokio::task::JoinHandle<()>,
    written: Option<GpuAgentStatus>,
    renewed: Option<Instant>,
}

struct Fleet {
    namespace: String,
    host: String,
    agents_api: Api<GpuAgent>,
    leases: Api<Lease>,
    gpu_agents: Store<GpuAgent>,
    agents: Mutex<HashMap<String, Agent>>,
    silent: Mutex<HashSet<String>>,
    /// Replicas per tenant UID, counted over every GpuAgent's assignments.
    replicas: Mutex<HashMap<String, u32>>,
    /// The knobs each replica (agent, tenant UID) runs, and since when.
    epochs: Mutex<HashMap<(String, String), (Knobs, Instant)>>,
    started: Instant,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let (Some(namespace), Some(host), Some(control)) = (
        flag("--namespace"),
        flag("--host"),
        flag("--control-listen"),
    ) else {
        anyhow::bail!(
            "usage: cotenant-fleet --namespace NS --host POD_IP --control-listen ADDR (KUBECONFIG names the cluster)"
        );
    };
    let client = Client::try_default().await?;
    let fleet = Arc::new(Fleet {
        agents_api: Api::namespaced(client.clone(), &namespace),
        leases: Api::namespaced(client.clone(), &namespace),
        gpu_agents: watch(Api::namespaced(client.clone(), &namespace), None),
        agents: Mutex::new(HashMap::new()),
        silent: Mutex::new(HashSet::new()),
        replicas: Mutex::new(HashMap::new()),
        epochs: Mutex::new(HashMap::new()),
        started: Instant::now(),
        namespace: namespace.clone(),
        host,
    });
    let pods = watch(
        Api::<Pod>::namespaced(client, &namespace),
        Some(AGENT_LABEL),
    );
    let control_app = Router::new()
        .route("/silence", post(silence))
        .route("/agents", get(list_agents))
        .with_state(fleet.clone());
    let listener = tokio::net::TcpListener::bind(&control).await?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, control_app).await;
    });
    eprintln!("cotenant-fleet: agents of namespace {namespace}; control on {control}");
    loop {
        if let Err(e) = fleet.sync(&pods).await {
            eprintln!("cotenant-fleet: {e}");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn watch<K>(api: Api<K>, labels: Option<&str>) -> Store<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync,
    K: 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let config = match labels {
        Some(l) => watcher::Config::default().labels(l),
        None => watcher::Config::default(),
    };
    let stream = reflector::reflector(writer, watcher::watcher(api, config))
        .default_backoff()
        .touched_objects();
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while stream.next().await.is_some() {}
    });
    reader
}

impl Fleet {
    /// One pass: agents for new running pods, none for gone ones, statuses that changed and
    /// Leases that are due.
    async fn sync(self: &Arc<Fleet>, pods: &Store<Pod>) -> anyhow::Result<()> {
        let running: BTreeMap<String, Arc<Pod>> = pods
            .state()
            .into_iter()
            .filter(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            })
            .map(|p| (p.name_any(), p))
            .collect();
        let silent = self.silent.lock().expect("lock").clone();
        {
            let mut agents = self.agents.lock().expect("lock");
            agents.retain(|name, a| {
                let keep = running.contains_key(name) && !silent.contains(name);
                if !keep {
                    a.server.abort();
                }
                keep
            });
        }
        for name in running.keys() {
            let known = self.agents.lock().expect("lock").contains_key(name);
            if !known && !silent.contains(name) {
                let (port, server) = self.serve(name.clone()).await?;
                self.agents.lock().expect("lock").insert(
                    name.clone(),
                    Agent {
                        port,
                        server,
                        written: None,
                        renewed: None,
                    },
                );
            }
        }
        let mut replicas: HashMap<String, u32> = HashMap::new();
        for a in self.gpu_agents.state() {
            for x in &a.spec.assignments {
                *replicas.entry(x.tenant.uid.clone()).or_default() += 1;
            }
        }
        *self.replicas.lock().expect("lock") = replicas;

        // Statuses and Leases, a bounded number of calls at once.
        let work: Vec<(String, Option<GpuAgentStatus>, bool)> = {
            let agents = self.agents.lock().expect("lock");
            agents
                .iter()
                .map(|(name, a)| {
                    let wanted = self
                        .gpu_agents
                        .get(&ObjectRef::new(name).within(&self.namespace))
                        .map(|g| self.status(&g, running.get(name), a.port))
                        .filter(|s| a.written.as_ref() != Some(s));
                    let due = a.renewed.is_none_or(|at| at.elapsed() >= RENEW);
                    (name.clone(), wanted, due)
                })
                .filter(|(_, wanted, due)| wanted.is_some() || *due)
                .collect()
        };
        let results: Vec<(String, Option<GpuAgentStatus>, bool)> = futures::stream::iter(work)
            .map(|(name, wanted, due)| async move {
                let mut written = None;
                if let Some(status) = wanted {
                    // `tenants` always present, so an empty list clears the last one.
                    let mut body = serde_json::to_value(&status).unwrap_or_default();
                    body["tenants"] = serde_json::to_value(&status.tenants).unwrap_or_default();
                    let patch = serde_json::json!({ "status": body });
                    let ok = self
                        .agents_api
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .is_ok();
                    written = ok.then_some(status);
                }
                let renewed = due && self.renew(&name).await.is_ok();
                (name, written, renewed)
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        let mut agents = self.agents.lock().expect("lock");
        for (name, written, renewed) in results {
            if let Some(a) = agents.get_mut(&name) {
                if written.is_some() {
                    a.written = written;
                }
                if renewed {
                    a.renewed = Some(Instant::now());
                }
            }
        }
        Ok(())
    }

    /// Binds a port for agent `name` and serves its `/report` there.
    async fn serve(
        self: &Arc<Fleet>,
        name: String,
    ) -> anyhow::Result<(u16, tokio::task::JoinHandle<()>)> {
        let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await?;
        let port = listener.local_addr()?.port();
        let app = Router::new()
            .route("/report", get(report))
            .with_state((self.clone(), name));
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok((port, server))
    }

    /// What agent `g`, serving its report on `port`, says of itself: every assignment Ready.
    /// It names the inference ports every real agent of a pool shares (nothing answers there:
    /// the operator only routes to them).
    fn status(&self, g: &GpuAgent, pod: Option<&Arc<Pod>>, port: u16) -> GpuAgentStatus {
        let admin_address = format!("{}:{port}", self.host);
        let mut conditions = Vec::new();
        set_condition(
            &mut conditions,
            "Ready",
            true,
            "Settled",
            "serving (cotenant-fleet)",
            g.metadata.generation,
        );
        // The transition time is fixed so that an unchanged status compares equal.
        for c in &mut conditions {
            c.last_transition_time = Timestamp::UNIX_EPOCH.into();
        }
        let tenants: Vec<LoadedTenant> = g
            .spec
            .assignments
            .iter()
            .map(|x| {
                let m = Model::of(&x.tenant.uid);
                LoadedTenant {
                    tenant: x.tenant.clone(),
                    state: ReplicaState::Ready,
                    knobs: Some(x.knobs),
                    weight_bytes: Some(m.weight_bytes()),
                    activation_bytes: Some(m.activation_bytes(x.knobs)),
                    error: None,
                }
            })
            .collect();
        GpuAgentStatus {
            address: Some(format!("{}:{INFERENCE_PORT}", self.host)),
            grpc_address: Some(format!("{}:{GRPC_PORT}", self.host)),
            admin_address: Some(admin_address),
            node: pod.and_then(|p| p.spec.as_ref()?.node_name.clone()),
            device: Some(Device {
                kind: DeviceKind::Sim,
                name: "cotenant-fleet".into(),
                memory_total_bytes: 80 << 30,
                memory_used_bytes: tenants.iter().filter_map(|t| t.weight_bytes).sum(),
            }),
            tenants,
            conditions,
            observed_generation: g.metadata.generation,
        }
    }

    /// Creates or renews agent `name`'s Lease in one server-side apply.
    async fn renew(&self, name: &str) -> kube::Result<Lease> {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/name".to_string(),
                    "cotenant-agent".to_string(),
                )])),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(name.to_string()),
                lease_duration_seconds: Some(40),
                renew_time: Some(MicroTime(Timestamp::now())),
                ..LeaseSpec::default()
            }),
        };
        let params = PatchParams::apply("cotenant-fleet").force();
        self.leases
            .patch(name, &params, &Patch::Apply(&lease))
            .await
    }
}

/// `/report` of one agent: each assignment Ready at its knobs, with its profile.
async fn report(State((fleet, name)): State<(Arc<Fleet>, String)>) -> axum::Json<AgentReport> {
    let t = fleet.started.elapsed().as_secs_f64();
    let replicas = fleet.replicas.lock().expect("lock").clone();
    let tenants = fleet
        .gpu_agents
        .get(&ObjectRef::new(&name).within(&fleet.namespace))
        .map(|g| {
            g.spec
                .assignments
                .iter()
                .map(|x| {
                    let m = Model::of(&x.tenant.uid);
                    let k = x.profile.unwrap_or(Knobs {
                        batch_size: 4,
                        instances: 4,
                    });
                    let count = replicas.get(&x.tenant.uid).copied().unwrap_or(1);
                    let since_s = {
                        let mut epochs = fleet.epochs.lock().expect("lock");
                        let key = (name.clone(), x.tenant.uid.clone());
                        let epoch = epochs.entry(key).or_insert((x.knobs, Instant::now()));
                        if epoch.0 != x.knobs {
                            *epoch = (x.knobs, Instant::now());
                        }
                        epoch.1.elapsed().as_secs_f64()
                    };
                    TenantReport {
                        name: served_name(&x.tenant.namespace, &x.tenant.name),
                        source: x.model.uri.clone(),
                        slo_millis: x.slo.latency_millis,
                        percentile: x.slo.percentile,
                        tenant: Some(x.tenant.clone()),
                        profiling: false,
                        approach: None,
                        profile: Some(m.profile(&x.model.uri, k)),
                        state: ReplicaReport::Ready(m.serving(
                            x.knobs,
                            count,
                            x.slo.latency_millis,
                            t,
                            since_s,
                        )),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    axum::Json(AgentReport::new(tenants))
}

async fn silence(State(fleet): State<Arc<Fleet>>, body: String) -> String {
    let names: Vec<String> = body
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    fleet
        .silent
        .lock()
        .expect("lock")
        .extend(names.iter().cloned());
    let mut agents = fleet.agents.lock().expect("lock");
    for name in &names {
        if let Some(a) = agents.remove(name) {
            a.server.abort();
        }
    }
    format!("silenced {}\n", names.len())
}

async fn list_agents(State(fleet): State<Arc<Fleet>>) -> String {
    let mut names: Vec<String> = fleet.agents.lock().expect("lock").keys().cloned().collect();
    names.sort();
    names.join("\n")
}
