//! Each phase of a round alone, on plain values.

use super::*;
use crate::decide::tenant::Aggregate;
use cotenant_crds::{Device, DeviceKind};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn with_device(mut a: AgentView, memory_bytes: u64) -> AgentView {
    if let Some(s) = a.status.as_mut() {
        s.device = Some(Device {
            kind: DeviceKind::Cuda,
            name: "NVIDIA H200".into(),
            memory_total_bytes: memory_bytes,
            memory_used_bytes: 0,
        });
    }
    a
}

fn assignment(t: &ModelTenant) -> Assignment {
    Assignment {
        tenant: tenant_ref(t),
        model: t.spec.model.clone(),
        slo: t.spec.slo.clone(),
        knobs: cotenant_crds::Knobs::default(),
        profile: None,
        credentials: None,
    }
}

/// `t` holding a Ready replica on `a`, as `a` reports.
fn hosting(mut a: AgentView, t: &ModelTenant) -> AgentView {
    a.assignments = vec![assignment(t)];
    a.report = Some(AgentReport::new(vec![replica_report(t, ready_replica())]));
    a
}

/// A decision for `replicas` replicas of `memory_bytes` each, asking for a profile.
fn decision(replicas: u32, memory_bytes: u64) -> TenantDecision {
    TenantDecision {
        approach: None,
        knobs: Knobs::ONE,
        learned: None,
        replicas,
        memory_bytes,
        load: 0.1,
        profile: None,
        wants_profile: Some(Knobs::new(4, 4)),
        failure: None,
        aggregate: Aggregate::default(),
        configured_for_s: f64::INFINITY,
        events: Vec::new(),
    }
}

fn decided(t: &Arc<ModelTenant>, d: TenantDecision) -> TenantsDecided {
    TenantsDecided {
        demands: vec![ReplicaDemand {
            tenant: t.uid().expect("uid"),
            replicas: d.replicas,
            memory_bytes: d.memory_bytes,
            load: d.load,
        }],
        tenants: vec![TenantDecided {
            tenant: Arc::clone(t),
            decision: d,
            too_big: false,
        }],
        current: Vec::new(),
    }
}

fn fleet(agents: &[AgentView]) -> Fleet {
    observe(Some(1024), &[], agents, &Tuning::default()).fleet
}

fn reasons(events: &[EventToRecord]) -> Vec<&str> {
    events.iter().map(|e| e.reason.as_str()).collect()
}

#[test]
fn observe_prefers_the_pools_memory_and_counts_only_healthy_agents() {
    let mut silent = agent("silent", 8001);
    silent.unreachable_for_s = Tuning::default().dead_after_s;
    let mut pending = agent("pending", 8002);
    pending.pod = PodState::Pending;
    let agents = [with_device(agent("a", 8000), 40 * GIB), silent, pending];
    let seen = observe(Some(1024), &[], &agents, &Tuning::default());
    assert_eq!(seen.fleet.healthy, vec![("a".to_string(), GIB)]);
    assert_eq!(seen.fleet.new_agent_memory, GIB);
    assert_eq!(seen.fleet.largest_agent, GIB);
}

#[test]
fn observe_without_the_pools_memory_reads_each_device_and_never_goes_below_the_default() {
    let small = [with_device(agent("a", 8000), 40 * GIB), agent("b", 8001)];
    let seen = observe(None, &[], &small, &Tuning::default());
    assert_eq!(
        seen.fleet.healthy,
        vec![
            ("a".to_string(), 40 * GIB),
            ("b".to_string(), DEFAULT_AGENT_MEMORY)
        ]
    );
    assert_eq!(seen.fleet.largest_agent, DEFAULT_AGENT_MEMORY);
    let large = [with_device(agent("a", 8000), 141 * GIB)];
    let seen = observe(None, &[], &large, &Tuning::default());
    assert_eq!(seen.fleet.largest_agent, 141 * GIB);
    assert_eq!(seen.fleet.new_agent_memory, DEFAULT_AGENT_MEMORY);
}

