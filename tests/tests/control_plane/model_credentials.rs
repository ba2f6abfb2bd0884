//! A ModelTenant whose model is in an S3-compatible bucket (moto), read with the credentials of a
//! Secret in the tenant's namespace: the operator (as its ServiceAccount) copies only the keys
//! agents use into the agents' namespace and names the copy in the assignment; the agent (as
//! its ServiceAccount, which may read Secrets only there) loads the model. A tenant naming a
//! missing Secret fails with a reason naming it while the other serves, and a removed tenant's
//! copy goes.

use cotenant_e2e::agents::{AgentHost, host_ip};
use cotenant_e2e::cluster::free_port;
use cotenant_e2e::process::{Lifetime, Process};
use cotenant_e2e::s3::S3Server;
use cotenant_e2e::{ControlPlane, TestNamespace, http_get, poll, workspace_binary};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const RELEASE: &str = "modelcreds";

/// Uninstalls the release and removes the tenants' namespace when the test ends.
struct Cleanup<'a> {
    cp: &'a ControlPlane,
    namespace: String,
    team: String,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let _ = self
            .cp
            .kubectl_ok(&["delete", "namespace", &self.team, "--wait=false"]);
        let mut uninstall = self.cp.helm();
        uninstall.args(["uninstall", RELEASE, "-n", &self.namespace]);
        let _ = uninstall.output();
    }
}

fn python() -> PathBuf {
    std::env::var_os("COTENANT_PYTHON")
        .map(PathBuf::from)
        .expect("COTENANT_PYTHON must name the reference venv's python: run cargo xtask test")
}

fn json(cp: &ControlPlane, args: &[&str]) -> Result<Value, String> {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    let out = cp.kubectl_ok(&all).map_err(|e| e.to_string())?;
    serde_json::from_str(&out).map_err(|e| e.to_string())
}

/// The condition `kind` of tenant `name` as `status: reason: message`.
fn condition(cp: &ControlPlane, team: &str, name: &str, kind: &str) -> String {
    cp.kubectl_ok(&[
        "get",
        "mt",
        name,
        "-n",
        team,
        "-o",
        &format!(
            "jsonpath={{.status.conditions[?(@.type==\"{kind}\")].status}}: {{.status.conditions[?(@.type==\"{kind}\")].reason}}: {{.status.conditions[?(@.type==\"{kind}\")].message}}"
        ),
    ])
    .unwrap_or_default()
}

/// The model source of tenant `name`'s assignment, on whichever agent holds it.
fn assigned_model(cp: &ControlPlane, n: &str, name: &str) -> Result<Value, String> {
    let agents = json(cp, &["get", "gpuagents", "-n", n])?;
    agents["items"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|a| a["spec"]["assignments"].as_array().into_iter().flatten())
        .find(|a| a["tenant"]["name"] == name)
        .map(|a| a["model"].clone())
        .ok_or_else(|| format!("{name} is not assigned"))
}

