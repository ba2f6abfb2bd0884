//! cuBLAS's strided batched SGEMM, column-major, on the CPU: what `cublasSgemmStridedBatched`
//! computes for a [`Gemm`], with every operand bounds-checked against its buffer.

use super::memory::{Memory, R};
use crate::gpu::api::{DevPtr, Gemm};
use cotenant_kernels::gemm::{Mat, sgemm};

/// Elements a column-major `rows × cols` matrix with leading dimension `ld` spans.
fn span(rows: usize, cols: usize, ld: usize) -> R<usize> {
    if rows == 0 || cols == 0 {
        return Ok(0);
    }
    if ld < rows {
        return Err(format!("leading dimension {ld} is below the {rows} rows"));
    }
    Ok((cols - 1) * ld + rows)
}

/// Batch member `i` of an operand.
fn member(p: DevPtr, i: usize, stride: i64) -> R<DevPtr> {
    let off = (i as i64)
        .checked_mul(stride)
        .and_then(|e| e.checked_mul(4))
        .and_then(|b| (p.offset as i64).checked_add(b))
        .filter(|&o| o >= 0)
        .ok_or("a batch stride reaches before the buffer")?;
    Ok(DevPtr::new(p.buffer, off as u64))
}

pub fn run(g: &Gemm, mem: &mut Memory) -> R<()> {
    // op(A) is m × k: A itself is m × k (lda ≥ m) or, transposed, k × m (lda ≥ k).
    let (a_rows, a_cols) = if g.trans_a { (g.k, g.m) } else { (g.m, g.k) };
    let (b_rows, b_cols) = if g.trans_b { (g.n, g.k) } else { (g.k, g.n) };
    let a_len = span(a_rows, a_cols, g.lda).map_err(|e| format!("sgemm A: {e}"))?;
    let b_len = span(b_rows, b_cols, g.ldb).map_err(|e| format!("sgemm B: {e}"))?;
    let c_len = span(g.m, g.n, g.ldc).map_err(|e| format!("sgemm C: {e}"))?;
    for i in 0..g.batch {
        let (pa, pb, pc) = (
            member(g.a, i, g.stride_a)?,
            member(g.b, i, g.stride_b)?,
            member(g.c, i, g.stride_c)?,
        );
        // C is column-major m × n, i.e. Cᵀ is row-major n × m with row stride ldc:
        // Cᵀ = op(B)ᵀ · op(A)ᵀ.
        let product: Vec<f32> = {
            let a = mem.slice::<f32>(pa, a_len)?;
            let b = mem.slice::<f32>(pb, b_len)?;
            // op(A)ᵀ (k × m) and op(B)ᵀ (n × k) as strided views of the column-major storage.
            let at = if g.trans_a {
                Mat {
                    data: a,
                    rs: 1,
                    cs: g.lda,
                }
            } else {
                Mat {
                    data: a,
                    rs: g.lda,
                    cs: 1,
                }
            };
            let bt = if g.trans_b {
                Mat {
                    data: b,
                    rs: 1,
                    cs: g.ldb,
                }
            } else {
                Mat {
                    data: b,
                    rs: g.ldb,
                    cs: 1,
                }
            };
            let mut out = vec![0.0f32; g.n * g.m];
            sgemm(1, g.n, g.m, g.k, bt, at, &mut out, g.m, false);
            out
        };
        let c = mem.slice_mut::<f32>(pc, c_len)?;
        for col in 0..g.n {
            for row in 0..g.m {
                let v = g.alpha * product[col * g.m + row];
                let at = col * g.ldc + row;
                c[at] = if g.beta == 0.0 { v } else { v + g.beta * c[at] };
            }
        }
    }
    Ok(())
}
