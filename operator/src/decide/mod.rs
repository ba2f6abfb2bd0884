//! The operator's decisions for one pool in one round, as a pure function of what exists (the
//! pool, its tenants, its agents and their reports) and of what earlier rounds remember. The
//! result says what every agent should run, what each tenant's status and routes are, and how
//! the pool should grow or shrink; `crate::apply` writes it.

mod status;
pub mod tenant;

use crate::reason::{EventReason, Reason};
use cotenant_crds::conditions::set_condition;
use cotenant_crds::convert::spec_knobs;
use cotenant_crds::report::{AgentReport, TenantReport};
use cotenant_crds::{Assignment, GpuAgentStatus, GpuPool, GpuPoolSpec, GpuPoolStatus};
use cotenant_crds::{ModelTenant, ModelTenantStatus, ReplicaPlacement, TenantRef};
use cotenant_policy::placement::Unplaced;
use cotenant_policy::{
    AgentCapacity, CurrentReplica, Knobs, PoolAgent, PoolConfig, ReplicaDemand, place_at_most,
    size_pool,
};
use kube::ResourceExt;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
pub use tenant::{EventToRecord, TenantDecision, TenantRecall};

/// A tenant whose model size is not known yet, in a pool where no size is known, is placed as if
/// it took this fraction of the largest agent's memory.
const UNKNOWN_MODEL_SHARE: u64 = 16;

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
    retiring: &mut HashMap<(String, String), f64>,
    tuning: &Tuning,
    now_s: f64,
) -> BTreeSet<(String, String)> {
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
    retiring.retain(|(agent, uid), _| {
        leaving
            .iter()
            .any(|(a, x)| &a.name == agent && &x.tenant.uid == uid)
    });
    let mut kept = Vec::new();
    for (a, x) in leaving {
        let uid = &x.tenant.uid;
        let stays_routed = agents
            .iter()
            .any(|other| other.serves(uid, tuning) && wanted(&other.name, uid));
        if !a.serves(uid, tuning) || !stays_routed {
            continue;
        }
        let key = (a.name.clone(), uid.clone());
        let since = *retiring.entry(key.clone()).or_insert(now_s);
        if now_s - since < ROUTE_DRAIN_S {
            kept.push((key, x.clone()));
        }
    }
    // Only where the agent has room under the API's limit on assignments: otherwise the
    // replica goes at once, without its route drain.
    kept.into_iter()
        .filter_map(|((agent, uid), x)| {
            let list = assignments.entry(agent.clone()).or_default();
            (list.len() < cotenant_crds::MAX_ASSIGNMENTS).then(|| {
                list.push(x);
                (agent, uid)
            })
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
    let seen = observe(pool.spec.gpu_memory_mib, tenants, agents, &tuning);
    let decided = decide_tenants(
        &seen.tenants,
        &seen.known,
        &mut recall.tenants,
        &tuning,
        seen.fleet.largest_agent,
        now_s,
        now_rfc3339,
    );
    let placed = place(
        agents,
        &seen.fleet,
        &decided,
        &mut recall.retiring,
        &tuning,
        now_s,
    );
    let resized = resize(
        &pool.spec,
        agents,
        &seen.fleet,
        &placed,
        &mut recall.idle_since,
        &tuning,
        now_s,
    );
    let outcomes = tenant_outcomes(
        decided.tenants,
        agents,
        &placed,
        resized.at_max,
        seen.fleet.largest_agent,
        &tuning,
        now,
    );
    let status = pool_status(pool, &seen.fleet, agents, &placed.unplaced, &resized);
    PoolOutcome {
        assignments: placed.assignments,
        tenants: outcomes,
        add_agents: resized.add,
        drain: resized.drain,
        undrain: resized.undrain,
        remove: resized.remove,
        status,
        events: resized.events,
    }
}

/// The pool's agents as a round sees them: their health and GPU memory.
#[derive(Clone, Debug, PartialEq)]
pub struct Fleet {
    /// Device memory of an agent the pool adds: the pool's stated memory, else
    /// [`DEFAULT_AGENT_MEMORY`].
    pub new_agent_memory: u64,
    /// Device memory of the largest healthy agent, and at least `new_agent_memory`: a replica
    /// that needs more fits on no agent.
    pub largest_agent: u64,
    /// The healthy agents and the device memory of each, in the order of the agents.
    pub healthy: Vec<(String, u64)>,
    /// Agents that say they cannot use their GPU, with the reason they give.
    pub device_unavailable: Vec<(String, String)>,
}

/// One live tenant and what its replicas report.
#[derive(Clone, Debug)]
pub struct TenantSeen<'a> {
    pub tenant: &'a Arc<ModelTenant>,
    pub uid: String,
    /// Its replicas: the agent that holds each, and the assignment it holds.
    pub replicas: Vec<(&'a AgentView, &'a Assignment)>,
    /// The reports of those replicas, where their agent's latest report has one.
    pub reports: Vec<&'a TenantReport>,
}

/// What a round starts from.
#[derive(Clone, Debug)]
pub struct Observation<'a> {
    pub fleet: Fleet,
    /// The live tenants (not deleting, with a uid), in the order given.
    pub tenants: Vec<TenantSeen<'a>>,
    /// The uid of every tenant, deleting ones included.
    pub known: BTreeSet<String>,
}

