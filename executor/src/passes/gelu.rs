//! Recognises GELU written out — with Erf, `x·0.5·(1 + erf(x/√2))` in either multiplication
//! order, with `/√2` or `·(1/√2)`, or with Tanh, `x·0.5·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`
//! with its products and the cube in any order and grouping (PyTorch's and Hugging Face's
//! `pow(x, 3)`, JAX's `x·(x·(0.044715·x))`) — and replaces it by one Gelu op (the Erf form can
//! then fuse into a MatMul).

use super::{near, other, scalar, sole_reader};
use crate::graph::{Graph, Node, ValueId};
use crate::ops::{
    Op,
    elementwise::{Binary, Unary},
};
use std::collections::HashMap;

pub fn fuse_gelu(g: &mut Graph) {
    let tanh_op = Op::Unary(Unary::Tanh);
    let ranks = match g.nodes.iter().any(|n| n.op == tanh_op) {
        true => super::shapes::known_ranks(g),
        false => HashMap::new(),
    };
    let mut i = 0;
    while i < g.nodes.len() {
        let erf = matches_at(g, i).map(|m| (m, false));
        let tanh = || tanh_matches_at(g, &ranks, i).map(|m| (m, true));
        if let Some(((last, x), approximate)) = erf.or_else(tanh) {
            let out = g.nodes[last].outputs[0];
            let name = format!("{}_gelu", g.nodes[last].name);
            // The final node becomes the Gelu; the rest of the pattern is dead and removed later.
            g.nodes[last] = Node {
                name,
                op: Op::Unary(Unary::Gelu(approximate)),
                inputs: vec![Some(x)],
                outputs: vec![out],
            };
        }
        i += 1;
    }
}

/// If node `i` is the Erf of a GELU pattern, the index of the pattern's last node and `x`.
fn matches_at(g: &Graph, i: usize) -> Option<(usize, usize)> {
    let erf = &g.nodes[i];
    if erf.op != Op::Unary(Unary::Erf) {
        return None;
    }
    let producers = g.producers();
    let uses = g.use_counts();
    let scaled = erf.inputs.first().copied().flatten()?;
    let d = &g.nodes[producers[scaled]?];
    let x = d.inputs.first().copied().flatten()?;
    let ok = match d.op {
        Op::Binary(Binary::Div) => near(
            scalar(g, d.inputs.get(1).copied().flatten()),
            std::f32::consts::SQRT_2,
        ),
        Op::Binary(Binary::Mul) => near(scalar(g, other(d, x)?), std::f32::consts::FRAC_1_SQRT_2),
        _ => false,
    };
    if !ok || uses[scaled] != 1 {
        return None;
    }
    let add_i = sole_reader(g, &uses, erf.outputs[0])?;
    let add = &g.nodes[add_i];
    if add.op != Op::Binary(Binary::Add) || !near(scalar(g, other(add, erf.outputs[0])?), 1.0) {
        return None;
    }
    let m1_i = sole_reader(g, &uses, add.outputs[0])?;
    let m1 = &g.nodes[m1_i];
    if m1.op != Op::Binary(Binary::Mul) {
        return None;
    }
    let p = other(m1, add.outputs[0])??;
    if p == x {
        // x·(1+erf) then ·0.5
        let m2_i = sole_reader(g, &uses, m1.outputs[0])?;
        let m2 = &g.nodes[m2_i];
        (m2.op == Op::Binary(Binary::Mul) && near(scalar(g, other(m2, m1.outputs[0])?), 0.5))
            .then_some((m2_i, x))
    } else {
        // (x·0.5)·(1+erf)
        let h = &g.nodes[producers[p]?];
        (h.op == Op::Binary(Binary::Mul)
            && uses[p] == 1
            && other(h, x).is_some_and(|c| near(scalar(g, c), 0.5)))
        .then_some((m1_i, x))
    }
}

/// `√(2/π)`, the tanh form's scale.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// A polynomial in one value `x` (none where it is a constant) of degree at most 3, as its
/// coefficients.
#[derive(Clone, Copy)]
struct Poly {
    x: Option<ValueId>,
    c: [f32; 4],
}

