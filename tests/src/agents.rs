//! A kubelet stand-in for agent pods: for every agent pod kwok marks Running, it starts
//! `cotenant-agent` as a host process with the pod's container arguments and plain environment
//! variables, its downward-API identity (its IP is this host's: see `cluster`) and a
//! ServiceAccount token bound to the pod, as the kubelet projects one. What a host process
//! cannot take from the pod is replaced, and only that: the listen addresses (free ports of this
//! host), the model roots (one directory standing for the pod's model volumes) and `--device
//! cuda` (this host has no GPU: such an agent computes on the CPU). When the pod goes, the
//! process goes. A test can kill an agent (a crash the kubelet does not restart).

use crate::cluster::{ControlPlane, free_port};
use crate::process::{Lifetime, Process};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Default)]
struct Hosted {
    /// Running agents by `namespace/pod`.
    agents: HashMap<String, Process>,
    /// Agents a test killed: not restarted.
    killed: HashSet<String>,
    /// Kubeconfigs with pod-bound tokens, by `namespace/pod`.
    kubeconfigs: HashMap<String, PathBuf>,
    /// Why the last start failed, for test messages.
    errors: Vec<String>,
}

pub struct AgentHost {
    hosted: Arc<Mutex<Hosted>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl AgentHost {
    /// Starts watching agent pods (every second) with `agent` as the binary, `threads` CPU
    /// threads per agent and `model_root` as every agent's `--model-root`.
    pub fn start(
        cp: &'static ControlPlane,
        agent: PathBuf,
        threads: usize,
        model_root: PathBuf,
    ) -> AgentHost {
        AgentHost::start_in(cp, agent, threads, model_root, None)
    }

    /// [`AgentHost::start`] for the agent pods of `namespace` only (all with `None`), so a test
    /// runs agents for its own pods and no other test's.
    pub fn start_in(
        cp: &'static ControlPlane,
        agent: PathBuf,
        threads: usize,
        model_root: PathBuf,
        namespace: Option<String>,
    ) -> AgentHost {
        let hosted = Arc::new(Mutex::new(Hosted::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (hosted, stop) = (hosted.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Err(e) = sync(cp, &agent, threads, &model_root, &namespace, &hosted) {
                        lock(&hosted).errors.push(e);
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
            })
        };
        AgentHost {
            hosted,
            stop,
            thread: Some(thread),
        }
    }

    /// `namespace/pod` of every agent running now.
    pub fn running(&self) -> Vec<String> {
        let mut names: Vec<String> = lock(&self.hosted).agents.keys().cloned().collect();
        names.sort();
        names
    }

    /// Kills the agent of pod `namespace/name` and does not restart it.
    pub fn kill(&self, key: &str) {
        let mut hosted = lock(&self.hosted);
        hosted.killed.insert(key.to_string());
        if let Some(mut p) = hosted.agents.remove(key) {
            p.stop();
        }
    }

    /// The last lines of an agent's log (running or not), for failure messages.
    pub fn logs(&self, lines: usize) -> String {
        let hosted = lock(&self.hosted);
        let mut out: Vec<String> = hosted
            .agents
            .iter()
            .map(|(k, p)| format!("--- {k}\n{}", p.log_tail(lines)))
            .collect();
        out.extend(hosted.errors.iter().rev().take(3).cloned());
        out.join("\n")
    }
}

impl Drop for AgentHost {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        for (_, mut p) in lock(&self.hosted).agents.drain() {
            p.stop();
        }
    }
}

fn lock(h: &Mutex<Hosted>) -> std::sync::MutexGuard<'_, Hosted> {
    h.lock().unwrap_or_else(|e| e.into_inner())
}

