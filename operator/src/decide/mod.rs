//! The operator's decisions for one pool in one round, as a pure function of what exists (the
//! pool, its tenants, its agents and their reports) and of what earlier rounds remember. The
//! result says what every agent should run, what each tenant's status and routes are, and how
//! the pool should grow or shrink; `crate::apply` writes it.

mod status;
pub mod tenant;

use cotenant_crds::convert::spec_knobs;
use cotenant_crds::report::{AgentReport, TenantReport};
use cotenant_crds::{Assignment, GpuAgentStatus, GpuPool, GpuPoolStatus, ModelTenant, TenantRef};
use cotenant_crds::{ModelTenantStatus, conditions::set_condition};
use cotenant_policy::{
    AgentCapacity, CurrentReplica, Knobs, PoolAgent, PoolConfig, ReplicaDemand, place_at_most,
    size_pool,
};
use kube::ResourceExt;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
pub use tenant::{EventToRecord, TenantRecall};

/// Memory of one agent when neither the pool nor the agent says (80 GiB, a common GPU size).
const DEFAULT_AGENT_MEMORY: u64 = 80 << 30;

/// Timings an operator deployment may tune.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tuning {
    /// An agent whose pod runs but whose report has failed this long is removed and replaced.
    pub dead_after_s: f64,
    /// A tenant keeps a replica it no longer needs this long before letting it go.
    pub replica_scale_down_s: f64,
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            dead_after_s: 45.0,
            replica_scale_down_s: 60.0,
        }
    }
}

/// Where an agent's pod is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodState {
    /// Created, not yet running (e.g. waiting for a GPU node).
    Pending,
    Running,
    /// Gone, failed or terminating: the agent will not come back.
    Gone,
}

/// One agent of the pool as the operator sees it this round.
#[derive(Clone, Debug)]
pub struct AgentView {
    pub name: String,
    pub assignments: Vec<Assignment>,
    pub status: Option<GpuAgentStatus>,
    pub pod: PodState,
    /// The pod's IP as the Pod object says (the kubelet writes it, not the agent): the only
    /// host the operator routes and scrapes to.
    pub pod_ip: Option<String>,
    /// The node the pod was scheduled to, from the Pod object (not the agent's status).
    pub node: Option<String>,
    /// Its latest report, when the latest scrape succeeded.
    pub report: Option<AgentReport>,
    /// Seconds since its report last failed continuously (0 when the last one succeeded).
    pub unreachable_for_s: f64,
    pub draining: bool,
    /// Its pod was made from an older version of the pool's template or agent settings.
    pub outdated: bool,
}

impl AgentView {
    /// Running, and reporting or only briefly silent (one slow scrape must not move every
    /// replica): replicas may stay and be placed here.
    fn healthy(&self, tuning: &Tuning) -> bool {
        self.pod == PodState::Running && self.unreachable_for_s < tuning.dead_after_s / 3.0
    }

    /// Whether the replica of tenant `uid` here serves now (routes need a fresh report).
    fn serves(&self, uid: &str, tuning: &Tuning) -> bool {
        self.healthy(tuning)
            && self
                .report
                .as_ref()
                .and_then(|r| r.tenant(uid))
                .is_some_and(|r| r.serving().is_some())
    }
}

/// What the operator recalls between rounds (not GPU memory): its tuning, each tenant's
/// scaler state, when agents went idle and which replicas are retiring. Rebuilt from the API
/// after a restart.
#[derive(Default)]
pub struct Recall {
    pub tuning: Tuning,
    pub tenants: HashMap<String, TenantRecall>,
    idle_since: HashMap<String, f64>,
    /// Replicas leaving an agent, by `(agent, tenant uid)`: when their route was taken away.
    retiring: HashMap<(String, String), f64>,
}

impl Recall {
    pub fn new(tuning: Tuning) -> Recall {
        Recall {
            tuning,
            ..Recall::default()
        }
    }
}

/// A tenant's routing target: an agent serving a ready replica, at its pod's IP.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Route {
    pub host: String,
    /// The agent's Open Inference Protocol port (HTTP).
    pub port: u16,
    /// Its gRPC port, when the agent reports one.
    pub grpc_port: Option<u16>,
    pub node: Option<String>,
    pub agent: String,
}

/// What one tenant should look like after this round.
#[derive(Clone, Debug)]
pub struct TenantOutcome {
    pub tenant: Arc<ModelTenant>,
    pub status: ModelTenantStatus,
    pub routes: Vec<Route>,
    pub events: Vec<EventToRecord>,
}

