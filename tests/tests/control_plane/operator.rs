//! The operator binary as a host process with the chart's ServiceAccount identity (not admin):
//! its RBAC suffices, it serves health and metrics, reports pool references on tenants, and grows
//! a pool with an agent pod when a tenant has nowhere to run.

use cotenant_e2e::cluster::{checked, free_port};
use cotenant_e2e::process::{Lifetime, Process};
use cotenant_e2e::{TestNamespace, http_get, poll, workspace_binary};
use std::process::Command;
use std::time::Duration;

#[test]
#[ignore = "needs the control plane: cargo xtask test"]
fn operator_runs_as_its_service_account_and_reports_pool_references() {
    let ns = TestNamespace::new("operator");
    let cp = ns.control_plane();
    let n = ns.name.as_str();
    let chart = TestNamespace::repo_root().join("charts/cotenant");
    let mut install = cp.helm();
    install.args([
        "install",
        "op",
        &chart.to_string_lossy(),
        "-n",
        n,
        "--set",
        "defaultPool.enabled=false",
    ]);
    checked(install.output(), "helm install").expect("chart installs");

    let kubeconfig = cp
        .service_account_kubeconfig(n, "cotenant-operator")
        .expect("token for the operator's ServiceAccount");
    let addr = format!("127.0.0.1:{}", free_port().expect("port"));
    let mut cmd = Command::new(workspace_binary("cotenant-operator"));
    cmd.args([
        "--listen",
        &addr,
        "--log-level",
        "info,cotenant_operator=debug",
    ])
    .env("KUBECONFIG", &kubeconfig)
    .env("POD_NAMESPACE", n);
    let mut operator = Process::spawn(
        &format!("operator-{n}"),
        cmd,
        &cp.dir.join("logs"),
        Lifetime::WithParent,
    )
    .expect("operator starts");

    let ready = poll("operator /readyz", Duration::from_secs(60), || {
        if !operator.is_running() {
            return Ok(Err(operator.log_tail(20)));
        }
        match http_get(&addr, "/readyz") {
            Ok((200, _)) => Ok(Ok(())),
            other => Err(format!("{other:?}")),
        }
    });
    match ready {
        Ok(Ok(())) => {}
        Ok(Err(log)) => panic!("the operator exited:\n{log}"),
        Err(e) => panic!("{e}\n{}", operator.log_tail(20)),
    }
    assert_eq!(http_get(&addr, "/healthz").expect("healthz").0, 200);

    let pool = format!("pool-{n}");
    let tenant = format!(
        "apiVersion: cotenant.dev/v1alpha1\nkind: ModelTenant\nmetadata:\n  name: t\nspec:\n  model:\n    uri: file:///models/m.onnx\n  slo:\n    latencyMillis: 30\n  pool: {pool}\n"
    );
    let out = cp
        .kubectl_stdin(&["apply", "-n", n, "-f", "-"], &tenant)
        .expect("kubectl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ready_reason = || {
        cp.kubectl_ok(&["get", "mt", "t", "-n", n, "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].reason} {.status.observedGeneration}"])
            .map_err(|e| e.to_string())
    };
    let wait_reason = |want: &str| {
        poll(want, Duration::from_secs(60), || {
            ready_reason().and_then(|r| {
                if r == format!("{want} 1") {
                    Ok(())
                } else {
                    Err(r)
                }
            })
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", operator.log_tail(20)))
    };
    wait_reason("PoolNotFound");
    let message = cp
        .kubectl_ok(&[
            "get",
            "mt",
            "t",
            "-n",
            n,
            "-o",
            "jsonpath={.status.conditions[0].message}",
        ])
        .expect("get");
    assert!(message.contains(&pool), "{message}");

    let pool_yaml = format!(
        "apiVersion: cotenant.dev/v1alpha1\nkind: GpuPool\nmetadata:\n  name: {pool}\nspec:\n  agentNamespace: {n}\n  template:\n    image: cotenant/agent:test\n"
    );
    let out = cp
        .kubectl_stdin(&["apply", "-f", "-"], &pool_yaml)
        .expect("kubectl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // No agent exists yet: the tenant waits while the pool creates one (a pod asking for a GPU,
    // and its GpuAgent), and the tenant gets its Service.
    wait_reason("AwaitingAgents");
    poll(
        "an agent pod and its GpuAgent",
        Duration::from_secs(60),
        || {
            let pods = cp
                .kubectl_ok(&[
                    "get",
                    "pods",
                    "-n",
                    n,
                    "-l",
                    &format!("cotenant.dev/pool={pool}"),
                    "-o",
                    "name",
                ])
                .map_err(|e| e.to_string())?;
            let agents = cp
                .kubectl_ok(&["get", "gpuagents", "-n", n, "-o", "name"])
                .map_err(|e| e.to_string())?;
            if !pods.trim().is_empty() && !agents.trim().is_empty() {
                Ok(())
            } else {
                Err(format!("pods: {pods:?}, agents: {agents:?}"))
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", operator.log_tail(30)));
    let gpus = cp
        .kubectl_ok(&[
            "get",
            "pods",
            "-n",
            n,
            "-l",
            &format!("cotenant.dev/pool={pool}"),
            "-o",
            "jsonpath={.items[0].spec.containers[0].resources.limits.nvidia\\.com/gpu}",
        ])
        .expect("get pods");
    assert_eq!(
        gpus,
        "1",
        "an agent pod asks for its GPU: {}",
        cp.kubectl_ok(&["get", "pods", "-n", n, "-o", "yaml"])
            .unwrap_or_default()
    );
    cp.kubectl_ok(&["get", "service", "t", "-n", n])
        .unwrap_or_else(|e| panic!("the tenant's Service: {e}\n{}", operator.log_tail(30)));

    let (code, metrics) = http_get(&addr, "/metrics").expect("metrics");
    assert_eq!(code, 200);
    assert!(
        metrics.contains(
            "cotenant_operator_reconciliations_total{controller=\"round\",result=\"ok\"}"
        ),
        "{metrics}"
    );
    assert!(
        !metrics.contains("result=\"error\""),
        "reconciles failed (RBAC?):\n{metrics}\n{}",
        operator.log_tail(30)
    );

    operator.stop();
    cp.kubectl_ok(&["delete", "gpupool", &pool])
        .expect("delete pool");
    let mut uninstall = cp.helm();
    uninstall.args(["uninstall", "op", "-n", n]);
    checked(uninstall.output(), "helm uninstall").expect("uninstall");
}
