//! Integer matrix product for the quantized operators: `i16` operands (8-bit values with their
//! zero points already subtracted, so -255..=255) and exact `i32` accumulation, wrapping on
//! overflow as the ONNX reference's int32 arithmetic does.
//!
//! Blocked so that a panel of `b` stays in cache while every row of `a` passes over it, and the
//! row of `c` being accumulated stays in L1; the inner loop is a multiply-add over contiguous
//! slices, which the compiler vectorises.

use rayon::prelude::*;

/// Columns of `b` and `c` per panel.
const NC: usize = 256;
/// Rows of `b` (the reduction) per panel: `KC x NC` i16 is 64 KiB.
const KC: usize = 128;

/// `c[m×n] = a[m×k] · b[k×n]`, all dense row-major.
pub fn igemm(threads: usize, m: usize, n: usize, k: usize, a: &[i16], b: &[i16], c: &mut [i32]) {
    assert!(
        a.len() >= m * k && b.len() >= k * n && c.len() >= m * n,
        "igemm operand too small"
    );
    if m == 0 || n == 0 {
        return;
    }
    let c = &mut c[..m * n];
    if k == 0 {
        c.fill(0);
        return;
    }
    if threads > 1 && m > 1 && m * n * k >= crate::PAR_MIN_WORK {
        let rows = m.div_ceil(threads);
        c.par_chunks_mut(rows * n)
            .zip(a.par_chunks(rows * k))
            .for_each(|(c, a)| block(c.len() / n, n, k, a, b, c));
    } else {
        block(m, n, k, a, b, c);
    }
}

fn block(m: usize, n: usize, k: usize, a: &[i16], b: &[i16], c: &mut [i32]) {
    c.fill(0);
    for j0 in (0..n).step_by(NC) {
        let j1 = (j0 + NC).min(n);
        for p0 in (0..k).step_by(KC) {
            let p1 = (p0 + KC).min(k);
            for i in 0..m {
                let row = &mut c[i * n + j0..i * n + j1];
                for p in p0..p1 {
                    let av = a[i * k + p] as i32;
                    if av == 0 {
                        continue;
                    }
                    let bp = &b[p * n + j0..p * n + j1];
                    for (o, &bv) in row.iter_mut().zip(bp) {
                        *o = o.wrapping_add(av.wrapping_mul(bv as i32));
                    }
                }
            }
        }
    }
}

/// The plain triple loop, for tests.
pub fn igemm_reference(m: usize, n: usize, k: usize, a: &[i16], b: &[i16]) -> Vec<i32> {
    let mut c = vec![0i32; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).fold(0i32, |s, p| {
                s.wrapping_add((a[i * k + p] as i32).wrapping_mul(b[p * n + j] as i32))
            });
        }
    }
    c
}

/// Deterministic operands over the whole range, for tests.
#[cfg(test)]
pub(crate) fn ints(len: usize, seed: u32) -> Vec<i16> {
    let mut s = seed;
    (0..len)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            ((s >> 16) % 511) as i16 - 255
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_triple_loop_across_panels_and_threads() {
        // Shapes below, at and past the panel sizes, and empty ones.
        for &(m, n, k) in &[
            (1, 1, 1),
            (3, 5, 7),
            (4, 300, 130),
            (17, 257, 129),
            (64, 64, 512),
            (0, 4, 4),
            (4, 0, 4),
            (4, 4, 0),
        ] {
            let (a, b) = (ints(m * k, 1), ints(k * n, 2));
            let want = igemm_reference(m, n, k, &a, &b);
            for threads in [1, 2, 3] {
                let mut c = vec![7i32; m * n];
                igemm(threads, m, n, k, &a, &b, &mut c);
                assert_eq!(c, want, "{m}x{n}x{k} on {threads} threads");
            }
        }
    }

    #[test]
    fn wraps_like_int32_on_overflow() {
        let k = 40_000;
        let (a, b) = (vec![255i16; k], vec![255i16; k]);
        let mut c = vec![0i32; 1];
        igemm(1, 1, 1, k, &a, &b, &mut c);
        assert_eq!(c[0], (255i64 * 255 * k as i64) as i32);
    }
}
