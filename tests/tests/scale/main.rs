//! The operator at scale on the real control plane. N ModelTenants go to one pool that grows to M
//! agents; the agents' pods are kwok pods, and `cotenant-fleet` plays every agent towards the
//! operator (reports, statuses, Leases). The operator runs as a host process under its chart
//! ServiceAccount, and the API server's audit log counts what it asks, by verb and resource.
//!
//! It prints a table: time until every tenant is placed and Ready, the operator's requests in
//! steady state and during changes, its RSS and CPU, the time to react to tightened SLOs and to
//! re-place the tenants of silent agents. It asserts the write pattern only: in steady state the
//! operator writes nothing but its leader-election Lease, and lists nothing (it reads from
//! watches). No timing is asserted.
//!
//! Size: `COTENANT_SCALE_TENANTS` (default 120) and `COTENANT_SCALE_AGENTS` (default 12);
//! `COTENANT_SCALE_STEADY_S` (default 30) is the steady-state window. `cargo xtask bench scale`
//! runs it at 2,000 and 200.

use cotenant_e2e::audit::{self, Requests, WRITES};
use cotenant_e2e::cluster::{ControlPlane, free_port};
use cotenant_e2e::http::http_post;
use cotenant_e2e::process::Process;
use cotenant_e2e::{Lifetime, TestNamespace, http_get, poll, workspace_binary};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

/// GPUs per fake node.
const GPUS_PER_NODE: u32 = 8;
/// The operator's own writes that are not about tenants: renewing its leader-election Lease.
const LEADER_LEASE: &str = "leases";
/// The SLO of every tenth tenant becomes this share of its observed latency.
const TIGHTER: f64 = 0.7;
/// How long the operator writes nothing before the steady window starts: longer than its dwell
/// time (30 s), after which a tenant's status summary taken while its knobs or replicas were
/// new is replaced once.
const QUIET: Duration = Duration::from_secs(40);
/// Tenants per `kubectl apply`.
const APPLY_CHUNK: usize = 250;

struct Size {
    tenants: usize,
    agents: usize,
    steady: Duration,
}

impl Size {
    fn from_env() -> Size {
        let var = |name: &str, default: usize| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(default)
        };
        Size {
            tenants: var("COTENANT_SCALE_TENANTS", 120),
            agents: var("COTENANT_SCALE_AGENTS", 12).max(1),
            steady: Duration::from_secs(var("COTENANT_SCALE_STEADY_S", 30) as u64),
        }
    }

    /// The pool's cap: 10% above the agents the tenants' memory fills (see the pool below).
    fn max_agents(&self) -> usize {
        self.agents + self.agents.div_ceil(10)
    }
}

/// CPU seconds and resident memory of a process, from /proc.
struct Usage {
    cpu_s: f64,
    rss_mib: f64,
    peak_rss_mib: f64,
}

fn usage(pid: u32) -> Usage {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at ") ".
    let fields: Vec<&str> = stat
        .rsplit_once(") ")
        .map_or(Vec::new(), |(_, rest)| rest.split(' ').collect());
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15, i.e. 11 and 12 after the name; 100 ticks a second.
    let cpu_s = (ticks(11) + ticks(12)) / 100.0;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Usage {
        cpu_s,
        rss_mib: kib("VmRSS:") / 1024.0,
        peak_rss_mib: kib("VmHWM:") / 1024.0,
    }
}

fn tenant_yaml(i: usize, pool: &str, slo_ms: f64) -> String {
    format!(
        "apiVersion: cotenant.dev/v1alpha1\nkind: ModelTenant\nmetadata:\n  name: t-{i:05}\nspec:\n  model:\n    uri: https://models.example/m-{i:05}.onnx\n    sha256: \"{}\"\n  slo:\n    latencyMillis: {slo_ms}\n  pool: {pool}\n",
        "ab".repeat(32)
    )
}

