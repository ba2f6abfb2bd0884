//! Fully-connected layers (`x · wᵀ`, the weights `[n, k]` as PyTorch's `Linear` keeps them) on
//! AVX-512 or AVX2 + FMA CPUs, reading the weights where they lie.
//!
//! A classifier at batch 1 is a matrix-vector product: every weight is read once and used once,
//! so the time is the time to stream the weights. A general GEMM packs them into its own layout
//! first, reading and writing them once more on every call (mobilenet_v2's 1280 × 1000
//! classifier: 0.37 ms on two threads, against 0.22 for onnxruntime). Here each output is a dot
//! product of two contiguous rows, 16 lanes at a time (one AVX-512 vector or two AVX2 ones); a
//! tile of up to 4 input rows (1 on AVX2, whose 16 registers hold 4 weight rows' sums) × 4
//! weight rows keeps its dot products in registers, and every input row passes one tile of
//! weight rows while those are in the cache.
//!
//! Every output is the same sum whatever the batch, the tile or the thread split: lane `l`
//! accumulates `k ≡ l (mod 16)` in order with fused multiply-adds, then the lanes are added in
//! one fixed order.

use crate::gemm::SharedOut;
#[cfg(target_arch = "x86_64")]
use crate::lanes16::{Avx2, Avx512, Lanes16};
use rayon::prelude::*;

const LANES: usize = 16;
/// Weight rows per register tile, and the most input rows.
const TILE: usize = 4;
/// Weight rows per parallel task: enough to amortise the task, few enough to balance.
const ROWS_PER_TASK: usize = 32;

/// Whether this CPU runs [`dense`].
pub fn available() -> bool {
    crate::nhwc_conv::available()
}

/// `out[r·n + j] = Σ_kk x[r·k + kk] · w[j·k + kk]` for `m` rows of `x` (`m × k`) and the `n`
/// rows of `w` (`n × k`), split over weight rows across `threads`.
///
/// # Panics
/// If the CPU has neither AVX-512F nor AVX2 + FMA ([`available`]) or a slice does not match
/// `(m, k, n)`.
pub fn dense(
    x: &[f32],
    w: &[f32],
    (m, k, n): (usize, usize, usize),
    out: &mut [f32],
    threads: usize,
) {
    assert!(available(), "dense needs AVX-512F or AVX2");
    dense_on(crate::avx512f(), x, w, (m, k, n), out, threads);
}

/// [`dense`] on the AVX-512 kernel, or on the AVX2 one.
fn dense_on(
    avx512: bool,
    x: &[f32],
    w: &[f32],
    (m, k, n): (usize, usize, usize),
    out: &mut [f32],
    threads: usize,
) {
    #[cfg(target_arch = "x86_64")]
    assert!(
        crate::avx512f() || !avx512 && crate::activation::avx2_fma(),
        "dense on this CPU"
    );
    assert!(
        x.len() == m * k && w.len() == n * k && out.len() == m * n,
        "dense sizes"
    );
    if m == 0 || n == 0 {
        return;
    }
    let out = SharedOut(out.as_mut_ptr());
    // Each task writes its own columns of every row.
    let block = |cols: std::ops::Range<usize>| {
        // SAFETY: the CPU has the kernel's instructions (asserted above); the sizes were
        // checked above; tasks write disjoint columns.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            if avx512 {
                weight_rows_avx512(x, w, (m, k, n), cols, out)
            } else {
                weight_rows_avx2(x, w, (m, k, n), cols, out)
            }
        }
    };
    let tasks = n.div_ceil(ROWS_PER_TASK);
    if threads > 1 && tasks > 1 && m * n * k >= crate::PAR_MIN_WORK {
        (0..tasks)
            .into_par_iter()
            .for_each(|t| block(t * ROWS_PER_TASK..((t + 1) * ROWS_PER_TASK).min(n)));
    } else {
        block(0..n);
    }
}

/// [`weight_rows`] on AVX-512.
///
/// # Safety
/// The CPU has AVX-512F; as [`weight_rows`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn weight_rows_avx512(
    x: &[f32],
    w: &[f32],
    shape: (usize, usize, usize),
    cols: std::ops::Range<usize>,
    out: SharedOut,
) {
    // SAFETY: this function's contract.
    unsafe { weight_rows::<Avx512>(x, w, shape, cols, out) }
}

/// [`weight_rows`] on AVX2 + FMA.
///
/// # Safety
/// The CPU has AVX2 and FMA; as [`weight_rows`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn weight_rows_avx2(
    x: &[f32],
    w: &[f32],
    shape: (usize, usize, usize),
    cols: std::ops::Range<usize>,
    out: SharedOut,
) {
    // SAFETY: this function's contract.
    unsafe { weight_rows::<Avx2>(x, w, shape, cols, out) }
}

