//! The one place the control plane's component versions are pinned. Changing a version here makes
//! the harness build and cache that version next to the old one.

/// `k8s.io/kubernetes`: kube-apiserver, kube-controller-manager, kube-scheduler and kubectl.
pub const KUBERNETES: &str = "v1.36.3";
/// `go.etcd.io/etcd/server/v3`.
pub const ETCD: &str = "v3.6.16";
/// `helm.sh/helm/v3`.
pub const HELM: &str = "v3.21.4";
/// `sigs.k8s.io/kwok`: fakes nodes and the kubelet's pod lifecycle.
pub const KWOK: &str = "v0.8.0";
/// `oha` (crates.io), the HTTP load generator of the standalone agent's overload test.
pub const OHA: &str = "1.16.0";
/// Triton's `perf_analyzer`, taken prebuilt from the `tritonclient` wheel of this version (from
/// 2.53 on the wheels need glibc 2.38; Debian 12 has 2.36).
pub const PERF_ANALYZER: &str = "2.41.0";
/// The `nvidia-cuda-runtime-cu12` wheel whose `libcudart.so.12` `perf_analyzer` links against
/// (it needs no GPU).
pub const CUDA_RUNTIME: &str = "12.9.79";
