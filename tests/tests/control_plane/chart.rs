//! The Helm chart on a real API server: install (under the `restricted` Pod Security Standard),
//! upgrade, uninstall, least-privilege RBAC asserted rule by rule, and agents kept to their own
//! GpuAgent status by the chart's admission policy.

use cotenant_e2e::{ControlPlane, TestNamespace, cluster::checked};
use std::collections::BTreeSet;

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
    // The operator's pods must meet the restricted Pod Security Standard to start at all.
    kubectl(
        cp,
        &[
            "label",
            "namespace",
            n,
            "pod-security.kubernetes.io/enforce=restricted",
        ],
    );
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
    kubectl(
        cp,
        &[
            "get",
            "validatingadmissionpolicy",
            "cotenant-agent-own-status",
        ],
    );
    let env = kubectl(
        cp,
        &[
            "get",
            "deployment",
            "cotenant-operator",
            "-n",
            n,
            "-o",
            "jsonpath={range .spec.template.spec.containers[0].env[*]}{.name}={.value}{\"\\n\"}{end}",
        ],
    );
    assert!(
        env.contains("COTENANT_SERVICE_ACCOUNT=cotenant-operator"),
        "{env}"
    );
    assert!(
        env.contains(&format!("COTENANT_AGENT_NAMESPACES={n}")),
        "{env}"
    );
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
        ("validatingadmissionpolicy", "cotenant-agent-own-status"),
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

/// The resource rules `kubectl auth can-i --list` shows for the ServiceAccount whose kubeconfig
/// is `kubeconfig`, in `namespace`: one `resource [names] [verbs]` line per rule, verbs sorted.
/// Non-resource URLs (the API server's defaults for every user) must be read-only.
fn rules(cp: &ControlPlane, kubeconfig: &std::path::Path, namespace: &str) -> BTreeSet<String> {
    let mut cmd = cp.kubectl();
    cmd.env("KUBECONFIG", kubeconfig)
        .args(["auth", "can-i", "--list", "-n", namespace]);
    let out = checked(cmd.output(), "kubectl auth can-i --list").unwrap_or_else(|e| panic!("{e}"));
    let mut rules = BTreeSet::new();
    for line in out.lines().skip(1) {
        let resource = line[..line.find('[').unwrap_or(line.len())].trim();
        let groups: Vec<&str> = line
            .split('[')
            .skip(1)
            .map(|g| g.split(']').next().unwrap_or_default())
            .collect();
        let [urls, names, verbs] = groups[..] else {
            panic!("unexpected line: {line:?}");
        };
        let mut verbs: Vec<&str> = verbs.split_whitespace().collect();
        verbs.sort_unstable();
        if resource.is_empty() {
            assert_eq!(verbs, ["get"], "a non-resource URL beyond reading: {line}");
            assert!(!urls.is_empty(), "{line}");
            continue;
        }
        rules.insert(format!("{resource} [{names}] [{}]", verbs.join(" ")));
    }
    rules
}

/// What every authenticated user may do (reviews of itself).
const EVERYONE: &[&str] = &[
    "selfsubjectaccessreviews.authorization.k8s.io [] [create]",
    "selfsubjectreviews.authentication.k8s.io [] [create]",
    "selfsubjectrulesreviews.authorization.k8s.io [] [create]",
];

fn set(rules: &[&[&str]]) -> BTreeSet<String> {
    rules
        .iter()
        .flat_map(|r| r.iter())
        .map(|r| r.to_string())
        .collect()
}

