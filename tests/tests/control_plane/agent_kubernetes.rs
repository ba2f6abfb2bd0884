//! The agent in Kubernetes mode as a host process with the chart's agent ServiceAccount identity
//! (not admin): it serves its GpuAgent's assignments (file:// under its model root and http://
//! models), marks a broken one Failed, refuses models outside its root and downloads from
//! loopback, writes its status, follows knob changes and removals, profiles on request, lets
//! only the operator's ServiceAccount (exactly: namespace and name) read `/report`, serves
//! `/metrics` on the admin port only, requires a guarded tenant's token (following its
//! rotation), and keeps serving through an API server outage.

use cotenant_e2e::agents::host_ip;
use cotenant_e2e::cluster::free_port;
use cotenant_e2e::http::http_post_json;
use cotenant_e2e::process::{Lifetime, Process};
use cotenant_e2e::proxy::TcpProxy;
use cotenant_e2e::{ControlPlane, TestNamespace, http_get, http_get_with, poll, workspace_binary};
use serde_json::Value;
use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const RELEASE: &str = "agentk";

/// Uninstalls the release when the test ends, passed or not, so its cluster-scoped RBAC does not
/// block the next run.
struct Release<'a> {
    cp: &'a ControlPlane,
    namespace: String,
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        let mut uninstall = self.cp.helm();
        uninstall.args(["uninstall", RELEASE, "-n", &self.namespace]);
        let _ = uninstall.output();
    }
}

/// Serves `file` to every GET on a port of `ip`, from a background thread; returns the URL.
fn serve_file(file: &Path, ip: &str) -> String {
    let bytes = std::fs::read(file).expect("model file");
    let listener = std::net::TcpListener::bind((ip, 0)).expect("bind");
    let url = format!(
        "http://{}/models/bert.onnx",
        listener.local_addr().expect("addr")
    );
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request);
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                bytes.len()
            );
            let _ = stream.write_all(&bytes);
        }
    });
    url
}

fn sha256_hex(path: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum runs");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("a digest")
        .to_string()
}

fn assignment(n: &str, name: &str, uri: &str, extra: &str) -> String {
    format!(
        "  - tenant: {{namespace: {n}, name: {name}, uid: uid-{name}}}\n    model: {{uri: \"{uri}\"{extra}}}\n    slo: {{latencyMillis: 5000, percentile: 99}}\n    knobs: {{batchSize: 1, instances: 1}}\n"
    )
}

fn agent_status(cp: &ControlPlane, n: &str) -> Result<Value, String> {
    let json = cp
        .kubectl_ok(&["get", "gpuagent", "agent-0", "-n", n, "-o", "json"])
        .map_err(|e| e.to_string())?;
    let agent: Value = serde_json::from_str(&json).map_err(|e| e.to_string())?;
    Ok(agent["status"].clone())
}

/// The agent's Lease: its renew time, and its owner's kind and name.
fn lease(cp: &ControlPlane, n: &str) -> Result<(Value, String), String> {
    let json = cp
        .kubectl_ok(&["get", "lease", "agent-0", "-n", n, "-o", "json"])
        .map_err(|e| e.to_string())?;
    let lease: Value = serde_json::from_str(&json).map_err(|e| e.to_string())?;
    let owner = &lease["metadata"]["ownerReferences"][0];
    Ok((
        lease["spec"]["renewTime"].clone(),
        format!(
            "{}/{}",
            owner["kind"].as_str().unwrap_or("-"),
            owner["name"].as_str().unwrap_or("-")
        ),
    ))
}

/// The GpuAgent's resourceVersion: it moves on every write.
fn agent_version(cp: &ControlPlane, n: &str) -> String {
    cp.kubectl_ok(&[
        "get",
        "gpuagent",
        "agent-0",
        "-n",
        n,
        "-o",
        "jsonpath={.metadata.resourceVersion}",
    ])
    .expect("gpuagent")
}

fn tenant<'a>(status: &'a Value, namespace: &str, name: &str) -> Option<&'a Value> {
    status["tenants"]
        .as_array()?
        .iter()
        .find(|t| t["tenant"]["namespace"] == namespace && t["tenant"]["name"] == name)
}

