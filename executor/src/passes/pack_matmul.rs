//! Packs the constant weights of a matrix product (a MatMul `x · W`, W a 2-D f32 initializer, as
//! in every transformer projection, or a Gemm `x · Wᵀ + b`, as PyTorch exports a Linear layer of
//! 2-D input) once, in the order the NHWC convolution tile reads them: the product then runs as
//! a 1x1 convolution over `x`'s rows (`nhwc_conv::matmul_packed`) instead of a GEMM that packs W
//! again on every call. The node becomes a MatMul holding W packed in place of its input (a
//! Gemm's `β·C` its fused bias), and W's ONNX copy is freed as soon as nothing else reads it, so
//! loading never holds all the weights twice. CPU only, where the NHWC kernel runs.

use crate::graph::{Graph, ValueId};
use crate::ops::Op;
use crate::tensor::{DType, Tensor};
use cotenant_kernels::nhwc_conv::{self, NhwcFilter};
use std::collections::HashMap;
use std::sync::Arc;

pub fn pack_matmul_weights(g: &mut Graph) {
    if !nhwc_conv::available() {
        return;
    }
    // Shape inference, for Gemms only, once the first is met.
    let mut ranks = None;
    let mut uses = g.use_counts();
    // A weight several products read is packed once (per orientation).
    let mut packs: HashMap<(ValueId, bool), Arc<NhwcFilter>> = HashMap::new();
    for i in 0..g.nodes.len() {
        let Some(product) = product(g, i, &mut ranks) else {
            continue;
        };
        let w = &g.constants[&product.weight];
        let Ok(values) = w.as_f32() else {
            continue;
        };
        let (k, n) = (product.k, product.n);
        let pack = packs
            .entry((product.weight, product.trans_b))
            .or_insert_with(|| {
                Arc::new(match product.trans_b {
                    true => NhwcFilter::new(values, n, k, 1, 1),
                    false => NhwcFilter::of_matrix(values, k, n),
                })
            })
            .clone();
        let node = &mut g.nodes[i];
        node.op = Op::MatMul {
            act: product.act,
            packed: Some(pack),
        };
        let mut released = vec![product.weight];
        node.inputs[1] = None;
        if let Some(bias) = product.bias {
            released.extend(node.inputs.get(2).copied().flatten());
            let b = match bias {
                Bias::None => None,
                Bias::Keep(b) => Some(b),
                Bias::New(values) => {
                    let b = g.add_value(format!("packed_bias_{}", g.value_names.len()));
                    let t = Tensor::f32(vec![n], values).expect("n values");
                    g.constants.insert(b, Arc::new(t));
                    uses.push(0);
                    Some(b)
                }
            };
            let node = &mut g.nodes[i];
            node.inputs.truncate(2);
            if let Some(b) = b {
                node.inputs.push(Some(b));
                uses[b] += 1;
            }
        }
        for v in released {
            uses[v] -= 1;
            if uses[v] == 0 {
                g.constants.remove(&v);
            }
        }
    }
}

/// A product of node inputs by a constant matrix that can run packed.
struct Product {
    weight: ValueId,
    /// Whether the weight is stored `[n, k]` (a Gemm's `transB`).
    trans_b: bool,
    k: usize,
    n: usize,
    act: Option<crate::ops::Activation>,
    /// A Gemm's bias as the MatMul's fused one; `None` for a MatMul, which keeps its own.
    bias: Option<Bias>,
}

/// What a Gemm's `β·C` becomes.
enum Bias {
    None,
    /// C itself: already one value per column, and β = 1.
    Keep(ValueId),
    New(Vec<f32>),
}

