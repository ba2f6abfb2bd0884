//! Single-precision matrix multiply over strided row-major views, through the `gemm` crate.

use gemm::Parallelism;
use rayon::prelude::*;

/// A read-only strided matrix: element (r, c) is at `data[r * rs + c * cs]`.
#[derive(Clone, Copy, Debug)]
pub struct Mat<'a> {
    pub data: &'a [f32],
    pub rs: usize,
    pub cs: usize,
}

impl<'a> Mat<'a> {
    /// A dense row-major matrix with `cols` columns.
    pub fn row_major(data: &'a [f32], cols: usize) -> Self {
        Mat {
            data,
            rs: cols,
            cs: 1,
        }
    }
    /// The transpose of a dense row-major matrix with `cols` columns, without copying.
    pub fn transposed(data: &'a [f32], cols: usize) -> Self {
        Mat {
            data,
            rs: 1,
            cs: cols,
        }
    }
    fn fits(&self, rows: usize, cols: usize) -> bool {
        rows == 0 || cols == 0 || (rows - 1) * self.rs + (cols - 1) * self.cs < self.data.len()
    }
}

/// `c[m×n] (+)= a[m×k] · b[k×n]`; `c` is dense row-major with row stride `ldc`.
/// With `accumulate` the product is added to what `c` holds (used to pre-load a bias).
#[allow(clippy::too_many_arguments)]
pub fn sgemm(
    threads: usize,
    m: usize,
    n: usize,
    k: usize,
    a: Mat<'_>,
    b: Mat<'_>,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    // These are invariants of the callers (shapes were validated by the executor); a violation
    // would be an out-of-bounds write, so it must stop here rather than reach unsafe code.
    assert!(a.fits(m, k) && b.fits(k, n), "sgemm operand too small");
    assert!((m - 1) * ldc + n <= c.len(), "sgemm destination too small");
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                c[r * ldc..r * ldc + n].fill(0.0);
            }
        }
        return;
    }
    let work = m * n * k;
    if threads > 1 && work >= 1 << 16 {
        split(threads, m, n, k, a, b, c, ldc, accumulate);
        return;
    }
    // SAFETY: bounds checked above; the three buffers are distinct borrows.
    unsafe { gemm_raw(m, n, k, a, b, c.as_mut_ptr(), ldc, accumulate) }
}

/// `sgemm` on several threads: one single-threaded GEMM per block of columns (or of rows, when
/// there are too few columns), which scales better than the gemm crate's own threading (on
/// resnet50's and BERT's shapes, 2 threads: 270-330 against 190-300 GFLOP/s).
#[allow(clippy::too_many_arguments)]
fn split(
    threads: usize,
    m: usize,
    n: usize,
    k: usize,
    a: Mat<'_>,
    b: Mat<'_>,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    let dst = SharedOut(c.as_mut_ptr());
    if n >= 32 * threads || m < 8 * threads {
        let cols = n.div_ceil(threads).next_multiple_of(16);
        (0..n.div_ceil(cols)).into_par_iter().for_each(|t| {
            let (j0, j1) = (t * cols, ((t + 1) * cols).min(n));
            let bj = Mat {
                data: &b.data[j0 * b.cs..],
                ..b
            };
            // SAFETY: columns [j0, j1) of every row are this task's alone; bounds as asserted.
            unsafe { sgemm_block(m, j1 - j0, k, a, bj, dst.at(j0), ldc, accumulate) }
        });
    } else {
        let rows = m.div_ceil(threads).next_multiple_of(8);
        (0..m.div_ceil(rows)).into_par_iter().for_each(|t| {
            let (i0, i1) = (t * rows, ((t + 1) * rows).min(m));
            let ai = Mat {
                data: &a.data[i0 * a.rs..],
                ..a
            };
            // SAFETY: rows [i0, i1) are this task's alone; bounds as asserted.
            unsafe { sgemm_block(i1 - i0, n, k, ai, b, dst.at(i0 * ldc), ldc, accumulate) }
        });
    }
}

/// A raw output pointer shared by tasks that write disjoint blocks of it.
#[derive(Clone, Copy)]
pub(crate) struct SharedOut(pub(crate) *mut f32);
// SAFETY: only used by tasks that write disjoint elements.
unsafe impl Send for SharedOut {}
// SAFETY: as above.
unsafe impl Sync for SharedOut {}
impl SharedOut {
    pub(crate) fn at(self, offset: usize) -> *mut f32 {
        self.0.wrapping_add(offset)
    }
}