#[test]
#[ignore = "needs the control plane: cargo xtask test"]
fn rbac_is_least_privilege() {
    let ns = TestNamespace::new("rbac");
    let cp = ns.control_plane();
    let n = ns.name.as_str();
    // A second release beside the other test's: its own names, and no default pool to collide on.
    cp.install_chart("rbac", n).expect("chart installs");
    let operator = cp
        .service_account_kubeconfig(n, "cotenant-operator")
        .expect("operator token");
    let agent = cp
        .service_account_kubeconfig(n, "cotenant-agent")
        .expect("agent token");
    let tenants = "some-tenant-namespace";
    // The operator anywhere (tenants live in any namespace).
    let operator_everywhere: &[&str] = &[
        "modeltenants.cotenant.dev [] [list patch watch]",
        "modeltenants.cotenant.dev/status [] [patch]",
        "gpupools.cotenant.dev [] [list watch]",
        "gpupools.cotenant.dev/status [] [patch]",
        "services [] [create delete get list patch watch]",
        "endpointslices.discovery.k8s.io [] [create delete list patch watch]",
        "events.events.k8s.io [] [create patch]",
        // Per-tenant credentials: a ModelTenant may name a Secret of bearer tokens, which the
        // operator reads by name and hands to agents as SHA-256 hashes.
        "secrets [] [get]",
    ];
    // The operator in its namespace, which is also the agents' here: besides reading tenants'
    // Secrets anywhere, it keeps its copies of tenants' model credentials here (kubectl shows
    // the two rules on Secrets as one).
    let operator_home: &[&str] = &[
        "pods [] [create delete list watch]",
        "gpuagents.cotenant.dev [] [create delete list patch watch]",
        "leases.coordination.k8s.io [] [create list watch]",
        "leases.coordination.k8s.io [cotenant-operator] [get update]",
        "secrets [] [create delete get list patch watch]",
    ];
    let operator_everywhere_else: Vec<&str> = operator_everywhere
        .iter()
        .copied()
        .filter(|r| !r.starts_with("secrets "))
        .collect();
    let agent_everywhere: &[&str] = &["tokenreviews.authentication.k8s.io [] [create]"];
    // The agent reads, by name, the copies of its tenants' model credentials.
    let agent_home: &[&str] = &[
        "gpuagents.cotenant.dev [] [list watch]",
        "gpuagents.cotenant.dev/status [] [patch]",
        "leases.coordination.k8s.io [] [create get update]",
        "secrets [] [get]",
    ];
    let cases = [
        (
            "operator",
            &operator,
            n,
            set(&[EVERYONE, &operator_everywhere_else, operator_home]),
        ),
        (
            "operator",
            &operator,
            tenants,
            set(&[EVERYONE, operator_everywhere]),
        ),
        (
            "agent",
            &agent,
            n,
            set(&[EVERYONE, agent_everywhere, agent_home]),
        ),
        ("agent", &agent, tenants, set(&[EVERYONE, agent_everywhere])),
    ];
    let mut wrong = Vec::new();
    for (who, kubeconfig, namespace, expected) in &cases {
        let actual = rules(cp, kubeconfig, namespace);
        for extra in actual.difference(expected) {
            wrong.push(format!("{who} in {namespace} may also: {extra}"));
        }
        for missing in expected.difference(&actual) {
            wrong.push(format!("{who} in {namespace} lacks: {missing}"));
        }
    }
    helm(cp, &["uninstall", "rbac", "-n", n]);
    assert!(wrong.is_empty(), "RBAC differs:\n{}", wrong.join("\n"));
}

