use super::*;
use cotenant_crds::report::{Serving, State, Window};
use cotenant_crds::{GpuPoolSpec, ModelTenantSpec};
use cotenant_policy::{Profile, ProfilePoint};

fn pool(memory_mib: u64, max_agents: u32) -> GpuPool {
    let spec: GpuPoolSpec = serde_json::from_value(serde_json::json!({
        "agentNamespace": "agents", "maxAgents": max_agents, "gpuMemoryMiB": memory_mib,
        "scaleDownDelaySeconds": 60, "template": {"image": "agent:1"}
    }))
    .expect("pool");
    let mut p = GpuPool::new("gpus", spec);
    p.metadata.generation = Some(1);
    p
}

fn tenant(name: &str, slo_ms: f64) -> Arc<ModelTenant> {
    let spec: ModelTenantSpec = serde_json::from_value(serde_json::json!({
        "model": {"uri": "file:///models/m.onnx"},
        "slo": {"latencyMillis": slo_ms},
        "pool": "gpus"
    }))
    .expect("spec");
    let mut t = ModelTenant::new(name, spec);
    t.metadata.namespace = Some("team".into());
    t.metadata.uid = Some(format!("uid-{name}"));
    t.metadata.generation = Some(1);
    Arc::new(t)
}

fn agent(name: &str, port: u16) -> AgentView {
    AgentView {
        name: name.into(),
        assignments: Vec::new(),
        status: Some(GpuAgentStatus {
            address: Some(format!("10.0.0.1:{port}")),
            grpc_address: Some(format!("10.0.0.1:{}", port + 1)),
            node: Some("node-1".into()),
            ..Default::default()
        }),
        pod: PodState::Running,
        pod_ip: Some("10.0.0.1".into()),
        node: Some("node-1".into()),
        report: Some(AgentReport::new(Vec::new())),
        unreachable_for_s: 0.0,
        draining: false,
        outdated: false,
    }
}

fn profile() -> Profile {
    let point = |batch, instances, throughput, p99_ms| ProfilePoint {
        batch,
        instances,
        throughput,
        p99_ms,
        peak_activation_bytes: 1 << 20,
        gpu_util: None,
    };
    Profile {
        model: "m".into(),
        weight_bytes: 10 << 20,
        points: vec![
            point(1, 1, 100.0, 10.0),
            point(4, 1, 300.0, 14.0),
            point(1, 4, 150.0, 27.0),
        ],
    }
}

fn replica_report(t: &ModelTenant, state: State) -> TenantReport {
    TenantReport {
        name: cotenant_crds::report::served_name("team", &t.name_any()),
        source: t.spec.model.uri.clone(),
        slo_millis: t.spec.slo.latency_millis,
        percentile: t.spec.slo.percentile,
        tenant: Some(TenantRef {
            namespace: "team".into(),
            name: t.name_any(),
            uid: t.uid().expect("uid"),
        }),
        profiling: false,
        approach: None,
        profile: None,
        state,
    }
}

/// A Ready replica at batch 1, 1 instance for a minute, with `latency_ms` and `compute_ms` at
/// the SLO percentile over `window`.
fn ready_with(latency_ms: Option<f64>, compute_ms: Option<f64>, window: Window) -> State {
    State::Ready(Serving {
        knobs: cotenant_crds::Knobs::default(),
        since_knobs_changed_seconds: 60.0,
        queue_depth: 0,
        admission_overrun: 1.0,
        latency_at_percentile_millis: latency_ms,
        compute_at_percentile_millis: compute_ms,
        window,
        weight_bytes: 10 << 20,
    })
}

/// A Ready replica at `knobs` for `since_s` seconds, with `latency_ms` and `compute_ms` at the
/// SLO percentile over `window`.
fn ready_at(
    knobs: cotenant_crds::Knobs,
    since_s: f64,
    latency_ms: f64,
    compute_ms: Option<f64>,
    window: Window,
) -> State {
    let State::Ready(serving) = ready_with(Some(latency_ms), compute_ms, window) else {
        unreachable!("ready_with is Ready")
    };
    State::Ready(Serving {
        knobs,
        since_knobs_changed_seconds: since_s,
        ..serving
    })
}

/// A Ready replica that has served nothing yet.
fn ready_replica() -> State {
    ready_with(None, None, Window::default())
}

/// An agent report with `t`'s replica Ready, at `latency_ms` at the SLO percentile over `window`.
fn serving(t: &ModelTenant, latency_ms: f64, window: Window) -> AgentReport {
    AgentReport::new(vec![replica_report(
        t,
        ready_with(Some(latency_ms), None, window),
    )])
}

/// Runs one round and puts its assignments on the agents, as the agents would see them.
fn round(
    pool: &GpuPool,
    tenants: &[Arc<ModelTenant>],
    agents: &mut [AgentView],
    recall: &mut Recall,
    now_s: f64,
) -> PoolOutcome {
    let outcome = decide_pool(pool, tenants, agents, recall, now_s, "2026-12-02T00:00:00Z");
    for a in agents.iter_mut() {
        a.assignments = outcome
            .assignments
            .get(&a.name)
            .cloned()
            .unwrap_or_default();
    }
    outcome
}

