//! Gemm and MatMul (numpy semantics, batched and broadcast), through the kernels' GEMM.

use super::elementwise::{broadcast_map, broadcast_shape};
use super::{Activation, Cx, input, opt_input};
use crate::error::{OpError, OpResult, shape_err};
use crate::ops::attrs::Attrs;
use crate::tensor::{DType, Data, Tensor, checked_numel};
use cotenant_kernels::conv::Epilogue;
use cotenant_kernels::dense;
use cotenant_kernels::gemm::{Mat, sgemm};
use cotenant_kernels::nhwc_conv::{self, NhwcFilter};
use rayon::prelude::*;

#[derive(Clone, Debug, PartialEq)]
pub struct GemmAttrs {
    pub alpha: f32,
    pub beta: f32,
    pub trans_a: bool,
    pub trans_b: bool,
    pub act: Option<Activation>,
}

impl GemmAttrs {
    pub fn parse(a: &Attrs) -> Result<GemmAttrs, String> {
        Ok(GemmAttrs {
            alpha: a.float_or("alpha", 1.0)?,
            beta: a.float_or("beta", 1.0)?,
            trans_a: a.int_or("transA", 0)? != 0,
            trans_b: a.int_or("transB", 0)? != 0,
            act: None,
        })
    }
}

pub fn gemm(cx: &Cx, g: &GemmAttrs, inputs: &[Option<&Tensor>]) -> OpResult<Tensor> {
    let (a, b, c) = (input(inputs, 0)?, input(inputs, 1)?, opt_input(inputs, 2));
    if a.rank() != 2 || b.rank() != 2 {
        return shape_err(format!(
            "Gemm needs 2-D operands, got {:?} and {:?}",
            a.shape, b.shape
        ));
    }
    let (m, k) = if g.trans_a {
        (a.shape[1], a.shape[0])
    } else {
        (a.shape[0], a.shape[1])
    };
    let (kb, n) = if g.trans_b {
        (b.shape[1], b.shape[0])
    } else {
        (b.shape[0], b.shape[1])
    };
    if k != kb {
        return shape_err(format!(
            "Gemm inner dimensions differ: {:?} x {:?}",
            a.shape, b.shape
        ));
    }
    let (av, bv) = (a.as_f32()?, b.as_f32()?);
    let am = if g.trans_a {
        Mat::transposed(av, m)
    } else {
        Mat::row_major(av, k)
    };
    let bm = if g.trans_b {
        Mat::transposed(bv, k)
    } else {
        Mat::row_major(bv, n)
    };
    let mut out = vec![0.0f32; checked_numel(&[m, n])?];
    let bias = match c {
        Some(c) if g.beta != 0.0 => {
            if broadcast_shape(&c.shape, &[m, n])? != [m, n] {
                return shape_err(format!(
                    "Gemm C {:?} does not broadcast to [{m}, {n}]",
                    c.shape
                ));
            }
            Some(broadcast_map(
                c.as_f32()?,
                &c.shape,
                &[0.0f32],
                &[1],
                &[m, n],
                |x, _| x * g.beta,
            ))
        }
        _ => None,
    };
    if g.trans_b && !g.trans_a && dense::available() {
        // A fully-connected layer with PyTorch's weight layout: the weights are read in place
        // (see `dense`), for every batch alike.
        dense::dense(av, bv, (m, k, n), &mut out, cx.threads);
        if g.alpha != 1.0 {
            out.iter_mut().for_each(|v| *v *= g.alpha);
        }
        if let Some(bias) = bias {
            out.iter_mut().zip(bias).for_each(|(v, b)| *v += b);
        }
    } else if g.alpha == 1.0 {
        let accumulate = bias.is_some();
        if let Some(bias) = bias {
            out = bias;
        }
        sgemm(cx.threads, m, n, k, am, bm, &mut out, n, accumulate);
    } else {
        sgemm(cx.threads, m, n, k, am, bm, &mut out, n, false);
        out.iter_mut().for_each(|v| *v *= g.alpha);
        if let Some(bias) = bias {
            out.iter_mut().zip(bias).for_each(|(v, b)| *v += b);
        }
    }
    if let Some(act) = g.act {
        act.apply_slice(cx.threads, &mut out);
    }
    Tensor::f32(vec![m, n], out)
}

/// MatMul's operand shapes resolved as numpy does: a 1-D operand is promoted to a matrix (and
/// the added axis dropped from the result), batch axes broadcast.
pub(crate) struct MatMulShape {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub a_batch: Vec<usize>,
    pub b_batch: Vec<usize>,
    /// The broadcast batch axes.
    pub batch: Vec<usize>,
    /// The result's shape.
    pub out: Vec<usize>,
}

