//! Einsum on any number of operands, by numpy's rules: repeated labels in one operand take its
//! diagonal, labels of size 1 broadcast, `...` stands for the same number of axes in every
//! operand that has it (as ONNX requires), and labels absent from the output are summed. Operands are contracted left to
//! right, two at a time, each pair as one batched matrix product (float32 through the GEMM
//! kernel), after every label no later step needs has been summed out of each operand.

use super::index::each_index;
use super::{Cx, elementwise::Num};
use crate::error::{OpError, OpResult, shape_err};
use crate::ops::half_here;
use crate::tensor::{DType, Data, Tensor, checked_numel, strides};

/// Labels `a`–`z` and `A`–`Z` are 0..52; the axes under `...` are 52 on.
const ELLIPSIS_BASE: usize = 52;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Sub {
    Letter(u8),
    Ellipsis,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Einsum {
    equation: String,
    terms: Vec<Vec<Sub>>,
    /// The output's subscripts; in implicit mode (no `->`), the letters used once, sorted,
    /// after `...` when any operand has it.
    output: Vec<Sub>,
}

fn label(c: u8) -> usize {
    if c.is_ascii_lowercase() {
        (c - b'a') as usize
    } else {
        26 + (c - b'A') as usize
    }
}

fn letter_name(l: usize) -> char {
    match l {
        0..26 => (b'a' + l as u8) as char,
        26..ELLIPSIS_BASE => (b'A' + (l - 26) as u8) as char,
        _ => '.',
    }
}

impl Einsum {
    /// Parses the `equation` attribute; errors name what is wrong with it.
    pub fn parse(equation: &str) -> Result<Einsum, String> {
        let eq: String = equation.chars().filter(|c| *c != ' ').collect();
        let bad = |why: String| format!("Einsum equation {equation:?}: {why}");
        let term = |s: &str| -> Result<Vec<Sub>, String> {
            let mut out = Vec::new();
            let mut rest = s.as_bytes();
            while let Some(&c) = rest.first() {
                if rest.starts_with(b"...") {
                    if out.contains(&Sub::Ellipsis) {
                        return Err(bad(format!("{s:?} has two ellipses")));
                    }
                    out.push(Sub::Ellipsis);
                    rest = &rest[3..];
                } else if c.is_ascii_alphabetic() {
                    out.push(Sub::Letter(c));
                    rest = &rest[1..];
                } else {
                    return Err(bad(format!("unexpected {:?}", c as char)));
                }
            }
            Ok(out)
        };
        let (lhs, rhs) = match eq.split_once("->") {
            Some((l, r)) => (l, Some(r)),
            None => (eq.as_str(), None),
        };
        let terms = lhs.split(',').map(term).collect::<Result<Vec<_>, _>>()?;
        let letters = |t: &[Sub]| -> Vec<u8> {
            t.iter()
                .filter_map(|s| match s {
                    Sub::Letter(c) => Some(*c),
                    Sub::Ellipsis => None,
                })
                .collect()
        };
        let used: Vec<u8> = terms.iter().flat_map(|t| letters(t)).collect();
        let output = match rhs {
            Some(r) => {
                let out = term(r)?;
                let out_letters = letters(&out);
                for (i, c) in out_letters.iter().enumerate() {
                    if out_letters[..i].contains(c) {
                        return Err(bad(format!("output repeats {:?}", *c as char)));
                    }
                    if !used.contains(c) {
                        return Err(bad(format!("output {:?} is in no operand", *c as char)));
                    }
                }
                if out.contains(&Sub::Ellipsis) && !terms.iter().any(|t| t.contains(&Sub::Ellipsis))
                {
                    return Err(bad("output has ... and no operand has".into()));
                }
                out
            }
            None => {
                let mut once: Vec<u8> = used
                    .iter()
                    .copied()
                    .filter(|c| used.iter().filter(|u| *u == c).count() == 1)
                    .collect();
                once.sort_unstable();
                let mut out = Vec::new();
                if terms.iter().any(|t| t.contains(&Sub::Ellipsis)) {
                    out.push(Sub::Ellipsis);
                }
                out.extend(once.into_iter().map(Sub::Letter));
                out
            }
        };
        Ok(Einsum {
            equation: equation.to_string(),
            terms,
            output,
        })
    }

    /// Every operand's labels, one per axis, the output's labels, and every label's size (the
    /// largest where size 1 broadcasts).
    fn resolve(&self, shapes: &[&[usize]]) -> OpResult<Resolved> {
        let bad = |why: String| OpError::Shape(format!("Einsum {:?}: {why}", self.equation));
        if shapes.len() != self.terms.len() {
            return Err(bad(format!(
                "{} operands for {} terms",
                shapes.len(),
                self.terms.len()
            )));
        }
        let letters = |t: &[Sub]| t.iter().filter(|s| **s != Sub::Ellipsis).count();
        // How many axes `...` stands for: the same number in every operand that has it.
        let mut dots = None;
        for (t, s) in self.terms.iter().zip(shapes) {
            let n = letters(t);
            let fits = if t.contains(&Sub::Ellipsis) {
                s.len() >= n
            } else {
                s.len() == n
            };
            if !fits {
                return Err(bad(format!(
                    "operand of shape {s:?} for term of {n} letters"
                )));
            }
            if t.contains(&Sub::Ellipsis) {
                match dots {
                    Some(d) if d != s.len() - n => {
                        return Err(bad(format!(
                            "... stands for {d} axes in one operand and {} in another",
                            s.len() - n
                        )));
                    }
                    _ => dots = Some(s.len() - n),
                }
            }
        }
        let dots = dots.unwrap_or(0);
        let expand = |t: &[Sub], e: usize| -> Vec<usize> {
            let mut out = Vec::new();
            for s in t {
                match s {
                    Sub::Letter(c) => out.push(label(*c)),
                    Sub::Ellipsis => out.extend(ELLIPSIS_BASE + dots - e..ELLIPSIS_BASE + dots),
                }
            }
            out
        };
        let mut size = vec![None::<usize>; ELLIPSIS_BASE + dots];
        let mut labels = Vec::with_capacity(shapes.len());
        for (t, s) in self.terms.iter().zip(shapes) {
            let ls = expand(t, s.len() - letters(t));
            for (axis, (&l, &d)) in ls.iter().zip(s.iter()).enumerate() {
                // Within one operand a repeated label is a diagonal: its sizes must agree.
                if let Some(prev) = ls[..axis].iter().position(|&p| p == l)
                    && s[prev] != d
                {
                    return Err(bad(format!(
                        "label {:?} is {} and {d} in one operand",
                        letter_name(l),
                        s[prev]
                    )));
                }
                size[l] = match size[l] {
                    None | Some(1) => Some(d),
                    Some(p) if p == d || d == 1 => Some(p),
                    Some(p) => {
                        return Err(bad(format!(
                            "label {:?} is {p} in one operand and {d} in another",
                            letter_name(l)
                        )));
                    }
                };
            }
            labels.push(ls);
        }
        if dots > 0 && !self.output.contains(&Sub::Ellipsis) {
            return Err(bad(format!(
                "operands have {dots} axes under ... and the output has no ..."
            )));
        }
        let output = expand(&self.output, dots);
        Ok(Resolved {
            labels,
            output,
            size: size.into_iter().map(|s| s.unwrap_or(1)).collect(),
        })
    }

    /// Elements of every intermediate result and of the output, at most (for the memory
    /// estimate).
    pub(crate) fn elements(&self, shapes: &[&[usize]]) -> OpResult<usize> {
        let r = self.resolve(shapes)?;
        let numel = |ls: &mut dyn Iterator<Item = usize>| -> OpResult<usize> {
            let dims: Vec<usize> = ls.map(|l| r.size[l]).collect();
            checked_numel(&dims)
        };
        let mut total = numel(&mut r.output.iter().copied())?;
        let mut seen: Vec<usize> = Vec::new();
        for i in 0..r.labels.len() {
            seen.extend(&r.labels[i]);
            seen.sort_unstable();
            seen.dedup();
            let keep = r.keep(i + 1);
            let step = numel(&mut seen.iter().copied().filter(|l| keep[*l]))?;
            total = total
                .checked_add(step)
                .ok_or(OpError::TooLarge(usize::MAX))?;
        }
        Ok(total)
    }

    pub fn eval(&self, cx: &Cx, inputs: &[Option<&Tensor>]) -> OpResult<Tensor> {
        let ts: Vec<&Tensor> = (0..self.terms.len())
            .map(|i| super::input(inputs, i))
            .collect::<OpResult<_>>()?;
        if let Some(t) = ts.iter().find(|t| t.dtype() != ts[0].dtype()) {
            return Err(OpError::DType(format!(
                "Einsum of {:?} and {:?}",
                ts[0].dtype(),
                t.dtype()
            )));
        }
        let shapes: Vec<&[usize]> = ts.iter().map(|t| t.shape.as_slice()).collect();
        let r = self.resolve(&shapes)?;
        let mut acc = Labeled::new(&r.labels[0], ts[0])?.sum_unless(&r.keep(1))?;
        for (i, t) in ts.iter().enumerate().skip(1) {
            let mut keep = r.keep(i + 1);
            for &l in &acc.labels {
                keep[l] = true;
            }
            let b = Labeled::new(&r.labels[i], t)?.sum_unless(&keep)?;
            acc = contract(cx, acc, b, &r.keep(i + 1))?;
        }
        // Every output label is in the result now; put them in the output's order.
        let perm: Vec<usize> = r
            .output
            .iter()
            .map(|l| {
                acc.labels.iter().position(|a| a == l).ok_or_else(|| {
                    OpError::Shape(format!(
                        "Einsum output label {:?} was lost",
                        letter_name(*l)
                    ))
                })
            })
            .collect::<OpResult<_>>()?;
        if perm.len() != acc.labels.len() {
            return shape_err(format!(
                "Einsum {:?}: result labels {:?} for output {:?}",
                self.equation, acc.labels, r.output
            ));
        }
        super::shape::transpose(&acc.t, Some(&perm))
    }
}

struct Resolved {
    labels: Vec<Vec<usize>>,
    output: Vec<usize>,
    size: Vec<usize>,
}

impl Resolved {
    /// Labels still needed once operands `..from` are consumed: the output's and those of
    /// operands `from..`.
    fn keep(&self, from: usize) -> Vec<bool> {
        let mut keep = vec![false; self.size.len()];
        for &l in self
            .output
            .iter()
            .chain(self.labels[from.min(self.labels.len())..].iter().flatten())
        {
            keep[l] = true;
        }
        keep
    }
}

/// A tensor with a label per axis, no label twice.
struct Labeled {
    labels: Vec<usize>,
    t: Tensor,
}

macro_rules! numeric {
    ($data:expr, $v:ident => $body:expr) => {
        $crate::map_numeric!($data, $v => $body, d => {
            return Err(match d.dtype() {
                DType::Bool => OpError::DType("Einsum of bool".into()),
                _ => half_here(),
            })
        })
    };
}

impl Labeled {
    /// `t` with labels `ls`; a label repeated takes the diagonal along those axes.
    fn new(ls: &[usize], t: &Tensor) -> OpResult<Labeled> {
        let mut labels: Vec<usize> = Vec::new();
        for &l in ls {
            if !labels.contains(&l) {
                labels.push(l);
            }
        }
        if labels.len() == ls.len() {
            return Ok(Labeled {
                labels,
                t: t.clone(),
            });
        }
        let st = strides(&t.shape);
        let (mut shape, mut step) = (Vec::new(), Vec::new());
        for &l in &labels {
            let axes: Vec<usize> = (0..ls.len()).filter(|&a| ls[a] == l).collect();
            shape.push(t.shape[axes[0]]);
            step.push(axes.iter().map(|&a| st[a]).sum::<usize>());
        }
        let mut idx = Vec::with_capacity(checked_numel(&shape)?);
        each_index(&shape, |pos| {
            idx.push(pos.iter().zip(&step).map(|(p, s)| p * s).sum());
            Ok(())
        })?;
        Ok(Labeled {
            labels,
            t: Tensor::new(shape, t.data.gather(&idx))?,
        })
    }

    /// Sums out every axis whose label is not in `keep`.
    fn sum_unless(self, keep: &[bool]) -> OpResult<Labeled> {
        let red: Vec<bool> = self.labels.iter().map(|&l| !keep[l]).collect();
        if !red.contains(&true) {
            return Ok(self);
        }
        let t = sum_axes(&self.t, &red, false)?;
        let labels = self
            .labels
            .iter()
            .zip(&red)
            .filter(|(_, r)| !**r)
            .map(|(l, _)| *l)
            .collect();
        Ok(Labeled { labels, t })
    }

    fn size(&self, l: usize) -> usize {
        self.labels
            .iter()
            .position(|&x| x == l)
            .map_or(1, |a| self.t.shape[a])
    }

    /// The tensor with its axes in the order of `order` (labels it has).
    fn ordered(&self, order: &[usize]) -> OpResult<Tensor> {
        let perm: Vec<usize> = order
            .iter()
            .filter_map(|l| self.labels.iter().position(|x| x == l))
            .collect();
        super::shape::transpose(&self.t, Some(&perm))
    }
}

/// Sums `t` over the axes marked in `red`, keeping them as size 1 when `keepdims`.
fn sum_axes(t: &Tensor, red: &[bool], keepdims: bool) -> OpResult<Tensor> {
    let full: Vec<usize> = t
        .shape
        .iter()
        .zip(red)
        .map(|(&d, &r)| if r { 1 } else { d })
        .collect();
    let n = checked_numel(&full)?;
    let ost = strides(&full);
    fn go<T: Num + Default>(
        v: &[T],
        shape: &[usize],
        red: &[bool],
        ost: &[usize],
        n: usize,
    ) -> OpResult<Vec<T>> {
        let mut acc = vec![T::default(); n];
        let mut k = 0;
        each_index(shape, |pos| {
            let o: usize = (0..pos.len())
                .filter(|&a| !red[a])
                .map(|a| pos[a] * ost[a])
                .sum();
            acc[o] = acc[o].add(v[k]);
            k += 1;
            Ok(())
        })?;
        Ok(acc)
    }
    let data = numeric!(&t.data, v => go(v, &t.shape, red, &ost, n)?);
    let shape = if keepdims {
        full
    } else {
        full.into_iter()
            .zip(red)
            .filter(|(_, r)| !**r)
            .map(|(d, _)| d)
            .collect()
    };
    Tensor::new(shape, data)
}

/// Contracts two labelled operands: labels in both and still needed are batch axes, labels in
/// both and no longer needed are summed, the rest pass through.
fn contract(cx: &Cx, mut a: Labeled, mut b: Labeled, keep: &[bool]) -> OpResult<Labeled> {
    let shared: Vec<usize> = a
        .labels
        .iter()
        .copied()
        .filter(|l| b.labels.contains(l))
        .collect();
    let batch: Vec<usize> = shared.iter().copied().filter(|&l| keep[l]).collect();
    let summed: Vec<usize> = shared.iter().copied().filter(|&l| !keep[l]).collect();
    // A summed label of size 1 on one side broadcasts: sum the other side over it first.
    for &l in &summed {
        let (sa, sb) = (a.size(l), b.size(l));
        if sa != sb {
            let side = if sa == 1 { &mut b } else { &mut a };
            let red: Vec<bool> = side.labels.iter().map(|&x| x == l).collect();
            side.t = sum_axes(&side.t, &red, true)?;
        }
    }
    let a_only: Vec<usize> = a
        .labels
        .iter()
        .copied()
        .filter(|l| !shared.contains(l))
        .collect();
    let b_only: Vec<usize> = b
        .labels
        .iter()
        .copied()
        .filter(|l| !shared.contains(l))
        .collect();
    let sizes =
        |x: &Labeled, ls: &[usize]| -> Vec<usize> { ls.iter().map(|&l| x.size(l)).collect() };
    let (m, k, n) = (
        sizes(&a, &a_only).iter().product::<usize>(),
        sizes(&a, &summed).iter().product::<usize>(),
        sizes(&b, &b_only).iter().product::<usize>(),
    );
    let (ab, bb) = (sizes(&a, &batch), sizes(&b, &batch));
    let left = a.ordered(&[batch.as_slice(), &a_only, &summed].concat())?;
    let right = b.ordered(&[batch.as_slice(), &summed, &b_only].concat())?;
    let mut ash = ab.clone();
    ash.extend([m, k]);
    let mut bsh = bb.clone();
    bsh.extend([k, n]);
    let product = batched_matmul(cx, &left.reshaped(ash)?, &right.reshaped(bsh)?)?;
    let mut shape: Vec<usize> = ab.iter().zip(&bb).map(|(&x, &y)| x.max(y)).collect();
    shape.extend(sizes(&a, &a_only));
    shape.extend(sizes(&b, &b_only));
    Ok(Labeled {
        labels: [batch, a_only, b_only].concat(),
        t: product.reshaped(shape)?,
    })
}

/// `[batch.., m, k] x [batch.., k, n]`, batch axes of equal rank broadcasting where 1.
fn batched_matmul(cx: &Cx, a: &Tensor, b: &Tensor) -> OpResult<Tensor> {
    let r = a.rank();
    let (m, k, n) = (a.shape[r - 2], a.shape[r - 1], b.shape[r - 1]);
    // The GEMM kernel for float32 operands with no empty axis.
    if let (Data::F32(_), false) = (&a.data, a.is_empty() || b.is_empty()) {
        return super::matmul::matmul(cx, a, b, None, None);
    }
    let batch: Vec<usize> = (0..r - 2).map(|i| a.shape[i].max(b.shape[i])).collect();
    let mut shape = batch.clone();
    shape.extend([m, n]);
    let total = checked_numel(&shape)?;
    let (sa, sb) = (strides(&a.shape[..r - 2]), strides(&b.shape[..r - 2]));
    let mut offsets = Vec::new();
    each_index(&batch, |pos| {
        let at = |shape: &[usize], st: &[usize]| -> usize {
            (0..pos.len())
                .map(|i| if shape[i] == 1 { 0 } else { pos[i] * st[i] })
                .sum()
        };
        offsets.push((at(&a.shape, &sa), at(&b.shape, &sb)));
        Ok(())
    })?;
    fn go<T: Num + Default>(
        a: &[T],
        b: &[T],
        offsets: &[(usize, usize)],
        (m, k, n): (usize, usize, usize),
        total: usize,
    ) -> Vec<T> {
        let mut out = vec![T::default(); total];
        for (bi, &(oa, ob)) in offsets.iter().enumerate() {
            let (a, b) = (&a[oa * m * k..], &b[ob * k * n..]);
            let o = &mut out[bi * m * n..];
            for i in 0..m {
                for p in 0..k {
                    let x = a[i * k + p];
                    for j in 0..n {
                        o[i * n + j] = o[i * n + j].add(x.mul(b[p * n + j]));
                    }
                }
            }
        }
        out
    }
    let data = match (&a.data, &b.data) {
        (Data::F32(x), Data::F32(y)) => Data::F32(go(x, y, &offsets, (m, k, n), total)),
        (Data::F64(x), Data::F64(y)) => Data::F64(go(x, y, &offsets, (m, k, n), total)),
        (Data::I64(x), Data::I64(y)) => Data::I64(go(x, y, &offsets, (m, k, n), total)),
        (Data::I32(x), Data::I32(y)) => Data::I32(go(x, y, &offsets, (m, k, n), total)),
        (Data::I16(x), Data::I16(y)) => Data::I16(go(x, y, &offsets, (m, k, n), total)),
        (Data::I8(x), Data::I8(y)) => Data::I8(go(x, y, &offsets, (m, k, n), total)),
        (Data::U64(x), Data::U64(y)) => Data::U64(go(x, y, &offsets, (m, k, n), total)),
        (Data::U32(x), Data::U32(y)) => Data::U32(go(x, y, &offsets, (m, k, n), total)),
        (Data::U16(x), Data::U16(y)) => Data::U16(go(x, y, &offsets, (m, k, n), total)),
        (Data::U8(x), Data::U8(y)) => Data::U8(go(x, y, &offsets, (m, k, n), total)),
        (x, y) => {
            return Err(OpError::DType(format!(
                "Einsum of {:?} and {:?}",
                x.dtype(),
                y.dtype()
            )));
        }
    };
    Tensor::new(shape, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(eq: &str, ins: &[&Tensor]) -> OpResult<Tensor> {
        let e = Einsum::parse(eq).unwrap();
        let refs: Vec<Option<&Tensor>> = ins.iter().copied().map(Some).collect();
        e.eval(&Cx::new(1), &refs)
    }

    fn iota(shape: &[usize]) -> Tensor {
        let n = shape.iter().product::<usize>();
        Tensor::f32(shape.to_vec(), (0..n).map(|v| v as f32).collect()).unwrap()
    }

    fn as_f64(t: &Tensor) -> Tensor {
        crate::ops::elementwise::cast(t, crate::tensor::DType::F64)
    }

    #[test]
    fn common_contractions_match_their_definitions() {
        let (a, b) = (iota(&[2, 3]), iota(&[3, 2]));
        let mm = run("ij,jk->ik", &[&a, &b]).unwrap();
        assert_eq!(mm.as_f32().unwrap(), &[10., 13., 28., 40.]);
        // The same in float64 (the generic path) and in implicit mode.
        let mm64 = run("ij,jk", &[&as_f64(&a), &as_f64(&b)]).unwrap();
        assert_eq!(mm64.to_f64_vec(), vec![10., 13., 28., 40.]);
        assert_eq!(run("ij->ji", &[&a]).unwrap().shape, vec![3, 2]);
        assert_eq!(run("ij->", &[&a]).unwrap().as_f32().unwrap(), &[15.]);
        assert_eq!(
            run("ij,ij->i", &[&a, &a]).unwrap().as_f32().unwrap(),
            &[5., 50.]
        );
        // Attention scores: batch and heads kept, the head dimension summed.
        let (q, k) = (iota(&[1, 2, 3, 4]), iota(&[1, 2, 5, 4]));
        let s = run("bhqd,bhkd->bhqk", &[&q, &k]).unwrap();
        assert_eq!(s.shape, vec![1, 2, 3, 5]);
        assert_eq!(
            s.as_f32().unwrap()[0],
            (0..4).map(|d| (d * d) as f32).sum::<f32>()
        );
        // Diagonal, outer product, ellipsis broadcasting, three operands.
        let sq = iota(&[3, 3]);
        assert_eq!(
            run("ii->i", &[&sq]).unwrap().as_f32().unwrap(),
            &[0., 4., 8.]
        );
        assert_eq!(run("ii", &[&sq]).unwrap().as_f32().unwrap(), &[12.]);
        assert_eq!(
            run("i,j->ij", &[&iota(&[2]), &iota(&[3])]).unwrap().shape,
            vec![2, 3]
        );
        let bm = run(
            "...ij,...jk->...ik",
            &[&iota(&[4, 2, 3]), &iota(&[1, 3, 2])],
        )
        .unwrap();
        assert_eq!(bm.shape, vec![4, 2, 2]);
        assert_eq!(&bm.as_f32().unwrap()[..4], &[10., 13., 28., 40.]);
        let ranks = [&iota(&[4, 2, 3]), &iota(&[3, 2])];
        assert!(run("...ij,...jk->...ik", &ranks).is_err());
        let three = run("ij,jk,kl->il", &[&a, &b, &iota(&[2, 1])]).unwrap();
        assert_eq!(three.as_f32().unwrap(), &[13., 40.]);
        // A summed label of size 1 on one side.
        let one = run("ij,jk->ik", &[&iota(&[2, 1]), &iota(&[3, 2])]).unwrap();
        assert_eq!(one.as_f32().unwrap(), &[0., 0., 6., 9.]);
        let ints = Tensor::i64(vec![2, 2], vec![1, 2, 3, 4]).unwrap();
        assert_eq!(
            run("ij,jk", &[&ints, &ints]).unwrap().to_i64_vec().unwrap(),
            vec![7, 10, 15, 22]
        );
    }

    #[test]
    fn bad_equations_and_operands_are_refused() {
        for eq in [
            "ij->k",
            "ij->ii",
            "i j,jk-> ik,",
            "ij-k",
            "i1",
            "....i",
            "i...j...",
            "->...",
        ] {
            assert!(Einsum::parse(eq).is_err(), "{eq}");
        }
        let a = iota(&[2, 3]);
        for (eq, ins) in [
            ("ij,jk->ik", vec![&a, &a]),
            ("ijk->i", vec![&a]),
            ("ij,jk->ik", vec![&a]),
            ("ii->i", vec![&a]),
            ("...ij->ij", vec![&iota(&[2, 2, 3])]),
        ] {
            assert!(run(eq, &ins).is_err(), "{eq}");
        }
        let b = Tensor::new(vec![2], Data::Bool(vec![true, false])).unwrap();
        assert!(run("i->", &[&b]).is_err());
        assert!(
            run(
                "i,i->",
                &[&iota(&[2]), &Tensor::i64(vec![2], vec![1, 2]).unwrap()]
            )
            .is_err()
        );
    }
}
