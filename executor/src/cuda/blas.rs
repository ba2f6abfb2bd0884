//! Row-major SGEMM through cuBLAS (column-major) by swapping the operands:
//! C = op(A)·op(B) row-major is Cᵀ = op(B)ᵀ·op(A)ᵀ column-major, and a row-major matrix read as
//! column-major is its transpose. So cuBLAS gets (B, A) with m ↔ n and the same trans flags.
//! [`row_major`] builds that configuration as a pure function, tested on the host against a
//! column-major reference of what cuBLAS computes.

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::{DevicePtr, DevicePtrMut};

/// One row-major product `C[m, n] = alpha · op(A)[m, k] · op(B)[k, n] + beta · C`, where
/// op(A) = Aᵀ when `trans_a` (A stored [k, m]), op(B) = Bᵀ when `trans_b` (B stored [n, k]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowMajor {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub trans_a: bool,
    pub trans_b: bool,
    pub alpha: f32,
    pub beta: f32,
}

/// The cuBLAS configuration for a [`RowMajor`] product; call it with (B, A, C), in that order.
/// None when a dimension does not fit cuBLAS's `int`.
pub fn row_major(p: &RowMajor) -> Option<GemmConfig<f32>> {
    let i = |v: usize| i32::try_from(v.max(1)).ok();
    let op = |t: bool| {
        if t {
            cublasOperation_t::CUBLAS_OP_T
        } else {
            cublasOperation_t::CUBLAS_OP_N
        }
    };
    Some(GemmConfig {
        transa: op(p.trans_b),
        transb: op(p.trans_a),
        m: i32::try_from(p.n).ok()?,
        n: i32::try_from(p.m).ok()?,
        k: i32::try_from(p.k).ok()?,
        alpha: p.alpha,
        // B stored [k, n] (leading dim n) or [n, k] (leading dim k).
        lda: if p.trans_b { i(p.k)? } else { i(p.n)? },
        // A stored [m, k] (leading dim k) or [k, m] (leading dim m).
        ldb: if p.trans_a { i(p.m)? } else { i(p.k)? },
        beta: p.beta,
        ldc: i(p.n)?,
    })
}

/// Element strides between consecutive products of a batch; 0 repeats one operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchStrides {
    pub a: i64,
    pub b: i64,
    pub c: i64,
}

/// The strided-batched configuration; call it with (B, A, C).
pub fn row_major_batched(
    p: &RowMajor,
    batch: usize,
    s: BatchStrides,
) -> Option<StridedBatchedConfig<f32>> {
    Some(StridedBatchedConfig {
        gemm: row_major(p)?,
        batch_size: i32::try_from(batch).ok()?,
        stride_a: s.b,
        stride_b: s.a,
        stride_c: s.c,
    })
}

/// `c = a·b` row-major on the device (see [`RowMajor`]).
pub fn sgemm<A, B, C>(blas: &CudaBlas, p: &RowMajor, a: &A, b: &B, c: &mut C) -> Result<(), String>
where
    A: DevicePtr<f32>,
    B: DevicePtr<f32>,
    C: DevicePtrMut<f32>,
{
    if p.m == 0 || p.n == 0 {
        return Ok(());
    }
    let cfg = row_major(p).ok_or("GEMM dimensions exceed cuBLAS's int")?;
    // SAFETY: the caller sized a, b and c for the product described by p.
    unsafe { blas.gemm(cfg, b, a, c) }.map_err(|e| format!("cublasSgemm: {e:?}"))
}

/// A batch of row-major products with element strides between them.
pub fn sgemm_batched<A, B, C>(
    blas: &CudaBlas,
    p: &RowMajor,
    batch: usize,
    s: BatchStrides,
    a: &A,
    b: &B,
    c: &mut C,
) -> Result<(), String>
where
    A: DevicePtr<f32>,
    B: DevicePtr<f32>,
    C: DevicePtrMut<f32>,
{
    if p.m == 0 || p.n == 0 || batch == 0 {
        return Ok(());
    }
    if batch == 1 {
        return sgemm(blas, p, a, b, c);
    }
    let cfg = row_major_batched(p, batch, s).ok_or("GEMM dimensions exceed cuBLAS's int")?;
    // SAFETY: the caller sized a, b and c for `batch` products at strides s.
    unsafe { blas.gemm_strided_batched(cfg, b, a, c) }
        .map_err(|e| format!("cublasSgemmStridedBatched: {e:?}"))
}

