//! Graph rewrite passes, run in order by [`optimize`]: quantized (QDQ) patterns to integer
//! ops, the NCHW/NHWC transposes between them cancelled, constant folding (shape subgraphs
//! included, under symbolic dimensions), BatchNorm folded into the
//! producing Conv, Erf-form GELU recognised, constant bias fused into MatMul, residual Adds fused
//! into the producing Conv, activations fused into the producing Conv/Gemm/MatMul, a 1x1 Conv
//! fused into the depthwise Conv after it and then the 1x1 Conv after the pair (MobileNet's
//! whole inverted residual block), dead-node removal. On the CPU, chains of convolutions go
//! NHWC and MatMuls by constant matrices hold them packed.

mod bias;
mod bn_fold;
mod dce;
mod fold;
mod fuse;
mod gelu;
mod nhwc;
mod pack_matmul;
mod pointwise_depthwise;
mod qdq;
mod residual;
mod shapes;
mod transposes;

pub use bias::fuse_matmul_bias;
pub use bn_fold::fold_batch_norm;
pub use dce::remove_dead;
pub use fold::fold_constants;
pub use fuse::fuse_activations;
pub use gelu::fuse_gelu;
pub use nhwc::nhwc_convolutions;
pub use pack_matmul::pack_matmul_weights;
pub use pointwise_depthwise::fuse_pointwise_depthwise;
pub use residual::fuse_residual_add;
pub use shapes::{batch_refusal, fold_shapes, separable_batch};

use crate::graph::Graph;

/// The layout-neutral rewrites: what a GPU plan runs.
pub fn optimize(g: &mut Graph) {
    rewrite(g, false);
}

/// [`optimize`], with chains of convolutions made NHWC where this CPU has the kernels
/// (`nhwc`), before the NCHW convolutions' fusions.
pub fn optimize_for_cpu(g: &mut Graph) {
    rewrite(g, true);
}

fn rewrite(g: &mut Graph, nhwc: bool) {
    qdq::fuse_qdq(g);
    transposes::cancel_transposes(g);
    fold_constants(g);
    if fold_shapes(g) > 0 {
        fold_constants(g);
    }
    fold_batch_norm(g);
    fuse_gelu(g);
    remove_dead(g);
    fuse_matmul_bias(g);
    fuse_residual_add(g);
    fuse_activations(g);
    if nhwc {
        nhwc_convolutions(g);
        pack_matmul_weights(g);
    }
    fuse_pointwise_depthwise(g);
    remove_dead(g);
}

/// The only node reading `v`, when exactly one node does and `v` is not a graph output.
pub(crate) fn sole_reader(g: &Graph, uses: &[usize], v: usize) -> Option<usize> {
    if uses[v] != 1 || g.outputs.contains(&v) {
        return None;
    }
    g.nodes.iter().position(|n| n.inputs.contains(&Some(v)))
}