/// Two rounds for one tenant on `agents[0]`: placed (asking for a profile), then its replica
/// Ready with the measured profile; the second round's outcome.
fn placed_then_profiled(
    pool: &GpuPool,
    t: &Arc<ModelTenant>,
    agents: &mut [AgentView],
    recall: &mut Recall,
) -> PoolOutcome {
    round(pool, std::slice::from_ref(t), agents, recall, 0.0);
    let mut r = replica_report(t, ready_replica());
    r.profile = Some(profile());
    agents[0].report = Some(AgentReport::new(vec![r]));
    round(pool, std::slice::from_ref(t), agents, recall, 2.0)
}

fn ready(outcome: &PoolOutcome, t: usize) -> (&str, &str) {
    let c = outcome.tenants[t]
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready");
    (c.status.as_str(), c.reason.as_str())
}

#[test]
fn a_new_tenant_is_placed_once_and_asks_for_a_profile() {
    let (pool, t) = (pool(1024, 4), tenant("a", 50.0));
    let mut agents = vec![agent("agent-0", 8000)];
    let mut recall = Recall::default();
    let outcome = round(
        &pool,
        std::slice::from_ref(&t),
        &mut agents,
        &mut recall,
        0.0,
    );
    let assigned = &outcome.assignments["agent-0"];
    assert_eq!(assigned.len(), 1);
    assert_eq!(assigned[0].tenant.uid, "uid-a");
    assert!(assigned[0].profile.is_some(), "the first replica profiles");
    assert_eq!(ready(&outcome, 0), ("False", "Loading"));
    assert_eq!(outcome.add_agents, 0);
    assert!(
        outcome.tenants[0].routes.is_empty(),
        "nothing ready to route to"
    );
}

#[test]
fn a_measured_profile_chooses_knobs_and_routes_to_the_ready_replica() {
    let (pool, t) = (pool(1024, 4), tenant("a", 50.0));
    let (mut agents, mut recall) = (vec![agent("agent-0", 8000)], Recall::default());
    let outcome = placed_then_profiled(&pool, &t, &mut agents, &mut recall);
    let status = &outcome.tenants[0].status;
    assert!(status.approach.is_some());
    assert!(status.profile.as_ref().is_some_and(|p| p.points.len() == 3));
    assert_eq!(ready(&outcome, 0), ("True", "Serving"));
    assert_eq!(
        outcome.tenants[0].routes,
        vec![Route {
            host: "10.0.0.1".into(),
            port: 8000,
            grpc_port: Some(8001),
            node: Some("node-1".into()),
            agent: "agent-0".into()
        }]
    );
    let assigned = &outcome.assignments["agent-0"][0];
    assert_eq!(assigned.profile, None, "profiled once");
    assert_eq!(Some(&assigned.knobs), status.knobs.as_ref());
    let reasons: Vec<&str> = outcome.tenants[0]
        .events
        .iter()
        .map(|n| n.reason.as_str())
        .collect();
    assert_eq!(
        reasons,
        ["ApproachChosen"],
        "one Event for the profile and the choice"
    );
}

#[test]
fn a_broken_model_fails_its_tenant_only() {
    let pool = pool(1024, 4);
    let (good, bad) = (tenant("good", 50.0), tenant("bad", 50.0));
    let mut agents = vec![agent("agent-0", 8000)];
    let mut recall = Recall::default();
    let tenants = [good.clone(), bad.clone()];
    round(&pool, &tenants, &mut agents, &mut recall, 0.0);
    let broken = replica_report(
        &bad,
        State::Failed {
            error: "model file /models/m.onnx: not ONNX".into(),
        },
    );
    agents[0].report = Some(AgentReport::new(vec![
        replica_report(&good, ready_replica()),
        broken,
    ]));
    let outcome = round(&pool, &tenants, &mut agents, &mut recall, 2.0);
    let by_name = |n: &str| {
        outcome
            .tenants
            .iter()
            .position(|o| o.tenant.name_any() == n)
            .expect("tenant")
    };
    assert_eq!(ready(&outcome, by_name("bad")).1, "LoadFailed");
    assert!(
        outcome.tenants[by_name("bad")]
            .status
            .conditions
            .iter()
            .any(|c| c.message.contains("not ONNX"))
    );
    assert_eq!(ready(&outcome, by_name("good")).0, "True");
    assert_eq!(
        outcome.assignments["agent-0"].len(),
        2,
        "both stay assigned"
    );
}

#[test]
fn a_model_larger_than_any_agent_is_unassigned_and_says_so() {
    let (pool, t) = (pool(8, 4), tenant("big", 50.0));
    let mut agents = vec![agent("agent-0", 8000)];
    let mut recall = Recall::default();
    round(
        &pool,
        std::slice::from_ref(&t),
        &mut agents,
        &mut recall,
        0.0,
    );
    agents[0].report = Some(AgentReport::new(vec![replica_report(&t, ready_replica())]));
    let outcome = round(
        &pool,
        std::slice::from_ref(&t),
        &mut agents,
        &mut recall,
        2.0,
    );
    assert_eq!(ready(&outcome, 0), ("False", "ModelTooLarge"));
    assert!(outcome.assignments["agent-0"].is_empty());
    assert_eq!(outcome.add_agents, 0, "more agents would not help");
    assert_eq!(outcome.tenants[0].events[0].reason, "ModelTooLarge");
}

