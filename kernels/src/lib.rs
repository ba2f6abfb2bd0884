//! Compute kernels. CPU kernels are plain Rust over slices; CUDA sources live in `cuda/*.cu` and are
//! loaded by name behind the `cuda` feature. Kernels know nothing of graphs, tenants or scheduling.
//!
//! Every CPU kernel takes a `threads` budget: the caller (one tenant's instance) decides how many
//! cores it may use, and the kernel parallelises with rayon inside whatever pool the caller installed.

pub mod activation;
pub mod conv;
pub mod dense;
mod depthwise;
mod depthwise_rows;
pub mod direct_conv;
pub mod fused;
pub mod gemm;
pub mod inverted_residual;
pub mod norm;
pub mod pool;

/// Work below this many scalar operations is not worth splitting across threads.
pub(crate) const PAR_MIN_WORK: usize = 1 << 15;
