//! The standalone agent against real clients: tritonclient and onnxruntime (via
//! `tests/python/oip_client.py`), bad requests, failed tenants, metrics and the report;
//! hostile requests and memory under them (`requests`); who may call a tenant, what errors tell
//! callers, and where models may come from (`access`); models in an S3-compatible object
//! store and the model cache (`object_store`); spans to a collector (`telemetry`); models that
//! Python packages ship, against onnxruntime (`third_party`).

mod access;
mod object_store;
mod perf;
mod requests;
mod telemetry;
mod third_party;

use cotenant_e2e::cluster::free_port;
use cotenant_e2e::process::{Lifetime, Process};
use cotenant_e2e::{TestNamespace, http_get, http_get_with, poll, workspace_binary};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn python() -> PathBuf {
    std::env::var_os("COTENANT_PYTHON")
        .map(PathBuf::from)
        .expect("COTENANT_PYTHON must name the reference venv's python: run cargo xtask test")
}

fn tenant_yaml(name: &str, uri: &str, extra: &str) -> String {
    format!(
        "apiVersion: cotenant.dev/v1alpha1\nkind: ModelTenant\nmetadata:\n  name: {name}\nspec:\n  model:\n    uri: {uri}\n{extra}  slo:\n    latencyMillis: 5000\n"
    )
}

/// A fresh scratch directory for one test, with a `models` folder and the report `token`.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cotenant-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("models")).expect("scratch dir");
    std::fs::write(dir.join("token"), "s3cret\n").expect("token");
    dir
}

/// Writes `tests/python/wide_model.py`'s model (`x` FP32 [n, width] → `y` [n]) to `out`.
fn wide_model(python: &Path, out: &Path, width: usize) {
    let status = Command::new(python)
        .arg(TestNamespace::repo_root().join("tests/python/wide_model.py"))
        .arg(out)
        .arg(width.to_string())
        .status()
        .expect("python runs");
    assert!(status.success(), "wide_model.py failed");
}

fn zoo(agent: &Path, models: &Path, name: &str, file: &str, extra: &[&str]) {
    let status = Command::new(agent)
        .args(["zoo", name, "--out"])
        .arg(models.join(file))
        .args(extra)
        .status()
        .expect("cotenant-agent zoo runs");
    assert!(status.success(), "zoo {name} failed");
}

/// Starts `cotenant-agent standalone` on the tenants in `dir` (2 threads, `dir/token` as the
/// report token) and waits until it is ready; returns it and its address.
fn serve(agent: &Path, dir: &Path, extra: &[&str]) -> (Process, String) {
    serve_with(agent, dir, extra, &[])
}