/// Node `i` as a [`Product`]: a MatMul, or a Gemm whose A is proven 2-D, not transposed, with
/// α = 1 and C absent or a constant with one value, or one per column.
fn product(g: &Graph, i: usize, ranks: &mut Option<HashMap<ValueId, usize>>) -> Option<Product> {
    let node = &g.nodes[i];
    let (act, trans_b, gemm) = match &node.op {
        Op::MatMul { act, packed: None } => (*act, false, None),
        Op::Gemm(a) if !a.trans_a && a.alpha == 1.0 => (a.act, a.trans_b, Some(a.beta)),
        _ => return None,
    };
    let weight = node.inputs.get(1).copied().flatten()?;
    let w = g.constants.get(&weight)?;
    let (&[rows, cols], DType::F32) = (w.shape.as_slice(), w.dtype()) else {
        return None;
    };
    let (k, n) = if trans_b { (cols, rows) } else { (rows, cols) };
    if k == 0 || n == 0 {
        return None;
    }
    let bias = match gemm {
        None => None,
        Some(beta) => {
            let x = node.inputs.first().copied().flatten()?;
            let ranks = ranks.get_or_insert_with(|| super::shapes::known_ranks(g));
            if ranks.get(&x) != Some(&2) {
                return None;
            }
            Some(gemm_bias(
                g,
                node.inputs.get(2).copied().flatten(),
                beta,
                n,
            )?)
        }
    };
    Some(Product {
        weight,
        trans_b,
        k,
        n,
        act,
        bias,
    })
}