/// Observe: the agents' health and GPU memory (the pool's stated memory wins over what each
/// agent reports of its device), and each live tenant's replicas and their reports.
pub fn observe<'a>(
    pool_memory_mib: Option<u64>,
    tenants: &'a [Arc<ModelTenant>],
    agents: &'a [AgentView],
    tuning: &Tuning,
) -> Observation<'a> {
    let pool_memory = pool_memory_mib.map(|m| m.saturating_mul(1 << 20));
    let new_agent_memory = pool_memory.unwrap_or(DEFAULT_AGENT_MEMORY);
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
    let healthy: Vec<(String, u64)> = agents
        .iter()
        .filter(|a| a.healthy(tuning))
        .map(|a| (a.name.clone(), memory_of(a)))
        .collect();
    let largest_agent = healthy
        .iter()
        .map(|(_, m)| *m)
        .max()
        .unwrap_or(new_agent_memory)
        .max(new_agent_memory);
    // An agent started for a GPU it cannot use says so in its status and exits.
    let device_unavailable = agents
        .iter()
        .filter_map(|a| {
            let c = a
                .status
                .as_ref()?
                .conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .filter(|c| {
                    c.status == "False" && Reason::DeviceUnavailable == c.reason.as_str()
                })?;
            Some((a.name.clone(), c.message.clone()))
        })
        .collect();
    let live = tenants
        .iter()
        .filter(|t| t.metadata.deletion_timestamp.is_none() && t.uid().is_some())
        .map(|t| {
            let uid = t.uid().unwrap_or_default();
            let replicas: Vec<(&AgentView, &Assignment)> = agents
                .iter()
                .flat_map(|a| {
                    a.assignments
                        .iter()
                        .filter(|x| x.tenant.uid == uid)
                        .map(move |x| (a, x))
                })
                .collect();
            let reports = replicas
                .iter()
                .filter_map(|(a, _)| a.report.as_ref().and_then(|r| r.tenant(&uid)))
                .collect();
            TenantSeen {
                tenant: t,
                uid,
                replicas,
                reports,
            }
        })
        .collect();
    Observation {
        fleet: Fleet {
            new_agent_memory,
            largest_agent,
            healthy,
            device_unavailable,
        },
        tenants: live,
        known: tenants.iter().filter_map(|t| t.uid()).collect(),
    }
}

/// One live tenant's decision this round.
#[derive(Clone, Debug)]
pub struct TenantDecided {
    pub tenant: Arc<ModelTenant>,
    pub decision: TenantDecision,
    /// One replica needs more memory than the largest agent has: it is not placed.
    pub too_big: bool,
}