#[test]
#[ignore = "needs the control plane and COTENANT_PYTHON (with moto): cargo xtask test"]
fn a_tenants_model_credentials_are_copied_to_the_agents_and_used() {
    let ns = TestNamespace::new("modelcreds");
    let cp = ns.control_plane();
    let n = ns.name.as_str();
    let team = format!("{n}-team");
    let _cleanup = Cleanup {
        cp,
        namespace: n.to_string(),
        team: team.clone(),
    };
    cp.install_chart(RELEASE, n).expect("chart installs");
    cp.kubectl_ok(&["create", "namespace", &team])
        .expect("the tenants' namespace");
    // A GPU for this test's agent, whatever other tests hold.
    cp.add_node(&format!("gpu-{n}"), 1).expect("a GPU node");

    // The model in a bucket, on an address agents may download from (not loopback).
    let dir = cp.dir.join(format!("modelcreds-{n}"));
    std::fs::create_dir_all(dir.join("models")).expect("scratch");
    let agent = workspace_binary("cotenant-agent");
    let model = dir.join("models/squeezenet.onnx");
    let status = Command::new(&agent)
        .args(["zoo", "squeezenet", "--out"])
        .arg(&model)
        .status()
        .expect("zoo");
    assert!(status.success());
    let python = python();
    let s3 = S3Server::start_on(&python, &dir, &host_ip(), "models", &[("sq.onnx", &model)])
        .expect("moto_server");
    let digest = {
        let out = Command::new(&python)
            .args([
                "-c",
                "import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest())",
            ])
            .arg(&model)
            .output()
            .expect("python");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };

    // The operator as its ServiceAccount, and agents for this namespace's agent pods.
    let kubeconfig = cp
        .service_account_kubeconfig(n, "cotenant-operator")
        .expect("operator token");
    // The token the operator reads agents' reports with, as the chart's Deployment projects it.
    let token = cp
        .kubectl_ok(&[
            "create",
            "token",
            "cotenant-operator",
            "-n",
            n,
            "--audience",
            "cotenant.dev/agent-report",
            "--duration",
            "1h",
        ])
        .expect("report token");
    let token_file = dir.join("report.token");
    std::fs::write(&token_file, token.trim()).expect("token file");
    let addr = format!("127.0.0.1:{}", free_port().expect("port"));
    let mut cmd = Command::new(workspace_binary("cotenant-operator"));
    cmd.args(["--listen", &addr])
        .args(["--log-level", "info,cotenant_operator=debug"])
        .env("COTENANT_REPORT_TOKEN_FILE", &token_file)
        .env("KUBECONFIG", &kubeconfig)
        .env("POD_NAMESPACE", n)
        .env("POD_NAME", format!("operator-{n}"));
    let mut operator = Process::spawn(
        &format!("operator-{n}"),
        cmd,
        &cp.dir.join("logs"),
        Lifetime::WithParent,
    )
    .expect("operator starts");
    poll("operator /readyz", Duration::from_secs(60), || {
        if !operator.is_running() {
            return Ok(());
        }
        match http_get(&addr, "/readyz") {
            Ok((200, _)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .expect("operator ready");
    assert!(operator.is_running(), "{}", operator.log_tail(20));
    let root = dir.join("models");
    let agents = AgentHost::start_in(cp, agent, 2, root, Some(n.to_string()));

    // The tenant's Secret: the store's keys, and one the agents have no business reading.
    let secret = format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: s3-reader\n  namespace: {team}\nstringData:\n  AWS_ACCESS_KEY_ID: {}\n  AWS_SECRET_ACCESS_KEY: {}\n  AWS_ENDPOINT_URL: {}\n  AWS_ALLOW_HTTP: \"true\"\n  ssh-privatekey: not-for-agents\n",
        s3.access_key_id, s3.secret_access_key, s3.endpoint
    );
    cp.kubectl_apply(&secret).expect("the tenant's Secret");
    let pool = format!("pool-{n}");
    let tenant = |name: &str, secret: &str| {
        format!(
            "apiVersion: cotenant.dev/v1alpha1\nkind: ModelTenant\nmetadata:\n  name: {name}\n  namespace: {team}\nspec:\n  model:\n    uri: s3://models/sq.onnx\n    sha256: {digest}\n    credentialsSecret:\n      name: {secret}\n  slo:\n    latencyMillis: 5000\n  scaling:\n    maxReplicas: 1\n  pool: {pool}\n"
        )
    };
    cp.kubectl_apply(&tenant("sq", "s3-reader"))
        .expect("the tenant");
    cp.kubectl_apply(&tenant("nokey", "absent"))
        .expect("a tenant naming a missing Secret");
    cp.kubectl_apply(&format!(
        "apiVersion: cotenant.dev/v1alpha1\nkind: GpuPool\nmetadata:\n  name: {pool}\nspec:\n  agentNamespace: {n}\n  maxAgents: 1\n  template:\n    image: cotenant/agent:test\n    serviceAccountName: cotenant-agent\n"
    ))
    .expect("the pool");
    let logs = || format!("{}\n{}", operator.log_tail(30), agents.logs(30));

    poll("sq's model loaded", Duration::from_secs(300), || {
        let loaded = condition(cp, &team, "sq", "ModelLoaded");
        if loaded.starts_with("True") {
            Ok(())
        } else {
            Err(loaded)
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", logs()));

    // The assignment names the copy, in the agents' namespace, holding only the store's keys.
    let assigned = assigned_model(cp, n, "sq").expect("assigned");
    let copy_name = assigned["credentialsSecret"]["name"]
        .as_str()
        .expect("the assignment names a Secret")
        .to_string();
    assert_ne!(copy_name, "s3-reader");
    let copy = json(cp, &["get", "secret", &copy_name, "-n", n]).expect("the copy");
    let mut keys: Vec<&str> = copy["data"]
        .as_object()
        .map(|d| d.keys().map(String::as_str).collect())
        .unwrap_or_default();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "AWS_ACCESS_KEY_ID",
            "AWS_ALLOW_HTTP",
            "AWS_ENDPOINT_URL",
            "AWS_SECRET_ACCESS_KEY"
        ],
        "{copy}"
    );
    assert_eq!(
        copy["metadata"]["annotations"]["cotenant.dev/source-secret"],
        format!("{team}/s3-reader").as_str()
    );
    assert_eq!(copy["metadata"]["ownerReferences"][0]["kind"], "GpuPool");

    // The tenant naming a missing Secret fails with its name; sq serves on.
    poll(
        "nokey fails naming its Secret",
        Duration::from_secs(120),
        || {
            let loaded = condition(cp, &team, "nokey", "ModelLoaded");
            if loaded.starts_with("False")
                && loaded.contains(&format!("Secret {team}/absent does not exist"))
            {
                Ok(())
            } else {
                Err(loaded)
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    assert!(condition(cp, &team, "sq", "ModelLoaded").starts_with("True"));

    // A removed tenant's copy goes.
    cp.kubectl_ok(&["delete", "mt", "sq", "-n", &team, "--wait=false"])
        .expect("delete sq");
    poll("sq's copy deleted", Duration::from_secs(60), || {
        match cp.kubectl_ok(&["get", "secret", &copy_name, "-n", n, "-o", "name"]) {
            Ok(found) => Err(format!("still there: {found}")),
            Err(_) => Ok(()),
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", logs()));

    drop(agents);
    operator.stop();
    let _ = cp.kubectl_ok(&["delete", "gpupool", &pool]);
}