#[test]
fn no_agent_means_the_pool_grows_and_the_tenant_waits() {
    let (pool, t) = (pool(1024, 4), tenant("a", 50.0));
    let mut recall = Recall::default();
    let outcome = round(&pool, &[t], &mut [], &mut recall, 0.0);
    assert_eq!(outcome.add_agents, 1);
    assert_eq!(ready(&outcome, 0), ("False", "AwaitingAgents"));
    assert_eq!(outcome.status.pending_agents, 1);
}

#[test]
fn a_dead_agent_is_removed_and_its_replica_placed_elsewhere() {
    let (pool, t) = (pool(1024, 4), tenant("a", 50.0));
    let mut agents = vec![agent("agent-0", 8000), agent("agent-1", 8001)];
    let mut recall = Recall::default();
    round(
        &pool,
        std::slice::from_ref(&t),
        &mut agents,
        &mut recall,
        0.0,
    );
    let (host, spare) = if agents[0].assignments.is_empty() {
        (1, 0)
    } else {
        (0, 1)
    };
    agents[host].report = None;
    agents[host].unreachable_for_s = Tuning::default().dead_after_s + 1.0;
    let outcome = round(
        &pool,
        std::slice::from_ref(&t),
        &mut agents,
        &mut recall,
        60.0,
    );
    assert!(outcome.remove.contains(&agents[host].name));
    assert_eq!(outcome.assignments[&agents[spare].name].len(), 1);
    assert!(outcome.assignments[&agents[host].name].is_empty());
}

#[test]
fn a_deleting_tenant_loses_its_replicas() {
    let (pool, t) = (pool(1024, 4), tenant("a", 50.0));
    let mut agents = vec![agent("agent-0", 8000)];
    let mut recall = Recall::default();
    round(
        &pool,
        std::slice::from_ref(&t),
        &mut agents,
        &mut recall,
        0.0,
    );
    let mut deleting = ModelTenant::clone(&t);
    deleting.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()),
    );
    let outcome = round(&pool, &[Arc::new(deleting)], &mut agents, &mut recall, 2.0);
    assert!(outcome.assignments["agent-0"].is_empty());
    assert!(outcome.tenants.is_empty());
}

#[test]
fn an_idle_agent_is_drained_after_the_delay_then_removed() {
    let pool = pool(1024, 4);
    let mut agents = vec![agent("agent-0", 8000)];
    let mut recall = Recall::default();
    let first = round(&pool, &[], &mut agents, &mut recall, 0.0);
    assert!(first.drain.is_empty());
    let later = round(&pool, &[], &mut agents, &mut recall, 61.0);
    assert_eq!(later.drain, vec!["agent-0".to_string()]);
    agents[0].draining = true;
    let last = round(&pool, &[], &mut agents, &mut recall, 62.0);
    assert_eq!(last.remove, vec!["agent-0".to_string()]);
}

#[test]
fn a_briefly_silent_agent_keeps_its_replicas_but_loses_its_routes() {
    let (pool, t) = (pool(1024, 4), tenant("a", 50.0));
    let mut agents = vec![agent("agent-0", 8000), agent("agent-1", 8001)];
    let mut recall = Recall::default();
    round(
        &pool,
        std::slice::from_ref(&t),
        &mut agents,
        &mut recall,
        0.0,
    );
    let host = agents
        .iter()
        .position(|a| !a.assignments.is_empty())
        .expect("placed");
    agents[host].report = Some(AgentReport::new(vec![replica_report(&t, ready_replica())]));
    let serving = round(
        &pool,
        std::slice::from_ref(&t),
        &mut agents,
        &mut recall,
        2.0,
    );
    assert_eq!(serving.tenants[0].routes.len(), 1);
    agents[host].report = None;
    agents[host].unreachable_for_s = 2.0;
    let silent = round(
        &pool,
        std::slice::from_ref(&t),
        &mut agents,
        &mut recall,
        4.0,
    );
    assert_eq!(
        silent.assignments[&agents[host].name].len(),
        1,
        "not moved yet"
    );
    assert!(
        silent.tenants[0].routes.is_empty(),
        "no traffic to an agent not heard from"
    );
    assert!(silent.remove.is_empty());
}

#[test]
fn a_new_model_uri_is_profiled_again() {
    let (pool, t) = (pool(1024, 4), tenant("a", 50.0));
    let (mut agents, mut recall) = (vec![agent("agent-0", 8000)], Recall::default());
    let profiled = placed_then_profiled(&pool, &t, &mut agents, &mut recall);
    let mut changed = ModelTenant::clone(&t);
    changed.status = Some(profiled.tenants[0].status.clone());
    changed.spec.model.uri = "file:///models/m2.onnx".into();
    agents[0].report = Some(AgentReport::new(vec![replica_report(&t, ready_replica())]));
    let outcome = round(&pool, &[Arc::new(changed)], &mut agents, &mut recall, 4.0);
    let assigned = &outcome.assignments["agent-0"][0];
    assert_eq!(assigned.model.uri, "file:///models/m2.onnx");
    assert!(assigned.profile.is_some(), "the new model is measured");
    assert_eq!(outcome.tenants[0].status.profile, None);
    assert_eq!(outcome.tenants[0].events[0].reason, "ModelChanged");
}