/// Everything one round decided for one pool.
#[derive(Clone, Debug, Default)]
pub struct PoolOutcome {
    /// The assignments every agent of the pool should have.
    pub assignments: BTreeMap<String, Vec<Assignment>>,
    pub tenants: Vec<TenantOutcome>,
    pub add_agents: u32,
    pub drain: Vec<String>,
    pub undrain: Vec<String>,
    /// Agents to delete: drained and empty, dead, or whose pod is gone.
    pub remove: Vec<String>,
    pub status: GpuPoolStatus,
    pub events: Vec<EventToRecord>,
}

/// Seconds a replica that a round removes keeps serving without a route before it is
/// unassigned: time for the EndpointSlice change to reach kube-proxy and clients, so no request
/// meets an agent that no longer holds the tenant.
pub const ROUTE_DRAIN_S: f64 = 5.0;

/// Route first, replica second: a Ready replica that this round removes from a healthy agent,
/// while another Ready replica of its tenant stays routed, is kept assigned (serving whatever
/// still reaches it) but loses its route, for [`ROUTE_DRAIN_S`]; then it goes. Returns the
/// `(agent, tenant uid)` pairs kept this way, which get no route.
fn retire_routes_first(
    agents: &[AgentView],
    assignments: &mut BTreeMap<String, Vec<Assignment>>,
    recall: &mut Recall,
    now_s: f64,
) -> BTreeSet<(String, String)> {
    let tuning = recall.tuning;
    let wanted = |agent: &str, uid: &str| {
        assignments
            .get(agent)
            .is_some_and(|l| l.iter().any(|x| x.tenant.uid == uid))
    };
    // Every replica an agent holds that the round no longer wants.
    let leaving: Vec<(&AgentView, &Assignment)> = agents
        .iter()
        .flat_map(|a| a.assignments.iter().map(move |x| (a, x)))
        .filter(|(a, x)| !wanted(&a.name, &x.tenant.uid))
        .collect();
    // Remembered until the agent no longer holds it, so a slow watch cannot restart its clock.
    recall.retiring.retain(|(agent, uid), _| {
        leaving
            .iter()
            .any(|(a, x)| &a.name == agent && &x.tenant.uid == uid)
    });
    let mut kept = Vec::new();
    for (a, x) in leaving {
        let uid = &x.tenant.uid;
        let stays_routed = agents
            .iter()
            .any(|other| other.serves(uid, &tuning) && wanted(&other.name, uid));
        if !a.serves(uid, &tuning) || !stays_routed {
            continue;
        }
        let key = (a.name.clone(), uid.clone());
        let since = *recall.retiring.entry(key.clone()).or_insert(now_s);
        if now_s - since < ROUTE_DRAIN_S {
            kept.push((key, x.clone()));
        }
    }
    kept.into_iter()
        .map(|((agent, uid), x)| {
            assignments.entry(agent.clone()).or_default().push(x);
            (agent, uid)
        })
        .collect()
}

/// The agents replaced this round, one holding replicas at a time: those already draining that
/// run an outdated template, else the first healthy one that does; outdated agents with nothing
/// to move (empty, or not running) go at once.
fn replacing(agents: &[AgentView], tuning: &Tuning) -> BTreeSet<String> {
    let outdated = || agents.iter().filter(|a| a.outdated);
    let mut chosen: BTreeSet<String> = outdated()
        .filter(|a| a.draining || a.assignments.is_empty() || a.pod != PodState::Running)
        .map(|a| a.name.clone())
        .collect();
    let one_moving = outdated().any(|a| a.draining && !a.assignments.is_empty());
    if !one_moving
        && let Some(next) = outdated()
            .filter(|a| a.healthy(tuning) && !a.assignments.is_empty())
            .map(|a| &a.name)
            .min()
    {
        chosen.insert(next.clone());
    }
    chosen
}

fn tenant_ref(t: &ModelTenant) -> TenantRef {
    TenantRef {
        namespace: t.namespace().unwrap_or_default(),
        name: t.name_any(),
        uid: t.uid().unwrap_or_default(),
    }
}