impl MatMulShape {
    pub fn of(a: &[usize], b: &[usize]) -> OpResult<MatMulShape> {
        if a.is_empty() || b.is_empty() {
            return shape_err("MatMul operands must have rank >= 1");
        }
        let ash: Vec<usize> = if a.len() == 1 {
            vec![1, a[0]]
        } else {
            a.to_vec()
        };
        let bsh: Vec<usize> = if b.len() == 1 {
            vec![b[0], 1]
        } else {
            b.to_vec()
        };
        let (m, k) = (ash[ash.len() - 2], ash[ash.len() - 1]);
        let (kb, n) = (bsh[bsh.len() - 2], bsh[bsh.len() - 1]);
        if k != kb {
            return shape_err(format!("MatMul inner dimensions differ: {a:?} x {b:?}"));
        }
        let (a_batch, b_batch) = (&ash[..ash.len() - 2], &bsh[..bsh.len() - 2]);
        let batch = broadcast_shape(a_batch, b_batch)?;
        let mut out = batch.clone();
        out.extend([m, n]);
        checked_numel(&out)?;
        if a.len() == 1 {
            out.remove(out.len() - 2);
        }
        if b.len() == 1 {
            out.pop();
        }
        Ok(MatMulShape {
            m,
            k,
            n,
            a_batch: a_batch.to_vec(),
            b_batch: b_batch.to_vec(),
            batch,
            out,
        })
    }

    /// Products in the result: the broadcast batch's size.
    pub fn products(&self) -> usize {
        self.batch.iter().product()
    }

    /// For each product, the matrix of `a` and the matrix of `b` it multiplies.
    pub fn operands(&self) -> (Vec<usize>, Vec<usize>) {
        let index = |shape: &[usize]| {
            let iota: Vec<usize> = (0..shape.iter().product()).collect();
            broadcast_map(&iota, shape, &[0], &[1], &self.batch, |i, _| i)
        };
        (index(&self.a_batch), index(&self.b_batch))
    }
}

pub fn matmul(
    cx: &Cx,
    a: &Tensor,
    b: &Tensor,
    bias: Option<&Tensor>,
    act: Option<Activation>,
) -> OpResult<Tensor> {
    let s = MatMulShape::of(&a.shape, &b.shape)?;
    if a.dtype() == DType::F64 || b.dtype() == DType::F64 {
        return matmul_f64(&s, a, b, bias, act);
    }
    let (m, k, n) = (s.m, s.k, s.n);
    let (av, bv) = (a.as_f32()?, b.as_f32()?);
    let mut out = cx.take_f32(checked_numel(&s.out)?);
    // A fused bias is pre-loaded into every row and the products accumulate onto it.
    let accumulate = match fused_bias(bias, n)? {
        Some(bv) => {
            if n > 0 {
                out.chunks_mut(n).for_each(|row| row.copy_from_slice(bv));
            }
            true
        }
        None => false,
    };
    let nb = s.products();
    if s.b_batch.iter().product::<usize>() == 1 && s.a_batch == s.batch {
        // Weights shared across the batch: one tall GEMM.
        sgemm(
            cx.threads,
            nb * m,
            n,
            k,
            Mat::row_major(av, k),
            Mat::row_major(bv, n),
            &mut out,
            n,
            accumulate,
        );
    } else if nb > 0 && m * n > 0 {
        let (ia, ib) = s.operands();
        let one = |bi: usize, dst: &mut [f32], threads: usize| {
            let am = Mat::row_major(&av[ia[bi] * m * k..(ia[bi] + 1) * m * k], k);
            let bm = Mat::row_major(&bv[ib[bi] * k * n..(ib[bi] + 1) * k * n], n);
            sgemm(threads, m, n, k, am, bm, dst, n, accumulate);
        };
        // Many small products (attention heads) parallelise best across the batch.
        if cx.threads > 1 && nb >= cx.threads {
            out.par_chunks_mut(m * n)
                .enumerate()
                .for_each(|(bi, dst)| one(bi, dst, 1));
        } else {
            out.chunks_mut(m * n)
                .enumerate()
                .for_each(|(bi, dst)| one(bi, dst, cx.threads));
        }
    }
    if let Some(act) = act {
        act.apply_slice(cx.threads, &mut out);
    }
    Tensor::f32(s.out, out)
}

/// MatMul by a constant matrix `f` the CPU plan packed (`passes::pack_matmul_weights`): every
/// row of `a` times it, as a 1x1 NHWC convolution, with the fused bias and activation applied on
/// the way out.
pub fn matmul_packed(
    cx: &Cx,
    a: &Tensor,
    f: &NhwcFilter,
    bias: Option<&Tensor>,
    act: Option<Activation>,
) -> OpResult<Tensor> {
    let [n, k, ..] = f.shape();
    let s = MatMulShape::of(&a.shape, &[k, n])?;
    let epi = Epilogue {
        bias: fused_bias(bias, n)?,
        residual: None,
        act,
    };
    let mut out = cx.take_f32(checked_numel(&s.out)?);
    if !out.is_empty() {
        let rows = s.products() * s.m;
        nhwc_conv::matmul_packed(cx.threads, a.as_f32()?, rows, f, epi, &mut out);
    }
    Tensor::f32(s.out, out)
}