/// Rounds of light traffic on a tenant restored from `status` by a new operator (empty memory);
/// the batch sizes the status shows afterwards.
fn batches_after_restart(status: cotenant_crds::ModelTenantStatus) -> Vec<u32> {
    let pool = pool(1024, 4);
    let mut t = (*tenant("a", 50.0)).clone();
    t.status = Some(status);
    let t = Arc::new(t);
    let mut agents = vec![agent("agent-0", 8000)];
    let mut recall = Recall::default();
    let mut batches = Vec::new();
    // The agent runs what it was assigned, from the round after it was.
    let mut runs = (t.status.as_ref().and_then(|s| s.knobs), 0.0);
    for i in 0..12 {
        let now = 5.0 * i as f64;
        let window = Window {
            arrival_rate_per_second: 10.0,
            throughput_per_second: 10.0,
            completions: 300,
            slo_attainment: Some(1.0),
            shed: 0,
            ..Window::default()
        };
        let knobs = runs.0.unwrap_or_default();
        agents[0].report = Some(AgentReport::new(vec![replica_report(
            &t,
            ready_at(knobs, now - runs.1, 5.0, None, window),
        )]));
        let outcome = round(
            &pool,
            std::slice::from_ref(&t),
            &mut agents,
            &mut recall,
            now,
        );
        if let Some(a) = agents[0].assignments.first()
            && runs.0.as_ref() != Some(&a.knobs)
        {
            runs = (Some(a.knobs), now);
        }
        let status = &outcome.tenants[0].status;
        batches.push(status.knobs.as_ref().map_or(0, |k| k.batch_size));
    }
    batches
}

#[test]
fn a_restarted_operator_keeps_what_dnnscaler_learned() {
    let mut status = cotenant_crds::ModelTenantStatus {
        profile: Some(cotenant_crds::convert::profile_to_status(
            &profile(),
            "file:///models/m.onnx",
            "2026-12-02T00:00:00Z".into(),
        )),
        approach: Some(cotenant_crds::ChosenApproach::Batching),
        knobs: Some(cotenant_crds::Knobs {
            batch_size: 2,
            instances: 1,
        }),
        ..Default::default()
    };
    // Without the memory, light traffic lets the batch grow past 2 again.
    let forgetful = batches_after_restart(status.clone());
    assert!(forgetful.iter().any(|&b| b >= 4), "{forgetful:?}");
    // With it, batch 4 is known to violate this SLO at this load: it stays below.
    status.scaler = Some(cotenant_crds::ScalerMemory {
        within_slo: 2,
        violated_at: Some(4),
        slo_millis: 50.0,
        arrival_rate_per_second: 10.0,
    });
    let remembering = batches_after_restart(status);
    assert!(remembering.iter().all(|&b| b < 4), "{remembering:?}");
}

#[test]
fn the_aggregate_takes_the_worst_replicas_compute_time_and_skips_what_is_missing() {
    let t = tenant("a", 50.0);
    let with =
        |compute: Option<f64>| replica_report(&t, ready_with(None, compute, Window::default()));
    let reports = [
        with(Some(4.0)),
        with(Some(9.0)),
        with(Some(f64::NAN)),
        with(None),
        replica_report(&t, State::Loading),
    ];
    let a = super::tenant::aggregate(&reports.iter().collect::<Vec<_>>());
    assert_eq!((a.replicas, a.compute_ms), (4, Some(9.0)));
    let unmeasured = [with(None)];
    let a = super::tenant::aggregate(&unmeasured.iter().collect::<Vec<_>>());
    assert_eq!(a.compute_ms, None);
}

/// Admission holds the SLO for the requests it accepts, so under overload the SLOMet condition
/// is true while most requests are refused: its message says how many.
#[test]
fn the_slo_condition_says_how_much_admission_refused() {
    let (pool, t) = (pool(1024, 4), tenant("a", 50.0));
    let (mut agents, mut recall) = (vec![agent("agent-0", 8000)], Recall::default());
    placed_then_profiled(&pool, &t, &mut agents, &mut recall);
    let mut message = |completions: u64, shed: u64| {
        let window = Window {
            arrival_rate_per_second: (completions + shed) as f64 / 30.0,
            throughput_per_second: completions as f64 / 30.0,
            completions,
            slo_attainment: Some(0.995),
            shed,
            ..Window::default()
        };
        agents[0].report = Some(serving(&t, 40.0, window));
        let outcome = round(
            &pool,
            std::slice::from_ref(&t),
            &mut agents,
            &mut recall,
            4.0,
        );
        let c = outcome.tenants[0]
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == "SLOMet")
            .expect("SLOMet")
            .clone();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "WithinSLO")
        );
        c.message
    };
    assert_eq!(message(300, 0), "p99 40.0 ms within 50 ms");
    assert_eq!(
        message(300, 2),
        "p99 40.0 ms within 50 ms",
        "under 1%: noise"
    );
    assert_eq!(
        message(300, 700),
        "p99 40.0 ms within 50 ms; about 70% of requests refused by admission control"
    );
    assert_eq!(
        message(300, 5),
        "p99 40.0 ms within 50 ms; under 10% of requests refused by admission control"
    );
}