fn apply(cp: &ControlPlane, n: &str, docs: &[String]) {
    for chunk in docs.chunks(APPLY_CHUNK) {
        // An API server short of CPU answers a large apply with a timeout; applying again is
        // safe, and what was created stays.
        let mut tries = 0;
        let out = loop {
            let out = cp
                .kubectl_stdin(&["apply", "-n", n, "-f", "-"], &chunk.join("---\n"))
                .expect("kubectl");
            tries += 1;
            let timed_out = String::from_utf8_lossy(&out.stderr).contains("Timeout");
            if out.status.success() || !timed_out || tries == 3 {
                break out;
            }
        };
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Every tenant of namespace `n` by name.
fn tenants(cp: &ControlPlane, n: &str) -> BTreeMap<String, Value> {
    let json = cp
        .kubectl_ok(&["get", "mt", "-n", n, "-o", "json"])
        .unwrap_or_default();
    let list: Value = serde_json::from_str(&json).unwrap_or(Value::Null);
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            (
                t["metadata"]["name"].as_str().unwrap_or("").to_string(),
                t.clone(),
            )
        })
        .collect()
}

fn ready(t: &Value) -> bool {
    t["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// What a tenant's knobs and replicas are now.
fn scale_of(t: &Value) -> (Value, Value) {
    (
        t["status"]["knobs"].clone(),
        t["status"]["replicas"].clone(),
    )
}

fn placed_on(t: &Value) -> BTreeSet<String> {
    t["status"]["placements"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["agent"].as_str().map(String::from))
        .collect()
}

/// Polls every 3 s until `done` holds for the tenants, for at most `limit`; how long it took.
fn until(
    what: &str,
    limit: Duration,
    cp: &ControlPlane,
    n: &str,
    operator: &mut Process,
    mut done: impl FnMut(&BTreeMap<String, Value>) -> Result<(), String>,
) -> Duration {
    let started = Instant::now();
    poll(what, limit, || {
        assert!(operator.is_running(), "{}", operator.log_tail(30));
        let all = tenants(cp, n);
        done(&all)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", operator.log_tail(30)));
    started.elapsed()
}

/// Which parts of the tenants' statuses differ between two snapshots: per field (conditions
/// by type), how many tenants, and one example.
fn status_changes(a: &BTreeMap<String, Value>, b: &BTreeMap<String, Value>) -> String {
    let mut moved: BTreeMap<String, (usize, String)> = BTreeMap::new();
    for (name, t) in a {
        let Some(u) = b.get(name) else { continue };
        let (s, v) = (&t["status"], &u["status"]);
        let mut fields: Vec<(String, &Value, &Value)> = Vec::new();
        for key in s.as_object().into_iter().flatten().map(|(k, _)| k) {
            if key != "conditions" {
                fields.push((key.clone(), &s[key], &v[key]));
            }
        }
        for c in s["conditions"].as_array().into_iter().flatten() {
            let other = v["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|d| d["type"] == c["type"])
                .unwrap_or(&Value::Null);
            fields.push((format!("condition {}", c["type"]), c, other));
        }
        for (key, x, y) in fields {
            if x != y {
                let entry = moved
                    .entry(key)
                    .or_insert_with(|| (0, format!("{name}: {x} -> {y}")));
                entry.0 += 1;
            }
        }
    }
    if moved.is_empty() {
        return "    none\n".into();
    }
    moved
        .iter()
        .map(|(k, (count, example))| {
            let example: String = example.chars().take(300).collect();
            format!("    {k}: {count} tenants, e.g. {example}\n")
        })
        .collect()
}

#[test]
#[ignore = "needs the control plane: cargo xtask test (reduced size) or cargo xtask bench scale"]
fn operator_at_scale() {
    let size = Size::from_env();
    let ns = TestNamespace::new("scale");
    let cp = ns.control_plane();
    let n = ns.name.as_str();
    cp.install_chart("scale", n).expect("chart installs");
    let nodes = size.max_agents().div_ceil(GPUS_PER_NODE as usize);
    for i in 0..nodes {
        cp.add_node(&format!("{n}-gpu-{i}"), GPUS_PER_NODE)
            .expect("node");
    }
    cp.kubectl_ok(&[
        "wait",
        "--for=condition=Ready",
        "node",
        "--all",
        "--timeout=120s",
    ])
    .expect("nodes Ready");

    // The operator, as its chart ServiceAccount; agents do not check its token here.
    let kubeconfig = cp
        .service_account_kubeconfig(n, "cotenant-operator")
        .expect("operator token");
    let token = cp.dir.join(format!("{n}-report-token"));
    std::fs::write(&token, "fleet").expect("token file");
    let operator_addr = format!("127.0.0.1:{}", free_port().expect("port"));
    let mut cmd = Command::new(workspace_binary("cotenant-operator"));
    cmd.args(["--listen", &operator_addr, "--log-level", "info"])
        .env("KUBECONFIG", &kubeconfig)
        .env("POD_NAMESPACE", n)
        .env("POD_NAME", format!("operator-{n}"))
        .env("COTENANT_REPORT_TOKEN_FILE", &token);
    let logs = cp.dir.join("logs");
    let mut operator = Process::spawn(&format!("operator-{n}"), cmd, &logs, Lifetime::WithParent)
        .expect("operator starts");
    let user = format!("system:serviceaccount:{n}:cotenant-operator");

    let control = format!("127.0.0.1:{}", free_port().expect("port"));
    let mut cmd = Command::new(workspace_binary("cotenant-fleet"));
    cmd.args([
        "--namespace",
        n,
        "--host",
        &cotenant_e2e::agents::host_ip(),
        "--control-listen",
        &control,
    ])
    .env("KUBECONFIG", &cp.kubeconfig);
    let mut fleet = Process::spawn(&format!("fleet-{n}"), cmd, &logs, Lifetime::WithParent)
        .expect("fleet starts");
    poll(
        "operator /readyz",
        Duration::from_secs(60),
        || match http_get(&operator_addr, "/readyz") {
            Ok((200, _)) => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", operator.log_tail(30)));

    // One pool for everything; each agent's memory holds about N/M tenants, so the tenants need
    // about M agents. Its cap leaves room above that, as a pool's cap must: packing thousands
    // of tenants of different loads into exactly as many agents as their memory fills would
    // need a perfect packing, and agents that die need replacements.
    let pool = format!("pool-{n}");
    let per_agent = size.tenants.div_ceil(size.agents).max(1);
    let memory_mib = 2_400 * per_agent + 1_024;
    cp.kubectl_apply(&format!(
        "apiVersion: cotenant.dev/v1alpha1\nkind: GpuPool\nmetadata:\n  name: {pool}\nspec:\n  agentNamespace: {n}\n  maxAgents: {}\n  gpuMemoryMiB: {memory_mib}\n  template:\n    image: cotenant/agent:test\n",
        size.max_agents()
    ))
    .expect("pool");

    // 1. Create N tenants; time until every one is placed and Ready.
    let slo_ms = 250.0;
    let docs: Vec<String> = (0..size.tenants)
        .map(|i| tenant_yaml(i, &pool, slo_ms))
        .collect();
    let log = cp.audit_log();
    let bringing_up = audit::offset(&log);
    apply(cp, n, &docs);
    let applied = Instant::now();
    let mut all_placed: Option<Duration> = None;
    let placed = until(
        "every tenant Ready",
        Duration::from_secs(900),
        cp,
        n,
        &mut operator,
        |all| {
            if all_placed.is_none()
                && all.len() == size.tenants
                && all.values().all(|t| !placed_on(t).is_empty())
            {
                all_placed = Some(applied.elapsed());
            }
            let r = all.values().filter(|t| ready(t)).count();
            if r == size.tenants {
                Ok(())
            } else {
                Err(format!("{r} of {} Ready", size.tenants))
            }
        },
    );
    let bringup = Requests::read(&log, &user, bringing_up, audit::offset(&log)).expect("audit log");
    // Each phase says what it measured as it ends, so a later failure keeps it.
    println!(
        "bring-up: every tenant placed after {}, Ready after {:.1} s; requests:\n{}",
        all_placed.map_or("-".to_string(), |d| format!("{:.1} s", d.as_secs_f64())),
        placed.as_secs_f64(),
        bringup.table(placed.as_secs_f64())
    );
    let agents_used = tenants(cp, n)
        .values()
        .flat_map(placed_on)
        .collect::<BTreeSet<_>>()
        .len();

    // 2. Settle: DNNScaler moves knobs for a while after the tenants are Ready. Wait until the
    //    operator writes nothing for QUIET (at most 5 minutes) but renewals of its leader Lease,
    //    then count its requests over the steady window, and which parts of the tenants'
    //    statuses moved in it.
    let settling = Instant::now();
    let settled = loop {
        let from = audit::offset(&log);
        std::thread::sleep(QUIET);
        let writes = Requests::read(&log, &user, from, audit::offset(&log))
            .expect("audit log")
            .of_except(WRITES, LEADER_LEASE);
        if writes == 0 {
            break true;
        }
        if settling.elapsed() > Duration::from_secs(300) {
            break false;
        }
    };
    let settle_s = settling.elapsed().as_secs_f64();
    let (from, before) = (audit::offset(&log), usage(operator.pid));
    let at_start = tenants(cp, n);
    let window = Instant::now();
    std::thread::sleep(size.steady);
    let (to, after) = (audit::offset(&log), usage(operator.pid));
    let steady_s = window.elapsed().as_secs_f64();
    let steady = Requests::read(&log, &user, from, to).expect("audit log");
    let cpu_share = (after.cpu_s - before.cpu_s) / steady_s;
    let moved = status_changes(&at_start, &tenants(cp, n));
    println!(
        "steady: settled after {settle_s:.0} s{}; requests in {steady_s:.0} s:\n{}status fields that moved:\n{moved}",
        if settled { "" } else { " (never: gave up)" },
        steady.table(steady_s)
    );

    // 3. Tighten the SLO of every tenth tenant to 70% of its observed latency; time until each
    //    one's knobs or replicas move.
    let now = tenants(cp, n);
    let chosen: Vec<(usize, String)> = (0..size.tenants)
        .step_by(10)
        .map(|i| (i, format!("t-{i:05}")))
        .collect();
    let was: BTreeMap<String, (Value, Value)> = chosen
        .iter()
        .filter_map(|(_, name)| Some((name.clone(), scale_of(now.get(name)?))))
        .collect();
    let tight: Vec<String> = chosen
        .iter()
        .map(|(i, name)| {
            let latency = now
                .get(name)
                .and_then(|t| t["status"]["observed"]["latencyMillis"].as_f64())
                .unwrap_or(slo_ms);
            tenant_yaml(*i, &pool, (latency * TIGHTER).max(1.0).round())
        })
        .collect();
    let from = audit::offset(&log);
    apply(cp, n, &tight);
    let mut moved_after: BTreeMap<String, Duration> = BTreeMap::new();
    let tightened = Instant::now();
    let _ = poll(
        "tightened tenants rescale",
        Duration::from_secs(180),
        || {
            let all = tenants(cp, n);
            for (name, before) in &was {
                if !moved_after.contains_key(name)
                    && all.get(name).is_some_and(|t| &scale_of(t) != before)
                {
                    moved_after.insert(name.clone(), tightened.elapsed());
                }
            }
            if moved_after.len() == was.len() {
                Ok(())
            } else {
                Err(format!("{} of {} moved", moved_after.len(), was.len()))
            }
        },
    );
    let changing_s = tightened.elapsed().as_secs_f64();
    let changing = Requests::read(&log, &user, from, audit::offset(&log)).expect("audit log");
    let before = tenants(cp, n);
    std::thread::sleep(Duration::from_secs(10));
    let still_moving = status_changes(&before, &tenants(cp, n));
    println!(
        "SLO tightened: {} of {} moved in {changing_s:.0} s; requests:\n{}status fields that moved in 10 s after:\n{still_moving}",
        moved_after.len(),
        was.len(),
        changing.table(changing_s)
    );
    let mut reaction: Vec<f64> = moved_after.values().map(Duration::as_secs_f64).collect();
    reaction.sort_by(f64::total_cmp);

    // 4. Every tenth agent stops answering (its port closes, its Lease stops); time until no
    //    tenant is placed on one and every tenant is Ready again.
    let (_, listed) = http_get(&control, "/agents").expect("fleet agents");
    let silent: BTreeSet<String> = listed.lines().step_by(10).map(String::from).collect();
    let body = silent.iter().cloned().collect::<Vec<_>>().join("\n");
    http_post(
        &control,
        "/silence",
        &[("Content-Type", "text/plain")],
        body.as_bytes(),
    )
    .expect("silence");
    let on_silent: BTreeSet<String> = tenants(cp, n)
        .iter()
        .filter(|(_, t)| !placed_on(t).is_disjoint(&silent))
        .map(|(name, _)| name.clone())
        .collect();
    let silenced = Instant::now();
    let off = until(
        "no tenant placed on a silent agent",
        Duration::from_secs(600),
        cp,
        n,
        &mut operator,
        |all| {
            let left = all
                .values()
                .filter(|t| !placed_on(t).is_disjoint(&silent))
                .count();
            if left == 0 {
                Ok(())
            } else {
                Err(format!("{left} tenants still placed on a silent agent"))
            }
        },
    );
    // Ready again takes a free agent: at maxAgents it may take none (reported, not asserted).
    let _ = poll(
        "the tenants of silent agents Ready again",
        Duration::from_secs(120),
        || {
            let all = tenants(cp, n);
            let waiting = on_silent
                .iter()
                .filter(|name| !all.get(*name).is_some_and(ready))
                .count();
            if waiting == 0 {
                Ok(())
            } else {
                Err(format!("{waiting} not Ready"))
            }
        },
    );
    let all = tenants(cp, n);
    let ready_again = on_silent
        .iter()
        .filter(|name| all.get(*name).is_some_and(ready))
        .count();
    let replaced = silenced.elapsed();
    let end = usage(operator.pid);

    let steady_writes = steady.of_except(WRITES, LEADER_LEASE);
    let writes_per_tenant_min = steady_writes as f64 / size.tenants as f64 / (steady_s / 60.0);
    let pct = |q: f64| {
        reaction
            .get(((reaction.len() as f64 - 1.0) * q).round() as usize)
            .map_or("-".to_string(), |s| format!("{s:.1} s"))
    };
    println!(
        "\noperator at scale: {} tenants, pool of at most {} agents ({} used), {} nodes of {GPUS_PER_NODE} GPUs\n\
         \n| measure | value |\n|---|---|\n\
         | time from the last apply until every tenant is placed on an agent | {} |\n\
         | time from the last apply until every tenant is placed and Ready | {:.1} s |\n\
         | then until the operator wrote nothing for {} s | {settle_s:.0} s{} |\n\
         | steady state: operator requests ({steady_s:.0} s window) | {} ({:.2}/s) |\n\
         | steady state: writes (create/update/patch/delete), leader Lease aside | {steady_writes} |\n\
         | steady state: leader Lease renewals (get and update) | {} |\n\
         | steady state: list calls | {} |\n\
         | steady state: writes per tenant per minute | {writes_per_tenant_min:.3} |\n\
         | steady state: operator CPU | {:.1}% of a core |\n\
         | operator RSS now / peak | {:.0} MiB / {:.0} MiB |\n\
         | SLO tightened for {} tenants: knobs or replicas moved | {} of {} (p50 {}, max {}) |\n\
         | requests while they rescale ({changing_s:.0} s) | {} ({:.2}/s), writes {} |\n\
         | {} agents silenced ({} tenants on them): no tenant placed on one after | {:.1} s |\n\
         | those tenants Ready again | {ready_again} of {}, {:.1} s after the silence |\n",
        size.tenants,
        size.max_agents(),
        agents_used,
        nodes,
        all_placed.map_or("-".to_string(), |d| format!("{:.1} s", d.as_secs_f64())),
        placed.as_secs_f64(),
        QUIET.as_secs(),
        if settled { "" } else { " (never: gave up)" },
        steady.total(),
        steady.total() as f64 / steady_s,
        steady
            .0
            .iter()
            .filter(|((_, r), _)| r == LEADER_LEASE)
            .map(|(_, n)| n)
            .sum::<u64>(),
        steady.of(&["list"]),
        cpu_share * 100.0,
        end.rss_mib,
        end.peak_rss_mib,
        was.len(),
        moved_after.len(),
        was.len(),
        pct(0.5),
        pct(1.0),
        changing.total(),
        changing.total() as f64 / changing_s,
        changing.of(WRITES),
        silent.len(),
        on_silent.len(),
        off.as_secs_f64(),
        on_silent.len(),
        replaced.as_secs_f64(),
    );
    assert!(fleet.is_running(), "{}", fleet.log_tail(20));
    assert_eq!(
        steady_writes,
        0,
        "the operator wrote in steady state:\n{}\nstatus fields that moved:\n{moved}",
        steady.table(steady_s),
    );
    assert_eq!(
        steady.of(&["list"]),
        0,
        "the operator listed in steady state:\n{}",
        steady.table(steady_s)
    );
}