#[test]
fn observe_lists_live_tenants_with_their_reports_and_knows_deleting_ones() {
    let (live, other) = (tenant("live", 50.0), tenant("other", 50.0));
    let mut deleting = ModelTenant::clone(&tenant("deleting", 50.0));
    deleting.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()),
    );
    let tenants = [Arc::clone(&live), Arc::new(deleting), Arc::clone(&other)];
    let mut quiet = agent("quiet", 8001);
    quiet.assignments = vec![assignment(&live)];
    quiet.report = None;
    let agents = [hosting(agent("a", 8000), &live), quiet];
    let seen = observe(Some(1024), &tenants, &agents, &Tuning::default());
    let uids: Vec<&str> = seen.tenants.iter().map(|s| s.uid.as_str()).collect();
    assert_eq!(uids, ["uid-live", "uid-other"]);
    assert_eq!(seen.tenants[0].replicas.len(), 2, "both agents hold it");
    assert_eq!(seen.tenants[0].reports.len(), 1, "one agent reported");
    assert!(seen.tenants[1].replicas.is_empty());
    assert!(seen.known.contains("uid-deleting"));
}

#[test]
fn observe_finds_agents_that_cannot_use_their_gpu() {
    let mut broken = agent("broken", 8001);
    if let Some(s) = broken.status.as_mut() {
        cotenant_crds::conditions::set_condition(
            &mut s.conditions,
            "Ready",
            false,
            "DeviceUnavailable",
            "no driver",
            None,
        );
    }
    let agents = [agent("a", 8000), broken];
    assert_eq!(
        fleet(&agents).device_unavailable,
        vec![("broken".to_string(), "no driver".to_string())]
    );
}

#[test]
fn decide_tenants_forgets_unknown_tenants_and_leaves_out_a_replica_too_big_for_any_agent() {
    let t = tenant("a", 50.0);
    let agents = [hosting(agent("a", 8000), &t)];
    let seen = observe(
        Some(1024),
        std::slice::from_ref(&t),
        &agents,
        &Tuning::default(),
    );
    let mut recall = HashMap::new();
    recall.insert("uid-gone".to_string(), TenantRecall::new(&t));
    let tuning = Tuning::default();
    let run = |recall: &mut HashMap<String, TenantRecall>, largest_agent| {
        let now = "2026-12-02T00:00:00Z";
        decide_tenants(
            &seen.tenants,
            &seen.known,
            recall,
            &tuning,
            largest_agent,
            0.0,
            now,
        )
    };
    // Before any profile, one replica needs its reported weights (10 MiB).
    let fits = run(&mut recall, GIB);
    assert_eq!(recall.keys().collect::<Vec<_>>(), ["uid-a"]);
    assert!(!fits.tenants[0].too_big);
    assert_eq!(fits.demands.len(), 1);
    assert_eq!(fits.demands[0].memory_bytes, 10 * MIB);
    let too_big = run(&mut recall, MIB);
    assert!(too_big.tenants[0].too_big);
    assert!(too_big.demands.is_empty(), "not placed");
    assert_eq!(too_big.current.len(), 1, "its replica still counts");
    assert!(too_big.current[0].ready);
}

#[test]
fn place_uses_only_schedulable_agents_and_asks_one_replica_for_the_profile() {
    let t = tenant("a", 50.0);
    let mut draining = agent("agent-1", 8001);
    draining.draining = true;
    let agents = [agent("agent-0", 8000), draining, agent("agent-2", 8002)];
    let mut retiring = HashMap::new();
    let tuning = Tuning::default();
    let placed = place(
        &agents,
        &fleet(&agents),
        &decided(&t, decision(2, 10 * MIB)),
        &mut retiring,
        &tuning,
        0.0,
    );
    assert!(placed.assignments["agent-1"].is_empty(), "draining");
    let on = |a: &str| &placed.assignments[a];
    assert_eq!((on("agent-0").len(), on("agent-2").len()), (1, 1));
    let profiling = placed
        .assignments
        .values()
        .flatten()
        .filter(|x| x.profile.is_some())
        .count();
    assert_eq!(profiling, 1);
    assert!(placed.unplaced.is_empty() && placed.retiring.is_empty());
}

