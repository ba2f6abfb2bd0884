//! float16 models computed in float32 between their inputs and outputs, as onnxruntime's CPU
//! computes them: for nearly every op its CPU has only a float32 kernel, so it casts each
//! float16 node's inputs up and its outputs down, then drops every float32 → float16 →
//! float32 pair of casts between two such nodes and after a float32 input (a model converted
//! with `keep_io_types` rounds to float16 only around the few ops with float16 kernels). Rounding every op's output
//! to float16 instead, as the ops alone do, leaves a model's values a few float16 steps from
//! onnxruntime's after each layer, overflows where float32 does not (randomly initialised
//! Inception v3: NaN) and loses what falls below float16's smallest normal value (randomly
//! initialised MobileNetV3: every activation), and converts every value twice an op.
//!
//! Float16 inputs are cast up on entry, float16 constants and the element types ops are told
//! to produce (`Cast`, `ConstantOfShape`, `EyeLike`, `DequantizeLinear`, windows,
//! `MelWeightMatrix`) become float32, and outputs the model declares float16 are cast down on
//! exit. Graphs with subgraphs (whose bodies declare their own types) or bit casts are left
//! as they are.

use crate::graph::{Graph, Node};
use crate::ops::elementwise::cast;
use crate::ops::{Op, quant::QuantOp, shape::ShapeOp};
use crate::tensor::DType;
use std::collections::HashMap;
use std::sync::Arc;

/// Rewrites `g` to compute its float16 values in float32; returns whether it changed it.
pub fn compute_half_in_float(g: &mut Graph) -> bool {
    let eligible = g.output_dtypes.len() == g.outputs.len()
        && g.output_dtypes.iter().all(Option::is_some)
        && !g
            .nodes
            .iter()
            .any(|n| matches!(n.op, Op::Control(_) | Op::BitCast { .. }));
    if !eligible {
        return false;
    }
    let mut changed = g.inputs.iter().any(|i| i.dtype == DType::F16);
    for t in g.constants.values_mut() {
        if t.dtype() == DType::F16 {
            *t = Arc::new(cast(t, DType::F32));
            changed = true;
        }
    }
    for n in &mut g.nodes {
        changed |= widen(&mut n.op);
    }
    if !changed {
        return false;
    }
    // Inputs: read through a cast up, by every node.
    let mut entry = Vec::new();
    let mut widened: HashMap<usize, usize> = HashMap::new();
    for i in 0..g.inputs.len() {
        if g.inputs[i].dtype != DType::F16 {
            continue;
        }
        let (v, name) = (g.inputs[i].value, g.inputs[i].name.clone());
        let up = g.add_value(format!("{name}/float32"));
        widened.insert(v, up);
        entry.push(cast_node(format!("{name}/to_float32"), v, DType::F32, up));
    }
    for n in &mut g.nodes {
        for v in n.inputs.iter_mut().flatten() {
            if let Some(&up) = widened.get(v) {
                *v = up;
            }
        }
    }
    entry.append(&mut g.nodes);
    g.nodes = entry;
    // Outputs declared float16: the value computed in float32 is renamed, and a cast down
    // takes the output's name (a float16 input given back as it is needs none).
    let mut narrowed: HashMap<usize, usize> = HashMap::new();
    for k in 0..g.outputs.len() {
        let v = g.outputs[k];
        if g.output_dtypes[k] != Some(DType::F16) || g.inputs.iter().any(|i| i.value == v) {
            continue;
        }
        let down = match narrowed.get(&v) {
            Some(&down) => down,
            None => {
                let name = g.value_names[v].clone();
                g.value_names[v] = format!("{name}/float32");
                let down = g.add_value(name.clone());
                g.nodes
                    .push(cast_node(format!("{name}/to_float16"), v, DType::F16, down));
                narrowed.insert(v, down);
                down
            }
        };
        g.outputs[k] = down;
    }
    true
}

/// A Cast of value `from` to `to` into value `into`.
fn cast_node(name: String, from: usize, to: DType, into: usize) -> Node {
    Node {
        name,
        op: Op::Cast {
            to,
            mode: Default::default(),
        },
        inputs: vec![Some(from)],
        outputs: vec![into],
    }
}