/// What the tenants decided, and what placement needs from them.
#[derive(Clone, Debug, Default)]
pub struct TenantsDecided {
    pub tenants: Vec<TenantDecided>,
    /// The replicas each tenant wants, except tenants too big for any agent.
    pub demands: Vec<ReplicaDemand>,
    /// The replicas that exist now, with the memory each takes at the knobs it runs.
    pub current: Vec<CurrentReplica>,
}

/// Decide tenants: each live tenant's knobs and replicas from its replicas' reports. What
/// `recall` holds of tenants not in `known` is forgotten.
pub fn decide_tenants(
    seen: &[TenantSeen],
    known: &BTreeSet<String>,
    recall: &mut HashMap<String, TenantRecall>,
    tuning: &Tuning,
    largest_agent: u64,
    now_s: f64,
    now_rfc3339: &str,
) -> TenantsDecided {
    recall.retain(|uid, _| known.contains(uid));
    let decided: Vec<(TenantDecision, bool)> = seen
        .iter()
        .map(|s| {
            let tenant_recall = recall
                .entry(s.uid.clone())
                .or_insert_with(|| TenantRecall::new(s.tenant));
            let d = tenant::decide(
                s.tenant,
                &s.reports,
                tenant_recall,
                tuning,
                largest_agent,
                now_s,
                now_rfc3339,
            );
            let unknown = tenant_recall.round.is_none() && d.memory_bytes == 0;
            (d, unknown)
        })
        .collect();
    // A model whose size no agent has reported yet is placed at a guess, so that new tenants
    // spread instead of piling onto the first agent and the pool grows for them early.
    let guess = SizeGuess::new(
        seen.iter()
            .zip(&decided)
            .filter(|(_, (_, unknown))| !unknown)
            .map(|(s, (d, _))| (s.tenant.spec.model.uri.as_str(), d.memory_bytes)),
        largest_agent,
    );
    let mut out = TenantsDecided::default();
    for (s, (d, unknown)) in seen.iter().zip(decided) {
        let uid = &s.uid;
        let tenant_recall = &recall[uid];
        let too_big = d.memory_bytes > largest_agent;
        let placed_bytes = if unknown {
            guess.bytes(&s.tenant.spec.model.uri)
        } else {
            d.memory_bytes
        };
        for (a, x) in &s.replicas {
            let knobs = cotenant_crds::convert::knobs(&x.knobs);
            out.current.push(CurrentReplica {
                tenant: uid.clone(),
                agent: a.name.clone(),
                ready: a.serves(uid, tuning),
                memory_bytes: tenant_recall
                    .round
                    .as_ref()
                    .map_or(placed_bytes, |r| r.model.memory_bytes(knobs)),
            });
        }
        if !too_big {
            out.demands.push(ReplicaDemand {
                tenant: uid.clone(),
                replicas: d.replicas,
                memory_bytes: placed_bytes,
                load: d.load,
            });
        }
        out.tenants.push(TenantDecided {
            tenant: Arc::clone(s.tenant),
            decision: d,
            too_big,
        });
    }
    out
}

/// The memory a tenant whose model size is not known yet is placed with: what a tenant of the
/// same model takes, else the mean of the sizes known in the pool, else a share of the largest
/// agent ([`UNKNOWN_MODEL_SHARE`]).
#[derive(Debug)]
struct SizeGuess<'a> {
    by_model: HashMap<&'a str, u64>,
    otherwise: u64,
}

