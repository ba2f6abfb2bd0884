//! The local control plane harness: builds etcd, the Kubernetes control plane, kubectl, Helm and
//! kwok from their Go modules (cached outside the repository), starts them on loopback, and gives
//! tests one control plane per test run with a fresh namespace per test. `cargo xtask cluster up`
//! uses the same code to start a detached cluster for a shell.

pub mod agents;
pub mod audit;
pub mod cluster;
pub mod http;
pub mod load;
pub mod pki;
pub mod process;
pub mod proxy;
pub mod s3;
pub mod shared;
pub mod toolchain;
pub mod versions;
pub mod wait;

pub use cluster::{ControlPlane, Options};
pub use process::Lifetime;
pub use shared::{TestNamespace, install_crds, shared};
pub use toolchain::{Tools, cache_dir};
pub use wait::{http_get, http_get_with, poll};

/// A binary of this workspace, built before the tests run (`cargo xtask test` builds them):
/// `$COTENANT_BIN_DIR/<name>`, else `<target dir>/debug/<name>`.
pub fn workspace_binary(name: &str) -> std::path::PathBuf {
    let dir = std::env::var_os("COTENANT_BIN_DIR")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("CARGO_TARGET_DIR").map(|t| std::path::PathBuf::from(t).join("debug"))
        })
        .unwrap_or_else(|| TestNamespace::repo_root().join("target/debug"));
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build it first (cargo build -p {name}, or run cargo xtask test)",
        path.display()
    );
    path
}

/// What can go wrong while building or running the control plane.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("certificates: {0}")]
    Pki(#[from] rcgen::Error),
    #[error("cannot start {what}: {source}")]
    Spawn {
        what: String,
        source: std::io::Error,
    },
    #[error("building {what} failed:\n{detail}")]
    Build { what: String, detail: String },
    #[error("{what} exited early; its log ends with:\n{log}")]
    Died { what: String, log: String },
    #[error("timed out waiting for {what}; logs end with:\n{log}")]
    Timeout { what: String, log: String },
    #[error("`{what}` failed:\n{stderr}")]
    Command { what: String, stderr: String },
}
