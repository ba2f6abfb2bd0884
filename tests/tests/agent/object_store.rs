//! Models in an S3-compatible object store (moto, with authentication on): a correct `s3://`
//! tenant serves while a wrong digest, a missing object, missing or wrong credentials and
//! transfers cut off or stalled fail their tenant alone, with a message saying so; tenants of
//! the same model download it once, and nothing partial is left in the model cache.
//! Standalone mode takes the store's settings from the agent's environment.

use super::{python, run_script, scratch, serve_with, tenant_yaml, zoo};
use cotenant_e2e::proxy::{Fault, FaultyProxy};
use cotenant_e2e::s3::S3Server;
use cotenant_e2e::{http_get_with, workspace_binary};
use std::path::Path;
use std::process::Command;

const BUCKET: &str = "models";

/// A credentials case: what it is, the agent's credential variables, what the failure says.
type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, &'a [&'a str]);

/// SHA-256 of a file, as lowercase hex.
fn sha256(python: &Path, file: &Path) -> String {
    let out = Command::new(python)
        .args([
            "-c",
            "import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest())",
        ])
        .arg(file)
        .output()
        .expect("python runs");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Every tenant's state and error from the agent's report.
fn states(addr: &str) -> serde_json::Value {
    let (code, body) =
        http_get_with(addr, "/report", &[("Authorization", "Bearer s3cret")]).expect("report");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("report JSON")
}

/// `(state, error)` of tenant `name`.
fn state_of(report: &serde_json::Value, name: &str) -> (String, String) {
    report["tenants"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["name"] == name))
        .map(|t| {
            (
                t["state"].as_str().unwrap_or("").to_string(),
                t["error"].as_str().unwrap_or("").to_string(),
            )
        })
        .unwrap_or_else(|| panic!("{name} not in the report: {report}"))
}