impl<'a> SizeGuess<'a> {
    /// `known`: (model URI, bytes) of the tenants whose size is known. Sizes over the largest
    /// agent (tenants that cannot be placed) say nothing about the others.
    fn new(known: impl Iterator<Item = (&'a str, u64)>, largest_agent: u64) -> Self {
        let mut by_model = HashMap::new();
        let (mut total, mut count) = (0u128, 0u128);
        for (model, bytes) in known.filter(|&(_, b)| b > 0 && b <= largest_agent) {
            by_model.insert(model, bytes);
            total += u128::from(bytes);
            count += 1;
        }
        let otherwise = total
            .checked_div(count)
            .map_or(largest_agent / UNKNOWN_MODEL_SHARE, |mean| mean as u64);
        SizeGuess {
            by_model,
            otherwise,
        }
    }

    fn bytes(&self, model: &str) -> u64 {
        self.by_model.get(model).copied().unwrap_or(self.otherwise)
    }
}

/// Where the replicas go this round.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Placed {
    /// The assignments every agent of the pool runs from now on, each list sorted by tenant.
    pub assignments: BTreeMap<String, Vec<Assignment>>,
    /// `(agent, tenant uid)` of replicas kept assigned without a route ([`ROUTE_DRAIN_S`]).
    pub retiring: BTreeSet<(String, String)>,
    /// The agents being replaced (see [`replacing`]).
    pub replacing: BTreeSet<String>,
    /// Replicas that fit on no agent.
    pub unplaced: Vec<Unplaced>,
}

/// Place: the tenants' replicas on the healthy agents that take new ones (neither draining nor
/// being replaced). One replica of a tenant that wants a profile measures it; replicas the
/// plan holds until replaced keep what they run; replicas that go lose their route first.
pub fn place(
    agents: &[AgentView],
    fleet: &Fleet,
    decided: &TenantsDecided,
    retiring: &mut HashMap<(String, String), f64>,
    tuning: &Tuning,
    now_s: f64,
) -> Placed {
    let replacing = replacing(agents, tuning);
    let draining: BTreeSet<&str> = agents
        .iter()
        .filter(|a| a.draining)
        .map(|a| a.name.as_str())
        .collect();
    let capacities: Vec<AgentCapacity> = fleet
        .healthy
        .iter()
        .map(|(name, memory_bytes)| AgentCapacity {
            agent: name.clone(),
            memory_bytes: *memory_bytes,
            compute: 1.0,
            schedulable: !draining.contains(name.as_str()) && !replacing.contains(name),
        })
        .collect();
    let plan = place_at_most(
        &capacities,
        &decided.demands,
        &decided.current,
        cotenant_crds::MAX_ASSIGNMENTS,
    );

    let by_uid: HashMap<String, (&Arc<ModelTenant>, Knobs, Option<Knobs>)> = decided
        .tenants
        .iter()
        .map(|d| {
            let uid = d.tenant.uid().unwrap_or_default();
            (uid, (&d.tenant, d.decision.knobs, d.decision.wants_profile))
        })
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
    let retiring = retire_routes_first(agents, &mut assignments, retiring, tuning, now_s);
    for list in assignments.values_mut() {
        list.sort_by(|x, y| x.tenant.cmp(&y.tenant));
    }
    Placed {
        assignments,
        retiring,
        replacing,
        unplaced: plan.unplaced,
    }
}

/// How the pool grows or shrinks this round.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Resized {
    pub add: u32,
    /// Agents to mark draining: idle ones, and the one being replaced that is not yet.
    pub drain: Vec<String>,
    pub undrain: Vec<String>,
    /// Agents to delete (sorted): dead, gone, or drained and empty.
    pub remove: Vec<String>,
    /// The pool's agents once this round is carried out.
    pub agents_after: u32,
    /// `agents_after` reaches the pool's `maxAgents`.
    pub at_max: bool,
    /// The pool's Events.
    pub events: Vec<EventToRecord>,
}

