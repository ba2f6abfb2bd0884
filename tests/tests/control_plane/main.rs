//! Tests against the real local control plane (one per test run; see `cotenant_e2e::shared`).
//! They need the Go-built binaries, so a bare `cargo test` skips them; `cargo xtask test` runs them.

mod agent_kubernetes;
mod api;
mod chart;
mod model_credentials;
mod observability;
mod operator;