/// The files in the model cache folder.
fn cached_files(cache: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(cache)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// The test's model (squeezenet) written, uploaded to a fresh moto, and its digest.
fn bucket_with_a_model(dir: &Path) -> (S3Server, String) {
    let python = python();
    let agent = workspace_binary("cotenant-agent");
    zoo(
        &agent,
        &dir.join("models"),
        "squeezenet",
        "squeezenet.onnx",
        &[],
    );
    let model = dir.join("models/squeezenet.onnx");
    let server = S3Server::start(&python, dir, BUCKET, &[("squeezenet.onnx", &model)])
        .expect("moto_server with the model");
    let digest = sha256(&python, &model);
    (server, digest)
}

fn s3_tenant(dir: &Path, name: &str, key: &str, digest: &str) {
    std::fs::write(
        dir.join(format!("{name}.yaml")),
        tenant_yaml(
            name,
            &format!("s3://{BUCKET}/{key}"),
            &format!("    sha256: {digest}\n"),
        ),
    )
    .expect("tenant file");
}

#[test]
#[ignore = "needs COTENANT_PYTHON (with moto) and the agent binary: cargo xtask test"]
fn s3_models_serve_download_once_and_bad_ones_fail_alone() {
    let python = python();
    let agent = workspace_binary("cotenant-agent");
    let dir = scratch("s3-models");
    let (s3, digest) = bucket_with_a_model(&dir);
    for name in ["first", "second"] {
        s3_tenant(&dir, name, "squeezenet.onnx", &digest);
    }
    s3_tenant(&dir, "wrong-digest", "squeezenet.onnx", &"0".repeat(64));
    s3_tenant(&dir, "missing-object", "no-such-model.onnx", &digest);
    let cache = dir.join("cache");
    let cache_arg = cache.to_string_lossy().into_owned();
    let env = [
        ("AWS_ENDPOINT_URL", s3.endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", s3.access_key_id.as_str()),
        ("AWS_SECRET_ACCESS_KEY", s3.secret_access_key.as_str()),
    ];
    let (mut server, addr) = serve_with(&agent, &dir, &["--model-cache-dir", &cache_arg], &env);
    let report = states(&addr);
    for name in ["first", "second"] {
        let (state, error) = state_of(&report, name);
        assert_eq!(state, "Ready", "{name}: {error}\n{}", server.log_tail(30));
    }
    let (state, error) = state_of(&report, "wrong-digest");
    assert_eq!(state, "Failed");
    assert!(
        error.contains(&format!("sha256 is {digest}"))
            && error.contains(&format!("the tenant expects {}", "0".repeat(64))),
        "{error}"
    );
    let (state, error) = state_of(&report, "missing-object");
    assert_eq!(state, "Failed");
    assert!(
        error.contains("s3://models/no-such-model.onnx: no such object"),
        "{error}"
    );
    // The good tenants answer, as onnxruntime does on the same file.
    let model = dir.join("models/squeezenet.onnx");
    let model_arg = model.to_string_lossy();
    run_script(
        &python,
        &server,
        "tenant_client.py",
        &["--url", &addr, "--model", "second", "--file", &model_arg],
    );
    // Two tenants of one model, one download; the wrong digest's download is not kept.
    let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    let downloads = log
        .lines()
        .filter(|l| {
            l.contains("model cache: downloading") && l.contains("s3://models/squeezenet.onnx")
        })
        .count();
    assert_eq!(downloads, 2, "first/second once, wrong-digest once:\n{log}");
    assert_eq!(cached_files(&cache).len(), 1, "{:?}", cached_files(&cache));
    server.stop();

    // A restarted agent finds the model in its cache and downloads nothing.
    std::fs::remove_file(dir.join("wrong-digest.yaml")).expect("rm");
    std::fs::remove_file(dir.join("missing-object.yaml")).expect("rm");
    let (mut server, addr) = serve_with(&agent, &dir, &["--model-cache-dir", &cache_arg], &env);
    let (state, error) = state_of(&states(&addr), "first");
    assert_eq!(state, "Ready", "{error}");
    let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    assert!(
        log.contains("model cache: hit") && !log.contains("model cache: downloading"),
        "{log}\nmoto:\n{}",
        s3.log_tail(10)
    );
    server.stop();
}

#[test]
#[ignore = "needs COTENANT_PYTHON (with moto) and the agent binary: cargo xtask test"]
fn s3_models_need_the_right_credentials() {
    let agent = workspace_binary("cotenant-agent");
    let dir = scratch("s3-credentials");
    let (s3, digest) = bucket_with_a_model(&dir);
    s3_tenant(&dir, "private", "squeezenet.onnx", &digest);
    let endpoint = [
        ("AWS_ENDPOINT_URL", s3.endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
    ];
    let cases: [Case; 4] = [
        (
            "no credentials",
            vec![],
            &["access denied read anonymously (no credentials)", "403"],
        ),
        (
            "a wrong secret key",
            vec![
                ("AWS_ACCESS_KEY_ID", s3.access_key_id.as_str()),
                ("AWS_SECRET_ACCESS_KEY", "not-the-secret"),
            ],
            &["access denied with the credentials given", "403"],
        ),
        (
            "half a key pair",
            vec![("AWS_ACCESS_KEY_ID", s3.access_key_id.as_str())],
            &[
                "the agent's environment",
                "AWS_SECRET_ACCESS_KEY is missing",
            ],
        ),
        (
            "a plain http endpoint not allowed",
            vec![
                ("AWS_ACCESS_KEY_ID", s3.access_key_id.as_str()),
                ("AWS_SECRET_ACCESS_KEY", s3.secret_access_key.as_str()),
                ("AWS_ALLOW_HTTP", "false"),
            ],
            &["AWS_ALLOW_HTTP=true"],
        ),
    ];
    for (i, (case, credentials, says)) in cases.iter().enumerate() {
        let cache = dir.join(format!("cache-{i}"));
        let cache_arg = cache.to_string_lossy().into_owned();
        let mut env = endpoint.to_vec();
        env.retain(|(k, _)| !credentials.iter().any(|(c, _)| c == k));
        env.extend(credentials.iter().copied());
        let (mut server, addr) = serve_with(&agent, &dir, &["--model-cache-dir", &cache_arg], &env);
        let (state, error) = state_of(&states(&addr), "private");
        assert_eq!(state, "Failed", "{case}: {error}");
        for text in *says {
            assert!(
                error.starts_with("s3://models/squeezenet.onnx: ") && error.contains(text),
                "{case}: {error}"
            );
        }
        assert!(!error.contains("not-the-secret"), "{case}: {error}");
        assert_eq!(cached_files(&cache), Vec::<String>::new(), "{case}");
        server.stop();
    }
}

#[test]
#[ignore = "needs COTENANT_PYTHON (with moto) and the agent binary: cargo xtask test"]
fn s3_transfers_cut_off_or_stalled_fail_and_leave_nothing_cached() {
    let agent = workspace_binary("cotenant-agent");
    let dir = scratch("s3-faults");
    let (s3, digest) = bucket_with_a_model(&dir);
    s3_tenant(&dir, "faulty", "squeezenet.onnx", &digest);
    // Enough for the response head and some of the body (the model is megabytes).
    let faults = [
        (Fault::Cut(64 << 10), "the transfer stopped after"),
        (Fault::Stall(64 << 10), "timed out"),
    ];
    for (i, (fault, says)) in faults.into_iter().enumerate() {
        let proxy = FaultyProxy::start(&s3.addr, fault).expect("proxy");
        let endpoint = format!("http://{}", proxy.addr);
        let cache = dir.join(format!("cache-{i}"));
        let cache_arg = cache.to_string_lossy().into_owned();
        let env = [
            ("AWS_ENDPOINT_URL", endpoint.as_str()),
            ("AWS_ALLOW_HTTP", "true"),
            ("AWS_ACCESS_KEY_ID", s3.access_key_id.as_str()),
            ("AWS_SECRET_ACCESS_KEY", s3.secret_access_key.as_str()),
        ];
        let (mut server, addr) = serve_with(
            &agent,
            &dir,
            &[
                "--model-cache-dir",
                &cache_arg,
                "--download-read-timeout",
                "2",
            ],
            &env,
        );
        let (state, error) = state_of(&states(&addr), "faulty");
        assert_eq!(state, "Failed", "{fault:?}: {error}");
        assert!(
            error.starts_with("s3://models/squeezenet.onnx: ") && error.contains(says),
            "{fault:?}: {error}"
        );
        assert_eq!(
            cached_files(&cache),
            Vec::<String>::new(),
            "{fault:?}: nothing partial is left"
        );
        server.stop();
    }
}