/// Size the pool: agents whose pod is gone or whose report failed for [`Tuning::dead_after_s`]
/// are removed; the rest, with the replicas placed on them and since when they are idle, go to
/// the policy's pool sizing. The pool's Events say what changed, and which agents cannot use
/// their GPU (the agent itself may not record Events).
pub fn resize(
    spec: &GpuPoolSpec,
    agents: &[AgentView],
    fleet: &Fleet,
    placed: &Placed,
    idle_since: &mut HashMap<String, f64>,
    tuning: &Tuning,
    now_s: f64,
) -> Resized {
    let replacing = &placed.replacing;
    let mut remove: Vec<String> = agents
        .iter()
        .filter(|a| {
            a.pod == PodState::Gone
                || (a.pod == PodState::Running && a.unreachable_for_s >= tuning.dead_after_s)
        })
        .map(|a| a.name.clone())
        .collect();
    let pool_agents: Vec<PoolAgent> = agents
        .iter()
        .filter(|a| !remove.contains(&a.name))
        .map(|a| {
            let replicas = placed.assignments.get(&a.name).map_or(0, Vec::len) as u32;
            let idle_since = if replicas == 0 && a.healthy(tuning) {
                Some(*idle_since.entry(a.name.clone()).or_insert(now_s))
            } else {
                idle_since.remove(&a.name);
                None
            };
            PoolAgent {
                agent: a.name.clone(),
                ready: a.healthy(tuning),
                draining: a.draining || replacing.contains(&a.name),
                replacing: replacing.contains(&a.name),
                replicas,
                idle_since,
            }
        })
        .collect();
    let cfg = PoolConfig {
        min_agents: spec.min_agents,
        max_agents: spec.max_agents,
        scale_down_delay_s: spec.scale_down_delay_seconds as f64,
        agent_memory_bytes: fleet.new_agent_memory,
        agent_compute: 1.0,
    };
    let sizing = size_pool(&pool_agents, &placed.unplaced, &cfg, now_s);
    remove.extend(sizing.remove.iter().cloned());
    let mut events = Vec::new();
    if sizing.add > 0 {
        events.push(EventToRecord {
            reason: EventReason::ScaledUp,
            message: format!(
                "adding {} agent(s): {} replica(s) fit on no agent",
                sizing.add,
                placed.unplaced.iter().map(|u| u.replicas).sum::<u32>()
            ),
        });
    }
    let mut drain = sizing.drain.clone();
    for a in agents {
        if replacing.contains(&a.name) && !a.draining && a.pod == PodState::Running {
            drain.push(a.name.clone());
            events.push(EventToRecord {
                reason: EventReason::Replacing,
                message: format!(
                    "agent {} runs an older version of the pool's template: moving its replicas, then replacing it",
                    a.name
                ),
            });
        }
    }
    for a in &sizing.drain {
        events.push(EventToRecord {
            reason: EventReason::Draining,
            message: format!(
                "agent {a} idle for {}s: draining before removal",
                spec.scale_down_delay_seconds
            ),
        });
    }
    for (agent, why) in &fleet.device_unavailable {
        events.push(EventToRecord {
            reason: EventReason::AgentDeviceUnavailable,
            message: format!("agent {agent} cannot use its GPU: {why}"),
        });
    }
    if !sizing.remove.is_empty() {
        events.push(EventToRecord {
            reason: EventReason::ScaledDown,
            message: format!("removing drained agent(s) {}", sizing.remove.join(", ")),
        });
    }
    let agents_after = agents.len() as u32 - remove.len().min(agents.len()) as u32 + sizing.add;
    remove.sort();
    remove.dedup();
    Resized {
        add: sizing.add,
        drain,
        undrain: sizing.undrain,
        remove,
        agents_after,
        at_max: agents_after >= cfg.max_agents,
        events,
    }
}

