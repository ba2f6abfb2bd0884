//! Row-major matrix products written as cuBLAS's column-major SGEMM by swapping the operands:
//! C = op(A)·op(B) row-major is Cᵀ = op(B)ᵀ·op(A)ᵀ column-major, and a row-major matrix read as
//! column-major is its transpose. So cuBLAS gets (B, A) with m ↔ n and the same trans flags.
//! Leading dimensions are explicit, so a product may address a block of rows or columns of
//! larger matrices (how a resized GEMM runs as pieces of the same buffers).

use super::api::{DevPtr, Gemm};

/// `C[m, n] = alpha · op(A)[m, k] · op(B)[k, n] + beta · C`, row-major, for `batch` products at
/// element strides `stride_*` (0 repeats one operand). op(A) = Aᵀ when `trans_a` (A stored
/// [k, m]); op(B) = Bᵀ when `trans_b` (B stored [n, k]). `ld*` are row strides in elements.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowMajor {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub trans_a: bool,
    pub trans_b: bool,
    pub alpha: f32,
    pub beta: f32,
    pub a: DevPtr,
    pub lda: usize,
    pub b: DevPtr,
    pub ldb: usize,
    pub c: DevPtr,
    pub ldc: usize,
    pub batch: usize,
    pub stride_a: i64,
    pub stride_b: i64,
    pub stride_c: i64,
}

impl RowMajor {
    /// A dense product (leading dimensions those of contiguous matrices), one of a batch.
    #[allow(clippy::too_many_arguments)]
    pub fn dense(
        m: usize,
        n: usize,
        k: usize,
        trans_a: bool,
        trans_b: bool,
        a: DevPtr,
        b: DevPtr,
        c: DevPtr,
    ) -> RowMajor {
        RowMajor {
            m,
            n,
            k,
            trans_a,
            trans_b,
            alpha: 1.0,
            beta: 0.0,
            a,
            lda: if trans_a { m } else { k },
            b,
            ldb: if trans_b { k } else { n },
            c,
            ldc: n,
            batch: 1,
            stride_a: 0,
            stride_b: 0,
            stride_c: 0,
        }
    }

    /// The same product over `batch` members at these element strides.
    pub fn batched(self, batch: usize, stride_a: i64, stride_b: i64, stride_c: i64) -> RowMajor {
        RowMajor {
            batch,
            stride_a,
            stride_b,
            stride_c,
            ..self
        }
    }

    /// Rows `r0..r1` of C (and of op(A)): a smaller product over the same buffers.
    pub fn rows(self, r0: usize, r1: usize) -> RowMajor {
        let a_step = if self.trans_a { 1 } else { self.lda };
        RowMajor {
            m: r1 - r0,
            a: self.a.at(r0 * a_step, 4),
            c: self.c.at(r0 * self.ldc, 4),
            ..self
        }
    }

    /// Columns `c0..c1` of C (and of op(B)).
    pub fn cols(self, c0: usize, c1: usize) -> RowMajor {
        let b_step = if self.trans_b { self.ldb } else { 1 };
        RowMajor {
            n: c1 - c0,
            b: self.b.at(c0 * b_step, 4),
            c: self.c.at(c0, 4),
            ..self
        }
    }

    /// The cuBLAS call: column-major with (B, A) swapped.
    pub fn gemm(&self) -> Gemm {
        Gemm {
            trans_a: self.trans_b,
            trans_b: self.trans_a,
            m: self.n,
            n: self.m,
            k: self.k,
            alpha: self.alpha,
            a: self.b,
            lda: self.ldb.max(1),
            stride_a: self.stride_b,
            b: self.a,
            ldb: self.lda.max(1),
            stride_b: self.stride_a,
            beta: self.beta,
            c: self.c,
            ldc: self.ldc.max(1),
            stride_c: self.stride_c,
            batch: self.batch,
        }
    }
}
