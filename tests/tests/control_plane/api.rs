//! The API as the API server enforces it: examples accepted (their standalone-only relative
//! model paths refused), invalid objects rejected with a message naming the field, docs in
//! `kubectl explain`, and the printer columns.

use cotenant_e2e::{TestNamespace, install_crds};

const VALID: &str = "apiVersion: cotenant.dev/v1alpha1
kind: ModelTenant
metadata:
  name: t
spec:
  model:
    uri: file:///models/m.onnx
  slo:
    latencyMillis: 50
";

/// One invalid manifest: what it breaks, the manifest, and the text the rejection must contain.
struct Case {
    rule: &'static str,
    manifest: String,
    expect: &'static [&'static str],
}

fn tenant(edit: (&str, &str)) -> String {
    assert!(VALID.contains(edit.0), "bad test edit {:?}", edit.0);
    VALID.replace(edit.0, edit.1)
}

fn pool(spec: &str) -> String {
    format!(
        "apiVersion: cotenant.dev/v1alpha1\nkind: GpuPool\nmetadata:\n  name: bad-pool\nspec:\n{spec}"
    )
}

/// A pool with `template` lines added to its template and `agent` lines as its agent settings.
fn agent_pool(template: &str, agent: &str) -> String {
    let agent = if agent.is_empty() {
        String::new()
    } else {
        format!("  agent:\n{agent}")
    };
    pool(&format!(
        "  agentNamespace: x\n  template:\n    image: a\n{template}{agent}"
    ))
}