/// Noise in a steady tenant's measurements leaves its status as it was, so the operator writes
/// nothing; a real move or a flip of the SLO rewrites the summary, age does not.
#[test]
fn a_steady_tenants_status_does_not_move_with_noise() {
    let (pool, t) = (pool(1024, 4), tenant("a", 50.0));
    let (mut agents, mut recall) = (vec![agent("agent-0", 8000)], Recall::default());
    placed_then_profiled(&pool, &t, &mut agents, &mut recall);
    let mut t = t;
    let mut statuses = Vec::new();
    for (i, (latency, rate)) in [(40.0, 10.0), (41.5, 10.7), (38.2, 9.4), (42.9, 11.1)]
        .into_iter()
        .enumerate()
    {
        let window = Window {
            arrival_rate_per_second: rate,
            throughput_per_second: rate,
            completions: (rate * 30.0) as u64,
            slo_attainment: Some(0.995 + i as f64 * 0.001),
            ..Window::default()
        };
        agents[0].report = Some(serving(&t, latency, window));
        let outcome = round(
            &pool,
            std::slice::from_ref(&t),
            &mut agents,
            &mut recall,
            4.0 + i as f64,
        );
        let status = outcome.tenants[0].status.clone();
        Arc::make_mut(&mut t).status = Some(status.clone());
        statuses.push(status);
    }
    assert!(
        statuses.windows(2).skip(1).all(|w| w[0] == w[1]),
        "{statuses:#?}"
    );
    let kept = statuses[3].observed.clone().expect("observed");
    assert_eq!(kept.latency_millis, 40.0);

    let measured: k8s_openapi::jiff::Timestamp = kept
        .measured_at
        .as_deref()
        .expect("measuredAt")
        .parse()
        .expect("time");
    let now = measured + std::time::Duration::from_secs(status::DWELL_S as u64);
    let steady = tenant::Aggregate {
        replicas: 1,
        arrival_rate: 10.0,
        throughput: 10.0,
        latency_ms: 41.0,
        attainment: Some(0.995),
        ..tenant::Aggregate::default()
    };
    let same = status::summary(Some(&kept), &steady, now, false, f64::INFINITY);
    assert_eq!(same, kept);
    let moved = tenant::Aggregate {
        latency_ms: 55.0,
        ..steady
    };
    assert_eq!(
        status::summary(Some(&kept), &moved, now, false, f64::INFINITY).latency_millis,
        55.0
    );
    let busier = tenant::Aggregate {
        arrival_rate: 14.0,
        ..steady
    };
    assert_eq!(
        status::summary(Some(&kept), &busier, now, false, f64::INFINITY).arrival_rate_per_second,
        14.0
    );
    let missing = tenant::Aggregate {
        attainment: Some(0.98),
        ..steady
    };
    assert_eq!(
        status::summary(Some(&kept), &missing, now, false, f64::INFINITY).slo_attainment,
        0.98
    );
    let flipped = status::summary(Some(&kept), &steady, now, true, f64::INFINITY);
    assert_eq!(flipped.latency_millis, 41.0);
    // A summary younger than the dwell time stays, however the values moved, unless the SLO
    // flipped.
    let young = measured + std::time::Duration::from_secs(5);
    assert_eq!(
        status::summary(Some(&kept), &moved, young, false, f64::INFINITY),
        kept
    );
    assert_eq!(
        status::summary(Some(&kept), &moved, young, true, f64::INFINITY).latency_millis,
        55.0
    );
    // Age alone rewrites nothing: a steady tenant's status stays as it is.
    let later = now + std::time::Duration::from_secs(3600);
    assert_eq!(
        status::summary(Some(&kept), &steady, later, false, f64::INFINITY),
        kept
    );

    // A summary measured in the first dwell time of the knobs and replicas the tenant runs now
    // is compared at half the thresholds while they serve their second: it measured a
    // transition, and a value that settled near a threshold must not cross it later with noise.
    let dwell = status::DWELL_S;
    let settled = tenant::Aggregate {
        latency_ms: 45.0,
        ..steady
    };
    let rebased = status::summary(Some(&kept), &settled, now, false, dwell + 5.0);
    assert_eq!(rebased.latency_millis, 45.0, "12% moved, over half of 20%");
    assert_ne!(rebased.measured_at, kept.measured_at);
    let close = status::summary(Some(&kept), &steady, now, false, dwell + 5.0);
    assert_eq!(close, kept, "2.5% is within half the threshold");
    // Not in the configuration's first dwell time…
    assert_eq!(
        status::summary(Some(&kept), &settled, now, false, dwell - 1.0),
        kept
    );
    // …nor once it has served two.
    assert_eq!(
        status::summary(Some(&kept), &settled, now, false, 2.0 * dwell + 1.0),
        kept
    );
    assert_eq!(
        status::summary(
            Some(&rebased),
            &moved_a_little(&settled),
            later,
            false,
            3600.0 + dwell + 5.0
        ),
        rebased
    );
}

fn moved_a_little(a: &tenant::Aggregate) -> tenant::Aggregate {
    tenant::Aggregate {
        latency_ms: a.latency_ms * 1.05,
        ..*a
    }
}

