//! The operator binary as a host process with the chart's ServiceAccount identity (not admin):
//! its RBAC suffices, it serves health and metrics, reports pool references on tenants, grows a
//! pool with an agent pod (admitted in a namespace that enforces the `restricted` Pod Security
//! Standard) when a tenant has nowhere to run, leaves a Service it does not own alone, and
//! follows the leader Lease by its own clock.

use cotenant_e2e::cluster::{checked, free_port};
use cotenant_e2e::process::{Lifetime, Process};
use cotenant_e2e::{ControlPlane, TestNamespace, http_get, poll, workspace_binary};
use serde_json::Value;
use std::process::Command;
use std::time::Duration;

/// The operator's `cotenant_operator_leader` gauge.
fn leader_gauge(addr: &str) -> Result<String, String> {
    let (_, metrics) = http_get(addr, "/metrics")?;
    metrics
        .lines()
        .find(|l| l.starts_with("cotenant_operator_leader "))
        .map(|l| {
            l.trim_start_matches("cotenant_operator_leader ")
                .to_string()
        })
        .ok_or_else(|| format!("no leader gauge in:\n{metrics}"))
}

/// The leader Lease as JSON.
fn lease(cp: &ControlPlane, n: &str) -> Result<Value, String> {
    let json = cp
        .kubectl_ok(&["get", "lease", "cotenant-operator", "-n", n, "-o", "json"])
        .map_err(|e| e.to_string())?;
    serde_json::from_str(&json).map_err(|e| e.to_string())
}

/// Writes the Lease as `holder`, renewal number `renewal`, with a renewTime long past (a holder
/// whose clock is far behind, but moves), as a compare-and-swap on `lease`'s resourceVersion: an
/// error when someone else wrote it since.
fn renew_as(
    cp: &ControlPlane,
    lease: &mut Value,
    holder: &str,
    renewal: u32,
) -> Result<(), String> {
    lease["spec"]["holderIdentity"] = holder.into();
    lease["spec"]["renewTime"] = format!("2000-01-01T00:{:02}:00.000000Z", renewal % 60).into();
    lease["spec"]["leaseDurationSeconds"] = 15.into();
    let out = cp
        .kubectl_stdin(&["replace", "-f", "-", "-o", "json"], &lease.to_string())
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    *lease = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    Ok(())
}