fn sync(
    cp: &'static ControlPlane,
    agent: &PathBuf,
    threads: usize,
    model_root: &PathBuf,
    only: &Option<String>,
    hosted: &Mutex<Hosted>,
) -> Result<(), String> {
    let scope = match only {
        Some(namespace) => ["-n", namespace.as_str()],
        None => ["-A", ""],
    };
    let mut args = vec!["get", "pods"];
    args.extend(scope.iter().copied().filter(|a| !a.is_empty()));
    args.extend(["-l", "app.kubernetes.io/name=cotenant-agent", "-o", "json"]);
    let out = cp.kubectl_ok(&args).map_err(|e| e.to_string())?;
    let pods: Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
    let mut running = HashSet::new();
    for pod in pods["items"].as_array().into_iter().flatten() {
        let namespace = pod["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        let deleting = !pod["metadata"]["deletionTimestamp"].is_null();
        if deleting || pod["status"]["phase"] != "Running" {
            continue;
        }
        let key = format!("{namespace}/{name}");
        running.insert(key.clone());
        let mut h = lock(hosted);
        if h.agents.contains_key(&key) || h.killed.contains(&key) {
            continue;
        }
        let account = pod["spec"]["serviceAccountName"]
            .as_str()
            .unwrap_or("default");
        let ip = pod["status"]["podIP"].as_str().unwrap_or_default();
        let kubeconfig = match h.kubeconfigs.get(&key) {
            Some(k) => k.clone(),
            None => {
                let k = cp
                    .pod_kubeconfig(namespace, account, name)
                    .map_err(|e| e.to_string())?;
                h.kubeconfigs.insert(key.clone(), k.clone());
                k
            }
        };
        let container = &pod["spec"]["containers"][0];
        let pod_args: Vec<String> = container["args"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str().map(str::to_string))
            .collect();
        let (http, grpc, admin) = (
            free_port().map_err(|e| e.to_string())?,
            free_port().map_err(|e| e.to_string())?,
            free_port().map_err(|e| e.to_string())?,
        );
        let mut cmd = Command::new(agent);
        cmd.args(host_args(&pod_args))
            .args([
                "--listen",
                &format!("0.0.0.0:{http}"),
                "--grpc-listen",
                &format!("0.0.0.0:{grpc}"),
                "--admin-listen",
                &format!("0.0.0.0:{admin}"),
            ])
            .arg("--model-root")
            .arg(model_root);
        if !pod_args.iter().any(|a| a == "--threads") {
            cmd.args(["--threads", &threads.to_string()]);
        }
        cmd.env("COTENANT_LOG", "info,cotenant_agent=debug");
        for var in container["env"].as_array().into_iter().flatten() {
            if let (Some(name), Some(value)) = (var["name"].as_str(), var["value"].as_str()) {
                cmd.env(name, value);
            }
        }
        cmd.env("KUBECONFIG", &kubeconfig)
            .env("POD_NAME", name)
            .env("POD_NAMESPACE", namespace)
            .env(
                "NODE_NAME",
                pod["spec"]["nodeName"].as_str().unwrap_or_default(),
            )
            .env("POD_IP", ip);
        let process = Process::spawn(
            &format!("agent-{namespace}-{name}"),
            cmd,
            &cp.dir.join("logs"),
            Lifetime::WithParent,
        )
        .map_err(|e| e.to_string())?;
        h.agents.insert(key, process);
    }
    let mut h = lock(hosted);
    let gone: Vec<String> = h
        .agents
        .keys()
        .filter(|k| !running.contains(*k))
        .cloned()
        .collect();
    for key in gone {
        if let Some(mut p) = h.agents.remove(&key) {
            p.stop();
        }
    }
    Ok(())
}

/// The pod's agent arguments less what a host process must choose itself: listen addresses and
/// model roots are dropped, and `--device cuda` becomes `--device cpu` (no GPU here).
fn host_args(pod_args: &[String]) -> Vec<String> {
    const HOST_CHOSEN: [&str; 4] = [
        "--listen",
        "--grpc-listen",
        "--admin-listen",
        "--model-root",
    ];
    let mut out = Vec::new();
    let mut args = pod_args.iter();
    while let Some(arg) = args.next() {
        if HOST_CHOSEN.contains(&arg.as_str()) {
            args.next();
        } else if arg == "--device" {
            let device = args.next().map(String::as_str).unwrap_or("auto");
            out.push(arg.clone());
            out.push(if device == "cuda" { "cpu" } else { device }.to_string());
        } else {
            out.push(arg.clone());
        }
    }
    out
}

/// An IPv4 address of this host that is not loopback: EndpointSlices reject 127.0.0.0/8, so
/// host-process agents advertise this one (and listen on every address).
pub fn host_ip() -> String {
    // SAFETY: getifaddrs fills a list we walk read-only and free once.
    unsafe {
        let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
        if libc::getifaddrs(&mut list) != 0 {
            panic!("getifaddrs: {}", std::io::Error::last_os_error());
        }
        let mut found = None;
        let mut cur = list;
        while !cur.is_null() {
            let addr = (*cur).ifa_addr;
            if !addr.is_null() && i32::from((*addr).sa_family) == libc::AF_INET {
                let sin = &*(addr as *const libc::sockaddr_in);
                let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                if !ip.is_loopback() && !ip.is_link_local() && found.is_none() {
                    found = Some(ip.to_string());
                }
            }
            cur = (*cur).ifa_next;
        }
        libc::freeifaddrs(list);
        found.expect("this host has no non-loopback IPv4 address for agents to advertise")
    }
}
