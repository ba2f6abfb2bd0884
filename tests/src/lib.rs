//! The local control plane harness.