/// Columns `cols` of every output row.
///
/// # Safety
/// The CPU has `V`'s instructions (this is inlined into a function compiled for them); `out`
/// holds `m × n` elements and no one else touches columns `cols`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn weight_rows<V: Lanes16>(
    x: &[f32],
    w: &[f32],
    (m, k, n): (usize, usize, usize),
    cols: std::ops::Range<usize>,
    out: SharedOut,
) {
    assert!(cols.end <= n, "dense columns");
    // Input rows per tile: TILE × TILE sums fill half of AVX-512's registers; on AVX2 one row's
    // TILE sums take half of its 16 (two per 16 lanes).
    let most = if V::REGISTERS >= 32 { TILE } else { 1 };
    let mut j = cols.start;
    while j < cols.end {
        let nj = (cols.end - j).min(TILE);
        let mut r = 0;
        while r < m {
            let nr = (m - r).min(most);
            // Short tiles repeat their last row or column; only their own outputs are stored.
            let rows: [usize; TILE] = std::array::from_fn(|i| r + i.min(nr - 1));
            let wrows: [usize; TILE] = std::array::from_fn(|c| j + c.min(nj - 1));
            // SAFETY: the CPU has V's instructions.
            let sums = unsafe {
                match nr {
                    1 => tile::<V, 1>(x, w, k, &rows, &wrows),
                    2 => tile::<V, 2>(x, w, k, &rows, &wrows),
                    3 => tile::<V, 3>(x, w, k, &rows, &wrows),
                    _ => tile::<V, 4>(x, w, k, &rows, &wrows),
                }
            };
            for (i, row) in sums.iter().enumerate().take(nr) {
                for (c, s) in row.iter().enumerate().take(nj) {
                    // SAFETY: row < m and column < n (asserted), owned by this call.
                    unsafe { *out.at(rows[i] * n + wrows[c]) = *s };
                }
            }
            r += nr;
        }
        j += nj;
    }
}

/// The dot products of input rows `rows[..R]` with weight rows `wrows`.
///
/// # Safety
/// The CPU has `V`'s instructions.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tile<V: Lanes16, const R: usize>(
    x: &[f32],
    w: &[f32],
    k: usize,
    rows: &[usize; TILE],
    wrows: &[usize; TILE],
) -> [[f32; TILE]; TILE] {
    assert!(
        rows.iter().all(|&r| (r + 1) * k <= x.len())
            && wrows.iter().all(|&j| (j + 1) * k <= w.len()),
        "dense tile bounds"
    );
    // SAFETY (all): the CPU has V's instructions (this function's contract).
    let mut acc = [[unsafe { V::zero() }; TILE]; R];
    let mut kk = 0;
    while kk < k {
        let mask = unsafe { V::mask(k - kk) };
        // SAFETY: the mask keeps elements kk..k of rows within x and w (asserted above).
        let wv: [V; TILE] = std::array::from_fn(|c| unsafe {
            V::load_masked(mask, w.as_ptr().add(wrows[c] * k + kk))
        });
        for (i, acc) in acc.iter_mut().enumerate() {
            // SAFETY: as above.
            let xv = unsafe { V::load_masked(mask, x.as_ptr().add(rows[i] * k + kk)) };
            for c in 0..TILE {
                acc[c] = unsafe { acc[c].fmadd(xv, wv[c]) };
            }
        }
        kk += LANES;
    }
    let mut sums = [[0.0; TILE]; TILE];
    for (s, a) in sums.iter_mut().zip(&acc) {
        for c in 0..TILE {
            s[c] = unsafe { a[c].reduce_add() };
        }
    }
    sums
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::lcg;

    fn reference(x: &[f32], w: &[f32], (m, k, n): (usize, usize, usize)) -> Vec<f64> {
        let mut out = vec![0.0; m * n];
        for r in 0..m {
            for j in 0..n {
                out[r * n + j] = (0..k)
                    .map(|i| x[r * k + i] as f64 * w[j * k + i] as f64)
                    .sum();
            }
        }
        out
    }

    #[test]
    fn matches_reference_and_each_row_alone_bit_for_bit() {
        if crate::skip_without(available(), "AVX-512F or AVX2 + FMA") {
            return;
        }
        // On an AVX-512 CPU the AVX2 kernel runs too.
        let kernels = if crate::avx512f() {
            &[true, false][..]
        } else {
            &[false]
        };
        for &avx512 in kernels {
            for (m, k, n) in [
                (1, 1, 1),
                (1, 1280, 1000),
                (3, 17, 5),
                (8, 64, 33),
                (5, 100, 130),
                (9, 15, 4),
            ] {
                let (x, w) = (lcg(1, m * k), lcg(2, n * k));
                let want = reference(&x, &w, (m, k, n));
                for threads in [1, 2, 3] {
                    let mut got = vec![f32::NAN; m * n];
                    rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .expect("pool")
                        .install(|| dense_on(avx512, &x, &w, (m, k, n), &mut got, threads));
                    for (g, r) in got.iter().zip(&want) {
                        assert!(
                            (*g as f64 - r).abs() <= 1e-5 * (1.0 + r.abs()) * (k as f64).sqrt(),
                            "{m}x{k}x{n} (AVX-512: {avx512}): {g} vs {r}"
                        );
                    }
                    // Each row computed alone (batch 1) gives the same bits.
                    for r in 0..m {
                        let mut one = vec![0.0; n];
                        dense_on(avx512, &x[r * k..(r + 1) * k], &w, (1, k, n), &mut one, 1);
                        assert!(
                            one.iter()
                                .zip(&got[r * n..(r + 1) * n])
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{m}x{k}x{n} row {r} with {threads} threads (AVX-512: {avx512})"
                        );
                    }
                }
            }
        }
    }
}
