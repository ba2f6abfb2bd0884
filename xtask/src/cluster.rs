//! `cargo xtask cluster up|down`: a detached local control plane for a shell.

use anyhow::Context;
use cotenant_e2e::process::{pid_alive, stop_pid};
use cotenant_e2e::{ControlPlane, Lifetime, Options, cache_dir, toolchain};
use std::path::PathBuf;
use std::time::Duration;

fn state_dir() -> PathBuf {
    cache_dir().join("cluster")
}

/// Starts the cluster (or finds the running one) and prints `export` lines on stdout.
pub fn up() -> anyhow::Result<()> {
    let dir = state_dir();
    let tools = toolchain::ensure()?;
    let pids = read_pids();
    if !pids.is_empty() && pids.iter().all(|p| pid_alive(*p)) {
        eprintln!("xtask: the cluster in {} is already up", dir.display());
    } else {
        stop(&pids);
        let _ = std::fs::remove_dir_all(&dir);
        let cp = ControlPlane::start(
            tools.clone(),
            &Options {
                dir: dir.clone(),
                lifetime: Lifetime::Detached,
                gpu_nodes: 2,
                gpus_per_node: 1,
            },
        )?;
        let pids: Vec<String> = cp.pids().iter().map(u32::to_string).collect();
        std::fs::write(dir.join("pids"), pids.join("\n")).context("cannot record pids")?;
        eprintln!(
            "xtask: control plane up at {} (logs in {})",
            cp.server,
            dir.join("logs").display()
        );
        cp.detach();
    }
    println!(
        "export KUBECONFIG='{}'",
        dir.join("admin.kubeconfig").display()
    );
    println!("export PATH='{}':\"$PATH\"", tools.path_dir.display());
    Ok(())
}

/// Stops every process of the cluster and removes its state.
pub fn down() -> anyhow::Result<()> {
    let pids = read_pids();
    stop(&pids);
    let dir = state_dir();
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .with_context(|| format!("cannot remove {}", dir.display()))?;
    }
    eprintln!("xtask: cluster down ({} processes stopped)", pids.len());
    Ok(())
}

fn read_pids() -> Vec<u32> {
    std::fs::read_to_string(state_dir().join("pids"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Stops in reverse start order so etcd goes last.
fn stop(pids: &[u32]) {
    for pid in pids.iter().rev() {
        stop_pid(*pid, Duration::from_secs(5));
    }
}
