//! The mission end to end on the real control plane (`cargo xtask e2e`): `helm install`, tenants
//! with SLOs become Ready and serve through their EndpointSlices, a tighter SLO under load grows
//! the pool until a new GPU node joins, a looser one without load shrinks it, agents and the operator die and the
//! system recovers, deletion cleans up, bad references say why without disturbing others, and
//! a tenant's Secret decides who may call it.
//!
//! The operator runs as a host process with the chart's ServiceAccount identity (not admin);
//! agents run as host processes for the pods kwok marks Running (`cotenant_e2e::agents`).

mod steps;

use steps::Cluster;

#[test]
#[ignore = "needs the control plane and the Python references: cargo xtask test / e2e"]
fn tenants_are_served_rescaled_and_recovered_end_to_end() {
    let mut c = Cluster::install("e2e");

    // 1. Three tenants with zoo models and different SLOs: all Ready, each served through its
    //    EndpointSlice to tritonclient, matching onnxruntime.
    let models = c.zoo(&["squeezenet", "mobilenet_v2", "resnet18", "vgg16"]);
    c.apply_tenant("sq", &models.uri("squeezenet"), 400.0, "");
    c.apply_tenant("mn", &models.uri("mobilenet_v2"), 800.0, "");
    // rn batches only: its replica holds the weights and one batch's activations, so the three
    // tenants share one agent at any batch (see GPU_MEMORY_MIB), and its replicas beyond the
    // first need agents of their own, which is what grows the pool in step 2.
    c.apply_tenant(
        "rn",
        &models.uri("resnet18"),
        2000.0,
        "  scaling:\n    approach: Batching\n",
    );
    c.step("three tenants Ready", 420, || {
        c.all_ready(&["sq", "mn", "rn"])
    });
    for (t, file) in [
        ("sq", "squeezenet"),
        ("mn", "mobilenet_v2"),
        ("rn", "resnet18"),
    ] {
        c.infer_through_slice(t, &models.path(file));
    }
    // A light load while waiting: the latency shows once rn's knobs are chosen from its profile
    // and its window has requests.
    let light = c.load_image_model("rn", 2.0);
    c.step("observed latency in rn's status", 120, || {
        let p99 = c.jsonpath("mt", "rn", "{.status.observed.latencyMillis}");
        match p99.parse::<f64>() {
            Ok(ms) if ms > 0.0 => Ok(()),
            _ => Err(format!("status.observed.latencyMillis = {p99:?}")),
        }
    });
    // The step may end before any of these requests is answered; none may fail.
    let answers = light.stop();
    assert!(
        answers
            .keys()
            .all(|code| ["200", "429", "503"].contains(&code.as_str())),
        "while waiting for rn's latency: {answers:?}"
    );
    let events = c.events_of("rn");
    assert!(
        events.contains("ApproachChosen") && events.contains("profile: batch 1 x 1 instances"),
        "DNNScaler's decisions are Events:\n{events}"
    );

    // 2. A tighter SLO and load at four times the most one replica of rn serves at any knob
    //    setting (its profile): ReplicaState asks for more replicas than there are GPUs (capped at
    //    maxReplicas 3, one more than the GPU nodes), the pool grows, the new agent stays Pending
    //    for lack of a GPU, a node joins (the test plays the cluster autoscaler), the tenant gets
    //    its replicas, and once the load is sustainable it meets its SLO again.
    // "Ready" includes serving while the profile is taken; the load needs the profile.
    let mut peak = 0.0;
    c.step("rn profiled", 300, || {
        peak = c.profiled_peak_throughput("rn")?;
        Ok(())
    });
    let knobs_before = c.jsonpath(
        "mt",
        "rn",
        "{.status.knobs.batchSize}x{.status.knobs.instances}",
    );
    c.patch_tenant(
        "rn",
        r#"{"spec":{"slo":{"latencyMillis":1500},"scaling":{"maxReplicas":3}}}"#,
    );
    let rate = 4.0 * peak;
    eprintln!("e2e: load on rn at {rate:.1} requests/s");
    let load = c.load_image_model("rn", rate);
    c.step("an agent pod Pending for lack of a GPU", 180, || {
        c.pending_agent_pods()
    });
    c.add_gpu_node("gpu-autoscaled-0");
    c.step(
        "three ready replicas under load after the node joined",
        300,
        || c.expect_jsonpath("mt", "rn", "{.status.readyReplicas}", "3"),
    );
    let knobs_after = c.jsonpath(
        "mt",
        "rn",
        "{.status.knobs.batchSize}x{.status.knobs.instances}",
    );
    eprintln!("e2e: rn knobs {knobs_before} -> {knobs_after} after the SLO tightened");
    // Every replica here shares the same two cores, so more replicas add no capacity: under
    // four times the load, admission sheds, and the SLOMet condition says how much. The status
    // read here still holds the SLO tightening (requests admitted for 2000 ms finishing against
    // 1500 ms) and the new replicas' start, so only the answers are checked against the SLO; at
    // half the peak load, the SLO is met again.
    let overloaded = c.jsonpath(
        "mt",
        "rn",
        "{.status.observed} at {.status.knobs.batchSize}x{.status.knobs.instances}",
    );
    let slo_met = c.jsonpath(
        "mt",
        "rn",
        "{.status.conditions[?(@.type==\"SLOMet\")].message}",
    );
    let answers = load.stop();
    eprintln!("e2e: rn under 4x load: {overloaded}; SLOMet: {slo_met}; answers {answers:?}");
    expect_only_served_or_shed(&answers);
    assert!(
        slo_met.contains("refused by admission control"),
        "SLOMet under 4x load: {slo_met}"
    );
    let load = c.load_image_model("rn", rate / 8.0);
    c.step("rn meets its SLO again at half the peak load", 240, || {
        c.all_ready(&["rn"])?;
        c.expect_jsonpath(
            "mt",
            "rn",
            "{.status.conditions[?(@.type==\"SLOMet\")].status}",
            "True",
        )
    });
    let answers = load.stop();
    eprintln!(
        "e2e: rn at half the peak load: {}; answers {answers:?}",
        c.jsonpath("mt", "rn", "{.status.observed}")
    );
    expect_only_served_or_shed(&answers);

    // 3. The load falls to a trickle and the SLO loosens: replicas consolidate, idle agents
    //    drain and the pool shrinks, and no request fails meanwhile: a replica loses its route
    //    before it goes, and an agent leaves its endpoints before it stops.
    //    One replica must be enough by the operator's own estimate: the rate times the headroom
    //    under the profiled throughput at rn's knobs. Profiled on this shared 2-core host that
    //    throughput has come out at 6.3/s at batch 4 (less than at batch 1), and a 32nd of the
    //    base rate (3.8/s) holds two replicas while it comes out below 4.6/s; a 64th
    //    (1.9/s) leaves room for a profile half as fast.
    let agents_at_peak = c.pool_agents();
    let steady = c.load_image_model("rn", rate / 64.0);
    c.patch_tenant("rn", r#"{"spec":{"slo":{"latencyMillis":2000}}}"#);
    // The scale-down waits for the operator's window of low load (60 s).
    c.step("one rn replica", 300, || {
        c.expect_jsonpath("mt", "rn", "{.status.replicas}", "1")
    });
    c.step("the pool shrinks", 240, || {
        let now = c.pool_agents();
        if now < agents_at_peak {
            Ok(())
        } else {
            Err(format!("{now} agents (peak {agents_at_peak})"))
        }
    });
    let answers = steady.stop();
    eprintln!("e2e: rn while the pool shrank: answers {answers:?}");
    assert!(
        answers.keys().all(|k| k == "200") && answers.get("200").is_some_and(|n| *n > 0),
        "a scale-down under steady load fails no request: {answers:?}"
    );

    // 4. An agent dies: its replicas move and the tenant recovers. The operator dies: a
    //    restarted one changes nothing that was correct.
    let host = c.agent_of("sq");
    c.kill_agent(&host);
    c.step("sq re-placed off the dead agent", 240, || {
        let now = c.agent_of("sq");
        if now != host && c.all_ready(&["sq"]).is_ok() {
            Ok(())
        } else {
            Err(format!("sq on {now}"))
        }
    });
    c.infer_through_slice("sq", &models.path("squeezenet"));
    c.step("assignments settled", 120, || c.settled());
    let before = c.assignments();
    c.restart_operator();
    // The new operator must have led and decided with every agent's report before the check
    // means anything: it holds the Lease and has finished several rounds.
    c.step("the restarted operator leads and acts", 120, || {
        c.operator_leads_after(3)
    });
    assert_eq!(
        before,
        c.assignments(),
        "a restarted operator moved replicas or changed knobs"
    );

    // 5. Deleting a tenant removes its Service, EndpointSlices and assignments.
    c.delete_tenant("mn");
    c.step("mn cleaned up", 120, || c.cleaned_up("mn"));

    // 6. Bad references each get a clear condition and disturb no other tenant.
    let missing = steps::serve_404();
    let not_onnx = models.write_text("not-onnx.onnx", "this is not a model");
    c.apply_tenant_in_pool("lost", &models.uri("squeezenet"), 400.0, "", "no-such-pool");
    // A download needs a sha256 (admission refuses one without); the URL answers 404 first.
    c.apply_tenant(
        "gone",
        &format!("{missing}\n    sha256: \"{}\"", "0".repeat(64)),
        400.0,
        "",
    );
    c.apply_tenant("text", &format!("file://{}", not_onnx.display()), 400.0, "");
    c.apply_tenant("huge", &models.uri("vgg16"), 4000.0, "");
    for (t, reason, says) in [
        ("lost", "PoolNotFound", "no-such-pool"),
        ("gone", "LoadFailed", "404"),
        ("text", "LoadFailed", "not-onnx.onnx"),
        ("huge", "ModelTooLarge", "MiB"),
    ] {
        c.step(&format!("{t}: {reason}"), 180, || {
            c.expect_reason(t, reason, says)
        });
    }
    c.all_ready(&["sq", "rn"])
        .expect("the good tenants kept serving");
    c.infer_through_slice("rn", &models.path("resnet18"));

    // 7. A tenant whose callers need a token from its Secret: tritonclient with the token is
    //    served, a caller without one gets 401; a rotated Secret applies within seconds, and a
    //    deleted one shuts every caller out with an Event saying why.
    let token = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    let rotated = "60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752";
    c.set_token_secret("callers", &[token]);
    c.apply_tenant(
        "guarded",
        &models.uri("squeezenet"),
        400.0,
        "  credentials:\n    secretRef:\n      name: callers\n",
    );
    c.step("guarded Ready", 240, || c.all_ready(&["guarded"]));
    c.step("guarded answers its token", 60, || {
        match c.metadata_status("guarded", Some(token))? {
            200 => Ok(()),
            code => Err(code.to_string()),
        }
    });
    c.infer_through_slice_with_token("guarded", &models.path("squeezenet"), Some(token));
    assert_eq!(c.metadata_status("guarded", None), Ok(401));
    c.set_token_secret("callers", &[rotated]);
    c.step(
        "the rotated token accepted, the old one refused",
        60,
        || match (
            c.metadata_status("guarded", Some(rotated))?,
            c.metadata_status("guarded", Some(token))?,
        ) {
            (200, 401) => Ok(()),
            codes => Err(format!("{codes:?}")),
        },
    );
    c.delete_secret("callers");
    c.step("every caller refused without the Secret", 60, || {
        match c.metadata_status("guarded", Some(rotated))? {
            401 => Ok(()),
            code => Err(code.to_string()),
        }
    });
    let events = c.events_of("guarded");
    assert!(
        events.contains("CredentialsUnavailable"),
        "the tenant is told why:\n{events}"
    );

    // 8. The pool's agent settings change: its agents are replaced one at a time, each after its
    //    replicas have moved, and rn serves throughout (the test plays the cluster autoscaler,
    //    adding the node the surge agent needs).
    c.add_gpu_node("gpu-surge");
    let before = c.pool_agent_names();
    let steady = c.load_image_model("rn", rate / 32.0);
    c.patch_pool(r#"{"spec":{"agent":{"schedule":"sequential"}}}"#);
    c.step("every agent of the pool replaced", 420, || {
        let now = c.pool_agent_names();
        let left: Vec<&String> = now.iter().filter(|a| before.contains(a)).collect();
        match (left.is_empty(), now.is_empty()) {
            (true, false) => Ok(()),
            _ => Err(format!("agents {now:?}; of the old ones {left:?} remain")),
        }
    });
    c.step("rn Ready after the rollout", 120, || c.all_ready(&["rn"]));
    let answers = steady.stop();
    eprintln!("e2e: rn while its pool's agents were replaced: answers {answers:?}");
    assert!(
        answers.keys().all(|k| k == "200") && answers.get("200").is_some_and(|n| *n > 0),
        "a rollout under steady load fails no request: {answers:?}"
    );
    for agent in c.pool_agent_names() {
        let args = c.agent_pod(&agent)["spec"]["containers"][0]["args"].to_string();
        assert!(
            args.contains(r#""--schedule","sequential""#),
            "{agent}: {args}"
        );
    }
    c.infer_through_slice("rn", &models.path("resnet18"));

    // 9. A CPU-only pool with typed agent settings: its agent asks for no GPU, lands on the
    //    node without GPUs, runs with the pool's schedule, and its tenant serves.
    let cpu_pool = c.apply_cpu_pool("  agent:\n    schedule: sequential\n    threads: 1\n");
    c.apply_tenant_in_pool("oncpu", &models.uri("squeezenet"), 2000.0, "", &cpu_pool);
    c.step("oncpu Ready on the CPU pool", 240, || {
        c.all_ready(&["oncpu"])
    });
    let agent = c.agent_of("oncpu");
    let pod = c.agent_pod(&agent);
    assert_eq!(pod["spec"]["nodeName"], "cpu-0", "{pod}");
    let container = &pod["spec"]["containers"][0];
    assert!(
        container["resources"]["limits"]["nvidia.com/gpu"].is_null(),
        "{container}"
    );
    let args = container["args"].to_string();
    assert!(
        args.contains(r#""--device","cpu","--schedule","sequential","--threads","1""#),
        "{args}"
    );
    assert_eq!(
        c.jsonpath("gpuagent", &agent, "{.status.device.kind}"),
        "cpu"
    );
    c.infer_through_slice("oncpu", &models.path("squeezenet"));

    // 9. The operator publishes each tenant's and pool's gauges, a deleted tenant's no more, and
    //    the chart's Grafana dashboard and alerts query only metrics that the operator and the
    //    agents really export.
    c.step("the operator's tenant and pool gauges", 30, || {
        c.operator_publishes(&[("oncpu", 1), ("lost", 0)], &["mn"])
    });
    c.step(
        "the dashboard and alerts query exported metrics",
        30,
        || c.monitoring_queries_exported(),
    );

    // 10. Uninstall in the README's order: the tenants first, while the operator runs, which
    //     leaves no route, assignment or finalizer behind; then the chart; then the pools, whose
    //     agent pods and GpuAgents the garbage collector removes.
    c.delete_all_tenants();
    c.step("every tenant gone, routes and assignments too", 180, || {
        c.no_tenant_left()
    });
    c.uninstall_chart();
    c.delete_pools(&[&cpu_pool]);
    c.step("every agent pod and GpuAgent gone", 180, || {
        c.no_agent_left()
    });
    c.report_steps();
}

/// Under load only 200 (served), 429 (shed) and 503 (not ready) are acceptable, and some were
/// served.
fn expect_only_served_or_shed(answers: &std::collections::BTreeMap<String, u64>) {
    let unexpected: Vec<_> = answers
        .keys()
        .filter(|code| !["200", "429", "503"].contains(&code.as_str()))
        .collect();
    assert!(
        unexpected.is_empty() && answers.get("200").is_some_and(|n| *n > 0),
        "under load only 200, 429 and 503 are acceptable answers: {answers:?}"
    );
}
