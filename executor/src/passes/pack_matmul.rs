//! Packs the constant weights of a MatMul (`x · W`, W a 2-D f32 initializer, as in every
//! transformer projection) once, in the order the NHWC convolution tile reads them: the product
//! then runs as a 1x1 convolution over `x`'s rows (`nhwc_conv::matmul_packed`) instead of a GEMM
//! that packs W again on every call. The MatMul then holds W packed in place of its input, and
//! W's ONNX copy is freed as soon as nothing else reads it, so loading never holds all the
//! weights twice. CPU only, where the NHWC kernel runs.

use crate::graph::Graph;
use crate::ops::Op;
use crate::tensor::DType;
use cotenant_kernels::nhwc_conv::{self, NhwcFilter};
use std::collections::HashMap;
use std::sync::Arc;

pub fn pack_matmul_weights(g: &mut Graph) {
    if !nhwc_conv::available() {
        return;
    }
    let mut uses = g.use_counts();
    // A weight several MatMuls read is packed once.
    let mut packs: HashMap<usize, Arc<NhwcFilter>> = HashMap::new();
    for n in &mut g.nodes {
        let Op::MatMul { packed, .. } = &mut n.op else {
            continue;
        };
        let Some(id) = n.inputs.get(1).copied().flatten() else {
            continue;
        };
        let Some(w) = g.constants.get(&id).filter(|_| packed.is_none()) else {
            continue;
        };
        let (&[k, cols], DType::F32) = (w.shape.as_slice(), w.dtype()) else {
            continue;
        };
        let Ok(values) = w.as_f32() else {
            continue;
        };
        if k == 0 || cols == 0 {
            continue;
        }
        let pack = packs
            .entry(id)
            .or_insert_with(|| Arc::new(NhwcFilter::of_matrix(values, k, cols)));
        *packed = Some(pack.clone());
        n.inputs[1] = None;
        uses[id] -= 1;
        if uses[id] == 0 {
            g.constants.remove(&id);
        }
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
    use crate::zoo::builder::{Builder, value_info};
    use prost::Message;

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
        if !cotenant_kernels::nhwc_conv::available() {
            eprintln!("skipped: this CPU lacks AVX-512F and AVX2, which the packed MatMul needs");
            return;
        }
        let raw = Plan::build(&graph()).expect("plan");
        let mut g = graph();
        crate::passes::optimize_for_cpu(&mut g);
        let plan = Plan::build(&g).expect("plan");
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
        let be = CpuBackend::new(2);
        for batch in [1, 3] {
            let x: Vec<f32> = (0..batch * 576)
                .map(|i| (i % 13) as f32 / 6.0 - 1.0)
                .collect();
            let input = || {
                vec![(
                    "x".to_string(),
                    Tensor::f32(vec![batch, 24, 24], x.clone()).unwrap(),
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
        // The wrong shape of rows is an error, not a crash.
        let bad = vec![(
            "x".to_string(),
            Tensor::f32(vec![1, 24, 23], vec![0.0; 552]).unwrap(),
        )];
        assert!(plan.run(&be, bad).is_err());
    }
}
