//! `cargo xtask`: the project's own commands. `test` is what CI runs: it sets up everything the
//! tests need on a fresh machine (a Python venv with the references, the control plane binaries),
//! then runs formatting, lints, the CRD drift check, `helm lint` and every test.

mod cluster;
mod device_check;
mod python;
mod test;

use anyhow::{Context, bail};
use std::path::PathBuf;
use std::process::Command;

const USAGE: &str = "usage: cargo xtask <command>

commands:
  test                 set up and run everything CI runs: fmt, clippy, crdgen --check,
                       helm lint, unit tests and the control-plane tests
  e2e                  only the end-to-end scenario (operator, agents, chart on the local
                       control plane), printing how long each step took
  cluster up           start a local control plane (etcd, kube-apiserver, controller-manager,
                       scheduler, kwok with fake GPU nodes); prints `export` lines, so
                       `eval \"$(cargo xtask cluster up)\"` readies a shell
  cluster down         stop it and remove its state
  bench executor       this executor vs onnxruntime on the CPU (ratio table)
  bench third-party    the third-party models' latency vs onnxruntime on the CPU (table)
  bench agent          goodput within the SLO under static b=1 m=1, DNNScaler and Clipper
                       AIMD on a standalone agent, and the HTTP overhead (tables)
  bench triton         Triton's perf_analyzer over HTTP and gRPC against a standalone agent,
                       next to the executor alone (table)
  bench scale [N M]    the operator with N tenants (2000) on up to M agents (200) on the
                       local control plane, agents played by cotenant-fleet (table)
  device-check         build the CUDA device check (release, --features cuda) into
                       target/device-bundle/ with run.sh for a GPU host
  setup                only build/cache the tools and the Python venv";

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["test", rest @ ..] => test::run(rest),
        ["e2e", rest @ ..] => test::e2e(rest),
        ["cluster", "up"] => cluster::up(),
        ["cluster", "down"] => cluster::down(),
        ["bench", "executor", rest @ ..] => bench_executor(rest),
        ["bench", "third-party", rest @ ..] => bench_third_party(rest),
        ["bench", "agent", rest @ ..] => bench_agent(rest),
        ["bench", "triton", rest @ ..] => bench_triton(rest),
        ["bench", "scale", rest @ ..] => test::scale(rest),
        ["device-check", rest @ ..] => device_check::run(rest),
        ["setup"] => {
            python::venv()?;
            cotenant_e2e::toolchain::ensure()?;
            Ok(())
        }
        [] | ["help" | "--help" | "-h"] => {
            println!("{USAGE}");
            Ok(())
        }
        _ => bail!("unknown command `{}`\n\n{USAGE}", args.join(" ")),
    }
}

/// The repository root (xtask lives one level below it).
pub fn repo_root() -> PathBuf {
    // `cargo xtask` sets the variable for the run: the checkout it was started in, also when a
    // target directory shared between checkouts holds an xtask binary built in another one.
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default()
}

/// Cargo's target directory: `$CARGO_TARGET_DIR` (CI keeps it outside the clone), else `target/`.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|dir| {
            if dir.is_relative() {
                repo_root().join(dir)
            } else {
                dir
            }
        })
        .unwrap_or_else(|| repo_root().join("target"))
}

/// Runs a command in the repository root, failing with its name when it fails.
pub fn run(mut cmd: Command) -> anyhow::Result<()> {
    let shown = format!("{cmd:?}");
    eprintln!("xtask: {shown}");
    let status = cmd
        .current_dir(repo_root())
        .status()
        .with_context(|| format!("cannot start {shown}"))?;
    if !status.success() {
        bail!("{shown} failed with {status}");
    }
    Ok(())
}

fn bench_executor(args: &[&str]) -> anyhow::Result<()> {
    bench_script("executor/bench/compare.py", args)
}

fn bench_third_party(args: &[&str]) -> anyhow::Result<()> {
    let cache = cotenant_e2e::toolchain::cache_dir().join("third-party-models");
    let cache = cache.to_string_lossy();
    let mut all = vec!["--cache", &cache];
    all.extend_from_slice(args);
    bench_script("executor/bench/third_party.py", &all)
}

fn bench_agent(args: &[&str]) -> anyhow::Result<()> {
    bench_script("node-agent/bench/agent_bench.py", args)
}

fn bench_triton(args: &[&str]) -> anyhow::Result<()> {
    let perf_analyzer = cotenant_e2e::toolchain::ensure()?.perf_analyzer;
    let perf_analyzer = perf_analyzer.to_string_lossy();
    let mut all = vec!["--perf-analyzer", &perf_analyzer];
    all.extend_from_slice(args);
    bench_script("node-agent/bench/triton_perf.py", &all)
}

/// Builds the agent in release and runs a benchmark script with the reference venv's Python.
fn bench_script(script: &str, args: &[&str]) -> anyhow::Result<()> {
    let python = python::venv()?;
    let mut build = Command::new("cargo");
    build.args(["build", "--release", "-p", "cotenant-agent"]);
    run(build)?;
    let agent = target_dir().join("release/cotenant-agent");
    let mut bench = Command::new(python);
    bench
        .arg(repo_root().join(script))
        .arg("--agent")
        .arg(agent)
        .args(args);
    run(bench)
}