/// A latency hovering at the SLO flips SLOMet at most once per dwell time, so it does not
/// rewrite the status every round.
#[test]
fn slo_met_flips_at_most_once_per_dwell_time() {
    let (pool, t) = (pool(1024, 4), tenant("a", 50.0));
    let (mut agents, mut recall) = (vec![agent("agent-0", 8000)], Recall::default());
    placed_then_profiled(&pool, &t, &mut agents, &mut recall);
    let mut t = t;
    let mut slo_met_after = |t: &mut Arc<ModelTenant>, latency: f64, now_s: f64| {
        let window = Window {
            arrival_rate_per_second: 10.0,
            throughput_per_second: 10.0,
            completions: 300,
            ..Window::default()
        };
        agents[0].report = Some(serving(t, latency, window));
        let outcome = round(
            &pool,
            std::slice::from_ref(t),
            &mut agents,
            &mut recall,
            now_s,
        );
        let status = outcome.tenants[0].status.clone();
        Arc::make_mut(t).status = Some(status.clone());
        status
            .conditions
            .iter()
            .find(|c| c.type_ == "SLOMet")
            .map(|c| c.status.clone())
    };
    // The rounds run at `round`'s time; the condition's last transition is set before it.
    let round_time: k8s_openapi::jiff::Timestamp = "2026-12-02T00:00:00Z".parse().expect("time");
    let transition_ago = |t: &mut Arc<ModelTenant>, seconds: u64| {
        let at = round_time - std::time::Duration::from_secs(seconds);
        for c in &mut Arc::make_mut(t).status.as_mut().expect("status").conditions {
            c.last_transition_time = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at);
        }
    };
    assert_eq!(slo_met_after(&mut t, 40.0, 10.0).as_deref(), Some("True"));
    // Over the SLO 5 s after the condition was set: it holds.
    transition_ago(&mut t, 5);
    assert_eq!(slo_met_after(&mut t, 60.0, 12.0).as_deref(), Some("True"));
    // Once its last transition is older than the dwell time, it flips.
    transition_ago(&mut t, status::DWELL_S as u64 + 1);
    assert_eq!(slo_met_after(&mut t, 60.0, 14.0).as_deref(), Some("False"));
}

#[test]
fn routes_go_to_the_pod_ip_not_to_the_address_an_agent_wrote() {
    let (pool, t) = (pool(1024, 4), tenant("a", 50.0));
    let mut hostile = agent("agent-0", 8000);
    // The agent claims to live at the cloud metadata address, on another node; only its port
    // is taken.
    if let Some(s) = hostile.status.as_mut() {
        s.address = Some("169.254.169.254:8000".into());
        s.node = Some("someone-elses-node".into());
    }
    hostile.pod_ip = Some("10.1.2.3".into());
    let (mut agents, mut recall) = (vec![hostile], Recall::default());
    let outcome = placed_then_profiled(&pool, &t, &mut agents, &mut recall);
    assert_eq!(
        outcome.tenants[0]
            .routes
            .iter()
            .map(|r| (r.host.as_str(), r.port, r.node.as_deref()))
            .collect::<Vec<_>>(),
        vec![("10.1.2.3", 8000, Some("node-1"))]
    );
    let placements = &outcome.tenants[0].status.placements;
    assert_eq!(placements[0].node.as_deref(), Some("node-1"));
    // A pod without an IP yet gets no route, whatever its agent says.
    agents[0].pod_ip = None;
    let outcome = round(
        &pool,
        std::slice::from_ref(&t),
        &mut agents,
        &mut recall,
        4.0,
    );
    assert!(outcome.tenants[0].routes.is_empty());
}

#[test]
fn counters_an_agent_reports_cannot_overflow_the_round() {
    let (pool, t) = (pool(1024, 4), tenant("a", 50.0));
    let (mut agents, mut recall) = (
        vec![agent("agent-0", 8000), agent("agent-1", 8001)],
        Recall::default(),
    );
    let mut t_two = (*t).clone();
    t_two.spec.scaling.min_replicas = 2;
    t_two.spec.scaling.max_replicas = 2;
    let t = Arc::new(t_two);
    round(
        &pool,
        std::slice::from_ref(&t),
        &mut agents,
        &mut recall,
        0.0,
    );
    let huge = Window {
        arrival_rate_per_second: 1.0,
        throughput_per_second: 1.0,
        completions: u64::MAX,
        slo_attainment: Some(1.0),
        shed: u64::MAX,
        ..Window::default()
    };
    for a in agents.iter_mut() {
        let mut report = serving(&t, 10.0, huge.clone());
        if let State::Ready(s) = &mut report.tenants[0].state {
            s.queue_depth = u64::MAX;
        }
        a.report = Some(report);
    }
    let reports: Vec<TenantReport> = agents
        .iter()
        .filter_map(|a| a.report.as_ref().map(|r| r.tenants[0].clone()))
        .collect();
    let a = super::tenant::aggregate(&reports.iter().collect::<Vec<_>>());
    assert_eq!(
        (a.completions, a.shed, a.queue_depth),
        (u64::MAX, u64::MAX, u64::MAX)
    );
    // The whole round, statuses included, copes.
    let outcome = round(
        &pool,
        std::slice::from_ref(&t),
        &mut agents,
        &mut recall,
        4.0,
    );
    assert_eq!(outcome.tenants.len(), 1);
}

