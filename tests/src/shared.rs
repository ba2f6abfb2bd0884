//! One control plane per test run, shared by every test of a test binary, and a fresh namespace
//! per test. The processes are children of a thread that lives as long as the test process, with
//! `PR_SET_PDEATHSIG`, so they die with it whether the tests pass, fail or abort.

use crate::cluster::{ControlPlane, Options};
use crate::process::{Lifetime, pid_alive};
use crate::{Error, toolchain};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();

/// The control plane of this test run, started on first use. Panics with the reason when it
/// cannot start: every test that needs it must fail, never pass vacuously.
pub fn shared() -> &'static ControlPlane {
    let result = SHARED.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        // The spawning thread must outlive every test: PDEATHSIG fires when it exits.
        std::thread::spawn(move || {
            let _ = tx.send(start_for_tests().map_err(|e| e.to_string()));
            loop {
                std::thread::park();
            }
        });
        rx.recv()
            .unwrap_or_else(|_| Err("the control plane thread died".to_string()))
    });
    match result {
        Ok(cp) => cp,
        Err(e) => panic!("the local control plane did not start: {e}"),
    }
}

fn start_for_tests() -> Result<ControlPlane, Error> {
    let tools = toolchain::ensure()?;
    let runs = toolchain::cache_dir().join("runs");
    remove_stale_runs(&runs);
    let dir = runs.join(std::process::id().to_string());
    let _ = std::fs::remove_dir_all(&dir);
    ControlPlane::start(
        tools,
        &Options {
            dir,
            lifetime: Lifetime::WithParent,
            gpu_nodes: 2,
            gpus_per_node: 1,
        },
    )
}

/// Run directories of test processes that no longer exist.
fn remove_stale_runs(runs: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(runs) else {
        return;
    };
    for entry in entries.flatten() {
        let stale = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
            .is_none_or(|pid| !pid_alive(pid));
        if stale {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A namespace created for one test and deleted when the test ends.
#[derive(Debug)]
pub struct TestNamespace {
    pub name: String,
    cp: &'static ControlPlane,
}

impl TestNamespace {
    /// Creates `<prefix>-<n>` on the shared control plane.
    pub fn new(prefix: &str) -> TestNamespace {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let cp = shared();
        let name = format!("{prefix}-{}", NEXT.fetch_add(1, Ordering::Relaxed));
        if let Err(e) = cp.kubectl_ok(&["create", "namespace", &name]) {
            panic!("cannot create namespace {name}: {e}");
        }
        TestNamespace { name, cp }
    }

    pub fn control_plane(&self) -> &'static ControlPlane {
        self.cp
    }

    /// The repository root, for manifests and the chart.
    pub fn repo_root() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .map(PathBuf::from)
            .unwrap_or_default()
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let _ = self
            .cp
            .kubectl_ok(&["delete", "namespace", &self.name, "--wait=false"]);
    }
}

/// Applies the chart's CRDs once per test run and waits until they are Established.
pub fn install_crds() {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    let result = DONE.get_or_init(|| {
        let cp = shared();
        let crds = TestNamespace::repo_root().join("charts/cotenant/crds");
        let crds = crds.to_string_lossy();
        cp.kubectl_ok(&["apply", "--server-side", "-f", &crds])
            .and_then(|_| {
                cp.kubectl_ok(&[
                    "wait",
                    "--for=condition=Established",
                    "--timeout=60s",
                    "-f",
                    &crds,
                ])
            })
            .map(drop)
            .map_err(|e| e.to_string())
    });
    if let Err(e) = result {
        panic!("cannot install the CRDs: {e}");
    }
}
