//! The e2e test's vocabulary: install the chart, run the operator and the agent host, apply and
//! patch tenants, wait for conditions, and time each step.

use cotenant_e2e::agents::AgentHost;
use cotenant_e2e::cluster::{checked, free_port};
use cotenant_e2e::load::{Load, Request};
use cotenant_e2e::process::{Lifetime, Process};
use cotenant_e2e::{ControlPlane, TestNamespace, http_get, poll, workspace_binary};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const RELEASE: &str = "e2e";
/// GPU memory the pool plans with: the three tenants fit on one agent at any knobs they may
/// run, so where they land never decides whether rn's replicas fit, and vgg16 fits on none.
/// The CPU executor's footprints (weights with their packed copies, plus activations): while all
/// three are profiled at batch 4 x 4 instances about 295 MiB; with rn at its largest batch (32)
/// about 275 MiB; vgg16's weights alone 528 MiB.
const GPU_MEMORY_MIB: u32 = 384;

pub struct Models {
    dir: PathBuf,
}

impl Models {
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.onnx"))
    }
    pub fn uri(&self, name: &str) -> String {
        format!("file://{}", self.path(name).display())
    }
    pub fn write_text(&self, file: &str, text: &str) -> PathBuf {
        let path = self.dir.join(file);
        std::fs::write(&path, text).expect("write");
        path
    }
}

pub struct Cluster {
    /// Deletes the namespace when the test ends.
    _namespace: TestNamespace,
    pub cp: &'static ControlPlane,
    pub ns: String,
    pool: String,
    operator: Option<Process>,
    operator_addr: String,
    /// The running operator's identity in leader election (its POD_NAME).
    operator_identity: String,
    operators_started: u32,
    agents: AgentHost,
    timings: std::cell::RefCell<Vec<(String, Duration)>>,
}

impl Cluster {
    /// `helm install` into a fresh namespace, a pool whose agents live there, the operator
    /// running as its ServiceAccount, and the agent host.
    pub fn install(prefix: &str) -> Cluster {
        let test_ns = TestNamespace::new(prefix);
        let cp = test_ns.control_plane();
        let ns = test_ns.name.clone();
        cp.install_chart(RELEASE, &ns).expect("chart installs");
        let pool = format!("pool-{ns}");
        cp.kubectl_apply(&format!(
            "apiVersion: cotenant.dev/v1alpha1\nkind: GpuPool\nmetadata:\n  name: {pool}\nspec:\n  agentNamespace: {ns}\n  minAgents: 0\n  maxAgents: 3\n  scaleDownDelaySeconds: 10\n  gpuMemoryMiB: {GPU_MEMORY_MIB}\n  template:\n    image: cotenant/agent:test\n    serviceAccountName: cotenant-agent\n  agent:\n    drainSeconds: 2\n"
        ))
        .expect("pool");
        // The agents' model volume: where `zoo` writes the models.
        let model_root = cp.dir.join(format!("models-{ns}"));
        std::fs::create_dir_all(&model_root).expect("models dir");
        let agents = AgentHost::start(cp, workspace_binary("cotenant-agent"), 1, model_root);
        let mut c = Cluster {
            _namespace: test_ns,
            cp,
            ns,
            pool,
            operator: None,
            operator_addr: String::new(),
            operator_identity: String::new(),
            operators_started: 0,
            agents,
            timings: Default::default(),
        };
        c.start_operator();
        c
    }

