//! Who may call a tenant (a standalone token file, checked with tritonclient and raw requests),
//! what error bodies tell callers, and where a standalone agent refuses to take models from.

use super::{python, run_script, scratch, serve, tenant_yaml, wide_model};
use cotenant_e2e::http::{Response, head, http_post, http_raw};
use cotenant_e2e::{TestNamespace, http_get_with, workspace_binary};
use std::time::Duration;

const TOKEN: &str = "a8f5f167f44f4964e6c998dee827110c";

fn get(addr: &str, path: &str, headers: &[(&str, &str)]) -> Response {
    http_raw(
        addr,
        &head(addr, "GET", path, headers),
        Duration::from_secs(30),
    )
    .expect("an answer")
}

/// A tenant file whose metadata carries `annotations` (YAML lines, indented four spaces).
fn annotated(name: &str, uri: &str, annotations: &str) -> String {
    tenant_yaml(name, uri, "").replace(
        &format!("  name: {name}\n"),
        &format!("  name: {name}\n  annotations:\n{annotations}"),
    )
}

#[test]
#[ignore = "needs COTENANT_PYTHON and the agent binary: cargo xtask test"]
fn guarded_tenants_answer_only_callers_with_their_token() {
    let python = python();
    let agent = workspace_binary("cotenant-agent");
    let dir = scratch("guarded");
    let model = dir.join("models/wide.onnx");
    wide_model(&python, &model, 8);
    std::fs::write(dir.join("callers"), format!("{TOKEN}\n")).expect("token file");
    std::fs::write(dir.join("weak"), "hunter2\n").expect("weak token file");
    let files = [
        (
            "guarded.yaml",
            annotated(
                "guarded",
                "file://models/wide.onnx",
                "    cotenant.dev/token-file: callers\n",
            ),
        ),
        (
            "open.yaml",
            tenant_yaml("open", "file://models/wide.onnx", ""),
        ),
        (
            "weak.yaml",
            annotated(
                "weak",
                "file://models/wide.onnx",
                "    cotenant.dev/token-file: weak\n",
            ),
        ),
        (
            "zero-token.yaml",
            annotated(
                "zero-token",
                "file://models/wide.onnx",
                "    cotenant.dev/token-file: /dev/zero\n",
            ),
        ),
        (
            "secret-ref.yaml",
            tenant_yaml(
                "secret-ref",
                "file://models/wide.onnx",
                "  credentials:\n    secretRef:\n      name: callers\n",
            ),
        ),
    ];
    for (file, text) in &files {
        std::fs::write(dir.join(file), text).expect("tenant file");
    }
    let (mut server, addr) = serve(&agent, &dir, &[]);
    let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    assert!(
        log.contains("weak.yaml") && log.contains("at least 32"),
        "{log}"
    );
    assert!(
        log.contains("zero-token.yaml") && log.contains("not a regular file"),
        "{log}"
    );
    assert!(
        log.contains("secret-ref.yaml") && log.contains("standalone mode cannot read"),
        "{log}"
    );

    // tritonclient with the token: metadata, readiness and inference, against onnxruntime.
    let model_arg = model.to_string_lossy();
    run_script(
        &python,
        &server,
        "tenant_client.py",
        &[
            "--url", &addr, "--model", "guarded", "--file", &model_arg, "--token", TOKEN,
        ],
    );
    run_script(
        &python,
        &server,
        "tenant_client.py",
        &["--url", &addr, "--model", "open", "--file", &model_arg],
    );

    // Without the token, every endpoint of the tenant answers the same 401.
    let request =
        br#"{"inputs":[{"name":"x","shape":[1,8],"datatype":"FP32","data":[1,2,3,4,5,6,7,8]}]}"#;
    let wrong = format!("Bearer {TOKEN}0");
    let right = format!("Bearer {TOKEN}");
    let mut refusals = Vec::new();
    for headers in [
        vec![],
        vec![("Authorization", wrong.as_str())],
        vec![("Authorization", "Basic Zm9vOmJhcg==")],
    ] {
        refusals
            .push(http_post(&addr, "/v2/models/guarded/infer", &headers, request).expect("infer"));
        refusals.push(get(&addr, "/v2/models/guarded", &headers));
        refusals.push(get(&addr, "/v2/models/guarded/ready", &headers));
        refusals.push(get(&addr, "/v2/models/guarded/versions/1", &headers));
    }
    // A name nobody serves answers exactly like a guarded one.
    refusals.push(get(&addr, "/v2/models/no-such-model", &[]));
    refusals.push(http_post(&addr, "/v2/models/no-such-model/infer", &[], request).expect("infer"));
    for r in &refusals {
        assert_eq!(r.status, 401, "{}", r.text());
        assert_eq!(r.body, refusals[0].body);
        assert!(
            r.header("www-authenticate")
                .is_some_and(|v| v.starts_with("Bearer"))
        );
    }
    let r = http_post(
        &addr,
        "/v2/models/guarded/infer",
        &[("Authorization", &right)],
        request,
    )
    .expect("infer");
    assert_eq!(r.status, 200, "{}", r.text());
    // The open tenant needs nothing.
    let r = http_post(&addr, "/v2/models/open/infer", &[], request).expect("infer");
    assert_eq!(r.status, 200, "{}", r.text());
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs COTENANT_PYTHON and the agent binary: cargo xtask test"]
fn models_come_only_from_regular_files_and_allowed_addresses_and_errors_keep_them_private() {
    let agent = workspace_binary("cotenant-agent");
    let dir = scratch("sources");
    wide_model(&python(), &dir.join("models/wide.onnx"), 8);
    let digest = "0".repeat(64);
    let files = [
        (
            "wide.yaml",
            tenant_yaml("wide", "file://models/wide.onnx", ""),
        ),
        (
            "missing.yaml",
            tenant_yaml("missing", "file://models/private-dir/missing.onnx", ""),
        ),
        ("zero.yaml", tenant_yaml("zero", "file:///dev/zero", "")),
        ("folder.yaml", tenant_yaml("folder", "file://models", "")),
        (
            "metadata.yaml",
            tenant_yaml(
                "metadata",
                "http://169.254.169.254/latest/meta-data/m.onnx",
                &format!("    sha256: {digest}\n"),
            ),
        ),
        (
            "unpinned.yaml",
            tenant_yaml("unpinned", "https://models.example/m.onnx", ""),
        ),
    ];
    for (file, text) in &files {
        std::fs::write(dir.join(file), text).expect("tenant file");
    }
    let (mut server, addr) = serve(&agent, &dir, &[]);
    let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    assert!(
        log.contains("unpinned.yaml") && log.contains("spec.model.sha256"),
        "{log}"
    );

    let (code, body) =
        http_get_with(&addr, "/report", &[("Authorization", "Bearer s3cret")]).expect("report");
    assert_eq!(code, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).expect("report JSON");
    let error = |name: &str| {
        report["tenants"]
            .as_array()
            .and_then(|ts| ts.iter().find(|t| t["name"] == name))
            .map(|t| {
                (
                    t["state"].clone(),
                    t["error"].as_str().unwrap_or("").to_string(),
                )
            })
            .unwrap_or_else(|| panic!("{name} not in the report: {body}"))
    };
    for (name, says) in [
        ("zero", "not a regular file"),
        ("folder", "not a regular file"),
        ("metadata", "link-local"),
        ("missing", "private-dir"),
    ] {
        let (state, reason) = error(name);
        assert_eq!(state, "Failed", "{name}: {reason}");
        assert!(reason.contains(says), "{name}: {reason}");
    }

    // A caller learns that the model failed, not where it lives.
    let request =
        br#"{"inputs":[{"name":"x","shape":[1,8],"datatype":"FP32","data":[1,2,3,4,5,6,7,8]}]}"#;
    let root = TestNamespace::repo_root();
    for name in ["missing", "zero", "metadata"] {
        let infer =
            http_post(&addr, &format!("/v2/models/{name}/infer"), &[], request).expect("infer");
        let meta = get(&addr, &format!("/v2/models/{name}"), &[]);
        assert_eq!(infer.status, 503, "{}", infer.text());
        for r in [&infer, &meta] {
            let text = r.text();
            for private in [
                "private-dir",
                "/dev/zero",
                "169.254",
                &dir.to_string_lossy(),
                &root.to_string_lossy(),
            ] {
                assert!(
                    !text.contains(private),
                    "{name} told a caller {private:?}: {text}"
                );
            }
        }
    }
    let r = http_post(&addr, "/v2/models/wide/infer", &[], request).expect("infer");
    assert_eq!(r.status, 200, "{}", r.text());
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