#[test]
#[ignore = "needs the control plane: cargo xtask test"]
fn an_agent_writes_only_its_own_gpuagent_status() {
    let ns = TestNamespace::new("own-status");
    let cp = ns.control_plane();
    let n = ns.name.as_str();
    cp.install_chart("own", n).expect("chart installs");
    // Two agent pods (kwok runs them) and their GpuAgents.
    for agent in ["agent-a", "agent-b"] {
        cp.kubectl_apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {agent}\n  namespace: {n}\nspec:\n  serviceAccountName: cotenant-agent\n  containers:\n  - name: agent\n    image: cotenant/agent:test\n---\napiVersion: cotenant.dev/v1alpha1\nkind: GpuAgent\nmetadata:\n  name: {agent}\n  namespace: {n}\nspec:\n  pool: p\n"
        ))
        .expect("pod and GpuAgent");
    }
    let as_agent_a = cp
        .pod_kubeconfig(n, "cotenant-agent", "agent-a")
        .expect("a token bound to agent-a");
    let unbound = cp
        .service_account_kubeconfig(n, "cotenant-agent")
        .expect("a token bound to no pod");
    // What the agent does: a status write without reading first (server-side apply here).
    let write_status = |kubeconfig: &std::path::Path, agent: &str, address: &str| {
        let mut cmd = cp.kubectl();
        cmd.env("KUBECONFIG", kubeconfig).args([
            "apply",
            "--server-side",
            "--subresource=status",
            "--field-manager=cotenant-agent",
            "-f",
            "-",
        ]);
        let manifest = format!(
            "apiVersion: cotenant.dev/v1alpha1\nkind: GpuAgent\nmetadata:\n  name: {agent}\n  namespace: {n}\nstatus:\n  address: \"{address}\"\n"
        );
        let mut child = cmd
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("kubectl");
        if let Some(mut stdin) = child.stdin.take() {
            std::io::Write::write_all(&mut stdin, manifest.as_bytes()).expect("stdin");
        }
        checked(
            child.wait_with_output(),
            "kubectl apply --subresource=status",
        )
    };
    let address = |agent: &str| {
        kubectl(
            cp,
            &[
                "get",
                "gpuagent",
                agent,
                "-n",
                n,
                "-o",
                "jsonpath={.status.address}",
            ],
        )
    };

    write_status(&as_agent_a, "agent-a", "10.0.0.1:8000").expect("its own status");
    assert_eq!(address("agent-a"), "10.0.0.1:8000");
    let refused = write_status(&as_agent_a, "agent-b", "10.6.6.6:8000")
        .expect_err("another agent's status is refused");
    let refused = refused.to_string();
    assert!(
        refused.contains("Forbidden")
            && refused.contains("only the status of the GpuAgent named after its own pod")
            && refused.contains("bound to pod agent-a"),
        "{refused}"
    );
    assert_eq!(address("agent-b"), "");
    let refused = write_status(&unbound, "agent-a", "10.6.6.6:8000")
        .expect_err("a token bound to no pod is refused");
    assert!(refused.to_string().contains("bound to no pod"), "{refused}");
    assert_eq!(address("agent-a"), "10.0.0.1:8000");
    // RBAC keeps agents off the specs: no agent assigns itself (or another) a tenant.
    let mut spec = cp.kubectl();
    spec.env("KUBECONFIG", &as_agent_a).args([
        "patch",
        "gpuagent",
        "agent-a",
        "-n",
        n,
        "--type=merge",
        "-p",
        r#"{"spec":{"pool":"other"}}"#,
    ]);
    let refused = checked(spec.output(), "kubectl patch").expect_err("no spec writes");
    assert!(refused.to_string().contains("Forbidden"), "{refused}");
    // Leases: an agent creates and renews its own, and no other: not another agent's, and not
    // the operator's leader-election Lease in the same namespace.
    let lease = |kubeconfig: &std::path::Path, verb: &str, name: &str| {
        let manifest = format!(
            "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: {name}\n  namespace: {n}\nspec:\n  holderIdentity: {name}\n  leaseDurationSeconds: 40\n"
        );
        let mut cmd = cp.kubectl();
        cmd.env("KUBECONFIG", kubeconfig)
            .args([verb, "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().expect("kubectl");
        if let Some(mut stdin) = child.stdin.take() {
            std::io::Write::write_all(&mut stdin, manifest.as_bytes()).expect("stdin");
        }
        checked(child.wait_with_output(), &format!("kubectl {verb} lease"))
    };
    lease(&as_agent_a, "create", "agent-a").expect("its own lease");
    lease(&as_agent_a, "replace", "agent-a").expect("renewing its own lease");
    for name in ["agent-b", "cotenant-operator"] {
        let refused = lease(&as_agent_a, "create", name).expect_err("another lease is refused");
        assert!(
            refused
                .to_string()
                .contains("only the Lease named after its own pod"),
            "{name}: {refused}"
        );
    }
    let refused = lease(&unbound, "create", "agent-a").expect_err("an unbound token is refused");
    assert!(refused.to_string().contains("bound to no pod"), "{refused}");
    helm(cp, &["uninstall", "own", "-n", n]);
}