#[test]
fn an_agent_that_cannot_use_its_gpu_is_named_in_a_pool_event() {
    let (pool, t) = (pool(1024, 4), tenant("a", 50.0));
    let mut agents = vec![agent("agent-0", 8000), agent("agent-1", 8001)];
    if let Some(s) = agents[1].status.as_mut() {
        cotenant_crds::conditions::set_condition(
            &mut s.conditions,
            "Ready",
            false,
            "DeviceUnavailable",
            "--device cuda: no libcuda.so found (no NVIDIA driver)",
            None,
        );
    }
    let outcome = round(&pool, &[t], &mut agents, &mut Recall::default(), 0.0);
    let events: Vec<(&str, &str)> = outcome
        .events
        .iter()
        .map(|n| (n.reason.as_str(), n.message.as_str()))
        .collect();
    assert_eq!(
        events,
        vec![(
            "AgentDeviceUnavailable",
            "agent agent-1 cannot use its GPU: --device cuda: no libcuda.so found (no NVIDIA driver)"
        )]
    );
}

#[test]
fn a_replica_that_goes_loses_its_route_first_and_serves_meanwhile() {
    let pool = pool(1024, 4);
    let (mut agents, mut recall) = (
        vec![agent("agent-0", 8000), agent("agent-1", 8001)],
        Recall::default(),
    );
    let replicas = |n: u32| {
        let mut t = ModelTenant::clone(&tenant("a", 50.0));
        t.spec.scaling.min_replicas = n;
        t.spec.scaling.max_replicas = n;
        Arc::new(t)
    };
    let two = replicas(2);
    round(
        &pool,
        std::slice::from_ref(&two),
        &mut agents,
        &mut recall,
        0.0,
    );
    let mut now = 2.0;
    loop {
        assert!(now < 60.0, "two replicas never served");
        for a in agents.iter_mut() {
            let mut report = serving(&two, 10.0, Window::default());
            report.tenants[0].profile = Some(profile());
            a.report = Some(report);
        }
        let outcome = round(
            &pool,
            std::slice::from_ref(&two),
            &mut agents,
            &mut recall,
            now,
        );
        now += 2.0;
        if outcome.tenants[0].routes.len() == 2 {
            break;
        }
    }

    let one = replicas(1);
    let holders =
        |agents: &[AgentView]| agents.iter().filter(|a| !a.assignments.is_empty()).count();
    let retired_at = loop {
        assert!(now < 600.0, "the second replica never went");
        let outcome = round(
            &pool,
            std::slice::from_ref(&one),
            &mut agents,
            &mut recall,
            now,
        );
        let routes = outcome.tenants[0].routes.len();
        if routes == 1 {
            assert_eq!(holders(&agents), 2, "the route goes before the replica");
            break now;
        }
        now += 2.0;
    };
    let outcome = round(
        &pool,
        std::slice::from_ref(&one),
        &mut agents,
        &mut recall,
        retired_at + 2.0,
    );
    assert_eq!(outcome.tenants[0].routes.len(), 1);
    assert_eq!(holders(&agents), 2, "still serving what reaches it");
    let outcome = round(
        &pool,
        std::slice::from_ref(&one),
        &mut agents,
        &mut recall,
        retired_at + ROUTE_DRAIN_S + 0.5,
    );
    assert_eq!(outcome.tenants[0].routes.len(), 1);
    assert_eq!(holders(&agents), 1, "then it goes");
    assert_eq!(outcome.tenants[0].status.placements.len(), 1);
}

#[test]
fn an_agent_on_an_older_template_is_replaced_without_losing_its_replica() {
    let (pool, t) = (pool(1024, 1), tenant("a", 50.0));
    let (mut agents, mut recall) = (vec![agent("agent-0", 8000)], Recall::default());
    placed_then_profiled(&pool, &t, &mut agents, &mut recall);
    agents[0].report = Some(serving(&t, 10.0, Window::default()));

    // The pool's template changed: its one agent drains, a replacement starts past maxAgents,
    // and the replica keeps serving where it is until the replacement's is ready.
    agents[0].outdated = true;
    let outcome = round(
        &pool,
        std::slice::from_ref(&t),
        &mut agents,
        &mut recall,
        10.0,
    );
    assert_eq!(outcome.drain, vec!["agent-0".to_string()]);
    assert_eq!(outcome.add_agents, 1);
    assert_eq!(
        outcome.assignments["agent-0"].len(),
        1,
        "held until replaced"
    );
    assert_eq!(outcome.tenants[0].routes.len(), 1);
    assert!(outcome.events.iter().any(|n| n.reason == "Replacing"));

    agents[0].draining = true;
    let mut new = agent("agent-1", 8002);
    new.pod = PodState::Running;
    agents.push(new);
    let outcome = round(
        &pool,
        std::slice::from_ref(&t),
        &mut agents,
        &mut recall,
        12.0,
    );
    assert!(outcome.undrain.is_empty(), "never undrained");
    assert_eq!(
        outcome.assignments["agent-1"].len(),
        1,
        "the replacement starts"
    );
    agents[1].report = Some(serving(&t, 10.0, Window::default()));
    let mut now = 14.0;
    while !agents[0].assignments.is_empty() {
        assert!(now < 60.0, "the old replica never stopped");
        round(
            &pool,
            std::slice::from_ref(&t),
            &mut agents,
            &mut recall,
            now,
        );
        now += 2.0;
    }
    let outcome = round(
        &pool,
        std::slice::from_ref(&t),
        &mut agents,
        &mut recall,
        now,
    );
    assert_eq!(
        outcome.remove,
        vec!["agent-0".to_string()],
        "empty, it goes"
    );
    assert_eq!(outcome.add_agents, 0);
}