#[test]
#[ignore = "needs the control plane: cargo xtask test"]
fn operator_runs_as_its_service_account_and_reports_pool_references() {
    let ns = TestNamespace::new("operator");
    let cp = ns.control_plane();
    let n = ns.name.as_str();
    cp.install_chart("op", n).expect("chart installs");

    let kubeconfig = cp
        .service_account_kubeconfig(n, "cotenant-operator")
        .expect("token for the operator's ServiceAccount");
    let addr = format!("127.0.0.1:{}", free_port().expect("port"));
    let identity = format!("operator-{n}");
    let mut cmd = Command::new(workspace_binary("cotenant-operator"));
    cmd.args([
        "--listen",
        &addr,
        "--log-level",
        "info,cotenant_operator=debug",
    ])
    .env("KUBECONFIG", &kubeconfig)
    .env("POD_NAMESPACE", n)
    .env("POD_NAME", &identity);
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
        "apiVersion: cotenant.dev/v1alpha1\nkind: ModelTenant\nmetadata:\n  name: t\nspec:\n  model:\n    uri: https://models.example/m.onnx\n    sha256: \"{}\"\n  slo:\n    latencyMillis: 30\n  pool: {pool}\n",
        "ab".repeat(32)
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

    // Agents must meet the restricted Pod Security Standard.
    cp.kubectl_ok(&[
        "label",
        "namespace",
        n,
        "pod-security.kubernetes.io/enforce=restricted",
    ])
    .expect("label the namespace");
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
    let memory = cp
        .kubectl_ok(&[
            "get",
            "pods",
            "-n",
            n,
            "-l",
            &format!("cotenant.dev/pool={pool}"),
            "-o",
            "jsonpath={.items[0].spec.containers[0].resources.limits.memory}",
        ])
        .expect("get pods");
    assert_eq!(memory, "16Gi", "the default memory limit of an agent");
    // The pod was admitted under `restricted`, and kwok runs it.
    poll("the agent pod Running", Duration::from_secs(60), || {
        let phase = cp
            .kubectl_ok(&[
                "get",
                "pods",
                "-n",
                n,
                "-l",
                &format!("cotenant.dev/pool={pool}"),
                "-o",
                "jsonpath={.items[0].status.phase}",
            ])
            .map_err(|e| e.to_string())?;
        if phase == "Running" {
            Ok(())
        } else {
            Err(phase)
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", operator.log_tail(30)));

    // A Service that is not the tenant's own is left alone: the tenant says so instead.
    cp.kubectl_ok(&[
        "create",
        "service",
        "clusterip",
        "taken",
        "--tcp=80:8080",
        "-n",
        n,
    ])
    .expect("someone else's Service");
    let taken = format!(
        "apiVersion: cotenant.dev/v1alpha1\nkind: ModelTenant\nmetadata:\n  name: taken\nspec:\n  model:\n    uri: https://models.example/m.onnx\n    sha256: \"{}\"\n  slo:\n    latencyMillis: 30\n  pool: {pool}\n",
        "ab".repeat(32)
    );
    cp.kubectl_stdin(&["apply", "-n", n, "-f", "-"], &taken)
        .expect("kubectl");
    poll("taken: ServiceConflict", Duration::from_secs(60), || {
        let reason = cp
            .kubectl_ok(&[
                "get",
                "mt",
                "taken",
                "-n",
                n,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].reason}: {.status.conditions[?(@.type==\"Ready\")].message}",
            ])
            .map_err(|e| e.to_string())?;
        if reason.starts_with("ServiceConflict") && reason.contains(&format!("{n}/taken")) {
            Ok(())
        } else {
            Err(reason)
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", operator.log_tail(30)));
    let service: Value = serde_json::from_str(
        &cp.kubectl_ok(&["get", "service", "taken", "-n", n, "-o", "json"])
            .expect("the Service"),
    )
    .expect("json");
    assert!(
        service["metadata"]["ownerReferences"].is_null()
            && service["metadata"]["labels"]["cotenant.dev/tenant"].is_null()
            && service["spec"]["ports"][0]["port"] == 80,
        "the operator changed someone else's Service: {service}"
    );
    let slices = cp
        .kubectl_ok(&[
            "get",
            "endpointslices",
            "-n",
            n,
            "-l",
            "kubernetes.io/service-name=taken,endpointslice.kubernetes.io/managed-by=cotenant.dev",
            "-o",
            "name",
        ])
        .expect("slices");
    assert!(
        slices.trim().is_empty(),
        "no endpoint of the tenant joins that Service: {slices}"
    );
    poll("a ServiceConflict Event", Duration::from_secs(30), || {
        let events = cp
            .kubectl_ok(&[
                "get",
                "events",
                "-n",
                n,
                "--field-selector",
                "involvedObject.name=taken,reason=ServiceConflict",
                "-o",
                "name",
            ])
            .map_err(|e| e.to_string())?;
        if events.trim().is_empty() {
            Err("none".into())
        } else {
            Ok(())
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", operator.log_tail(30)));

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

    // Leadership by the operator's own clock. It leads now.
    assert_eq!(leader_gauge(&addr).as_deref(), Ok("1"));
    let mut current = lease(cp, n).expect("the Lease");
    assert_eq!(current["spec"]["holderIdentity"], identity.as_str());
    // Someone else takes the lease and keeps renewing it, with a clock far behind: the
    // operator stops acting, and does not take the lease back while its record keeps changing,
    // whatever its renewTime says (a take-over would fail the intruder's next compare-and-swap).
    // The leader renews every few seconds, so a take-over that meets a renewal (409) is tried
    // again on the record that renewal wrote.
    let mut taken = renew_as(cp, &mut current, "intruder", 0);
    for _ in 0..5 {
        if taken.is_ok() {
            break;
        }
        current = lease(cp, n).expect("the Lease");
        taken = renew_as(cp, &mut current, "intruder", 0);
    }
    taken.expect("take the lease");
    poll(
        "the operator stands by",
        Duration::from_secs(15),
        || match leader_gauge(&addr)? {
            g if g == "0" => Ok(()),
            g => Err(format!("leader gauge {g}")),
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", operator.log_tail(30)));
    // The intruder renews every 2 s for longer than a lease duration (15 s).
    for renewal in 1..=10 {
        std::thread::sleep(Duration::from_secs(2));
        renew_as(cp, &mut current, "intruder", renewal).unwrap_or_else(|e| {
            panic!(
                "the operator took a lease its holder kept renewing: {e}\n{}",
                operator.log_tail(30)
            )
        });
        assert_eq!(leader_gauge(&addr).as_deref(), Ok("0"));
    }
    // The intruder lets go: the operator leads again at once.
    renew_as(cp, &mut current, "", 11).expect("release the lease");
    poll("the operator leads again", Duration::from_secs(15), || {
        let holder = lease(cp, n)?["spec"]["holderIdentity"].clone();
        match leader_gauge(&addr)? {
            g if g == "1" && holder == identity.as_str() => Ok(()),
            g => Err(format!("leader gauge {g}, holder {holder}")),
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", operator.log_tail(30)));

    operator.stop();
    // It gave the lease up on its way out.
    let holder = lease(cp, n).expect("the Lease")["spec"]["holderIdentity"].clone();
    assert!(holder.is_null() || holder == "", "{holder}");
    cp.kubectl_ok(&["delete", "gpupool", &pool])
        .expect("delete pool");
    let mut uninstall = cp.helm();
    uninstall.args(["uninstall", "op", "-n", n]);
    checked(uninstall.output(), "helm uninstall").expect("uninstall");
}