    fn start_operator(&mut self) {
        let kubeconfig = self
            .cp
            .service_account_kubeconfig(&self.ns, "cotenant-operator")
            .expect("operator kubeconfig");
        let token = self
            .cp
            .kubectl_ok(&[
                "create",
                "token",
                "cotenant-operator",
                "-n",
                &self.ns,
                "--audience",
                "cotenant.dev/agent-report",
                "--duration",
                "2h",
            ])
            .expect("report token");
        let token_file = self.cp.dir.join(format!("{}-report.token", self.ns));
        std::fs::write(&token_file, token.trim()).expect("token file");
        self.operator_addr = format!("127.0.0.1:{}", free_port().expect("port"));
        self.operators_started += 1;
        self.operator_identity = format!("operator-{}", self.operators_started);
        let mut cmd = Command::new(workspace_binary("cotenant-operator"));
        cmd.args(["--listen", &self.operator_addr])
            .args(["--log-level", "info,cotenant_operator=debug"])
            .env("KUBECONFIG", &kubeconfig)
            .env("POD_NAMESPACE", &self.ns)
            .env("POD_NAME", &self.operator_identity)
            .env("COTENANT_REPORT_TOKEN_FILE", &token_file)
            .env("COTENANT_AGENT_DEAD_AFTER", "10")
            .env("COTENANT_REPLICA_SCALE_DOWN_DELAY", "5");
        let process = Process::spawn(
            &format!("{}-{}", self.operator_identity, self.ns),
            cmd,
            &self.cp.dir.join("logs"),
            Lifetime::WithParent,
        )
        .expect("operator starts");
        self.operator = Some(process);
        let addr = self.operator_addr.clone();
        poll(
            "operator /readyz",
            Duration::from_secs(60),
            || match http_get(&addr, "/readyz") {
                Ok((200, _)) => Ok(()),
                other => Err(format!("{other:?}")),
            },
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", self.logs()));
    }

    /// Stops the operator and starts a new one (a new leader after the old lease is released).
    pub fn restart_operator(&mut self) {
        if let Some(mut p) = self.operator.take() {
            p.stop();
        }
        self.start_operator();
    }

    /// The running operator holds the leader Lease and has finished `rounds` rounds without an
    /// error since it started: it has acted on everything it sees.
    pub fn operator_leads_after(&self, rounds: u64) -> Result<(), String> {
        let holder = self.jsonpath("lease", "cotenant-operator", "{.spec.holderIdentity}");
        if holder != self.operator_identity {
            return Err(format!(
                "the Lease is held by {holder:?}, not {:?}",
                self.operator_identity
            ));
        }
        let (_, metrics) = http_get(&self.operator_addr, "/metrics")?;
        let counter = |line: &str| -> Option<u64> {
            line.strip_prefix(
                "cotenant_operator_reconciliations_total{controller=\"round\",result=\"ok\"} ",
            )?
            .trim()
            .parse()
            .ok()
        };
        let done = metrics.lines().find_map(counter).unwrap_or(0);
        if done >= rounds {
            Ok(())
        } else {
            Err(format!("{done} of {rounds} rounds done"))
        }
    }

    pub fn logs(&self) -> String {
        // The operator's decisions, without the line each round ends with.
        let operator = self
            .operator
            .as_ref()
            .map(|p| {
                let tail = p.log_tail(400);
                let said: Vec<&str> = tail.lines().filter(|l| !l.contains("round done")).collect();
                said[said.len().saturating_sub(40)..].join("\n")
            })
            .unwrap_or_default();
        format!(
            "--- operator\n{operator}\n--- agents\n{}",
            self.agents.logs(15)
        )
    }

    /// Runs `check` until it passes within `secs`, records how long it took, or fails the test
    /// with the operator's and agents' logs.
    pub fn step(&self, what: &str, secs: u64, check: impl FnMut() -> Result<(), String>) {
        let started = Instant::now();
        match poll(what, Duration::from_secs(secs), check) {
            Ok(()) => {
                let took = started.elapsed();
                eprintln!("e2e: {what}: {took:.1?}");
                self.timings.borrow_mut().push((what.to_string(), took));
            }
            // The tenants first: a long log is cut short where it is shown.
            Err(e) => panic!(
                "{e}\n--- tenants\n{}\n{}",
                self.tenants_table(),
                self.logs()
            ),
        }
    }

    pub fn report_steps(&self) {
        eprintln!("e2e: step timings");
        for (what, took) in self.timings.borrow().iter() {
            eprintln!("  {took:>8.1?}  {what}");
        }
    }

    /// Writes zoo models with the agent binary.
    pub fn zoo(&self, names: &[&str]) -> Models {
        let dir = self.cp.dir.join(format!("models-{}", self.ns));
        std::fs::create_dir_all(&dir).expect("models dir");
        for name in names {
            let out = dir.join(format!("{name}.onnx"));
            let status = Command::new(workspace_binary("cotenant-agent"))
                .args(["zoo", name, "--out"])
                .arg(&out)
                .status()
                .expect("zoo");
            assert!(status.success(), "zoo {name}");
        }
        Models { dir }
    }

    pub fn apply_tenant(&self, name: &str, uri: &str, slo_ms: f64, extra: &str) {
        self.apply_tenant_in_pool(name, uri, slo_ms, extra, &self.pool)
    }

    pub fn apply_tenant_in_pool(
        &self,
        name: &str,
        uri: &str,
        slo_ms: f64,
        extra: &str,
        pool: &str,
    ) {
        self.cp
            .kubectl_apply(&format!(
                "apiVersion: cotenant.dev/v1alpha1\nkind: ModelTenant\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  model:\n    uri: {uri}\n  slo:\n    latencyMillis: {slo_ms}\n  pool: {pool}\n{extra}",
                ns = self.ns
            ))
            .unwrap_or_else(|e| panic!("apply {name}: {e}"));
    }

    pub fn patch_tenant(&self, name: &str, patch: &str) {
        self.cp
            .kubectl_ok(&[
                "patch", "mt", name, "-n", &self.ns, "--type", "merge", "-p", patch,
            ])
            .unwrap_or_else(|e| panic!("patch {name}: {e}"));
    }

    pub fn delete_tenant(&self, name: &str) {
        self.cp
            .kubectl_ok(&["delete", "mt", name, "-n", &self.ns, "--wait=false"])
            .unwrap_or_else(|e| panic!("delete {name}: {e}"));
    }

    /// Creates a CPU-only pool (agents in this namespace, no GPUs) with `agent` lines as its
    /// agent settings; returns its name.
    pub fn apply_cpu_pool(&self, agent: &str) -> String {
        let pool = format!("cpu-{}", self.ns);
        self.cp
            .kubectl_apply(&format!(
                "apiVersion: cotenant.dev/v1alpha1\nkind: GpuPool\nmetadata:\n  name: {pool}\nspec:\n  agentNamespace: {ns}\n  maxAgents: 1\n  scaleDownDelaySeconds: 10\n  template:\n    image: cotenant/agent-cpu:test\n    serviceAccountName: cotenant-agent\n    gpusPerAgent: 0\n{agent}    drainSeconds: 2\n",
                ns = self.ns
            ))
            .unwrap_or_else(|e| panic!("pool {pool}: {e}"));
        pool
    }

    /// The agent pod `name` as JSON.
    pub fn agent_pod(&self, name: &str) -> Value {
        self.json(&["pod", name])
    }

    pub fn add_gpu_node(&self, name: &str) {
        self.cp.add_node(name, 1).expect("add node");
    }

    pub fn jsonpath(&self, kind: &str, name: &str, path: &str) -> String {
        self.cp
            .kubectl_ok(&[
                "get",
                kind,
                name,
                "-n",
                &self.ns,
                "-o",
                &format!("jsonpath={path}"),
            ])
            .unwrap_or_default()
    }

    pub fn expect_jsonpath(
        &self,
        kind: &str,
        name: &str,
        path: &str,
        want: &str,
    ) -> Result<(), String> {
        let got = self.jsonpath(kind, name, path);
        if got == want {
            Ok(())
        } else {
            Err(format!("{kind} {name} {path} = {got:?}, want {want:?}"))
        }
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-n", &self.ns, "-o", "json"]);
        let out = self.cp.kubectl_ok(&all).unwrap_or_default();
        serde_json::from_str(&out).unwrap_or(Value::Null)
    }

    /// Every named tenant has Ready=True.
    pub fn all_ready(&self, names: &[&str]) -> Result<(), String> {
        for name in names {
            self.expect_jsonpath(
                "mt",
                name,
                "{.status.conditions[?(@.type==\"Ready\")].status}",
                "True",
            )?;
        }
        Ok(())
    }

    pub fn expect_reason(&self, name: &str, reason: &str, says: &str) -> Result<(), String> {
        let got = self.jsonpath(
            "mt",
            name,
            "{.status.conditions[?(@.type==\"Ready\")].reason}: {.status.conditions[?(@.type==\"Ready\")].message}",
        );
        if got.starts_with(reason) && got.contains(says) {
            Ok(())
        } else {
            Err(format!(
                "{name}: {got:?}, want {reason} mentioning {says:?}"
            ))
        }
    }

    /// Sends inference with tritonclient to the first address of the tenant's EndpointSlices.
    pub fn infer_through_slice(&self, tenant: &str, file: &Path) {
        self.infer_through_slice_with_token(tenant, file, None)
    }

    /// Creates or replaces Secret `name` with `tokens` (one per line) under the key `token`.
    pub fn set_token_secret(&self, name: &str, tokens: &[&str]) {
        let value = tokens.join("\n");
        self.cp
            .kubectl_apply(&format!(
                "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  namespace: {ns}\nstringData:\n  token: \"{value}\"\n",
                ns = self.ns,
                value = value.replace('\n', "\\n")
            ))
            .unwrap_or_else(|e| panic!("Secret {name}: {e}"));
    }

    pub fn delete_secret(&self, name: &str) {
        self.cp
            .kubectl_ok(&["delete", "secret", name, "-n", &self.ns])
            .unwrap_or_else(|e| panic!("delete Secret {name}: {e}"));
    }

    /// The status code of the tenant's metadata through its EndpointSlice, presenting `token`.
    pub fn metadata_status(&self, tenant: &str, token: Option<&str>) -> Result<u16, String> {
        let addresses = slice_addresses(self.cp, &self.ns, tenant);
        let address = addresses
            .first()
            .ok_or_else(|| format!("{tenant} has no EndpointSlice address"))?;
        let bearer = token.map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> = bearer
            .as_deref()
            .map(|b| vec![("Authorization", b)])
            .unwrap_or_default();
        let path = format!("/v2/models/{}.{tenant}", self.ns);
        cotenant_e2e::http_get_with(address, &path, &headers).map(|(code, _)| code)
    }

    /// tritonclient through the tenant's EndpointSlice, over REST and over gRPC, presenting
    /// `token` when given.
    pub fn infer_through_slice_with_token(&self, tenant: &str, file: &Path, token: Option<&str>) {
        let addresses = slice_addresses(self.cp, &self.ns, tenant);
        let Some(address) = addresses.first() else {
            panic!("{tenant} has no EndpointSlice address");
        };
        let grpc_addresses = slice_addresses_on(self.cp, &self.ns, tenant, "grpc");
        let Some(grpc_address) = grpc_addresses.first() else {
            panic!("{tenant} has no EndpointSlice address for gRPC");
        };
        let python =
            std::env::var_os("COTENANT_PYTHON").expect("COTENANT_PYTHON: run cargo xtask test");
        let script = TestNamespace::repo_root().join("tests/python/tenant_client.py");
        let out = Command::new(python)
            .arg(script)
            .args([
                "--url",
                address,
                "--grpc-url",
                grpc_address,
                "--model",
                &format!("{}.{tenant}", self.ns),
            ])
            .arg("--file")
            .arg(file)
            .args(token.map(|t| ["--token", t]).into_iter().flatten())
            .output()
            .expect("python");
        assert!(
            out.status.success(),
            "tritonclient through {tenant}'s EndpointSlice:\n{}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.logs()
        );
        eprint!("e2e: {}", String::from_utf8_lossy(&out.stdout));
    }

    /// The highest throughput DNNScaler's profile measured for `tenant` at any knob setting (no
    /// knob choice lets one replica serve more); an error until the profile is in the status.
    pub fn profiled_peak_throughput(&self, tenant: &str) -> Result<f64, String> {
        let status = self.json(&["mt", tenant]);
        let points = status["status"]["profile"]["points"].as_array().cloned();
        points
            .unwrap_or_default()
            .iter()
            .filter_map(|p| p["throughputPerSecond"].as_f64())
            .reduce(f64::max)
            .ok_or_else(|| format!("{tenant} has no profile yet: {}", status["status"]))
    }

    /// Open-loop load on `tenant`'s EndpointSlice addresses (re-read as they change), one
    /// image-classifier input per request, as a binary tensor.
    pub fn load_image_model(&self, tenant: &str, rate_per_s: f64) -> Load {
        let values: Vec<f32> = (0..3 * 224 * 224)
            .map(|i| (i % 255) as f32 / 255.0)
            .collect();
        let model = format!("{}.{tenant}", self.ns);
        let request = Request::oip_binary_f32(&model, "input", &[1, 3, 224, 224], &values);
        let (cp, ns, tenant) = (self.cp, self.ns.clone(), tenant.to_string());
        Load::start(rate_per_s, request, move || {
            slice_addresses(cp, &ns, &tenant)
        })
    }

    pub fn events_of(&self, tenant: &str) -> String {
        self.cp
            .kubectl_ok(&[
                "get",
                "events",
                "-n",
                &self.ns,
                "--field-selector",
                &format!("regarding.name={tenant}"),
                "-o",
                "custom-columns=REASON:.reason,NOTE:.note",
            ])
            .or_else(|_| {
                self.cp
                    .kubectl_ok(&["get", "events", "-n", &self.ns, "-o", "wide"])
            })
            .unwrap_or_default()
    }

    /// Agent pods of the pool that are Pending.
    pub fn pending_agent_pods(&self) -> Result<(), String> {
        let pods = self.json(&["pods", "-l", &format!("cotenant.dev/pool={}", self.pool)]);
        let pending = pods["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["status"]["phase"] == "Pending")
            .count();
        if pending > 0 {
            Ok(())
        } else {
            Err("no Pending agent pod".into())
        }
    }

    pub fn pool_agents(&self) -> usize {
        let agents = self.json(&["gpuagents"]);
        agents["items"].as_array().map_or(0, Vec::len)
    }

    /// The names of the main pool's agents.
    pub fn pool_agent_names(&self) -> Vec<String> {
        let agents = self.json(&["gpuagents"]);
        let mut names: Vec<String> = agents["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|a| a["spec"]["pool"] == self.pool.as_str())
            .filter_map(|a| a["metadata"]["name"].as_str().map(str::to_string))
            .collect();
        names.sort();
        names
    }

    /// Merge-patches the main pool.
    pub fn patch_pool(&self, patch: &str) {
        self.cp
            .kubectl_ok(&[
                "patch", "gpupool", &self.pool, "--type", "merge", "-p", patch,
            ])
            .unwrap_or_else(|e| panic!("patch pool: {e}"));
    }

    /// The agent hosting `tenant`'s first replica.
    pub fn agent_of(&self, tenant: &str) -> String {
        self.jsonpath("mt", tenant, "{.status.placements[0].agent}")
    }

    pub fn kill_agent(&self, agent: &str) {
        self.agents.kill(&format!("{}/{agent}", self.ns));
    }

    /// Every tenant's replicas are placed and ready.
    pub fn settled(&self) -> Result<(), String> {
        let tenants = self.json(&["mt"]);
        for t in tenants["items"].as_array().into_iter().flatten() {
            let (want, ready) = (&t["status"]["replicas"], &t["status"]["readyReplicas"]);
            if want != ready {
                return Err(format!(
                    "{}: {ready} of {want} ready",
                    t["metadata"]["name"]
                ));
            }
        }
        Ok(())
    }

    /// Tenant replicas by agent, for agents that hold any. Knobs are left out: they follow traffic
    /// (DNNScaler keeps stepping), while a replica's place must survive an operator restart.
    /// Each agent's tenants with their knobs (`name at BxM`).
    pub fn assignments(&self) -> BTreeMap<String, Vec<String>> {
        let agents = self.json(&["gpuagents"]);
        agents["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| {
                let tenants = a["spec"]["assignments"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|x| {
                        let knobs = &x["knobs"];
                        format!(
                            "{} at {}x{}",
                            x["tenant"]["name"].as_str().unwrap_or_default(),
                            knobs["batchSize"],
                            knobs["instances"]
                        )
                    })
                    .collect();
                (
                    a["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    tenants,
                )
            })
            .filter(|(_, tenants): &(String, Vec<String>)| !tenants.is_empty())
            .collect()
    }

    pub fn cleaned_up(&self, tenant: &str) -> Result<(), String> {
        let services = self.json(&["services", "-l", &format!("cotenant.dev/tenant={tenant}")]);
        let slices = self.json(&[
            "endpointslices",
            "-l",
            &format!("cotenant.dev/tenant={tenant}"),
        ]);
        let left = services["items"].as_array().map_or(0, Vec::len)
            + slices["items"].as_array().map_or(0, Vec::len);
        let assigned = self.assignments().values().flatten().any(|x| x == tenant);
        let exists = !self.jsonpath("mt", tenant, "{.metadata.name}").is_empty();
        if left == 0 && !assigned && !exists {
            Ok(())
        } else {
            Err(format!(
                "{left} routes left, assigned: {assigned}, tenant exists: {exists}"
            ))
        }
    }

    /// `kubectl delete mt --all`, without waiting: the operator's finalizer does the rest.
    pub fn delete_all_tenants(&self) {
        self.cp
            .kubectl_ok(&["delete", "mt", "--all", "-n", &self.ns, "--wait=false"])
            .unwrap_or_else(|e| panic!("delete tenants: {e}"));
    }

    /// No tenant, tenant Service, EndpointSlice or assignment is left in the namespace.
    pub fn no_tenant_left(&self) -> Result<(), String> {
        let count = |args: &[&str]| self.json(args)["items"].as_array().map_or(0, Vec::len);
        let tenants = count(&["mt"]);
        let services = count(&["services", "-l", "cotenant.dev/tenant"]);
        let slices = count(&["endpointslices", "-l", "cotenant.dev/tenant"]);
        let assigned: usize = self.assignments().values().map(Vec::len).sum();
        match (tenants, services, slices, assigned) {
            (0, 0, 0, 0) => Ok(()),
            left => Err(format!(
                "(tenants, services, slices, assignments) left: {left:?}\n{}",
                self.tenants_table()
            )),
        }
    }

    /// Stops the operator (the chart's Deployment would go with the release) and uninstalls.
    pub fn uninstall_chart(&mut self) {
        if let Some(mut p) = self.operator.take() {
            p.stop();
        }
        let mut uninstall = self.cp.helm();
        uninstall.args(["uninstall", RELEASE, "-n", &self.ns]);
        checked(uninstall.output(), "helm uninstall").expect("the chart uninstalls");
    }

    /// Deletes the main pool and `others`.
    pub fn delete_pools(&self, others: &[&str]) {
        for pool in std::iter::once(self.pool.as_str()).chain(others.iter().copied()) {
            self.cp
                .kubectl_ok(&["delete", "gpupool", pool, "--wait=false"])
                .unwrap_or_else(|e| panic!("delete pool {pool}: {e}"));
        }
    }

    /// No agent pod or GpuAgent is left in the namespace.
    pub fn no_agent_left(&self) -> Result<(), String> {
        let pods = self.json(&["pods", "-l", "app.kubernetes.io/name=cotenant-agent"]);
        let agents = self.json(&["gpuagents"]);
        let count = |v: &Value| v["items"].as_array().map_or(0, Vec::len);
        match (count(&pods), count(&agents)) {
            (0, 0) => Ok(()),
            left => Err(format!("(agent pods, GpuAgents) left: {left:?}")),
        }
    }

    /// The tenants, agents and pods, then every tenant's conditions with their messages.
    fn tenants_table(&self) -> String {
        let table = self
            .cp
            .kubectl_ok(&["get", "mt,gpuagents,pods", "-n", &self.ns, "-o", "wide"])
            .unwrap_or_default();
        let conditions = self
            .cp
            .kubectl_ok(&[
                "get",
                "mt",
                "-n",
                &self.ns,
                "-o",
                r#"jsonpath={range .items[*]}{.metadata.name}{"\n"}{range .status.conditions[*]}{"  "}{.type}={.status} {.reason}: {.message}{"\n"}{end}{end}"#,
            ])
            .unwrap_or_default();
        // The operator's events say why: the profile behind each approach, each knob and
        // replica change with the arrival rate it saw.
        let events = self
            .cp
            .kubectl_ok(&[
                "get",
                "events",
                "-n",
                &self.ns,
                "--sort-by=.lastTimestamp",
                "-o",
                "custom-columns=LAST:.lastTimestamp,OBJECT:.involvedObject.name,REASON:.reason,MESSAGE:.message",
            ])
            .unwrap_or_default();
        format!("{table}\n{conditions}\n--- events\n{events}")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut p) = self.operator.take() {
            p.stop();
        }
        let _ = self
            .cp
            .kubectl_ok(&["delete", "gpupool", &self.pool, "--wait=false"]);
        let mut uninstall = self.cp.helm();
        uninstall.args(["uninstall", RELEASE, "-n", &self.ns]);
        let _ = uninstall.output();
    }
}

/// A URL on loopback that answers every request with 404.
/// `host:port` of every ready endpoint in `tenant`'s EndpointSlices.
/// `host:port` of every ready endpoint of the tenant's EndpointSlices, for its REST port.
fn slice_addresses(cp: &ControlPlane, ns: &str, tenant: &str) -> Vec<String> {
    slice_addresses_on(cp, ns, tenant, "http")
}

/// `host:port` of every ready endpoint of the tenant's EndpointSlices, for the port named `port`.
fn slice_addresses_on(cp: &ControlPlane, ns: &str, tenant: &str, port: &str) -> Vec<String> {
    let selector = format!("kubernetes.io/service-name={tenant}");
    let out = cp
        .kubectl_ok(&[
            "get",
            "endpointslices",
            "-n",
            ns,
            "-l",
            &selector,
            "-o",
            "json",
        ])
        .unwrap_or_default();
    let slices: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
    let mut addresses = Vec::new();
    for slice in slices["items"].as_array().into_iter().flatten() {
        let ports = slice["ports"].as_array().into_iter().flatten();
        let Some(port) = ports
            .filter(|p| p["name"] == port)
            .find_map(|p| p["port"].as_u64())
        else {
            continue;
        };
        for endpoint in slice["endpoints"].as_array().into_iter().flatten() {
            if endpoint["conditions"]["ready"] == false {
                continue;
            }
            let hosts = endpoint["addresses"].as_array().into_iter().flatten();
            addresses.extend(
                hosts
                    .filter_map(Value::as_str)
                    .map(|h| format!("{h}:{port}")),
            );
        }
    }
    addresses
}

/// A URL that answers 404, on an address agents may download from (not loopback).
pub fn serve_404() -> String {
    let listener = std::net::TcpListener::bind((cotenant_e2e::agents::host_ip(), 0)).expect("bind");
    let url = format!(
        "http://{}/models/missing.onnx",
        listener.local_addr().expect("addr")
    );
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request);
            let _ = stream.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot found");
        }
    });
    url
}