/// The report's entry for served name `model`.
fn reported(admin: &str, token: &str, model: &str) -> Value {
    let (code, body) = report(admin, Some(token));
    assert_eq!(code, 200, "{body}");
    let report: Value = serde_json::from_str(&body).expect("report JSON");
    report["tenants"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["name"] == model))
        .cloned()
        .unwrap_or(Value::Null)
}

fn patch(cp: &ControlPlane, n: &str, json_patch: &str) {
    cp.kubectl_ok(&[
        "patch",
        "gpuagent",
        "agent-0",
        "-n",
        n,
        "--type=json",
        "-p",
        json_patch,
    ])
    .unwrap_or_else(|e| panic!("patch {json_patch}: {e}"));
}

fn report(admin: &str, token: Option<&str>) -> (u16, String) {
    let bearer = token.map(|t| format!("Bearer {}", t.trim()));
    let headers: Vec<(&str, &str)> = bearer
        .as_deref()
        .map(|b| vec![("Authorization", b)])
        .unwrap_or_default();
    http_get_with(admin, "/report", &headers).expect("report answers")
}

#[test]
#[ignore = "needs the control plane: cargo xtask test"]
fn agent_serves_its_gpuagent_as_its_service_account() {
    let ns = TestNamespace::new("agentk");
    let cp = ns.control_plane();
    let n = ns.name.as_str();
    cp.install_chart(RELEASE, n).expect("chart installs");
    let _release = Release {
        cp,
        namespace: n.to_string(),
    };

    let agent_bin = workspace_binary("cotenant-agent");
    let dir = cp.dir.join(format!("agentk-{n}"));
    std::fs::create_dir_all(&dir).expect("dir");
    let model = dir.join("bert.onnx");
    let zoo = Command::new(&agent_bin)
        .args(["zoo", "bert", "--out"])
        .arg(&model)
        .args([
            "--layers", "1", "--hidden", "32", "--heads", "2", "--seq", "8", "--vocab", "50",
        ])
        .status()
        .expect("zoo runs");
    assert!(zoo.success(), "zoo bert failed");
    // Models come over a non-loopback address: a Kubernetes-mode agent refuses loopback.
    let url = serve_file(&model, &host_ip());
    let loopback_url = serve_file(&model, "127.0.0.1");
    let sha = sha256_hex(&model);

    let file_uri = format!("file://{}", model.display());
    let missing_uri = format!("file://{}", dir.join("missing.onnx").display());
    let manifest = format!(
        "apiVersion: cotenant.dev/v1alpha1\nkind: GpuAgent\nmetadata:\n  name: agent-0\n  namespace: {n}\nspec:\n  pool: p\n  assignments:\n{}{}{}{}{}",
        assignment(n, "bert", &file_uri, "") + "    profile: {batchSize: 2, instances: 2}\n",
        assignment(n, "broken", &missing_uri, ""),
        assignment(n, "web", &url, &format!(", sha256: \"{sha}\"")),
        assignment(n, "escape", "file:///dev/zero", ""),
        assignment(n, "loop", &loopback_url, &format!(", sha256: \"{sha}\"")),
    );
    cp.kubectl_apply(&manifest).expect("GpuAgent created");

    // The agent's pod, which its token is bound to (the test runs the agent itself, so the pod
    // asks for a node that does not exist and stays Pending).
    cp.kubectl_apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: agent-0\n  namespace: {n}\nspec:\n  serviceAccountName: cotenant-agent\n  nodeSelector:\n    cotenant.dev/no-such-node: \"true\"\n  containers:\n  - name: agent\n    image: cotenant/agent:test\n"
    ))
    .expect("the agent's pod");
    // The agent reaches the API server through a proxy the test can cut.
    let upstream = cp.server.trim_start_matches("https://");
    let proxy = TcpProxy::start(upstream).expect("proxy");
    let kubeconfig = cp
        .service_account_kubeconfig_via(
            n,
            "cotenant-agent",
            Some("agent-0"),
            &format!("https://{}", proxy.addr),
        )
        .expect("token for the agent's ServiceAccount");
    let addr = format!("127.0.0.1:{}", free_port().expect("port"));
    let admin = format!("127.0.0.1:{}", free_port().expect("port"));
    let mut cmd = Command::new(&agent_bin);
    cmd.args([
        "kubernetes",
        "--listen",
        &addr,
        "--grpc-listen",
        "127.0.0.1:0",
        "--admin-listen",
        &admin,
        "--threads",
        "2",
        "--drain-seconds",
        "3",
    ])
    .arg("--model-root")
    .arg(&dir)
    .env("KUBECONFIG", &kubeconfig)
    .env("POD_NAME", "agent-0")
    .env("POD_NAMESPACE", n)
    .env("NODE_NAME", "node-a")
    .env("POD_IP", "127.0.0.1")
    .env("COTENANT_LOG", "info,cotenant_agent=debug")
    .env_remove("COTENANT_REPORT_AUDIENCE")
    .env(
        "COTENANT_REPORT_READER",
        format!("system:serviceaccount:{n}:cotenant-operator"),
    );
    // Without the one identity it trusts on /report, the agent refuses to start: there is no
    // default that would trust an account of some name in any namespace.
    let mut unconfigured = Command::new(&agent_bin);
    unconfigured
        .args(cmd.get_args())
        .envs(cmd.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .env_remove("COTENANT_REPORT_READER");
    let mut refused = Process::spawn(
        &format!("agent-{n}-no-reader"),
        unconfigured,
        &cp.dir.join("logs"),
        Lifetime::WithParent,
    )
    .expect("agent spawns");
    poll(
        "the agent without a reader to exit",
        Duration::from_secs(30),
        || {
            if refused.is_running() {
                Err(refused.log_tail(5))
            } else {
                Ok(())
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let said = std::fs::read_to_string(&refused.log).unwrap_or_default();
    assert!(said.contains("COTENANT_REPORT_READER"), "{said}");
    let mut agent = Process::spawn(
        &format!("agent-{n}"),
        cmd,
        &cp.dir.join("logs"),
        Lifetime::WithParent,
    )
    .expect("agent starts");

    // Status: addresses, device, the good tenants Ready (bert also profiled), broken Failed.
    let status = poll("the agent's status", Duration::from_secs(180), || {
        if !agent.is_running() {
            panic!("the agent exited:\n{}", agent.log_tail(30));
        }
        let s = agent_status(cp, n)?;
        let state = |name: &str| tenant(&s, n, name).map(|t| t["state"].clone());
        let ready = s["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
            .map(|c| c["status"].clone());
        if state("bert") == Some("Ready".into())
            && state("web") == Some("Ready".into())
            && state("broken") == Some("Failed".into())
            && state("escape") == Some("Failed".into())
            && state("loop") == Some("Failed".into())
            && ready == Some("True".into())
        {
            Ok(s)
        } else {
            Err(s.to_string())
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_tail(30)));
    let port = |a: &str| a.rsplit(':').next().unwrap_or_default().to_string();
    assert_eq!(status["address"], format!("127.0.0.1:{}", port(&addr)));
    assert_eq!(
        status["adminAddress"],
        format!("127.0.0.1:{}", port(&admin))
    );
    assert_eq!(status["node"], "node-a");
    assert_eq!(status["device"]["kind"], "cpu");
    assert!(status["device"]["memoryTotalBytes"].as_u64().unwrap_or(0) > 0);
    assert!(status["device"]["memoryUsedBytes"].as_u64().unwrap_or(0) > 0);
    assert!(status["observedGeneration"].as_i64().is_some(), "{status}");
    let broken = tenant(&status, n, "broken").expect("broken tenant");
    let error = broken["error"].as_str().unwrap_or_default();
    assert!(error.contains("missing.onnx"), "{broken}");
    // Outside the model root, and a download from loopback: refused, with the reason.
    for (name, says) in [("escape", "not under a model volume"), ("loop", "loopback")] {
        let t = tenant(&status, n, name).expect("tenant");
        let error = t["error"].as_str().unwrap_or_default();
        assert!(error.contains(says), "{name}: {t}");
    }
    let bert = tenant(&status, n, "bert").expect("bert tenant");
    assert_eq!(
        bert["knobs"],
        serde_json::json!({"batchSize": 1, "instances": 1})
    );
    assert!(bert["weightBytes"].as_u64().unwrap_or(0) > 0, "{bert}");
    assert!(bert["activationBytes"].as_u64().unwrap_or(0) > 0, "{bert}");
    assert_eq!(http_get(&addr, "/v2/health/ready").expect("ready").0, 200);
    // Nothing changes now: the agent's Lease is renewed (every 10 s), owned by its GpuAgent,
    // and the GpuAgent is not written at all.
    let version = agent_version(cp, n);
    let (first, _) = lease(cp, n).unwrap_or_else(|e| panic!("{e}\n{}", agent.log_tail(20)));
    poll("a lease renewal", Duration::from_secs(15), || {
        let (renewed, _) = lease(cp, n)?;
        if renewed != first {
            Ok(())
        } else {
            Err(format!("still {first}"))
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_tail(20)));
    assert_eq!(
        agent_version(cp, n),
        version,
        "a steady agent wrote its GpuAgent"
    );

    // Inference under the qualified name and the bare name; the broken tenant answers 503.
    let request = r#"{"inputs":[{"name":"input_ids","shape":[1,8],"datatype":"INT64","data":[1,2,3,4,5,6,7,8]}]}"#;
    for model in [format!("{n}.bert"), "bert".to_string(), format!("{n}.web")] {
        let (code, answer) =
            http_post_json(&addr, &format!("/v2/models/{model}/infer"), request).expect("infer");
        assert_eq!(code, 200, "{model}: {answer}");
        let answer: Value = serde_json::from_str(&answer).expect("JSON answer");
        assert_eq!(answer["outputs"][0]["shape"], serde_json::json!([1, 8, 32]));
    }
    let (code, answer) =
        http_post_json(&addr, &format!("/v2/models/{n}.broken/infer"), request).expect("infer");
    assert_eq!(code, 503, "{answer}");
    // The caller is not told where the model was looked for.
    assert!(
        !answer.contains("missing.onnx") && !answer.contains(&*dir.to_string_lossy()),
        "{answer}"
    );
    // /metrics: on the admin port, which the chart's NetworkPolicy closes, not the inference one.
    assert_eq!(http_get(&addr, "/metrics").expect("metrics").0, 404);
    let (code, metrics) = http_get(&admin, "/metrics").expect("metrics");
    assert_eq!(code, 200);
    assert!(metrics.contains("cotenant_agent_tenant_state"), "{metrics}");
    // The missing file appears: the agent's retries (10 s, 20 s, 40 s, ...) load it later.
    std::fs::copy(&model, dir.join("missing.onnx")).expect("copy the model");

    // /report: only the operator's ServiceAccount with the report audience.
    assert_eq!(report(&admin, None).0, 401);
    let default_token = cp
        .kubectl_ok(&["create", "token", "default", "-n", n])
        .expect("default token");
    let (code, body) = report(&admin, Some(&default_token));
    assert_eq!(code, 401, "{body}");
    let operator_no_audience = cp
        .kubectl_ok(&["create", "token", "cotenant-operator", "-n", n])
        .expect("operator token");
    let (code, body) = report(&admin, Some(&operator_no_audience));
    assert_eq!(code, 401, "{body}");
    // An account of the operator's name in another namespace is someone else.
    let elsewhere = format!("{n}-elsewhere");
    cp.kubectl_ok(&["create", "namespace", &elsewhere])
        .expect("namespace");
    cp.kubectl_ok(&[
        "create",
        "serviceaccount",
        "cotenant-operator",
        "-n",
        &elsewhere,
    ])
    .expect("account");
    let impostor = cp
        .kubectl_ok(&[
            "create",
            "token",
            "cotenant-operator",
            "--audience",
            "cotenant.dev/agent-report",
            "-n",
            &elsewhere,
        ])
        .expect("impostor token");
    let (code, body) = report(&admin, Some(&impostor));
    let _ = cp.kubectl_ok(&["delete", "namespace", &elsewhere, "--wait=false"]);
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("may not read the report"), "{body}");
    // Refused again without another review (the reason is remembered).
    let (code, body) = report(&admin, Some(&impostor));
    assert_eq!(code, 401, "{body}");
    let operator = cp
        .kubectl_ok(&[
            "create",
            "token",
            "cotenant-operator",
            "--audience",
            "cotenant.dev/agent-report",
            "-n",
            n,
        ])
        .expect("operator token");
    let (code, body) = report(&admin, Some(&operator));
    assert_eq!(code, 200, "{body}\n{}", agent.log_tail(20));
    let report_json: Value = serde_json::from_str(&body).expect("report JSON");
    eprintln!(
        "GpuAgent status:\n{}\n/report:\n{}",
        serde_json::to_string_pretty(&status).unwrap_or_default(),
        serde_json::to_string_pretty(&report_json).unwrap_or_default()
    );
    let bert_report = report_json["tenants"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["name"] == format!("{n}.bert")))
        .expect("bert in the report")
        .clone();
    assert_eq!(
        bert_report["tenant"],
        serde_json::json!({"namespace": n, "name": "bert", "uid": "uid-bert"})
    );
    let points = bert_report["profile"]["points"]
        .as_array()
        .map(Vec::len)
        .unwrap_or(0);
    // (1, 1), (k, 1), (1, k) and the joint point (k, 2).
    assert_eq!(points, 4, "{bert_report}");
    assert_eq!(http_get(&addr, "/report").expect("no report here").0, 404);

    // Knobs change live.
    cp.kubectl_ok(&[
        "patch",
        "gpuagent",
        "agent-0",
        "-n",
        n,
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/spec/assignments/0/knobs","value":{"batchSize":4,"instances":2}}]"#,
    ])
    .expect("patch knobs");
    poll(
        "the new knobs in the status",
        Duration::from_secs(60),
        || {
            let s = agent_status(cp, n)?;
            let knobs = tenant(&s, n, "bert").map(|t| t["knobs"].clone());
            if knobs == Some(serde_json::json!({"batchSize": 4, "instances": 2})) {
                Ok(())
            } else {
                Err(format!("{knobs:?}"))
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_tail(20)));
    let (code, body) = report(&admin, Some(&operator));
    assert_eq!(code, 200, "{body}");
    let report_json: Value = serde_json::from_str(&body).expect("report JSON");
    let knobs = report_json["tenants"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["name"] == format!("{n}.bert")))
        .map(|t| t["knobs"].clone());
    assert_eq!(
        knobs,
        Some(serde_json::json!({"batchSize": 4, "instances": 2}))
    );

    // Removing an assignment unloads it.
    cp.kubectl_ok(&[
        "patch",
        "gpuagent",
        "agent-0",
        "-n",
        n,
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/spec/assignments/2"}]"#,
    ])
    .expect("patch out web");
    poll("web gone from the status", Duration::from_secs(60), || {
        let s = agent_status(cp, n)?;
        if tenant(&s, n, "web").is_none() {
            Ok(())
        } else {
            Err(s.to_string())
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_tail(20)));
    // A client still routed here is told to retry (503), not that the model does not exist.
    let (code, body) =
        http_post_json(&addr, &format!("/v2/models/{n}.web/infer"), request).expect("infer");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("moved off this agent"), "{body}");
    assert_eq!(
        http_post_json(&addr, &format!("/v2/models/{n}.bert/infer"), request)
            .expect("infer")
            .0,
        200
    );

    // An SLO change reaches the running replica.
    patch(
        cp,
        n,
        r#"[{"op":"replace","path":"/spec/assignments/0/slo","value":{"latencyMillis":2000,"percentile":95}}]"#,
    );
    poll("the new SLO in the report", Duration::from_secs(60), || {
        let t = reported(&admin, &operator, &format!("{n}.bert"));
        if t["sloMillis"] == 2000.0 && t["percentile"] == 95.0 {
            Ok(())
        } else {
            Err(t.to_string())
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_tail(20)));

    // A second tenant called bert in another namespace: the bare name becomes ambiguous.
    let other = format!("{n}-other");
    patch(
        cp,
        n,
        &format!(
            r#"[{{"op":"add","path":"/spec/assignments/-","value":{{"tenant":{{"namespace":"{other}","name":"bert","uid":"uid-bert-2"}},"model":{{"uri":"{file_uri}"}},"slo":{{"latencyMillis":5000,"percentile":99}},"knobs":{{"batchSize":1,"instances":1}}}}}}]"#
        ),
    );
    poll("the second bert Ready", Duration::from_secs(120), || {
        let s = agent_status(cp, n)?;
        match tenant(&s, &other, "bert") {
            Some(t) if t["state"] == "Ready" => Ok(()),
            _ => Err(s.to_string()),
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_tail(20)));
    let (code, answer) = http_post_json(&addr, "/v2/models/bert/infer", request).expect("infer");
    assert_eq!(code, 404, "{answer}");
    assert!(
        answer.contains(&format!("{n}.bert")) && answer.contains(&format!("{other}.bert")),
        "{answer}"
    );
    for model in [format!("{n}.bert"), format!("{other}.bert")] {
        let (code, answer) =
            http_post_json(&addr, &format!("/v2/models/{model}/infer"), request).expect("infer");
        assert_eq!(code, 200, "{model}: {answer}");
    }

    // The model changes: the new one loads beside the old, which serves until the swap.
    patch(
        cp,
        n,
        &format!(
            r#"[{{"op":"replace","path":"/spec/assignments/0/model","value":{{"uri":"{url}","sha256":"{sha}"}}}}]"#
        ),
    );
    poll("the new model serving", Duration::from_secs(120), || {
        let (code, answer) = http_post_json(&addr, &format!("/v2/models/{n}.bert/infer"), request)?;
        assert_eq!(code, 200, "served through the swap: {answer}");
        let t = reported(&admin, &operator, &format!("{n}.bert"));
        if t["source"] == url.as_str() && t["state"] == "Ready" {
            Ok(t)
        } else {
            Err(t.to_string())
        }
    })
    .map(|t| {
        assert_eq!(
            t["knobs"],
            serde_json::json!({"batchSize": 4, "instances": 2})
        )
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_tail(20)));

    poll(
        "the once-missing model loaded by a retry",
        Duration::from_secs(180),
        || {
            let s = agent_status(cp, n)?;
            match tenant(&s, n, "broken") {
                Some(t) if t["state"] == "Ready" && t.get("error").is_none() => Ok(()),
                _ => Err(s.to_string()),
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_tail(20)));

    // The API server goes away: the agent keeps serving its last assignments. Once it is
    // back, the agent writes its status again and follows new assignments.
    proxy.cut();
    let outage = Instant::now();
    let mut served = 0;
    while outage.elapsed() < Duration::from_secs(15) {
        let (code, answer) = http_post_json(&addr, &format!("/v2/models/{n}.bert/infer"), request)
            .expect("the agent answers during the outage");
        assert_eq!(code, 200, "{answer}");
        served += 1;
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(agent.is_running(), "{}", agent.log_tail(20));
    let log = std::fs::read_to_string(&agent.log).unwrap_or_default();
    assert!(
        log.contains("serving continues"),
        "the outage was not noticed:\n{}",
        agent.log_tail(20)
    );
    eprintln!("served {served} requests during a 15 s API server outage");
    let (stale, _) = lease(cp, n).expect("lease");
    proxy.restore();
    poll(
        "a lease renewal after the outage",
        Duration::from_secs(90),
        || {
            let (renewed, _) = lease(cp, n)?;
            if renewed != stale {
                Ok(())
            } else {
                Err(format!("still {stale}"))
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_tail(20)));
    patch(
        cp,
        n,
        r#"[{"op":"replace","path":"/spec/assignments/0/knobs","value":{"batchSize":2,"instances":1}}]"#,
    );
    poll(
        "knobs changed after the outage",
        Duration::from_secs(90),
        || {
            let t = reported(&admin, &operator, &format!("{n}.bert"));
            if t["knobs"] == serde_json::json!({"batchSize": 2, "instances": 1}) {
                Ok(())
            } else {
                Err(t.to_string())
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_tail(20)));

    // A guarded tenant: callers need one of the tokens whose digests its assignment carries,
    // and a new digest list applies to the next request.
    let token = "d3b07384d113edec49eaa6238ad5ff00d3b07384d113edec49eaa6238ad5ff00";
    let next_token = "c157a79031e1c40f85931829bc5fc552c157a79031e1c40f85931829bc5fc552";
    let digest = |t: &str| {
        cotenant_crds::credentials::hex(&cotenant_crds::credentials::digest(t.as_bytes()))
    };
    patch(
        cp,
        n,
        &format!(
            r#"[{{"op":"add","path":"/spec/assignments/-","value":{{"tenant":{{"namespace":"{n}","name":"guarded","uid":"uid-guarded"}},"model":{{"uri":"{file_uri}"}},"slo":{{"latencyMillis":5000,"percentile":99}},"knobs":{{"batchSize":1,"instances":1}},"credentials":{{"tokenSha256":["{}"]}}}}}}]"#,
            digest(token)
        ),
    );
    let guarded = format!("/v2/models/{n}.guarded/infer");
    let with = |t: &str| format!("Bearer {t}");
    let infer_as = |bearer: Option<&str>| {
        let headers: Vec<(&str, &str)> = bearer
            .map(|b| vec![("Authorization", b)])
            .unwrap_or_default();
        cotenant_e2e::http::http_post(&addr, &guarded, &headers, request.as_bytes())
            .expect("an answer")
    };
    poll(
        "the guarded tenant serving its caller",
        Duration::from_secs(120),
        || match infer_as(Some(&with(token))) {
            r if r.status == 200 => Ok(()),
            r => Err(format!("{} {}", r.status, r.text())),
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_tail(20)));
    for bearer in [None, Some(with(next_token))] {
        let r = infer_as(bearer.as_deref());
        assert_eq!(r.status, 401, "{}", r.text());
    }
    let (code, _) = http_get(&addr, &format!("/v2/models/{n}.guarded")).expect("metadata");
    assert_eq!(code, 401);
    let names = cp
        .kubectl_ok(&[
            "get",
            "gpuagent",
            "agent-0",
            "-n",
            n,
            "-o",
            "jsonpath={.spec.assignments[*].tenant.name}",
        ])
        .expect("the assignments");
    let index = names
        .split_whitespace()
        .position(|t| t == "guarded")
        .expect("the guarded assignment");
    patch(
        cp,
        n,
        &format!(
            r#"[{{"op":"replace","path":"/spec/assignments/{index}/credentials","value":{{"tokenSha256":["{}"]}}}}]"#,
            digest(next_token)
        ),
    );
    poll(
        "the rotated token",
        Duration::from_secs(60),
        || match infer_as(Some(&with(next_token))) {
            r if r.status == 200 => Ok(()),
            r => Err(format!("{} {}", r.status, r.text())),
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_tail(20)));
    assert_eq!(
        infer_as(Some(&with(token))).status,
        401,
        "the old token still works"
    );

    // SIGTERM: the agent drains. It says at once that it is not ready (probe and status), so its
    // endpoints drop it, and serves on meanwhile; then it finishes and exits.
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(agent.pid as i32, libc::SIGTERM) };
    poll(
        "not ready while draining",
        Duration::from_secs(2),
        || match http_get(&addr, "/v2/health/ready") {
            Ok((503, _)) => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_tail(20)));
    let served = infer_as(Some(&with(next_token)));
    assert_eq!(
        served.status,
        200,
        "served while draining: {}",
        served.text()
    );
    poll("ShuttingDown in the status", Duration::from_secs(3), || {
        let s = agent_status(cp, n)?;
        let ready = s["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
            .cloned()
            .unwrap_or_default();
        if ready["status"] == "False" && ready["reason"] == "ShuttingDown" {
            Ok(())
        } else {
            Err(s.to_string())
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_tail(20)));
    poll(
        "the agent exits after draining",
        Duration::from_secs(15),
        || {
            if agent.is_running() {
                Err("still running".into())
            } else {
                Ok(())
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_tail(20)));
    let log = std::fs::read_to_string(&agent.log).unwrap_or_default();
    assert!(
        log.contains("draining") && log.contains("stopped"),
        "{}",
        agent.log_tail(20)
    );
}