fn cases() -> Vec<Case> {
    let slo = "  slo:\n    latencyMillis: 50\n";
    let scaling = |s: &str| tenant((slo, &format!("{slo}  scaling:\n{s}")));
    vec![
        Case { rule: "latency > 0", manifest: tenant(("latencyMillis: 50", "latencyMillis: 0")), expect: &["spec.slo.latencyMillis", "latencyMillis must be greater than 0"] },
        Case { rule: "latency not negative", manifest: tenant(("latencyMillis: 50", "latencyMillis: -5")), expect: &["spec.slo.latencyMillis"] },
        Case { rule: "latency bounded", manifest: tenant(("latencyMillis: 50", "latencyMillis: 1000000000")), expect: &["spec.slo.latencyMillis", "less than or equal to 600000"] },
        Case { rule: "latency is a number", manifest: tenant(("latencyMillis: 50", "latencyMillis: fast")), expect: &["spec.slo.latencyMillis"] },
        Case { rule: "percentile >= 50", manifest: tenant(("latencyMillis: 50", "latencyMillis: 50\n    percentile: 30")), expect: &["spec.slo.percentile", "greater than or equal to 50"] },
        Case { rule: "percentile <= 99.99", manifest: tenant(("latencyMillis: 50", "latencyMillis: 50\n    percentile: 99.995")), expect: &["spec.slo.percentile", "percentile must be at most 99.99"] },
        Case { rule: "slo required", manifest: tenant((slo, "")), expect: &["spec.slo", "Required"] },
        Case { rule: "uri required", manifest: tenant(("    uri: file:///models/m.onnx\n", "    format: onnx\n")), expect: &["spec.model.uri", "Required"] },
        Case { rule: "uri scheme ftp", manifest: tenant(("file:///models/m.onnx", "ftp://host/m.onnx")), expect: &["spec.model.uri", "should match"] },
        Case { rule: "s3 without sha256", manifest: tenant(("file:///models/m.onnx", "s3://bucket/m.onnx")), expect: &["spec.model.sha256", "needs spec.model.sha256"] },
        Case { rule: "s3 without a key", manifest: tenant(("    uri: file:///models/m.onnx\n", &format!("    uri: s3://bucket\n    sha256: {}\n", "0".repeat(64)))), expect: &["spec.model.uri", "should match"] },
        Case { rule: "credentialsSecret on file://", manifest: tenant(("    uri: file:///models/m.onnx\n", "    uri: file:///models/m.onnx\n    credentialsSecret:\n      name: s3-reader\n")), expect: &["spec.model.credentialsSecret", "for s3://, gs:// and az:// models only"] },
        Case { rule: "credentialsSecret name", manifest: tenant(("    uri: file:///models/m.onnx\n", &format!("    uri: gs://bucket/m.onnx\n    sha256: {}\n    credentialsSecret:\n      name: Not_A_Name\n", "0".repeat(64)))), expect: &["spec.model.credentialsSecret.name"] },
        Case { rule: "sha256 length", manifest: tenant(("    uri: file:///models/m.onnx\n", "    uri: file:///models/m.onnx\n    sha256: abc123\n")), expect: &["spec.model.sha256"] },
        Case { rule: "sha256 hex", manifest: tenant(("    uri: file:///models/m.onnx\n", &format!("    uri: file:///models/m.onnx\n    sha256: {}\n", "z".repeat(64)))), expect: &["spec.model.sha256"] },
        Case { rule: "format enum", manifest: tenant(("    uri: file:///models/m.onnx\n", "    uri: file:///models/m.onnx\n    format: tensorflow\n")), expect: &["spec.model.format", "Unsupported value"] },
        Case { rule: "relative file:// in a cluster", manifest: tenant(("file:///models/m.onnx", "file://models/m.onnx")), expect: &["spec.model.uri", "standalone mode only"] },
        Case { rule: "https without sha256", manifest: tenant(("file:///models/m.onnx", "https://models.example/m.onnx")), expect: &["spec.model.sha256", "needs spec.model.sha256"] },
        Case { rule: "http without sha256", manifest: tenant(("file:///models/m.onnx", "http://models.example/m.onnx")), expect: &["spec.model.sha256", "needs spec.model.sha256"] },
        Case { rule: "http with a null sha256", manifest: tenant(("    uri: file:///models/m.onnx\n", "    uri: http://models.example/m.onnx\n    sha256: null\n")), expect: &["spec.model.sha256"] },
        Case { rule: "credentials Secret name", manifest: tenant((slo, &format!("{slo}  credentials:\n    secretRef:\n      name: Not_A_Name\n"))), expect: &["spec.credentials.secretRef.name"] },
        Case { rule: "credentials without a Secret", manifest: tenant((slo, &format!("{slo}  credentials: {{}}\n"))), expect: &["spec.credentials.secretRef", "Required"] },
        Case { rule: "approach enum", manifest: scaling("    approach: Fastest\n"), expect: &["spec.scaling.approach", "Unsupported value"] },
        Case { rule: "maxBatchSize >= 1", manifest: scaling("    maxBatchSize: 0\n"), expect: &["spec.scaling.maxBatchSize"] },
        Case { rule: "maxBatchSize <= 1024", manifest: scaling("    maxBatchSize: 5000\n"), expect: &["spec.scaling.maxBatchSize"] },
        Case { rule: "maxInstances >= 1", manifest: scaling("    maxInstances: 0\n"), expect: &["spec.scaling.maxInstances"] },
        Case { rule: "minReplicas <= maxReplicas", manifest: scaling("    minReplicas: 5\n    maxReplicas: 2\n"), expect: &["spec.scaling.minReplicas", "minReplicas must be less than or equal to maxReplicas"] },
        Case { rule: "pool name", manifest: tenant((slo, &format!("{slo}  pool: Bad_Pool\n"))), expect: &["spec.pool"] },
        Case { rule: "unknown field (strict)", manifest: tenant((slo, &format!("{slo}  sloo: 5\n"))), expect: &["unknown field", "spec.sloo"] },
        Case { rule: "name with a dot is no Service name", manifest: tenant(("name: t", "name: bert.large")), expect: &["metadata.name", "must be a Service name"] },
        Case { rule: "name starting with a digit is no Service name", manifest: tenant(("name: t", "name: 3net")), expect: &["metadata.name", "must be a Service name"] },
        Case { rule: "malformed YAML", manifest: "apiVersion: cotenant.dev/v1alpha1\nkind: ModelTenant\nmetadata:\n  name: t\nspec: [unclosed\n".to_string(), expect: &["yaml"] },
        Case { rule: "wrong apiVersion", manifest: VALID.replace("cotenant.dev/v1alpha1", "cotenant.dev/v1"), expect: &["ModelTenant", "cotenant.dev/v1"] },
        Case { rule: "minAgents <= maxAgents", manifest: pool("  agentNamespace: x\n  minAgents: 5\n  maxAgents: 2\n  template:\n    image: a\n"), expect: &["spec.minAgents", "minAgents must be less than or equal to maxAgents"] },
        Case { rule: "one GPU per agent at most", manifest: pool("  agentNamespace: x\n  template:\n    image: a\n    gpusPerAgent: 2\n"), expect: &["spec.template.gpusPerAgent"] },
        Case { rule: "cuda needs a GPU", manifest: agent_pool("    gpusPerAgent: 0\n", "    device: cuda\n"), expect: &["spec.agent.device", "cuda needs a GPU"] },
        Case { rule: "cpu holds no GPU", manifest: agent_pool("", "    device: cpu\n"), expect: &["spec.agent.device", "gpusPerAgent to 0"] },
        Case { rule: "device enum", manifest: agent_pool("", "    device: tpu\n"), expect: &["spec.agent.device", "Unsupported value"] },
        Case { rule: "schedule enum", manifest: agent_pool("", "    schedule: fastest\n"), expect: &["spec.agent.schedule", "Unsupported value"] },
        Case { rule: "threads >= 1", manifest: agent_pool("", "    threads: 0\n"), expect: &["spec.agent.threads"] },
        Case { rule: "tenantMemoryLimit is a size", manifest: agent_pool("", "    tenantMemoryLimit: lots\n"), expect: &["spec.agent.tenantMemoryLimit"] },
        Case { rule: "env the operator sets", manifest: agent_pool("    env:\n    - {name: POD_IP, value: 169.254.169.254}\n", ""), expect: &["spec.template.env", "the operator sets them"] },
        Case { rule: "hostPath volume", manifest: agent_pool("    volumes:\n    - {name: root, hostPath: {path: /}}\n", ""), expect: &["spec.template.volumes", "hostPath volumes are not allowed"] },
        Case { rule: "scratch volume name", manifest: agent_pool("    volumes:\n    - {name: tmp, emptyDir: {}}\n", ""), expect: &["spec.template.volumes", "scratch space"] },
        Case { rule: "mount of no volume", manifest: agent_pool("    volumeMounts:\n    - {name: certs, mountPath: /certs}\n", ""), expect: &["spec.template.volumeMounts", "must name a volume"] },
        Case { rule: "model mount of no volume", manifest: agent_pool("    modelMounts:\n    - {name: models, mountPath: /models}\n", ""), expect: &["spec.template.modelMounts", "must name a volume"] },
        Case { rule: "model mount on /", manifest: agent_pool("    volumes:\n    - {name: models, persistentVolumeClaim: {claimName: m}}\n    modelMounts:\n    - {name: models, mountPath: /}\n", ""), expect: &["spec.template.modelMounts", "must be absolute, not / or /tmp"] },
        Case { rule: "pod labels the operator selects by", manifest: agent_pool("    podLabels: {cotenant.dev/pool: other}\n", ""), expect: &["spec.template.podLabels", "the operator selects agent pods by them"] },
        Case { rule: "agent image required", manifest: pool("  agentNamespace: x\n  template:\n    gpusPerAgent: 1\n"), expect: &["spec.template.image", "Required"] },
        Case { rule: "agent knobs >= 1", manifest: "apiVersion: cotenant.dev/v1alpha1\nkind: GpuAgent\nmetadata:\n  name: a\nspec:\n  pool: default\n  assignments:\n  - tenant: {namespace: ns, name: t, uid: u}\n    model: {uri: file://m.onnx}\n    slo: {latencyMillis: 10}\n    knobs: {batchSize: 0, instances: 1}\n".to_string(), expect: &["spec.assignments[0].knobs.batchSize"] },
    ]
}