/// A bias fused into a MatMul (`passes::fuse_matmul_bias`): one value per column of `n`.
fn fused_bias(bias: Option<&Tensor>, n: usize) -> OpResult<Option<&[f32]>> {
    let Some(b) = bias else {
        return Ok(None);
    };
    let bv = b.as_f32()?;
    if bv.len() != n {
        return shape_err(format!(
            "MatMul bias has {} values for {n} columns",
            bv.len()
        ));
    }
    Ok(Some(bv))
}

/// MatMul of two float64 operands, summed in f64 product by product (no f64 GEMM kernel:
/// double-precision models are rare and small).
fn matmul_f64(
    s: &MatMulShape,
    a: &Tensor,
    b: &Tensor,
    bias: Option<&Tensor>,
    act: Option<Activation>,
) -> OpResult<Tensor> {
    let (Data::F64(av), Data::F64(bv)) = (&a.data, &b.data) else {
        return Err(OpError::DType(format!(
            "MatMul of {:?} and {:?}: both must be float64",
            a.dtype(),
            b.dtype()
        )));
    };
    if bias.is_some() || act.is_some() {
        return Err(OpError::Unsupported(
            "a float64 MatMul with a fused bias or activation".into(),
        ));
    }
    let (m, k, n) = (s.m, s.k, s.n);
    let mut out = vec![0.0f64; checked_numel(&s.out)?];
    if m * n > 0 {
        let (ia, ib) = s.operands();
        for (bi, dst) in out.chunks_mut(m * n).enumerate() {
            let (am, bm) = (
                &av[ia[bi] * m * k..][..m * k],
                &bv[ib[bi] * k * n..][..k * n],
            );
            for i in 0..m {
                for p in 0..k {
                    let x = am[i * k + p];
                    for (d, &y) in dst[i * n..][..n].iter_mut().zip(&bm[p * n..][..n]) {
                        *d += x * y;
                    }
                }
            }
        }
    }
    Tensor::new(s.out.clone(), Data::F64(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batched_matmul_broadcasts_and_promotes_vectors() {
        let cx = Cx::new(2);
        let a = Tensor::f32(vec![2, 1, 2, 3], (0..12).map(|v| v as f32).collect()).unwrap();
        let b = Tensor::f32(vec![3, 3, 1], vec![1., 0., 0., 0., 1., 0., 0., 0., 1.]).unwrap();
        let o = matmul(&cx, &a, &b, None, None).unwrap();
        assert_eq!(o.shape, vec![2, 3, 2, 1]);
        assert_eq!(&o.as_f32().unwrap()[..6], &[0., 3., 1., 4., 2., 5.]);
        let v = Tensor::f32(vec![3], vec![1., 1., 1.]).unwrap();
        let m = Tensor::f32(vec![2, 3], vec![1., 2., 3., 4., 5., 6.]).unwrap();
        let o = matmul(&cx, &m, &v, None, None).unwrap();
        assert_eq!(
            (o.shape.clone(), o.as_f32().unwrap().to_vec()),
            (vec![2], vec![6., 15.])
        );
    }

    #[test]
    fn a_packed_matmul_agrees_with_the_gemm_on_every_operand_shape() {
        if !nhwc_conv::available() {
            eprintln!("skipped: this CPU lacks AVX-512F and AVX2, which the packed MatMul needs");
            return;
        }
        let cx = Cx::new(2);
        let (k, n) = (7, 19);
        let values = |len: usize| (0..len).map(|i| (i % 9) as f32 * 0.25 - 1.0).collect();
        let b = Tensor::f32(vec![k, n], values(k * n)).unwrap();
        let bias = Tensor::f32(vec![n], values(n)).unwrap();
        let f = NhwcFilter::of_matrix(b.as_f32().unwrap(), k, n);
        // A vector, a matrix, a batch of matrices, and no rows at all.
        for shape in [
            vec![k],
            vec![3, k],
            vec![2, 5, k],
            vec![0, k],
            vec![2, 0, k],
        ] {
            let a = Tensor::f32(shape.clone(), values(shape.iter().product())).unwrap();
            let act = Some(Activation::Relu);
            let want = matmul(&cx, &a, &b, Some(&bias), act).unwrap();
            let got = matmul_packed(&cx, &a, &f, Some(&bias), act).unwrap();
            assert_eq!(got.shape, want.shape, "{shape:?}");
            for (g, w) in got.as_f32().unwrap().iter().zip(want.as_f32().unwrap()) {
                assert!(
                    (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                    "{shape:?}: {g} vs {w}"
                );
            }
        }
        // Rows of the wrong length, a bias of the wrong length, or rows not of f32: errors.
        let short = Tensor::f32(vec![2, k - 1], values(2 * (k - 1))).unwrap();
        assert!(matmul_packed(&cx, &short, &f, None, None).is_err());
        let a = Tensor::f32(vec![2, k], values(2 * k)).unwrap();
        assert!(matmul_packed(&cx, &a, &f, Some(&b), None).is_err());
        let ints = Tensor::new(vec![2, k], Data::I64(vec![1; 2 * k])).unwrap();
        assert!(matmul_packed(&cx, &ints, &f, None, None).is_err());
    }
}