/// A replayed stream of reports around one knob change: batch 4 violates the SLO in its own
/// batch time, batch 2 meets it. After the round that shrinks 4 to 2, the reports still show
/// batch 4 (the agent has not applied 2 yet), then batch 2 with the backlog batch 4 left, then
/// batch 2 alone: none of that is evidence against batch 2, and it shrinks no further (it may
/// grow back towards 4 once its own measurements stay under the band).
#[test]
fn the_round_steps_only_on_measurements_of_the_knobs_it_set() {
    let (pool, t) = (pool(1024, 4), tenant("a", 50.0));
    let (mut agents, mut recall) = (vec![agent("agent-0", 8000)], Recall::default());
    let profiled = placed_then_profiled(&pool, &t, &mut agents, &mut recall);
    let knobs = |b| cotenant_crds::Knobs {
        batch_size: b,
        instances: 1,
    };
    assert_eq!(profiled.tenants[0].status.knobs, Some(knobs(4)));
    let window = Window {
        arrival_rate_per_second: 50.0,
        throughput_per_second: 50.0,
        completions: 500,
        ..Window::default()
    };
    // (seconds, knobs the agent runs, for how long, latency, compute)
    let stream = [
        (10.0, 4, 10.0, 80.0, 60.0),
        (14.0, 4, 14.0, 80.0, 60.0),
        (18.0, 2, 1.0, 80.0, 20.0),
        (22.0, 2, 5.0, 30.0, 20.0),
        (26.0, 2, 9.0, 30.0, 20.0),
        (30.0, 2, 13.0, 30.0, 20.0),
    ];
    let mut applied = Vec::new();
    for (now, batch, since, latency, compute) in stream {
        let state = ready_at(knobs(batch), since, latency, Some(compute), window.clone());
        agents[0].report = Some(AgentReport::new(vec![replica_report(&t, state)]));
        let outcome = round(
            &pool,
            std::slice::from_ref(&t),
            &mut agents,
            &mut recall,
            now,
        );
        applied.push(outcome.tenants[0].status.knobs.map(|k| k.batch_size));
    }
    assert_eq!(
        applied[..4],
        [Some(2); 4],
        "shrinks once, to 2: {applied:?}"
    );
    assert!(
        applied.iter().all(|b| *b >= Some(2)),
        "batch 2 meets the SLO: {applied:?}"
    );
}

/// Where the agent measured a point with both knobs above 1 and it beats both single-knob
/// points, the operator runs the tenant Joint at that point.
#[test]
fn a_profile_with_a_winning_joint_point_runs_joint() {
    let (pool, t) = (pool(1024, 4), tenant("a", 50.0));
    let (mut agents, mut recall) = (vec![agent("agent-0", 8000)], Recall::default());
    round(
        &pool,
        std::slice::from_ref(&t),
        &mut agents,
        &mut recall,
        0.0,
    );
    let asked = agents[0].assignments[0]
        .profile
        .expect("asks for a profile");
    assert_eq!((asked.batch_size, asked.instances), (4, 4));
    let mut p = profile();
    p.points.push(ProfilePoint {
        batch: 4,
        instances: 4,
        throughput: 700.0,
        p99_ms: 30.0,
        peak_activation_bytes: 1 << 20,
        gpu_util: None,
    });
    let mut r = replica_report(&t, ready_replica());
    r.profile = Some(p);
    agents[0].report = Some(AgentReport::new(vec![r]));
    let outcome = round(
        &pool,
        std::slice::from_ref(&t),
        &mut agents,
        &mut recall,
        2.0,
    );
    let status = &outcome.tenants[0].status;
    assert_eq!(status.approach, Some(cotenant_crds::ChosenApproach::Joint));
    let joint = cotenant_crds::Knobs {
        batch_size: 4,
        instances: 4,
    };
    assert_eq!(status.knobs, Some(joint));
    assert_eq!(agents[0].assignments[0].knobs, joint);
    assert!(
        status.profile.as_ref().is_some_and(|p| p.points.len() == 4),
        "the joint point is recorded"
    );
    let chosen = outcome.tenants[0]
        .events
        .iter()
        .find(|n| n.reason == "ApproachChosen")
        .expect("chosen");
    assert!(chosen.message.contains("joint 7.00"), "{}", chosen.message);
}

mod phases;

/// New tenants whose model size no agent has reported yet spread over the agents instead of
/// piling onto the first one (the limit of 64 per agent is `policy`'s `place_at_most`).
#[test]
fn tenants_of_unknown_size_spread_over_the_agents() {
    let big = pool(80 * 1024, 8);
    let tenants: Vec<Arc<ModelTenant>> =
        (0..40).map(|i| tenant(&format!("t{i:02}"), 50.0)).collect();
    let mut agents: Vec<AgentView> = (0..4)
        .map(|i| agent(&format!("agent-{i}"), 8000 + i as u16 * 10))
        .collect();
    let mut recall = Recall::default();
    let outcome = round(&big, &tenants, &mut agents, &mut recall, 0.0);
    let counts: Vec<usize> = outcome.assignments.values().map(Vec::len).collect();
    assert_eq!(counts.iter().sum::<usize>(), 40, "{counts:?}");
    assert!(counts.iter().all(|&c| c <= 16), "{counts:?}");
}