#[test]
fn place_leaves_unplaced_what_fits_nowhere_and_moves_off_an_outdated_agent() {
    let t = tenant("a", 50.0);
    let mut outdated = hosting(agent("agent-0", 8000), &t);
    outdated.outdated = true;
    let agents = [outdated];
    let mut decided = decided(&t, decision(1, 10 * MIB));
    decided.current.push(CurrentReplica {
        tenant: "uid-a".into(),
        agent: "agent-0".into(),
        ready: true,
        memory_bytes: 10 * MIB,
    });
    let placed = place(
        &agents,
        &fleet(&agents),
        &decided,
        &mut HashMap::new(),
        &Tuning::default(),
        0.0,
    );
    assert_eq!(placed.replacing, BTreeSet::from(["agent-0".to_string()]));
    assert_eq!(placed.unplaced.len(), 1);
    assert_eq!(placed.unplaced[0].replicas, 1);
    assert_eq!(
        placed.assignments["agent-0"].len(),
        1,
        "held until replaced"
    );
}

fn spec(max_agents: u32) -> GpuPoolSpec {
    pool(1024, max_agents).spec
}

#[test]
fn resize_removes_gone_and_dead_agents() {
    let t = tenant("a", 50.0);
    let mut gone = agent("gone", 8001);
    gone.pod = PodState::Gone;
    let mut dead = agent("dead", 8002);
    dead.unreachable_for_s = Tuning::default().dead_after_s;
    let agents = [hosting(agent("a", 8000), &t), gone, dead];
    let placed = Placed {
        assignments: BTreeMap::from([("a".to_string(), vec![assignment(&t)])]),
        ..Placed::default()
    };
    let mut idle_since = HashMap::new();
    let resized = resize(
        &spec(3),
        &agents,
        &fleet(&agents),
        &placed,
        &mut idle_since,
        &Tuning::default(),
        0.0,
    );
    assert_eq!(resized.remove, ["dead", "gone"]);
    assert_eq!(
        (resized.add, resized.agents_after, resized.at_max),
        (0, 1, false)
    );
    assert!(resized.events.is_empty());
    assert!(idle_since.is_empty(), "the one agent left is busy");
}

#[test]
fn resize_adds_agents_for_unplaced_replicas_up_to_the_maximum() {
    let unplaced = |replicas| Placed {
        unplaced: vec![Unplaced {
            tenant: "uid-a".into(),
            replicas,
            memory_bytes: 10 * MIB,
            load: 0.1,
        }],
        ..Placed::default()
    };
    let run = |placed: &Placed, max_agents| {
        let fleet = fleet(&[]);
        let (mut idle, tuning) = (HashMap::new(), Tuning::default());
        resize(
            &spec(max_agents),
            &[],
            &fleet,
            placed,
            &mut idle,
            &tuning,
            0.0,
        )
    };
    let grown = run(&unplaced(2), 4);
    assert_eq!((grown.add, grown.agents_after, grown.at_max), (2, 2, false));
    assert_eq!(
        grown.events,
        vec![EventToRecord {
            reason: EventReason::ScaledUp,
            message: "adding 2 agent(s): 2 replica(s) fit on no agent".into()
        }]
    );
    let capped = run(&unplaced(3), 2);
    assert_eq!((capped.add, capped.at_max), (2, true));
}

#[test]
fn resize_drains_an_outdated_agent_and_says_which_agents_cannot_use_their_gpu() {
    let t = tenant("a", 50.0);
    let agents = [hosting(agent("old", 8000), &t), agent("idle", 8001)];
    let mut fleet = fleet(&agents);
    fleet.device_unavailable = vec![("idle".into(), "no driver".into())];
    let placed = Placed {
        assignments: BTreeMap::from([
            ("old".to_string(), vec![assignment(&t)]),
            ("idle".to_string(), Vec::new()),
        ]),
        replacing: BTreeSet::from(["old".to_string()]),
        ..Placed::default()
    };
    let mut idle_since = HashMap::new();
    let resized = resize(
        &spec(4),
        &agents,
        &fleet,
        &placed,
        &mut idle_since,
        &Tuning::default(),
        7.0,
    );
    assert_eq!(resized.drain, ["old"]);
    assert_eq!(
        reasons(&resized.events),
        ["Replacing", "AgentDeviceUnavailable"]
    );
    assert_eq!(idle_since, HashMap::from([("idle".to_string(), 7.0)]));
}

