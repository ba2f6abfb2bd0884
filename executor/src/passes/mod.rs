//! Graph rewrite passes, run in order by [`optimize`]: Identity nodes removed, quantized (QDQ)
//! patterns to integer ops, the NCHW/NHWC transposes between them cancelled, constant folding
//! (shape subgraphs included, under symbolic dimensions), constant bias Adds and BatchNorm
//! folded into the producing Conv, Erf-form GELU, written-out hard-swish and RMS normalisation
//! (on the CPU, SiLU too) recognised, (on the CPU) a scalar scaling of Softmax's input folded into it, constant
//! bias fused into MatMul, residual Adds fused into the producing Conv, activations fused into
//! the producing Conv/Gemm/MatMul, a 1x1 Conv fused into the depthwise Conv after it and then
//! the 1x1 Conv after the pair (MobileNet's whole inverted residual block), dead-node removal.
//! On the CPU, chains of convolutions go NHWC and MatMuls by constant matrices hold them
//! packed.
mod bias;
mod bn_fold;
mod dce;
mod fold;
mod fuse;
mod gelu;
mod half_as_float;
mod hard_swish;
mod identity;
mod integer_products;
mod nhwc;
mod pack_matmul;
mod pointwise_depthwise;
mod qdq;
mod residual;
mod rms_norm;
mod scaled_softmax;
mod shapes;
mod swish;
#[cfg(test)]
mod test_graph;
mod transposes;

pub use bias::{fold_conv_bias, fuse_matmul_bias};
pub use bn_fold::fold_batch_norm;
pub use dce::remove_dead;
pub use fold::fold_constants;
pub use fuse::fuse_activations;
pub use gelu::fuse_gelu;
pub use half_as_float::compute_half_in_float;
pub use hard_swish::fuse_hard_swish;
pub use identity::remove_identities;
pub use nhwc::nhwc_convolutions;
pub use pack_matmul::pack_matmul_weights;
pub use pointwise_depthwise::fuse_pointwise_depthwise;
pub use residual::fuse_residual_add;
pub use rms_norm::fuse_rms_norm;
pub use scaled_softmax::fuse_scaled_softmax;
pub use shapes::{batch_refusal, fold_shapes, separable_batch};
pub use swish::fuse_swish;

use crate::graph::{Graph, Node};
use crate::ops::{Op, elementwise::Binary};

/// The layout-neutral rewrites: what a GPU plan runs.
pub fn optimize(g: &mut Graph) {
    rewrite(g, false);
}

/// [`optimize`], with SiLU fused, and chains of convolutions made NHWC where this CPU has the
/// kernels (`nhwc`) before the NCHW convolutions' fusions.
pub fn optimize_for_cpu(g: &mut Graph) {
    rewrite(g, true);
}

fn rewrite(g: &mut Graph, cpu: bool) {
    if cpu {
        compute_half_in_float(g);
    }
    remove_identities(g);
    qdq::fuse_qdq(g);
    transposes::cancel_transposes(g);
    fold_constants(g);
    if fold_shapes(g) > 0 {
        fold_constants(g);
    }
    // Per-channel affine ops after a Conv, in whatever order they come (Paddle's Conv → bias
    // Add → BatchNorm, PP-LCNetV3's Conv → Mul → Add), fold into its weights and bias.
    while fold_conv_bias(g) + fold_batch_norm(g) > 0 {}
    fuse_gelu(g);
    fuse_hard_swish(g);
    fuse_rms_norm(g);
    if cpu {
        fuse_swish(g);
        fuse_scaled_softmax(g);
    }
    remove_dead(g);
    fuse_matmul_bias(g);
    fuse_residual_add(g);
    fuse_activations(g);
    if cpu {
        nhwc_convolutions(g);
        pack_matmul_weights(g);
    }
    fuse_pointwise_depthwise(g);
    remove_dead(g);
}

/// The node producing `v`.
pub(crate) fn producer(g: &Graph, v: usize) -> Option<usize> {
    g.nodes.iter().position(|n| n.outputs.contains(&v))
}

/// The only node reading `v`, when exactly one node does and `v` is not a graph output.
pub(crate) fn sole_reader(g: &Graph, uses: &[usize], v: usize) -> Option<usize> {
    if uses[v] != 1 || g.outputs.contains(&v) {
        return None;
    }
    g.nodes.iter().position(|n| n.inputs.contains(&Some(v)))
}

/// The Add that alone reads `v` (no graph output), with its other operand: `(its index, the
/// operand)`.
pub(crate) fn add_reading(g: &Graph, v: usize) -> Option<(usize, Option<usize>)> {
    let j = sole_reader(g, &g.use_counts(), v)?;
    let add = &g.nodes[j];
    if add.op != Op::Binary(Binary::Add) || add.outputs.len() != 1 {
        return None;
    }
    Some((j, other(add, v)?))
}

/// Whether op `n` computes each output element from the same element of its inputs
/// (broadcast alike), so that it gives the same values on inputs and constants all transposed
/// alike.
pub(crate) fn elementwise(n: &Node) -> bool {
    matches!(
        &n.op,
        Op::Unary(_) | Op::Binary(_) | Op::Variadic(..) | Op::Clip { .. }
    ) && n.outputs.len() == 1
}

/// The value of a one-element constant, as f32.
pub(crate) fn scalar(g: &Graph, v: Option<usize>) -> Option<f32> {
    let t = g.constants.get(&v?)?;
    (t.len() == 1).then(|| t.to_f64_vec()[0] as f32)
}

/// Whether a pattern's constant is `b`, to the precision exporters write it with.
pub(crate) fn near(a: Option<f32>, b: f32) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-4)
}

/// The other input of a binary node whose one input is `v`.
pub(crate) fn other(n: &Node, v: usize) -> Option<Option<usize>> {
    match n.inputs.as_slice() {
        [a, b] if *a == Some(v) => Some(*b),
        [a, b] if *b == Some(v) => Some(*a),
        _ => None,
    }
}

/// Asserts that `rewritten` computes what `raw` does on `inputs`: every output's shape, and its
/// values within `tol` relative.
#[cfg(test)]
pub(crate) fn assert_same_outputs(
    raw: &Graph,
    rewritten: &Graph,
    inputs: &[(String, crate::tensor::Tensor)],
    tol: f32,
) {
    use crate::{backend::CpuBackend, plan::Plan};
    let be = CpuBackend::new(2);
    let run = |g: &Graph| {
        let plan = Plan::build(g).expect("plan");
        plan.run(&be, inputs.to_vec()).expect("runs")
    };
    let (want, got) = (run(raw), run(rewritten));
    assert_eq!(want.len(), got.len());
    for ((n, a), (_, b)) in want.iter().zip(&got) {
        assert_eq!(a.shape, b.shape, "{n}");
        let (a, b) = (a.as_f32().expect("f32"), b.as_f32().expect("f32"));
        for (p, q) in a.iter().zip(b) {
            assert!((p - q).abs() <= tol * (1.0 + p.abs()), "{n}: {p} vs {q}");
        }
    }
}
