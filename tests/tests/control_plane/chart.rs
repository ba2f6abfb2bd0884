//! The Helm chart on a real API server: install, upgrade, uninstall, and least-privilege RBAC.

use cotenant_e2e::{ControlPlane, TestNamespace, cluster::checked};

fn chart() -> String {
    TestNamespace::repo_root()
        .join("charts/cotenant")
        .to_string_lossy()
        .into_owned()
}

fn helm(cp: &ControlPlane, args: &[&str]) -> String {
    let mut cmd = cp.helm();
    cmd.args(args);
    checked(cmd.output(), &format!("helm {}", args.join(" "))).unwrap_or_else(|e| panic!("{e}"))
}

fn kubectl(cp: &ControlPlane, args: &[&str]) -> String {
    cp.kubectl_ok(args).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
#[ignore = "needs the control plane: cargo xtask test"]
fn helm_install_upgrade_uninstall() {
    let ns = TestNamespace::new("helm");
    let cp = ns.control_plane();
    let n = ns.name.as_str();
    helm(
        cp,
        &[
            "install",
            "cotenant",
            &chart(),
            "-n",
            n,
            "--wait",
            "--timeout",
            "180s",
        ],
    );

    for crd in ["modeltenants", "gpupools", "gpuagents"] {
        kubectl(
            cp,
            &[
                "wait",
                "--for=condition=Established",
                &format!("crd/{crd}.cotenant.dev"),
                "--timeout=60s",
            ],
        );
    }
    // kwok plays the kubelet, so the operator pod is scheduled and reported ready.
    kubectl(
        cp,
        &[
            "rollout",
            "status",
            "deployment/cotenant-operator",
            "-n",
            n,
            "--timeout=120s",
        ],
    );
    let deployment = kubectl(
        cp,
        &[
            "get",
            "deployment",
            "cotenant-operator",
            "-n",
            n,
            "-o",
            "json",
        ],
    );
    let deployment: serde_json::Value = serde_json::from_str(&deployment).expect("json");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["runAsNonRoot"], true);
    assert_eq!(security["capabilities"]["drop"][0], "ALL");
    assert_eq!(security["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(
        deployment["spec"]["template"]["spec"]["serviceAccountName"],
        "cotenant-operator"
    );
    for (kind, name) in [
        ("serviceaccount", "cotenant-operator"),
        ("serviceaccount", "cotenant-agent"),
        ("service", "cotenant-operator"),
        ("rolebinding", "cotenant-agent"),
        ("gpupool", "default"),
    ] {
        kubectl(cp, &["get", kind, name, "-n", n]);
    }
    kubectl(cp, &["get", "clusterrole", "cotenant-operator"]);
    let pool_ns = kubectl(
        cp,
        &[
            "get",
            "gpupool",
            "default",
            "-o",
            "jsonpath={.spec.agentNamespace}",
        ],
    );
    assert_eq!(pool_ns, n, "agents default to the release namespace");

    // A tenant created while installed must survive the uninstall (the CRDs stay).
    let tenant = "apiVersion: cotenant.dev/v1alpha1\nkind: ModelTenant\nmetadata:\n  name: keep\nspec:\n  model:\n    uri: https://models.example/m.onnx\n    sha256: \"0000000000000000000000000000000000000000000000000000000000000000\"\n  slo:\n    latencyMillis: 20\n";
    let out = cp
        .kubectl_stdin(&["apply", "-n", n, "-f", "-"], tenant)
        .expect("kubectl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    helm(
        cp,
        &[
            "upgrade",
            "cotenant",
            &chart(),
            "-n",
            n,
            "--set",
            "operator.replicas=2",
            "--set",
            "defaultPool.maxAgents=3",
            "--wait",
            "--timeout",
            "180s",
        ],
    );
    let replicas = kubectl(
        cp,
        &[
            "get",
            "deployment",
            "cotenant-operator",
            "-n",
            n,
            "-o",
            "jsonpath={.spec.replicas}",
        ],
    );
    assert_eq!(replicas, "2");
    let max = kubectl(
        cp,
        &[
            "get",
            "gpupool",
            "default",
            "-o",
            "jsonpath={.spec.maxAgents}",
        ],
    );
    assert_eq!(max, "3");

    // A typo in values fails at install through values.schema.json.
    let mut typo = cp.helm();
    typo.args([
        "upgrade",
        "cotenant",
        &chart(),
        "-n",
        n,
        "--set",
        "operatr.replicas=2",
    ]);
    let err = checked(typo.output(), "helm upgrade with a typo").expect_err("typo rejected");
    assert!(err.to_string().contains("operatr"), "{err}");

    helm(
        cp,
        &[
            "uninstall",
            "cotenant",
            "-n",
            n,
            "--wait",
            "--timeout",
            "120s",
        ],
    );
    for (kind, name) in [
        ("deployment", "cotenant-operator"),
        ("serviceaccount", "cotenant-agent"),
        ("clusterrole", "cotenant-operator"),
        ("gpupool", "default"),
    ] {
        let out = cp
            .kubectl()
            .args(["get", kind, name, "-n", n])
            .output()
            .expect("kubectl");
        assert!(
            !out.status.success(),
            "{kind}/{name} survived helm uninstall"
        );
    }
    kubectl(cp, &["get", "crd", "modeltenants.cotenant.dev"]);
    kubectl(cp, &["get", "modeltenant", "keep", "-n", n]);
}

#[test]
#[ignore = "needs the control plane: cargo xtask test"]
fn rbac_is_least_privilege() {
    let ns = TestNamespace::new("rbac");
    let cp = ns.control_plane();
    let n = ns.name.as_str();
    // A second release beside the other test's: its own names, and no default pool to collide on.
    helm(
        cp,
        &[
            "install",
            "rbac",
            &chart(),
            "-n",
            n,
            "--set",
            "defaultPool.enabled=false",
        ],
    );
    let operator = format!("system:serviceaccount:{n}:cotenant-operator");
    let agent = format!("system:serviceaccount:{n}:cotenant-agent");
    let can = |who: &str, verb: &str, resource: &str, namespace: Option<&str>| -> bool {
        let mut cmd = cp.kubectl();
        cmd.args(["auth", "can-i", verb, "--as", who]);
        match resource.split_once('/') {
            Some((resource, subresource)) => cmd.args([resource, "--subresource", subresource]),
            None => cmd.arg(resource),
        };
        match namespace {
            Some(namespace) => cmd.args(["-n", namespace]),
            None => cmd.arg("--all-namespaces"),
        };
        let out = cmd.output().expect("kubectl");
        String::from_utf8_lossy(&out.stdout).trim() == "yes"
    };
    let other = Some("some-tenant-namespace");
    let mine = Some(n);
    let expectations: &[(&str, &str, &str, Option<&str>, bool)] = &[
        ("operator", "watch", "modeltenants.cotenant.dev", None, true),
        (
            "operator",
            "patch",
            "modeltenants.cotenant.dev/status",
            other,
            true,
        ),
        (
            "operator",
            "update",
            "modeltenants.cotenant.dev/finalizers",
            other,
            true,
        ),
        ("operator", "create", "gpuagents.cotenant.dev", mine, true),
        (
            "operator",
            "patch",
            "gpupools.cotenant.dev/status",
            None,
            true,
        ),
        ("operator", "create", "pods", mine, true),
        ("operator", "delete", "pods", mine, true),
        ("operator", "create", "services", other, true),
        (
            "operator",
            "create",
            "endpointslices.discovery.k8s.io",
            other,
            true,
        ),
        ("operator", "create", "events.events.k8s.io", other, true),
        ("operator", "list", "nodes", None, true),
        (
            "operator",
            "update",
            "leases.coordination.k8s.io",
            mine,
            true,
        ),
        // One Secret by name, the one a tenant names for its caller tokens; never all of them.
        ("operator", "get", "secrets", other, true),
        ("operator", "list", "secrets", other, false),
        ("operator", "watch", "secrets", other, false),
        (
            "operator",
            "delete",
            "modeltenants.cotenant.dev",
            other,
            false,
        ),
        ("operator", "create", "clusterrolebindings", None, false),
        ("operator", "delete", "nodes", None, false),
        (
            "operator",
            "update",
            "leases.coordination.k8s.io",
            other,
            false,
        ),
        ("agent", "watch", "gpuagents.cotenant.dev", mine, true),
        (
            "agent",
            "patch",
            "gpuagents.cotenant.dev/status",
            mine,
            true,
        ),
        (
            "agent",
            "create",
            "tokenreviews.authentication.k8s.io",
            None,
            true,
        ),
        ("agent", "patch", "gpuagents.cotenant.dev", mine, false),
        ("agent", "update", "gpuagents.cotenant.dev", mine, false),
        ("agent", "create", "modeltenants.cotenant.dev", other, false),
        ("agent", "patch", "modeltenants.cotenant.dev", mine, false),
        (
            "agent",
            "patch",
            "modeltenants.cotenant.dev/status",
            mine,
            false,
        ),
        ("agent", "create", "pods", mine, false),
        ("agent", "delete", "pods", mine, false),
        ("agent", "get", "secrets", mine, false),
        ("agent", "list", "secrets", None, false),
        ("agent", "create", "services", mine, false),
        ("agent", "create", "rolebindings", mine, false),
        ("agent", "create", "clusterroles", None, false),
        ("agent", "watch", "gpuagents.cotenant.dev", other, false),
    ];
    let mut wrong = Vec::new();
    for (who, verb, resource, namespace, allowed) in expectations {
        let subject = if *who == "operator" {
            &operator
        } else {
            &agent
        };
        if can(subject, verb, resource, *namespace) != *allowed {
            wrong.push(format!(
                "{who} {verb} {resource} in {namespace:?}: expected {allowed}"
            ));
        }
    }
    helm(cp, &["uninstall", "rbac", "-n", n]);
    assert!(wrong.is_empty(), "RBAC differs:\n{}", wrong.join("\n"));
}