#[test]
fn routes_go_to_serving_replicas_that_are_not_retiring() {
    let t = tenant("a", 50.0);
    let mut silent = hosting(agent("agent-2", 8002), &t);
    silent.report = None;
    let agents = [
        hosting(agent("agent-0", 8000), &t),
        hosting(agent("agent-1", 8001), &t),
        silent,
    ];
    let placed = Placed {
        assignments: agents
            .iter()
            .map(|a| (a.name.clone(), a.assignments.clone()))
            .collect(),
        retiring: BTreeSet::from([("agent-1".to_string(), "uid-a".to_string())]),
        ..Placed::default()
    };
    let (routes, placements) = routes("uid-a", &agents, &placed, &Tuning::default());
    let at: Vec<(&str, bool)> = placements
        .iter()
        .map(|p| (p.agent.as_str(), p.ready))
        .collect();
    assert_eq!(at, [("agent-0", true), ("agent-2", false)]);
    assert_eq!(
        routes,
        [Route {
            host: "10.0.0.1".into(),
            port: 8000,
            grpc_port: Some(8001),
            node: Some("node-1".into()),
            agent: "agent-0".into()
        }]
    );
}

#[test]
fn a_tenant_that_newly_fails_to_load_gets_one_event() {
    let t = tenant("a", 50.0);
    let failing = || {
        let mut d = decision(1, 10 * MIB);
        d.failure = Some("not ONNX".into());
        d.wants_profile = None;
        d
    };
    let outcomes = |t: &Arc<ModelTenant>| {
        let decided = vec![TenantDecided {
            tenant: Arc::clone(t),
            decision: failing(),
            too_big: false,
        }];
        let now = k8s_openapi::jiff::Timestamp::UNIX_EPOCH;
        let placed = Placed::default();
        tenant_outcomes(decided, &[], &placed, false, GIB, &Tuning::default(), now)
    };
    let first = outcomes(&t);
    assert_eq!(reasons(&first[0].events), ["LoadFailed"]);
    let mut again = ModelTenant::clone(&t);
    again.status = Some(first[0].status.clone());
    let second = outcomes(&Arc::new(again));
    assert!(second[0].events.is_empty(), "said once");
}

#[test]
fn pool_status_says_at_max_then_pending_then_ready() {
    let pool = pool(1024, 1);
    let agents = [agent("a", 8000)];
    let fleet = fleet(&agents);
    let unplaced = [Unplaced {
        tenant: "uid-a".into(),
        replicas: 2,
        memory_bytes: MIB,
        load: 0.1,
    }];
    let at_max = Resized {
        agents_after: 1,
        at_max: true,
        ..Resized::default()
    };
    let reason = |s: &GpuPoolStatus| {
        (
            s.conditions[0].reason.clone(),
            s.conditions[0].message.clone(),
        )
    };
    let full = pool_status(&pool, &fleet, &agents, &unplaced, &at_max);
    assert_eq!(
        reason(&full),
        (
            "AtMaxAgents".into(),
            "2 replica(s) fit on no agent and the pool is at maxAgents 1".into()
        )
    );
    let adding = Resized {
        add: 1,
        agents_after: 2,
        ..Resized::default()
    };
    let growing = pool_status(&pool, &fleet, &agents, &unplaced, &adding);
    assert_eq!(growing.pending_agents, 1);
    assert_eq!(growing.agents, 2);
    assert_eq!(reason(&growing).0, "AgentsPending");
    let steady = Resized {
        agents_after: 1,
        ..Resized::default()
    };
    let ready = pool_status(&pool, &fleet, &agents, &[], &steady);
    assert_eq!(
        (ready.ready_agents, reason(&ready)),
        (1, ("AgentsReady".into(), "1 agent(s) ready".into()))
    );
}

#[test]
fn an_unknown_model_is_guessed_from_the_same_model_then_the_pool_then_the_agent() {
    let agent = 16 << 30;
    let none = SizeGuess::new(std::iter::empty(), agent);
    assert_eq!(none.bytes("a"), agent / UNKNOWN_MODEL_SHARE);
    let known = [
        ("a", 3 << 30),
        ("b", 1 << 30),
        ("huge", agent * 2),
        ("zero", 0),
    ];
    let guess = SizeGuess::new(known.into_iter(), agent);
    assert_eq!(guess.bytes("a"), 3 << 30);
    assert_eq!(guess.bytes("b"), 1 << 30);
    // The mean of the placeable sizes: neither the tenant too big for any agent nor a zero.
    assert_eq!(guess.bytes("c"), 2 << 30);
}