impl Poly {
    fn constant(c: f32) -> Poly {
        Poly {
            x: None,
            c: [c, 0.0, 0.0, 0.0],
        }
    }

    /// Both in the same value, when they have one.
    fn common(a: Poly, b: Poly) -> Option<Option<ValueId>> {
        match (a.x, b.x) {
            (Some(x), Some(y)) if x != y => None,
            (x, y) => Some(x.or(y)),
        }
    }

    fn add(a: Poly, b: Poly) -> Option<Poly> {
        let x = Poly::common(a, b)?;
        Some(Poly {
            x,
            c: std::array::from_fn(|k| a.c[k] + b.c[k]),
        })
    }

    fn mul(a: Poly, b: Poly) -> Option<Poly> {
        let x = Poly::common(a, b)?;
        let mut c = [0.0; 4];
        for (i, &p) in a.c.iter().enumerate().filter(|(_, p)| **p != 0.0) {
            for (j, &q) in b.c.iter().enumerate().filter(|(_, q)| **q != 0.0) {
                *c.get_mut(i + j)? += p * q;
            }
        }
        Some(Poly { x, c })
    }
}

/// What `v` computes as a polynomial: through the Mul, Add and Pow (by 3) nodes that alone read
/// their operands, down to scalar constants (of a rank at most `rank`) and the value they
/// share, which is read more often (the GELU's input).
fn polynomial(g: &Graph, uses: &[usize], v: ValueId, rank: usize, depth: usize) -> Option<Poly> {
    if let Some(t) = g.constants.get(&v) {
        return (t.rank() <= rank).then(|| scalar(g, Some(v)).map(Poly::constant))?;
    }
    let variable = Poly {
        x: Some(v),
        c: [0.0, 1.0, 0.0, 0.0],
    };
    let Some(n) = g.nodes.iter().find(|n| n.outputs.contains(&v)) else {
        return Some(variable);
    };
    if uses[v] != 1 || depth == 0 || n.inputs.len() != 2 {
        return Some(variable);
    }
    let operand = |k: usize| polynomial(g, uses, n.inputs[k]?, rank, depth - 1);
    match n.op {
        Op::Binary(Binary::Mul) => Poly::mul(operand(0)?, operand(1)?),
        Op::Binary(Binary::Add) => Poly::add(operand(0)?, operand(1)?),
        Op::Binary(Binary::Pow)
            if near(scalar(g, n.inputs[1]), 3.0)
                && polynomial(g, uses, n.inputs[1]?, rank, 0).is_some() =>
        {
            let x = operand(0)?;
            Poly::mul(Poly::mul(x, x)?, x)
        }
        _ => Some(variable),
    }
}