/// Write status, per tenant: its status, its routes (agents serving a Ready replica that is
/// not retiring) and its Events, with one when it newly fails for a reason a user must act on.
pub fn tenant_outcomes(
    decided: Vec<TenantDecided>,
    agents: &[AgentView],
    placed: &Placed,
    pool_at_max: bool,
    largest_agent: u64,
    tuning: &Tuning,
    now: k8s_openapi::jiff::Timestamp,
) -> Vec<TenantOutcome> {
    let unplaced: HashMap<&str, u32> = placed
        .unplaced
        .iter()
        .map(|u| (u.tenant.as_str(), u.replicas))
        .collect();
    let mut outcomes = Vec::new();
    for TenantDecided {
        tenant: t,
        decision: d,
        too_big,
    } in decided
    {
        let uid = t.uid().unwrap_or_default();
        let (mut routes, placements) = routes(&uid, agents, placed, tuning);
        let status = status::tenant_status(
            &t,
            &d,
            status::Placement {
                placements,
                too_big: too_big.then_some(largest_agent),
                unplaced: unplaced.get(uid.as_str()).copied().unwrap_or(0),
                pool_at_max,
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
            && let Some(reason) = match Reason::parse(&ready.reason) {
                Some(Reason::LoadFailed) => Some(EventReason::LoadFailed),
                Some(Reason::ModelTooLarge) => Some(EventReason::ModelTooLarge),
                _ => None,
            }
            && !was_failed_for(&ready.reason)
        {
            events.push(EventToRecord {
                reason,
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
    outcomes
}

/// Tenant `uid`'s routes and placements: every agent assigned a replica of it that is not
/// retiring is a placement; those serving it, with a pod IP and a reported port, are routes.
fn routes(
    uid: &str,
    agents: &[AgentView],
    placed: &Placed,
    tuning: &Tuning,
) -> (Vec<Route>, Vec<ReplicaPlacement>) {
    let mut routes = Vec::new();
    let mut placements = Vec::new();
    for (agent, list) in &placed.assignments {
        if !list.iter().any(|x| x.tenant.uid == uid)
            || placed.retiring.contains(&(agent.clone(), uid.to_string()))
        {
            continue;
        }
        let Some(view) = agents.iter().find(|a| &a.name == agent) else {
            continue;
        };
        let ready = view.serves(uid, tuning);
        let node = view.node.clone();
        placements.push(ReplicaPlacement {
            agent: agent.clone(),
            node: node.clone(),
            ready,
        });
        // The agent chooses only the ports, on its own pod's IP.
        let port_of =
            |address: Option<&String>| address.and_then(|a| split_address(a)).map(|(_, port)| port);
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
    (routes, placements)
}

/// Write status, for the pool: its agent counts and its Ready condition.
pub fn pool_status(
    pool: &GpuPool,
    fleet: &Fleet,
    agents: &[AgentView],
    unplaced: &[Unplaced],
    resized: &Resized,
) -> GpuPoolStatus {
    let ready_agents = fleet.healthy.len() as u32;
    let pending_agents =
        agents.iter().filter(|a| a.pod == PodState::Pending).count() as u32 + resized.add;
    let mut status = pool.status.clone().unwrap_or_default();
    status.agents = resized.agents_after;
    status.ready_agents = ready_agents;
    status.pending_agents = pending_agents;
    status.observed_generation = pool.metadata.generation;
    let (ok, reason, message) = if !unplaced.is_empty() && resized.at_max {
        (
            false,
            Reason::AtMaxAgents,
            format!(
                "{} replica(s) fit on no agent and the pool is at maxAgents {}",
                unplaced.iter().map(|u| u.replicas).sum::<u32>(),
                pool.spec.max_agents
            ),
        )
    } else if pending_agents > 0 {
        (
            false,
            Reason::AgentsPending,
            format!("{pending_agents} agent(s) waiting for a node with a free GPU"),
        )
    } else {
        (
            true,
            Reason::AgentsReady,
            format!("{ready_agents} agent(s) ready"),
        )
    };
    set_condition(
        &mut status.conditions,
        "Ready",
        ok,
        reason.as_str(),
        &message,
        pool.metadata.generation,
    );
    status
}

/// `host:port` (IPv6 hosts in brackets) into its parts.
pub fn split_address(address: &str) -> Option<(String, u16)> {
    let (host, port) = address.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some((host.to_string(), port.parse().ok()?))
}

#[cfg(test)]
mod tests;