/// `sgemm` on one thread into a raw destination, for callers that hand disjoint blocks of one
/// output to several threads at once.
///
/// # Safety
/// `a` and `b` must hold `m×k` and `k×n` (as `sgemm` asserts), `k > 0`, and `c` must be valid
/// for writes (and reads, with `accumulate`) of element `(r, j)` at `c + r*ldc + j` for
/// `r < m`, `j < n`, with no other access to those elements during the call.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn sgemm_block(
    m: usize,
    n: usize,
    k: usize,
    a: Mat<'_>,
    b: Mat<'_>,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    debug_assert!(a.fits(m, k) && b.fits(k, n) && k > 0);
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { gemm_raw(m, n, k, a, b, c, ldc, accumulate) }
}

/// The deepest product handed to the gemm crate in one call. Deeper ones go in slices of at
/// most this depth, each added onto the last: the crate's own depth blocking of a deeper product
/// depends on the other dimensions too (a block of rows could come out with other last bits than
/// the whole matrix), ours on `k` alone. So an element's value does not depend on how the rows or
/// columns are split between threads, or on the batch.
const MAX_DEPTH: usize = 512;

#[allow(clippy::too_many_arguments)]
unsafe fn gemm_raw(
    m: usize,
    n: usize,
    k: usize,
    a: Mat<'_>,
    b: Mat<'_>,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    let step = k.div_ceil(k.div_ceil(MAX_DEPTH));
    for (i, p0) in (0..k).step_by(step).enumerate() {
        let depth = step.min(k - p0);
        let (ad, bd) = (&a.data[p0 * a.cs..], &b.data[p0 * b.rs..]);
        // SAFETY: the callers' contracts (bounds checked, destination exclusively ours); the
        // slices start at depth p0 of the operands.
        unsafe {
            gemm::gemm(
                m,
                n,
                depth,
                c,
                1,
                ldc as isize,
                accumulate || i > 0,
                ad.as_ptr(),
                a.cs as isize,
                a.rs as isize,
                bd.as_ptr(),
                b.cs as isize,
                b.rs as isize,
                1.0,
                1.0,
                false,
                false,
                false,
                Parallelism::None,
            );
        }
    }
}

/// Straightforward reference used by the tests of this crate and of the executor.
#[allow(clippy::too_many_arguments)]
pub fn sgemm_reference(
    m: usize,
    n: usize,
    k: usize,
    a: Mat<'_>,
    b: Mat<'_>,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0f64;
            for p in 0..k {
                s += a.data[i * a.rs + p * a.cs] as f64 * b.data[p * b.rs + j * b.cs] as f64;
            }
            let d = &mut c[i * ldc + j];
            *d = if accumulate { *d + s as f32 } else { s as f32 };
        }
    }
}

#[cfg(test)]
pub(crate) fn lcg(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Split by rows (few columns) or by columns on 2 and 3 threads, every element is what one
    /// thread computes, bit for bit, also deeper than one slice.
    #[test]
    fn splits_do_not_change_any_element() {
        for &(m, n, k) in &[
            (160, 56, 962),
            (512, 49, 4608),
            (96, 200, 700),
            (64, 7, 300),
        ] {
            let (a, b) = (lcg(1, m * k), lcg(2, k * n));
            let run = |threads| {
                let mut c = lcg(3, m * n);
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build();
                pool.expect("pool").install(|| {
                    let (am, bm) = (Mat::row_major(&a, k), Mat::row_major(&b, n));
                    sgemm(threads, m, n, k, am, bm, &mut c, n, true)
                });
                c
            };
            let one = run(1);
            for threads in [2, 3] {
                assert!(run(threads) == one, "{m}x{n}x{k}: {threads} threads differ");
            }
        }
    }

    #[test]
    fn matches_reference_with_transposes_and_accumulate() {
        // Shapes that take each path: one thread, split by columns, split by rows (few
        // columns), and too little work to split; with A and B each stored either way.
        for &(m, n, k) in &[
            (1, 1, 1),
            (3, 5, 7),
            (64, 33, 129),
            (200, 70, 90),
            (200, 40, 90),
            (1, 1000, 300),
            (2, 333, 256),
        ] {
            for threads in [1, 2, 3] {
                let a = lcg(1, m * k);
                let bt = lcg(2, n * k);
                let am = if threads == 3 {
                    Mat::transposed(&a, m)
                } else {
                    Mat::row_major(&a, k)
                };
                let ldc = n + 3;
                let mut c = lcg(3, m * ldc);
                let mut r = c.clone();
                let bm = Mat::transposed(&bt, k);
                sgemm(threads, m, n, k, am, bm, &mut c, ldc, true);
                sgemm_reference(m, n, k, am, bm, &mut r, ldc, true);
                for (x, y) in c.iter().zip(&r) {
                    assert!(
                        (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
                        "{m}x{n}x{k} on {threads} threads: {x} vs {y}"
                    );
                }
            }
        }
    }
}