#[test]
#[ignore = "needs the control plane: cargo xtask test"]
fn invalid_manifests_are_rejected_naming_the_field() {
    install_crds();
    let ns = TestNamespace::new("invalid");
    let cp = ns.control_plane();
    let cases = cases();
    assert!(cases.len() >= 15);
    let mut table = String::from("| rule | API server message |\n|---|---|\n");
    let mut failures = Vec::new();
    for case in &cases {
        let out = cp
            .kubectl_stdin(
                &["apply", "--validate=strict", "-n", &ns.name, "-f", "-"],
                &case.manifest,
            )
            .expect("kubectl runs");
        let stderr = String::from_utf8_lossy(&out.stderr).replace('\n', " ");
        table.push_str(&format!("| {} | {} |\n", case.rule, stderr.trim()));
        if out.status.success() {
            failures.push(format!("{}: accepted", case.rule));
        } else if let Some(missing) = case.expect.iter().find(|e| !stderr.contains(*e)) {
            failures.push(format!(
                "{}: message lacks {missing:?}: {stderr}",
                case.rule
            ));
        }
    }
    eprintln!("{table}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Nothing invalid was stored.
    let stored = cp
        .kubectl_ok(&["get", "modeltenants", "-n", &ns.name, "-o", "name"])
        .expect("list tenants");
    assert_eq!(stored.trim(), "");
}

#[test]
#[ignore = "needs the control plane: cargo xtask test"]
fn examples_are_accepted_defaulted_and_shown() {
    install_crds();
    let ns = TestNamespace::new("examples");
    let cp = ns.control_plane();
    let examples = TestNamespace::repo_root().join("examples");
    let out = cp
        .kubectl_ok(&[
            "apply",
            "--validate=strict",
            "-f",
            &examples.join("pools").to_string_lossy(),
        ])
        .expect("the example pool is accepted");
    for pool in ["h200", "cpu"] {
        assert!(
            out.contains(&format!("gpupool.cotenant.dev/{pool}")),
            "{out}"
        );
    }
    // The example tenants name their models relative to their files, for standalone mode; a
    // cluster refuses that, and takes them with the path under a model volume instead.
    let mut out = String::new();
    for name in ["resnet50", "mobilenet-v2", "bert-encoder"] {
        let file = examples.join(format!("{name}.yaml"));
        let text = std::fs::read_to_string(&file).expect("example");
        assert!(text.contains("file://models/"), "{}", file.display());
        let apply = ["apply", "--validate=strict", "-n", &ns.name, "-f", "-"];
        let refused = cp.kubectl_stdin(&apply, &text).expect("kubectl runs");
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(
            !refused.status.success() && stderr.contains("spec.model.uri"),
            "{name}: {stderr}"
        );
        let in_cluster = text.replace("file://models/", "file:///models/");
        let accepted = cp.kubectl_stdin(&apply, &in_cluster).expect("kubectl runs");
        assert!(
            accepted.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&accepted.stderr)
        );
        out.push_str(&String::from_utf8_lossy(&accepted.stdout));
    }
    assert!(
        out.contains("modeltenant.cotenant.dev/resnet50 created"),
        "{out}"
    );
    // The cluster examples are accepted as they are: absolute paths under a model volume, with
    // their digests.
    let cluster = TestNamespace::new("examples-cluster");
    let out = cp
        .kubectl_ok(&[
            "apply",
            "--validate=strict",
            "-n",
            &cluster.name,
            "-f",
            &examples.join("cluster").to_string_lossy(),
        ])
        .expect("the cluster examples are accepted");
    for name in ["resnet50", "mobilenet-v2", "bert-encoder"] {
        assert!(
            out.contains(&format!("modeltenant.cotenant.dev/{name} created")),
            "{out}"
        );
    }

    // The API server filled in the defaults.
    let percentile = cp
        .kubectl_ok(&["get", "mt", "mobilenet-v2", "-n", &ns.name, "-o", "jsonpath={.spec.slo.percentile} {.spec.pool} {.spec.scaling.maxBatchSize} {.spec.scaling.approach}"])
        .expect("get");
    assert_eq!(percentile, "99 default 32 Auto");

    // The short name, the category and the printer columns.
    let table = cp
        .kubectl_ok(&["get", "mt", "-n", &ns.name])
        .expect("get mt");
    for column in [
        "NAME",
        "SLO(MS)",
        "P99(MS)",
        "THROUGHPUT",
        "APPROACH",
        "BATCH",
        "INSTANCES",
        "REPLICAS",
        "READY",
        "AGE",
    ] {
        assert!(table.contains(column), "column {column} missing:\n{table}");
    }
    let wide = cp
        .kubectl_ok(&["get", "cotenant", "-n", &ns.name, "-o", "wide"])
        .expect("get cotenant");
    for text in [
        "PERCENTILE",
        "ATTAINMENT",
        "POOL",
        "ENDPOINT",
        "bert-encoder",
        "95",
    ] {
        assert!(wide.contains(text), "{text} missing:\n{wide}");
    }
    let pools = cp
        .kubectl_ok(&["get", "gpupools", "h200"])
        .expect("get pools");
    for column in ["AGENTS", "READY", "PENDING", "MIN", "MAX"] {
        assert!(pools.contains(column), "column {column} missing:\n{pools}");
    }

    // Field selection on the pool.
    let selected = cp
        .kubectl_ok(&[
            "get",
            "mt",
            "-n",
            &ns.name,
            "--field-selector",
            "spec.pool=default",
            "-o",
            "name",
        ])
        .expect("field selector");
    assert_eq!(selected.lines().count(), 3, "{selected}");
    cp.kubectl_ok(&["delete", "gpupool", "h200"])
        .expect("delete pool");
}

#[test]
#[ignore = "needs the control plane: cargo xtask test"]
fn kubectl_explain_shows_the_docs() {
    install_crds();
    let cp = cotenant_e2e::shared();
    let slo = cp
        .kubectl_ok(&["explain", "modeltenant.spec.slo"])
        .expect("explain");
    assert!(slo.contains("latencyMillis"), "{slo}");
    assert!(slo.contains("percentile"), "{slo}");
    assert!(slo.contains("Latency target in milliseconds"), "{slo}");
    let root = cp.kubectl_ok(&["explain", "mt"]).expect("explain");
    assert!(root.contains("A model served with a latency SLO"), "{root}");
    let pool = cp
        .kubectl_ok(&["explain", "gpupool.spec.template.gpusPerAgent"])
        .expect("explain");
    assert!(pool.contains("nvidia.com/gpu"), "{pool}");
    let agent = cp
        .kubectl_ok(&["explain", "gpuagent.status.tenants.state"])
        .expect("explain");
    assert!(agent.contains("lifecycle"), "{agent}");
}