// Shared with the control-plane test, which uses the rendered objects as well as the queries.
#[allow(dead_code)]
#[path = "../common/monitoring.rs"]
mod monitoring;

impl Cluster {
    /// Every metric the chart's dashboard and alerts query is exported by the running operator
    /// or by an agent (its admin `/metrics`, which needs no token), by the `# TYPE` lines of
    /// their `/metrics` pages; the error names each one missing and where it is queried.
    pub fn monitoring_queries_exported(&self) -> Result<(), String> {
        let queried = monitoring::render_monitoring(self.cp.helm(), &self.ns)?.queried_metrics()?;
        let (code, operator) = http_get(&self.operator_addr, "/metrics")?;
        if code != 200 {
            return Err(format!("operator /metrics: {code}"));
        }
        let agents = self.json(&["gpuagents"]);
        let admin = agents["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|a| a["status"]["adminAddress"].as_str())
            .ok_or("no agent reports an admin address")?;
        let (code, agent) = http_get(admin, "/metrics")?;
        if code != 200 {
            return Err(format!("agent {admin} /metrics: {code}"));
        }
        let mut exported = monitoring::exported(&operator);
        exported.extend(monitoring::exported(&agent));
        let missing: Vec<String> = queried
            .iter()
            .filter(|(name, _)| !exported.contains(*name))
            .map(|(name, places)| format!("{name} (in {places:?})"))
            .collect();
        if missing.is_empty() {
            eprintln!(
                "e2e: the dashboard and alerts query {} metrics, all exported",
                queried.len()
            );
            Ok(())
        } else {
            Err(format!(
                "queried but exported by neither the operator nor agent {admin}:\n{}",
                missing.join("\n")
            ))
        }
    }
}

impl Cluster {
    /// The operator's `cotenant_operator_tenant_ready` is `ready` for each tenant named there,
    /// absent for each of `deleted`, and its pool gauges cover the test's pool.
    pub fn operator_publishes(&self, ready: &[(&str, u8)], deleted: &[&str]) -> Result<(), String> {
        let (_, metrics) = http_get(&self.operator_addr, "/metrics")?;
        let ns = &self.ns;
        let mut want: Vec<String> = ready
            .iter()
            .map(|(t, v)| {
                format!(r#"cotenant_operator_tenant_ready{{namespace="{ns}",tenant="{t}"}} {v}"#)
            })
            .collect();
        want.push(format!(
            r#"cotenant_operator_pool_max_agents{{pool="{}"}} 3"#,
            self.pool
        ));
        for line in want {
            if !metrics.lines().any(|l| l == line) {
                return Err(format!("no {line} in the operator's /metrics:\n{metrics}"));
            }
        }
        let total = format!(
            r#"cotenant_operator_pool_agents{{pool="{}",state="total"}} "#,
            self.pool
        );
        if !metrics.lines().any(|l| l.starts_with(&total)) {
            return Err(format!("no {total} in the operator's /metrics"));
        }
        for t in deleted {
            let label = format!(r#"namespace="{ns}",tenant="{t}""#);
            if let Some(line) = metrics.lines().find(|l| l.contains(&label)) {
                return Err(format!("deleted tenant {t} still published: {line}"));
            }
        }
        Ok(())
    }
}