/// Makes `op` produce float32 where it is told to produce float16; whether it was.
fn widen(op: &mut Op) -> bool {
    let f32_for = |d: &mut DType| {
        let half = *d == DType::F16;
        if half {
            *d = DType::F32;
        }
        half
    };
    match op {
        Op::Cast { to, .. } | Op::MelWeightMatrix { to } => f32_for(to),
        Op::Quant(QuantOp::Dequantize(a)) => a.output_dtype.as_mut().is_some_and(f32_for),
        Op::Shape(ShapeOp::EyeLike { dtype, .. }) => dtype.as_mut().is_some_and(f32_for),
        Op::Shape(ShapeOp::Window { dtype, .. }) => f32_for(dtype),
        Op::Shape(ShapeOp::ConstantOfShape { value }) => {
            let half = value.dtype() == DType::F16;
            if half {
                *value = cast(value, DType::F32);
            }
            half
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::CpuBackend;
    use crate::passes::test_graph::{G, attr_int, t};
    use crate::plan::Plan;
    use crate::tensor::{Data, Tensor};
    use half::f16;

    fn halves(v: &[f32]) -> Data {
        Data::F16(v.iter().map(|&x| f16::from_f32(x)).collect())
    }

    /// x (float16) · 1e-4 · 1e4, then a Cast to float16 and a Relu: the product's 1e-7 is a
    /// float16 subnormal, two bits of precision, where float32 keeps it.
    fn graph() -> Graph {
        let mut b = G::new();
        let x = b.input("x", DType::F16, &[1, 3]);
        let small = b.constant(t(&[1], halves(&[1e-4])));
        let large = b.constant(t(&[1], halves(&[1e4])));
        let a = b.node("Mul", &[Some(x), Some(small)], 1, vec![])[0];
        let c = b.node("Mul", &[Some(a), Some(large)], 1, vec![])[0];
        let h = b.node("Cast", &[Some(c)], 1, vec![attr_int("to", 10)])[0];
        let y = b.node("Relu", &[Some(h)], 1, vec![])[0];
        let mut g = b.output(y);
        g.output_dtypes = vec![Some(DType::F16)];
        g
    }

    fn run(g: &Graph) -> (String, Tensor) {
        let x = Tensor::new(vec![1, 3], halves(&[1e-3, 3e-3, -7e-3])).unwrap();
        let mut out = Plan::build(g)
            .unwrap()
            .run(&CpuBackend::new(1), vec![("x".into(), x)])
            .unwrap();
        out.remove(0)
    }

    #[test]
    fn float16_values_are_computed_in_float32_between_input_and_output() {
        let (name, per_op) = run(&graph());
        let mut g = graph();
        assert!(compute_half_in_float(&mut g));
        let (widened_name, widened) = run(&g);
        assert_eq!((name.as_str(), widened_name.as_str()), ("v6_0", "v6_0"));
        assert_eq!(widened.dtype(), DType::F16);
        let want = [1e-3f32, 3e-3, 0.0].map(|v| f16::from_f32(v).to_f32());
        let got: Vec<f32> = widened.to_f64_vec().iter().map(|&v| v as f32).collect();
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() <= w.abs() * 1e-3, "{got:?} vs {want:?}");
        }
        // Rounded to float16 after each op, the subnormal product is a quarter off.
        let off = per_op.to_f64_vec()[0] as f32;
        assert!((off - want[0]).abs() > 0.1 * want[0], "{off}");
        // Nothing of float16 in it: unchanged.
        let mut b = G::new();
        let x = b.input("x", DType::F32, &[1, 3]);
        let y = b.node("Relu", &[Some(x)], 1, vec![])[0];
        let mut g = b.output(y);
        g.output_dtypes = vec![Some(DType::F32)];
        assert!(!compute_half_in_float(&mut g));
        // An output without a declared type: left alone.
        let mut g = graph();
        g.output_dtypes = vec![None];
        assert!(!compute_half_in_float(&mut g));
    }
}