/// [`serve`] with environment variables for the agent.
fn serve_with(agent: &Path, dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> (Process, String) {
    let addr = format!("127.0.0.1:{}", free_port().expect("port"));
    let mut cmd = Command::new(agent);
    cmd.envs(env.iter().copied());
    cmd.args(["standalone", "--tenants"])
        .arg(dir)
        .args(["--listen", &addr, "--threads", "2", "--report-token-file"])
        .arg(dir.join("token"))
        .args(extra);
    if !extra.contains(&"--grpc-listen") {
        // Any free port: tests that speak gRPC pass their own.
        cmd.args(["--grpc-listen", "127.0.0.1:0"]);
    }
    let mut server = Process::spawn("agent", cmd, dir, Lifetime::WithParent).expect("agent starts");
    let ready = poll("agent readiness", Duration::from_secs(120), || {
        if !server.is_running() {
            return Ok(false);
        }
        match http_get(&addr, "/v2/health/ready") {
            Ok((200, _)) => Ok(true),
            other => Err(format!("{other:?}")),
        }
    });
    assert!(
        matches!(ready, Ok(true)),
        "{ready:?}\n{}",
        server.log_tail(30)
    );
    (server, addr)
}

/// Runs `tests/python/<script>` against the agent, failing with its output and the agent's log.
fn run_script(python: &Path, server: &Process, script: &str, args: &[&str]) {
    let mut cmd = Command::new(python);
    cmd.arg(TestNamespace::repo_root().join("tests/python").join(script))
        .args(args);
    run_checked(cmd, script, || {
        format!("agent log:\n{}", server.log_tail(30))
    });
}

/// Runs `cmd`, printing its output, and fails with it (and `context()`) when it fails.
fn run_checked(mut cmd: Command, what: &str, context: impl FnOnce() -> String) {
    let out = cmd.output().expect("the command runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "{what} failed:\n{stdout}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        context()
    );
}

#[test]
#[ignore = "needs COTENANT_PYTHON and the agent binary: cargo xtask test"]
fn standalone_agent_serves_real_clients() {
    let python = python();
    let agent = workspace_binary("cotenant-agent");
    let dir = std::env::temp_dir().join(format!("cotenant-agent-test-{}", std::process::id()));
    let models = dir.join("models");
    std::fs::create_dir_all(&models).expect("temp dir");
    zoo(&agent, &models, "squeezenet", "squeezenet.onnx", &[]);
    zoo(
        &agent,
        &models,
        "bert",
        "bert.onnx",
        &[
            "--layers", "2", "--hidden", "64", "--heads", "2", "--seq", "16", "--vocab", "100",
        ],
    );
    std::fs::write(models.join("garbage.onnx"), b"this is not an onnx file").expect("write");

    let files = [
        (
            "squeezenet.yaml",
            tenant_yaml("squeezenet", "file://models/squeezenet.onnx", ""),
        ),
        (
            "bert.yaml",
            tenant_yaml("bert", "file://models/bert.onnx", ""),
        ),
        (
            "overload.yaml",
            // Knobs held at batch 1, one instance: this tenant checks admission and back-pressure
            // at a fixed capacity (knobs moving under load are what `cargo xtask bench agent`
            // measures; a batch growing mid-test would absorb the overload unshed, a batch
            // shrinking mid-test would strand requests admitted at the larger one).
            tenant_yaml(
                "overload",
                "file://models/squeezenet.onnx",
                "  scaling:\n    approach: Batching\n    maxBatchSize: 1\n    maxInstances: 1\n",
            )
            .replace("latencyMillis: 5000", "latencyMillis: 1500"),
        ),
        (
            "garbage.yaml",
            tenant_yaml("garbage", "file://models/garbage.onnx", ""),
        ),
        (
            "missing.yaml",
            tenant_yaml("missing", "file://models/missing.onnx", ""),
        ),
        (
            "wrong-sha.yaml",
            tenant_yaml(
                "wrong-sha",
                "file://models/squeezenet.onnx",
                &format!("    sha256: {}\n", "0".repeat(64)),
            ),
        ),
        (
            "invalid.yaml",
            tenant_yaml("invalid", "ftp://nowhere/m.onnx", ""),
        ),
        ("not-yaml.yaml", "kind: [".to_string()),
    ];
    for (file, text) in &files {
        std::fs::write(dir.join(file), text).expect("write tenant");
    }
    std::fs::write(dir.join("token"), "s3cret\n").expect("token");

    let grpc = format!("127.0.0.1:{}", free_port().expect("port"));
    let (mut server, addr) = serve(&agent, &dir, &["--grpc-listen", &grpc]);
    let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    assert!(
        log.contains("invalid.yaml") && log.contains("spec.model.uri"),
        "{log}"
    );
    assert!(log.contains("not-yaml.yaml"), "{log}");

    let models_arg = models.to_string_lossy();
    run_script(
        &python,
        &server,
        "oip_client.py",
        &[
            "--url",
            &addr,
            "--models",
            &models_arg,
            "--good",
            "squeezenet,bert",
            "--failed",
            "garbage,missing,wrong-sha",
            "--report-token",
            "s3cret",
        ],
    );
    // The same tenants over gRPC: tritonclient.grpc, typed contents, malformed messages.
    run_script(
        &python,
        &server,
        "grpc_client.py",
        &[
            "--url",
            &grpc,
            "--rest",
            &addr,
            "--models",
            &models_arg,
            "--good",
            "squeezenet,bert",
            "--failed",
            "garbage,missing,wrong-sha",
        ],
    );
    // DNNScaler profiled each good tenant and chose an approach, reported to the operator.
    let report = poll(
        "DNNScaler's choice in the report",
        Duration::from_secs(120),
        || {
            let (_, body) = http_get_with(&addr, "/report", &[("Authorization", "Bearer s3cret")])?;
            let report: serde_json::Value =
                serde_json::from_str(&body).map_err(|e| e.to_string())?;
            let chosen = report["tenants"]
                .as_array()
                .is_some_and(|ts| ts.iter().filter(|t| t["approach"].is_string()).count() == 3);
            if chosen { Ok(report) } else { Err(body) }
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", server.log_tail(20)));
    for tenant in report["tenants"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["state"] == "Ready")
    {
        let points = tenant["profile"]["points"].as_array().map_or(0, Vec::len);
        // (1, 1), (k, 1), (1, k) and the joint point (k, 2); the overload tenant's bounds leave
        // only (1, 1).
        let want = if tenant["name"] == "overload" { 1 } else { 4 };
        assert_eq!(points, want, "profile points: {tenant}");
        assert!(
            tenant["knobs"]["batchSize"]
                .as_u64()
                .is_some_and(|b| b >= 1),
            "{tenant}"
        );
    }
    // Eight times the profiled capacity for a minute with oha: only 200, 429 and 503, some shed,
    // the SLO held for what is accepted, and memory flat. Eight, because every tenant is profiled
    // at once at start-up, on two cores shared with the test: the profile has read 1/3 to 1/5 of
    // what the tenant serves once it runs alone.
    let pid = server.pid.to_string();
    let oha = std::env::var("COTENANT_OHA")
        .expect("COTENANT_OHA must name the oha binary: run cargo xtask test");
    run_script(
        &python,
        &server,
        "load.py",
        &[
            "--url",
            &addr,
            "--model",
            "overload",
            "--report-token",
            "s3cret",
            "--pid",
            &pid,
            "--oha",
            &oha,
            "--factor",
            "8",
        ],
    );
    // Failed tenants say why.
    let (_, meta) = http_get(&addr, "/v2/models/wrong-sha").expect("metadata");
    assert!(meta.contains("Failed"), "{meta}");
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The tenants co-scheduled on the device (`--schedule sequential` and `gacer`) serve the same
/// numbers as onnxruntime; under `gacer` the planner publishes a plan for the tenants loaded.
#[test]
#[ignore = "needs COTENANT_PYTHON and the agent binary: cargo xtask test"]
fn co_scheduled_tenants_serve_real_clients() {
    let python = python();
    let agent = workspace_binary("cotenant-agent");
    for schedule in ["sequential", "gacer"] {
        let dir =
            std::env::temp_dir().join(format!("cotenant-agent-{schedule}-{}", std::process::id()));
        let models = dir.join("models");
        std::fs::create_dir_all(&models).expect("temp dir");
        zoo(&agent, &models, "squeezenet", "squeezenet.onnx", &[]);
        zoo(&agent, &models, "mobilenet_v2", "mobilenet.onnx", &[]);
        for name in ["squeezenet", "mobilenet"] {
            let uri = format!("file://models/{name}.onnx");
            std::fs::write(
                dir.join(format!("{name}.yaml")),
                tenant_yaml(name, &uri, ""),
            )
            .expect("write tenant");
        }
        std::fs::write(dir.join("token"), "s3cret\n").expect("token");
        let (mut server, addr) = serve(&agent, &dir, &["--schedule", schedule]);
        let models_arg = models.to_string_lossy();
        run_script(
            &python,
            &server,
            "oip_client.py",
            &[
                "--url",
                &addr,
                "--models",
                &models_arg,
                "--good",
                "squeezenet,mobilenet",
                "--report-token",
                "s3cret",
            ],
        );
        let log = || std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
        assert!(
            log().contains(&format!("schedule=\"{schedule}\"")),
            "{}",
            log()
        );
        // `--device` defaults to auto: the device and why are logged once.
        assert!(
            log().contains("tenants compute on this device"),
            "{}",
            log()
        );
        if schedule == "gacer" {
            let planned = poll("a GACER plan", Duration::from_secs(120), || {
                match log().contains("gacer: a plan for the new tenant mix") {
                    true => Ok(()),
                    false => Err("no plan yet".to_string()),
                }
            });
            assert!(planned.is_ok(), "{planned:?}\n{}", log());
        }
        server.stop();
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The GPU path served end to end on the simulated device (`--device sim`, which runs on any
/// machine): two tenants under the GACER schedule answer tritonclient with onnxruntime's numbers,
/// and the agent says where it computes and that no step falls back to the host.
#[test]
#[ignore = "needs COTENANT_PYTHON and the agent binary: cargo xtask test"]
fn the_gpu_path_serves_real_clients_on_the_simulated_device() {
    let python = python();
    let agent = workspace_binary("cotenant-agent");
    let dir = scratch("agent-sim");
    let models = dir.join("models");
    zoo(&agent, &models, "squeezenet", "squeezenet.onnx", &[]);
    zoo(&agent, &models, "mobilenet_v2", "mobilenet.onnx", &[]);
    for name in ["squeezenet", "mobilenet"] {
        let uri = format!("file://models/{name}.onnx");
        std::fs::write(
            dir.join(format!("{name}.yaml")),
            tenant_yaml(name, &uri, ""),
        )
        .expect("write tenant");
    }
    let (mut server, addr) = serve(
        &agent,
        &dir,
        &[
            "--device",
            "sim",
            "--schedule",
            "gacer",
            "--knob-policy",
            "static:2x1",
        ],
    );
    for name in ["squeezenet", "mobilenet"] {
        let file = models.join(format!("{name}.onnx"));
        run_script(
            &python,
            &server,
            "tenant_client.py",
            &[
                "--url",
                &addr,
                "--model",
                name,
                "--file",
                &file.to_string_lossy(),
            ],
        );
    }
    let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    assert!(log.contains("sim: a simulated GPU"), "{log}");
    // The zoo models run wholly on the device: the coverage logged at load names no fallback.
    let coverage: Vec<&str> = log.lines().filter(|l| l.contains("GPU coverage")).collect();
    assert_eq!(coverage.len(), 2, "{log}");
    assert!(
        coverage.iter().all(|l| l.contains("host_fallbacks=0")),
        "{coverage:?}"
    );
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--device`: a typo names the choices, `cuda` where no GPU can be used (this build has no
/// `cuda` feature, and this machine no GPU) stops at start-up with the reason, and a zero memory
/// budget is refused; none of them gets as far as reading the tenants.
#[test]
#[ignore = "needs the agent binary: cargo xtask test"]
fn device_choices_are_checked_at_start_up() {
    let agent = workspace_binary("cotenant-agent");
    let missing = std::env::temp_dir().join(format!("cotenant-no-tenants-{}", std::process::id()));
    for (args, says) in [
        (&["--device", "gpu"][..], "auto, cpu, cuda or sim"),
        (&["--device", "cuda"][..], "--device cuda: "),
        (
            &["--device-memory-per-tenant-mib", "0"][..],
            "must be at least 1",
        ),
    ] {
        let out = Command::new(&agent)
            .args(["standalone", "--tenants"])
            .arg(&missing)
            .args(args)
            .output()
            .expect("the agent runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("no valid ModelTenant"),
            "{args:?}: {stderr}"
        );
    }
}

/// The cluster examples name the zoo models by the digests `cotenant-agent zoo` writes them with
/// (seed 0), so a model volume filled with `zoo` serves them as they are.
#[test]
#[ignore = "needs the agent binary: cargo xtask test"]
fn cluster_examples_name_the_zoo_models_by_their_digests() {
    let agent = workspace_binary("cotenant-agent");
    let dir = scratch("cluster-examples");
    let examples = TestNamespace::repo_root().join("examples/cluster");
    for (example, model) in [
        ("resnet50", "resnet50"),
        ("mobilenet-v2", "mobilenet_v2"),
        ("bert-encoder", "bert"),
    ] {
        let text =
            std::fs::read_to_string(examples.join(format!("{example}.yaml"))).expect("example");
        let tenant: serde_yaml::Value = serde_yaml::from_str(&text).expect("YAML");
        let uri = tenant["spec"]["model"]["uri"].as_str().expect("uri");
        let file = uri.rsplit('/').next().expect("file name");
        zoo(&agent, &dir.join("models"), model, file, &[]);
        let out = Command::new("sha256sum")
            .arg(dir.join("models").join(file))
            .output()
            .expect("sha256sum");
        let digest = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            tenant["spec"]["model"]["sha256"].as_str(),
            digest.split_whitespace().next(),
            "{example}"
        );
    }
    // Half a gigabyte of models: not left behind.
    let _ = std::fs::remove_dir_all(&dir);
}