/// TF32 tensor-core math on or off for this handle (off: plain fp32, the default).
pub fn set_tf32(blas: &CudaBlas, on: bool) -> Result<(), String> {
    use cudarc::cublas::sys::cublasMath_t;
    let mode = if on {
        cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH
    } else {
        cublasMath_t::CUBLAS_DEFAULT_MATH
    };
    // SAFETY: a valid handle owned by `blas`.
    let rc = unsafe { cudarc::cublas::sys::cublasSetMathMode(*blas.handle(), mode) };
    if rc == cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(format!("cublasSetMathMode: {rc:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What cuBLAS SGEMM computes: column-major C(m×n) = alpha·op(A)·op(B) + beta·C.
    fn colmajor_gemm(cfg: &GemmConfig<f32>, a: &[f32], b: &[f32], c: &mut [f32]) {
        let t = |o: cublasOperation_t| o == cublasOperation_t::CUBLAS_OP_T;
        let (m, n, k) = (cfg.m as usize, cfg.n as usize, cfg.k as usize);
        let (lda, ldb, ldc) = (cfg.lda as usize, cfg.ldb as usize, cfg.ldc as usize);
        for j in 0..n {
            for i in 0..m {
                let mut s = 0.0f32;
                for p in 0..k {
                    let av = if t(cfg.transa) {
                        a[p + i * lda]
                    } else {
                        a[i + p * lda]
                    };
                    let bv = if t(cfg.transb) {
                        b[j + p * ldb]
                    } else {
                        b[p + j * ldb]
                    };
                    s += av * bv;
                }
                c[i + j * ldc] = cfg.alpha * s + cfg.beta * c[i + j * ldc];
            }
        }
    }

    fn rowmajor_reference(p: &RowMajor, a: &[f32], b: &[f32], c: &mut [f32]) {
        for i in 0..p.m {
            for j in 0..p.n {
                let mut s = 0.0f32;
                for q in 0..p.k {
                    let av = if p.trans_a {
                        a[q * p.m + i]
                    } else {
                        a[i * p.k + q]
                    };
                    let bv = if p.trans_b {
                        b[j * p.k + q]
                    } else {
                        b[q * p.n + j]
                    };
                    s += av * bv;
                }
                c[i * p.n + j] = p.alpha * s + p.beta * c[i * p.n + j];
            }
        }
    }

    fn vals(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as u32 * 37 + seed * 11) % 17) as f32 - 8.0)
            .collect()
    }

    #[test]
    fn operand_swap_computes_the_row_major_product() {
        for (m, n, k) in [(3, 5, 4), (1, 7, 2), (6, 1, 3), (4, 4, 1)] {
            for (trans_a, trans_b) in [(false, false), (true, false), (false, true), (true, true)] {
                let p = RowMajor {
                    m,
                    n,
                    k,
                    trans_a,
                    trans_b,
                    alpha: 1.5,
                    beta: 0.5,
                };
                let (a, b) = (vals(m * k, 1), vals(k * n, 2));
                let mut want = vals(m * n, 3);
                let mut got = want.clone();
                rowmajor_reference(&p, &a, &b, &mut want);
                // cuBLAS gets (B, A, C).
                colmajor_gemm(&row_major(&p).unwrap(), &b, &a, &mut got);
                assert_eq!(got, want, "m{m} n{n} k{k} ta{trans_a} tb{trans_b}");
            }
        }
    }

    #[test]
    fn batched_strides_swap_with_the_operands() {
        let p = RowMajor {
            m: 2,
            n: 3,
            k: 4,
            trans_a: false,
            trans_b: false,
            alpha: 1.0,
            beta: 0.0,
        };
        let cfg = row_major_batched(&p, 5, BatchStrides { a: 8, b: 0, c: 6 }).unwrap();
        assert_eq!(
            (cfg.stride_a, cfg.stride_b, cfg.stride_c, cfg.batch_size),
            (0, 8, 6, 5)
        );
        // Each batch entry, emulated: A advances by 8, B is shared, C by 6.
        let (a, b) = (vals(40, 4), vals(12, 5));
        let mut got = vec![0.0; 30];
        for i in 0..5 {
            let mut c = vec![0.0; 6];
            colmajor_gemm(&cfg.gemm, &b, &a[i * 8..], &mut c);
            got[i * 6..i * 6 + 6].copy_from_slice(&c);
        }
        let mut want = vec![0.0; 30];
        for i in 0..5 {
            rowmajor_reference(&p, &a[i * 8..i * 8 + 8], &b, &mut want[i * 6..i * 6 + 6]);
        }
        assert_eq!(got, want);
        assert!(row_major(&RowMajor { m: 1 << 40, ..p }).is_none());
    }
}
