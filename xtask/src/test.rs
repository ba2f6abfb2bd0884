//! `cargo xtask test`: everything CI runs, with its own set-up.

use crate::{python, repo_root};
use std::process::Command;
use std::time::Instant;

pub fn run(extra: &[&str]) -> anyhow::Result<()> {
    let started = Instant::now();
    let python = python::venv()?;
    let tools = cotenant_e2e::toolchain::ensure()?;
    eprintln!("xtask: set-up done in {:.0?}", started.elapsed());

    let mut fmt = Command::new("cargo");
    fmt.args(["fmt", "--all", "--", "--check"]);
    crate::run(fmt)?;

    let mut clippy = Command::new("cargo");
    clippy.args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]);
    crate::run(clippy)?;

    let mut crdgen = Command::new("cargo");
    crdgen.args([
        "run",
        "--quiet",
        "-p",
        "cotenant-crds",
        "--bin",
        "crdgen",
        "--",
        "--check",
    ]);
    crate::run(crdgen)?;

    let mut lint = Command::new(&tools.helm);
    lint.args(["lint", "--strict"])
        .arg(repo_root().join("charts/cotenant"));
    crate::run(lint)?;

    // The control-plane tests run these binaries as host processes.
    let mut bins = Command::new("cargo");
    bins.args([
        "build",
        "-p",
        "cotenant-operator",
        "-p",
        "cotenant-agent",
        "-p",
        "cotenant-fleet",
    ]);
    crate::run(bins)?;

    // Tests that need the venv or the control plane are #[ignore]d for a bare `cargo test`; here
    // everything they need exists, so they all run.
    let mut test = Command::new("cargo");
    test.args(["test", "--workspace", "--", "--include-ignored"])
        .args(extra)
        .env("COTENANT_PYTHON", &python)
        .env("COTENANT_OHA", &tools.oha)
        .env("COTENANT_PERF_ANALYZER", &tools.perf_analyzer)
        .env("COTENANT_BIN_DIR", crate::target_dir().join("debug"));
    crate::run(test)?;

    // The kernels and the executor again on each instruction-set level below this CPU's
    // (`COTENANT_ISA`): the paths other CPUs run, checked here against the same references.
    for cap in lower_isa_levels() {
        let mut capped = Command::new("cargo");
        capped
            .args(["test", "-p", "cotenant-kernels", "-p", "cotenant-executor"])
            .args(["--", "--include-ignored"])
            .env("COTENANT_PYTHON", &python)
            .env("COTENANT_ISA", cap);
        eprintln!("xtask: the kernels and the executor with COTENANT_ISA={cap}");
        crate::run(capped)?;
    }

    // The CUDA backend is behind a feature the workspace build leaves off: lint it and the agent
    // that serves on it, and test its GPU-free parts, NVRTC included (from the venv's wheel), so
    // it cannot rot unseen.
    let mut cuda_clippy = Command::new("cargo");
    cuda_clippy.args([
        "clippy",
        "-p",
        "cotenant-executor",
        "-p",
        "cotenant-agent",
        "--features",
        "cotenant-agent/cuda",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]);
    crate::run(cuda_clippy)?;
    let mut cuda_test = Command::new("cargo");
    cuda_test
        .args([
            "test",
            "-p",
            "cotenant-executor",
            "--features",
            "cuda",
            "--lib",
            "cuda",
        ])
        .env("LD_LIBRARY_PATH", python::nvrtc_lib_dir(&python)?)
        .env("COTENANT_REQUIRE_NVRTC", "1");
    crate::run(cuda_test)?;
    eprintln!("xtask: all checks passed in {:.0?}", started.elapsed());
    Ok(())
}

/// `cargo xtask e2e`: only the end-to-end scenario on the real control plane, with its step
/// timings printed.
pub fn e2e(extra: &[&str]) -> anyhow::Result<()> {
    let python = python::venv()?;
    cotenant_e2e::toolchain::ensure()?;
    let mut bins = Command::new("cargo");
    bins.args(["build", "-p", "cotenant-operator", "-p", "cotenant-agent"]);
    crate::run(bins)?;
    let mut test = Command::new("cargo");
    test.args([
        "test",
        "-p",
        "cotenant-e2e",
        "--test",
        "e2e",
        "--",
        "--include-ignored",
        "--nocapture",
    ])
    .args(extra)
    .env("COTENANT_PYTHON", &python)
    .env("COTENANT_BIN_DIR", crate::target_dir().join("debug"));
    crate::run(test)
}

/// `cargo xtask bench scale [TENANTS AGENTS]`: the operator at scale on the local control plane
/// (`tests/tests/scale`), 2,000 tenants filling 200 agents unless given, printing its table.
pub fn scale(args: &[&str]) -> anyhow::Result<()> {
    let (tenants, agents) = match args {
        [] => ("2000", "200"),
        [t, a] => (*t, *a),
        _ => anyhow::bail!("usage: cargo xtask bench scale [TENANTS AGENTS]"),
    };
    cotenant_e2e::toolchain::ensure()?;
    // Release binaries: the operator's CPU is part of what this measures.
    let mut bins = Command::new("cargo");
    bins.args([
        "build",
        "--release",
        "-p",
        "cotenant-operator",
        "-p",
        "cotenant-fleet",
    ]);
    crate::run(bins)?;
    let mut test = Command::new("cargo");
    test.args([
        "test",
        "-p",
        "cotenant-e2e",
        "--test",
        "scale",
        "--",
        "--include-ignored",
        "--nocapture",
    ])
    .env("COTENANT_SCALE_TENANTS", tenants)
    .env("COTENANT_SCALE_AGENTS", agents)
    .env("COTENANT_SCALE_STEADY_S", "60")
    .env("COTENANT_BIN_DIR", crate::target_dir().join("release"));
    crate::run(test)
}

/// The kernels' instruction-set levels (`COTENANT_ISA`) below the highest this CPU runs.
fn lower_isa_levels() -> Vec<&'static str> {
    let flags = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("flags"))
        .map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .unwrap_or_default();
    let has = |f: &str| flags.iter().any(|x| x == f);
    let levels = [
        ("amx", has("amx_int8") && has("avx512_vnni")),
        ("avx512", has("avx512f") && has("avx512bw")),
        ("avx2", has("avx2") && has("fma")),
        ("portable", cfg!(target_arch = "x86_64")),
    ];
    match levels.iter().position(|&(_, here)| here) {
        Some(top) => levels[top + 1..].iter().map(|&(name, _)| name).collect(),
        None => Vec::new(),
    }
}
