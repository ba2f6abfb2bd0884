//! The local control plane harness: builds etcd, the Kubernetes control plane, kubectl, Helm and
//! kwok from their Go modules (cached outside the repository), starts them on loopback, and gives
//! tests one control plane per test run with a fresh namespace per test. `cargo xtask cluster up`
//! uses the same code to start a detached cluster for a shell.

pub mod cluster;
pub mod pki;
pub mod process;
pub mod shared;
pub mod toolchain;
pub mod versions;

pub use cluster::{ControlPlane, Options};
pub use process::Lifetime;
pub use shared::{TestNamespace, install_crds, shared};
pub use toolchain::{Tools, cache_dir};

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