/// If node `i` is the Tanh of a GELU written with it, the index of the pattern's last node and
/// `x`. Its constants must not broadcast `x` to a higher rank (`ranks`, where known).
fn tanh_matches_at(g: &Graph, ranks: &HashMap<ValueId, usize>, i: usize) -> Option<(usize, usize)> {
    let tanh = &g.nodes[i];
    if tanh.op != Op::Unary(Unary::Tanh) {
        return None;
    }
    let uses = &g.use_counts();
    let u = tanh.inputs.first().copied().flatten()?;
    // Find `x` with constants of any rank, then read the pattern again with those of `x`'s.
    let x = polynomial(g, uses, u, usize::MAX, 8)?.x?;
    let rank = *ranks.get(&x)?;
    let inner = polynomial(g, uses, u, rank, 8)?;
    let [c0, c1, c2, c3] = inner.c;
    let cubic = inner.x == Some(x) && c0 == 0.0 && c2 == 0.0;
    if !cubic || !near(Some(c1), SQRT_2_OVER_PI) || !near(Some(c3 / c1), 0.044715) {
        return None;
    }
    let add = &g.nodes[sole_reader(g, uses, tanh.outputs[0])?];
    let one = other(add, tanh.outputs[0])?;
    let constant_rank = g.constants.get(&one?).map(|t| t.rank());
    if add.op != Op::Binary(Binary::Add) || constant_rank? > rank || !near(scalar(g, one), 1.0) {
        return None;
    }
    // Then products by `x` and constants (alone or as a product of their own) to `0.5·x`.
    let (mut at, mut factor) = (add.outputs[0], Poly::constant(1.0));
    for _ in 0..3 {
        let m = sole_reader(g, uses, at)?;
        let mul = &g.nodes[m];
        if mul.op != Op::Binary(Binary::Mul) || mul.outputs.len() != 1 {
            return None;
        }
        let by = other(mul, at)??;
        factor = Poly::mul(factor, polynomial(g, uses, by, rank, 2)?)?;
        at = mul.outputs[0];
        let [f0, f1, f2, f3] = factor.c;
        if factor.x == Some(x) && f0 == 0.0 && f2 == 0.0 && f3 == 0.0 && near(Some(f1), 0.5) {
            return Some((m, x));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::super::test_graph::{G, run_both, t};
    use super::*;
    use crate::tensor::{DType, Data, Tensor};

    /// The tanh GELU of `x` `[batch, 6]` as exporters write it: JAX's (`jax`), else PyTorch's
    /// `0.5·x` first and `pow(x, 3)`; `cube` is the cube's coefficient.
    fn tanh_gelu(jax: bool, cube: f32) -> crate::graph::Graph {
        let mut g = G::new();
        let x = g.input("x", DType::F32, &[1, 6]);
        let c = |g: &mut G, v: f32| g.constant(Tensor::scalar_f32(v));
        let (k, s, one, half) = (
            c(&mut g, cube),
            c(&mut g, SQRT_2_OVER_PI),
            c(&mut g, 1.0),
            c(&mut g, 0.5),
        );
        let mul = |g: &mut G, a: usize, b: usize| g.node("Mul", &[Some(a), Some(b)], 1, vec![])[0];
        let y = if jax {
            let a = mul(&mut g, k, x);
            let b = mul(&mut g, x, a);
            let cubed = mul(&mut g, x, b);
            let sum = g.node("Add", &[Some(x), Some(cubed)], 1, vec![])[0];
            let inner = mul(&mut g, s, sum);
            let th = g.node("Tanh", &[Some(inner)], 1, vec![])[0];
            let plus = g.node("Add", &[Some(one), Some(th)], 1, vec![])[0];
            let halved = mul(&mut g, half, plus);
            mul(&mut g, x, halved)
        } else {
            let hx = mul(&mut g, x, half);
            let three = c(&mut g, 3.0);
            let p = g.node("Pow", &[Some(x), Some(three)], 1, vec![])[0];
            let kp = mul(&mut g, p, k);
            let sum = g.node("Add", &[Some(x), Some(kp)], 1, vec![])[0];
            let inner = mul(&mut g, sum, s);
            let th = g.node("Tanh", &[Some(inner)], 1, vec![])[0];
            let plus = g.node("Add", &[Some(th), Some(one)], 1, vec![])[0];
            mul(&mut g, hx, plus)
        };
        g.output(y)
    }

    fn inputs() -> Vec<(String, Tensor)> {
        let x = vec![-4.0, -1.5, -0.3, 0.0, 0.7, 3.2];
        vec![("x".into(), t(&[1, 6], Data::F32(x)))]
    }

    #[test]
    fn tanh_gelus_as_exporters_write_them_become_one_op() {
        for jax in [true, false] {
            let (names, want, got) = run_both(tanh_gelu(jax, 0.044715), &inputs);
            assert_eq!(names, ["Gelu(true)"], "jax {jax}");
            let (want, got) = (want.as_f32().unwrap(), got.as_f32().unwrap());
            for (w, g) in want.iter().zip(got) {
                assert!((w - g).abs() <= 1e-6 * w.abs().max(1.0), "{want:?} {got:?}");
            }
        }
        // Another cube coefficient is another function: left as it is.
        let (names, want, got) = run_both(tanh_gelu(true, 0.05), &inputs);
        assert!(names.contains(&"Tanh".to_string()), "{names:?}");
        assert_eq!(want, got);
    }
}