/// A Gemm's `β·C` as one value per column, where C is absent or constant with one value or one
/// per column (`[n]`, `[1, n]`); `None` for any other C.
fn gemm_bias(g: &Graph, c: Option<ValueId>, beta: f32, n: usize) -> Option<Bias> {
    let Some(c) = c.filter(|_| beta != 0.0) else {
        return Some(Bias::None);
    };
    let t = g.constants.get(&c)?;
    let values = t.as_f32().ok()?;
    let per_column = t.shape.iter().rev().skip(1).all(|&d| d == 1);
    match values.len() {
        len if len == n && t.shape == [n] && beta == 1.0 => Some(Bias::Keep(c)),
        len if len == n && per_column => Some(Bias::New(values.iter().map(|v| beta * v).collect())),
        1 => Some(Bias::New(vec![beta * values[0]; n])),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::CpuBackend;
    use crate::graph::Graph;
    use crate::ops::Op;
    use crate::plan::Plan;
    use crate::proto::ModelProto;
    use crate::tensor::{DType, Tensor};
    use crate::zoo::builder::{Builder, attr_float, attr_int, value_info};
    use prost::Message;

    /// `graph` planned as it is and optimised for the CPU; `None` where the CPU lacks the
    /// kernel (the test is then skipped).
    fn plans(graph: fn() -> Graph) -> Option<(Plan, Plan)> {
        if !cotenant_kernels::nhwc_conv::available() {
            eprintln!("skipped: this CPU lacks AVX-512F and AVX2, which the packed MatMul needs");
            return None;
        }
        let raw = Plan::build(&graph()).expect("plan");
        let mut g = graph();
        crate::passes::optimize_for_cpu(&mut g);
        Some((raw, Plan::build(&g).expect("plan")))
    }

    /// Both plans give the same output, within rounding, for input `x` of `[batch] + dims` at
    /// batches 1 and 3.
    fn outputs_agree(raw: &Plan, plan: &Plan, dims: &[usize]) {
        let be = CpuBackend::new(2);
        for batch in [1, 3] {
            let shape: Vec<usize> = [batch].iter().chain(dims).copied().collect();
            let x: Vec<f32> = (0..shape.iter().product())
                .map(|i| (i % 13) as f32 / 6.0 - 1.0)
                .collect();
            let input = || {
                vec![(
                    "x".to_string(),
                    Tensor::f32(shape.clone(), x.clone()).unwrap(),
                )]
            };
            let want = raw.run(&be, input()).expect("raw runs");
            let got = plan.run(&be, input()).expect("packed runs");
            let (a, b) = (want[0].1.as_f32().unwrap(), got[0].1.as_f32().unwrap());
            assert_eq!(want[0].1.shape, got[0].1.shape);
            for (p, q) in a.iter().zip(b) {
                assert!((p - q).abs() <= 1e-4 * (1.0 + p.abs()), "{p} vs {q}");
            }
        }
    }

    /// `q = relu(x · W + b) · W`, then `y = q · V + V`: W is read by two MatMuls, V by a
    /// MatMul and an Add.
    fn graph() -> Graph {
        let mut m = Builder::new(5, false);
        let w = m.normal("w", &[24, 24], 0.3);
        let b = m.normal("b", &[24], 0.1);
        let v = m.normal("v", &[24, 40], 0.3);
        let p = m.node("MatMul", &["x", &w], vec![]);
        let s = m.node("Add", &[&p, &b], vec![]);
        let r = m.node("Relu", &[&s], vec![]);
        let q = m.node("MatMul", &[&r, &w], vec![]);
        let t = m.node("MatMul", &[&q, &v], vec![]);
        let y = m.node("Add", &[&t, &v], vec![]);
        m.node_rename_last(&y, "y");
        let proto: ModelProto = m.finish(
            "packed",
            13,
            vec![value_info("x", DType::F32, &[None, Some(24), Some(24)])],
            vec![value_info("y", DType::F32, &[None, Some(24), Some(40)])],
        );
        crate::import::import(&proto.encode_to_vec(), None).expect("imports")
    }

    #[test]
    fn matmuls_by_constant_weights_run_packed_and_hold_them_once() {
        let Some((raw, plan)) = plans(graph) else {
            return;
        };
        let matmuls: Vec<_> = plan
            .steps
            .iter()
            .filter_map(|s| match &s.op {
                Op::MatMul { packed, act } => Some((s, packed.clone(), act.is_some())),
                _ => None,
            })
            .collect();
        assert_eq!(matmuls.len(), 3, "{:?}", plan.steps);
        assert!(matmuls.iter().all(|(_, p, _)| p.is_some()), "all packed");
        assert!(
            matmuls[0].2 && matmuls[0].0.inputs.len() == 3,
            "bias and Relu fused"
        );
        // The two MatMuls by W share one packed copy. Each MatMul holds its weights packed
        // only; W's ONNX copy is gone, V's is kept for the Add.
        assert!(std::sync::Arc::ptr_eq(
            matmuls[0].1.as_ref().unwrap(),
            matmuls[1].1.as_ref().unwrap()
        ));
        assert!(matmuls.iter().all(|(s, _, _)| s.inputs[1].is_none()));
        let shapes: Vec<&[usize]> = plan.constants.iter().map(|t| &t.shape[..]).collect();
        assert!(!shapes.contains(&&[24, 24][..]), "{shapes:?}");
        assert!(shapes.contains(&&[24, 40][..]), "{shapes:?}");
        // Requests still batch: the rows stay apart.
        assert_eq!(plan.separable_batch, raw.separable_batch);
        assert!(plan.separable_batch.is_some());
        outputs_agree(&raw, &plan, &[24, 24]);
        // The wrong shape of rows is an error, not a crash.
        let bad = vec![(
            "x".to_string(),
            Tensor::f32(vec![1, 24, 23], vec![0.0; 552]).unwrap(),
        )];
        assert!(plan.run(&CpuBackend::new(1), bad).is_err());
    }

    /// `y = (relu(x · Wᵀ + b) · V + 0.5·C) · U` as Gemms (PyTorch's Linear layers), x `[N, 24]`:
    /// the first two run packed, the third (α = 2) stays a Gemm.
    fn gemms() -> Graph {
        let mut m = Builder::new(6, false);
        let w = m.normal("w", &[40, 24], 0.3);
        let b = m.normal("b", &[40], 0.1);
        let v = m.normal("v", &[40, 16], 0.3);
        let c = m.normal("c", &[1, 16], 0.1);
        let u = m.normal("u", &[16, 8], 0.3);
        let p = m.node("Gemm", &["x", &w, &b], vec![attr_int("transB", 1)]);
        let r = m.node("Relu", &[&p], vec![]);
        let q = m.node("Gemm", &[&r, &v, &c], vec![attr_float("beta", 0.5)]);
        let y = m.node("Gemm", &[&q, &u], vec![attr_float("alpha", 2.0)]);
        m.node_rename_last(&y, "y");
        let proto: ModelProto = m.finish(
            "gemms",
            13,
            vec![value_info("x", DType::F32, &[None, Some(24)])],
            vec![value_info("y", DType::F32, &[None, Some(8)])],
        );
        crate::import::import(&proto.encode_to_vec(), None).expect("imports")
    }

    #[test]
    fn gemms_by_constant_weights_run_packed_with_their_bias() {
        let Some((raw, plan)) = plans(gemms) else {
            return;
        };
        let names: Vec<String> = plan.steps.iter().map(|s| s.op.name()).collect();
        assert_eq!(names, ["MatMul(packed)+Relu", "MatMul(packed)", "Gemm"]);
        assert!(
            plan.steps[..2]
                .iter()
                .all(|s| s.inputs[1].is_none() && s.inputs.len() == 3)
        );
        assert_eq!(plan.separable_batch, raw.separable_batch);
        outputs_agree(&raw, &plan, &[24]);
    }
}