/// Decides one round for `pool`. `tenants` are those naming the pool, deleting ones included
/// (they get no replicas); `agents` are the pool's agents.
#[tracing::instrument(name = "decide_pool", skip_all, fields(pool = %pool.name_any()))]
pub fn decide_pool(
    pool: &GpuPool,
    tenants: &[Arc<ModelTenant>],
    agents: &[AgentView],
    recall: &mut Recall,
    now_s: f64,
    now_rfc3339: &str,
) -> PoolOutcome {
    let tuning = recall.tuning;
    let now = now_rfc3339
        .parse::<k8s_openapi::jiff::Timestamp>()
        .unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now());
    // The pool's stated GPU memory wins; otherwise what each agent reports of its device.
    let pool_memory = pool.spec.gpu_memory_mib.map(|m| m.saturating_mul(1 << 20));
    let agent_memory = pool_memory.unwrap_or(DEFAULT_AGENT_MEMORY);
    let memory_of = |a: &AgentView| {
        pool_memory
            .or_else(|| {
                a.status
                    .as_ref()?
                    .device
                    .as_ref()
                    .map(|d| d.memory_total_bytes)
            })
            .unwrap_or(DEFAULT_AGENT_MEMORY)
    };
    let largest_agent = agents
        .iter()
        .filter(|a| a.healthy(&tuning))
        .map(memory_of)
        .max()
        .unwrap_or(agent_memory)
        .max(agent_memory);

    let live: Vec<&Arc<ModelTenant>> = tenants
        .iter()
        .filter(|t| t.metadata.deletion_timestamp.is_none() && t.uid().is_some())
        .collect();
    let uids: BTreeSet<String> = tenants.iter().filter_map(|t| t.uid()).collect();
    recall.tenants.retain(|uid, _| uids.contains(uid));

    // Each tenant's decision from the reports of its replicas.
    let mut decisions = Vec::new();
    let mut demands = Vec::new();
    let mut current = Vec::new();
    for t in &live {
        let uid = t.uid().unwrap_or_default();
        let placed: Vec<(&AgentView, &Assignment)> = agents
            .iter()
            .flat_map(|a| {
                a.assignments
                    .iter()
                    .filter(|x| x.tenant.uid == uid)
                    .map(move |x| (a, x))
            })
            .collect();
        let reports: Vec<&TenantReport> = placed
            .iter()
            .filter_map(|(a, _)| a.report.as_ref().and_then(|r| r.tenant(&uid)))
            .collect();
        let mem = recall
            .tenants
            .entry(uid.clone())
            .or_insert_with(|| TenantRecall::new(t));
        let d = tenant::decide(t, &reports, mem, &tuning, now_s, now_rfc3339);
        let too_big = d.memory_bytes > largest_agent;
        for (a, x) in &placed {
            let ready = a.serves(&uid, &tuning);
            let knobs = cotenant_crds::convert::knobs(&x.knobs);
            current.push(CurrentReplica {
                tenant: uid.clone(),
                agent: a.name.clone(),
                ready,
                memory_bytes: mem
                    .model
                    .as_ref()
                    .map_or(d.memory_bytes, |m| m.memory_bytes(knobs)),
            });
        }
        if !too_big {
            demands.push(ReplicaDemand {
                tenant: uid.clone(),
                replicas: d.replicas,
                memory_bytes: d.memory_bytes,
                load: d.load,
            });
        }
        decisions.push((Arc::clone(t), d, too_big));
    }

    let replacing = replacing(agents, &tuning);
    let capacities: Vec<AgentCapacity> = agents
        .iter()
        .filter(|a| a.healthy(&tuning))
        .map(|a| AgentCapacity {
            agent: a.name.clone(),
            memory_bytes: memory_of(a),
            compute: 1.0,
            schedulable: !a.draining && !replacing.contains(&a.name),
        })
        .collect();
    let plan = place_at_most(
        &capacities,
        &demands,
        &current,
        cotenant_crds::MAX_ASSIGNMENTS,
    );

    // The assignments each agent runs from now on.
    let by_uid: HashMap<String, (&Arc<ModelTenant>, Knobs, Option<Knobs>)> = decisions
        .iter()
        .map(|(t, d, _)| (t.uid().unwrap_or_default(), (t, d.knobs, d.wants_profile)))
        .collect();
    let mut assignments: BTreeMap<String, Vec<Assignment>> = agents
        .iter()
        .map(|a| (a.name.clone(), Vec::new()))
        .collect();
    let mut profiling_asked: BTreeSet<String> = BTreeSet::new();
    let mut running: Vec<_> = plan.keep.iter().chain(&plan.start).collect();
    running.sort();
    for p in running {
        let Some((t, knobs, wants_profile)) = by_uid.get(&p.tenant) else {
            continue;
        };
        // One replica measures the profile; the others just serve.
        let profile = wants_profile.filter(|_| profiling_asked.insert(p.tenant.clone()));
        assignments
            .entry(p.agent.clone())
            .or_default()
            .push(Assignment {
                tenant: tenant_ref(t),
                model: t.spec.model.clone(),
                slo: t.spec.slo.clone(),
                knobs: spec_knobs(*knobs),
                profile: profile.map(spec_knobs),
                // Resolved from the tenant's Secret after deciding (`crate::credentials`).
                credentials: None,
            });
    }
    for p in &plan.hold_until_replaced {
        let held = agents
            .iter()
            .find(|a| a.name == p.agent)
            .and_then(|a| a.assignments.iter().find(|x| x.tenant.uid == p.tenant));
        if let Some(x) = held {
            assignments
                .entry(p.agent.clone())
                .or_default()
                .push(x.clone());
        }
    }
    let retiring = retire_routes_first(agents, &mut assignments, recall, now_s);
    for list in assignments.values_mut() {
        list.sort_by(|x, y| x.tenant.cmp(&y.tenant));
    }

    // The pool's size.
    let mut remove: Vec<String> = agents
        .iter()
        .filter(|a| {
            a.pod == PodState::Gone
                || (a.pod == PodState::Running && a.unreachable_for_s >= recall.tuning.dead_after_s)
        })
        .map(|a| a.name.clone())
        .collect();
    let pool_agents: Vec<PoolAgent> = agents
        .iter()
        .filter(|a| !remove.contains(&a.name))
        .map(|a| {
            let replicas = assignments.get(&a.name).map_or(0, Vec::len) as u32;
            let idle_since = if replicas == 0 && a.healthy(&tuning) {
                Some(*recall.idle_since.entry(a.name.clone()).or_insert(now_s))
            } else {
                recall.idle_since.remove(&a.name);
                None
            };
            PoolAgent {
                agent: a.name.clone(),
                ready: a.healthy(&tuning),
                draining: a.draining || replacing.contains(&a.name),
                replacing: replacing.contains(&a.name),
                replicas,
                idle_since,
            }
        })
        .collect();
    let cfg = PoolConfig {
        min_agents: pool.spec.min_agents,
        max_agents: pool.spec.max_agents,
        scale_down_delay_s: pool.spec.scale_down_delay_seconds as f64,
        agent_memory_bytes: agent_memory,
        agent_compute: 1.0,
    };
    let sizing = size_pool(&pool_agents, &plan.unplaced, &cfg, now_s);
    remove.extend(sizing.remove.iter().cloned());
    let mut events = Vec::new();
    if sizing.add > 0 {
        events.push(EventToRecord {
            reason: "ScaledUp",
            message: format!(
                "adding {} agent(s): {} replica(s) fit on no agent",
                sizing.add,
                plan.unplaced.iter().map(|u| u.replicas).sum::<u32>()
            ),
        });
    }
    let mut drain = sizing.drain.clone();
    for a in agents {
        if replacing.contains(&a.name) && !a.draining && a.pod == PodState::Running {
            drain.push(a.name.clone());
            events.push(EventToRecord {
                reason: "Replacing",
                message: format!(
                    "agent {} runs an older version of the pool's template: moving its replicas, then replacing it",
                    a.name
                ),
            });
        }
    }
    for a in &sizing.drain {
        events.push(EventToRecord {
            reason: "Draining",
            message: format!(
                "agent {a} idle for {}s: draining before removal",
                pool.spec.scale_down_delay_seconds
            ),
        });
    }
    // An agent started for a GPU it cannot use says so in its status and exits: the pool says
    // so too, since the agent itself may not record Events.
    for a in agents {
        let unusable = a
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
            .filter(|c| c.status == "False" && c.reason == "DeviceUnavailable");
        if let Some(c) = unusable {
            events.push(EventToRecord {
                reason: "AgentDeviceUnavailable",
                message: format!("agent {} cannot use its GPU: {}", a.name, c.message),
            });
        }
    }
    if !sizing.remove.is_empty() {
        events.push(EventToRecord {
            reason: "ScaledDown",
            message: format!("removing drained agent(s) {}", sizing.remove.join(", ")),
        });
    }

    // Tenant statuses and routes.
    let unplaced: HashMap<&str, u32> = plan
        .unplaced
        .iter()
        .map(|u| (u.tenant.as_str(), u.replicas))
        .collect();
    let at_max =
        agents.len() as u32 - remove.len().min(agents.len()) as u32 + sizing.add >= cfg.max_agents;
    let mut outcomes = Vec::new();
    for (t, d, too_big) in decisions {
        let uid = t.uid().unwrap_or_default();
        let mut routes = Vec::new();
        let mut placements = Vec::new();
        for (agent, list) in &assignments {
            if !list.iter().any(|x| x.tenant.uid == uid)
                || retiring.contains(&(agent.clone(), uid.clone()))
            {
                continue;
            }
            let Some(view) = agents.iter().find(|a| &a.name == agent) else {
                continue;
            };
            let ready = view.serves(&uid, &tuning);
            let node = view.node.clone();
            placements.push(cotenant_crds::ReplicaPlacement {
                agent: agent.clone(),
                node: node.clone(),
                ready,
            });
            // The agent chooses only the ports, on its own pod's IP.
            let port_of = |address: Option<&String>| {
                address.and_then(|a| split_address(a)).map(|(_, port)| port)
            };
            let status = view.status.as_ref();
            let port = port_of(status.and_then(|s| s.address.as_ref()));
            let grpc_port = port_of(status.and_then(|s| s.grpc_address.as_ref()));
            if let (true, Some(host), Some(port)) = (ready, view.pod_ip.clone(), port) {
                routes.push(Route {
                    host,
                    port,
                    grpc_port,
                    node,
                    agent: agent.clone(),
                });
            }
        }
        let status = status::tenant_status(
            &t,
            &d,
            status::Placement {
                placements,
                too_big: too_big.then_some(largest_agent),
                unplaced: unplaced.get(uid.as_str()).copied().unwrap_or(0),
                pool_at_max: at_max,
            },
            now,
        );
        let mut events = d.events.clone();
        let was_failed_for = |reason: &str| {
            t.status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
                .is_some_and(|c| c.reason == reason)
        };
        if let Some(ready) = status.conditions.iter().find(|c| c.type_ == "Ready")
            && ready.status == "False"
            && matches!(ready.reason.as_str(), "ModelTooLarge" | "LoadFailed")
            && !was_failed_for(&ready.reason)
        {
            events.push(EventToRecord {
                reason: if ready.reason == "LoadFailed" {
                    "LoadFailed"
                } else {
                    "ModelTooLarge"
                },
                message: ready.message.clone(),
            });
        }
        routes.sort();
        outcomes.push(TenantOutcome {
            tenant: t,
            status,
            routes,
            events,
        });
    }
    let ready_agents = agents.iter().filter(|a| a.healthy(&tuning)).count() as u32;
    let pending_agents =
        agents.iter().filter(|a| a.pod == PodState::Pending).count() as u32 + sizing.add;
    let mut pool_status = pool.status.clone().unwrap_or_default();
    pool_status.agents = agents.len() as u32 - remove.len().min(agents.len()) as u32 + sizing.add;
    pool_status.ready_agents = ready_agents;
    pool_status.pending_agents = pending_agents;
    pool_status.observed_generation = pool.metadata.generation;
    let (ok, reason, message) = if !plan.unplaced.is_empty() && at_max {
        (
            false,
            "AtMaxAgents",
            format!(
                "{} replica(s) fit on no agent and the pool is at maxAgents {}",
                plan.unplaced.iter().map(|u| u.replicas).sum::<u32>(),
                cfg.max_agents
            ),
        )
    } else if pending_agents > 0 {
        (
            false,
            "AgentsPending",
            format!("{pending_agents} agent(s) waiting for a node with a free GPU"),
        )
    } else {
        (
            true,
            "AgentsReady",
            format!("{ready_agents} agent(s) ready"),
        )
    };
    set_condition(
        &mut pool_status.conditions,
        "Ready",
        ok,
        reason,
        &message,
        pool.metadata.generation,
    );
    remove.sort();
    remove.dedup();
    PoolOutcome {
        assignments,
        tenants: outcomes,
        add_agents: sizing.add,
        drain,
        undrain: sizing.undrain,
        remove,
        status: pool_status,
        events,
    }
}

/// `host:port` (IPv6 hosts in brackets) into its parts.
pub fn split_address(address: &str) -> Option<(String, u16)> {
    let (host, port) = address.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some((host.to_string(), port.parse().ok()?))
}

#[cfg(test)]
mod tests;
