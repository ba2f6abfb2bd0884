//! Row-wise normalisations: softmax / log-softmax, layer normalisation and RMS normalisation
//! over the last axis.

use crate::activation::{Elements, InPlace, OutOfPlace};
use rayon::prelude::*;

fn rows(threads: usize, data: &mut [f32], len: usize, f: impl Fn(&mut [f32]) + Sync + Send) {
    if len == 0 {
        return;
    }
    if threads > 1 && data.len() >= crate::PAR_MIN_WORK {
        data.par_chunks_mut(len).for_each(f);
    } else {
        data.chunks_mut(len).for_each(f);
    }
}

/// Softmax (or log-softmax) of every contiguous row of length `len`, in place.
pub fn softmax_rows(threads: usize, data: &mut [f32], len: usize, log: bool) {
    rows(threads, data, len, |r| {
        crate::wide::wide(
            #[inline(always)]
            || softmax_row(InPlace(r), log, 1.0),
        )
    });
}

/// [`softmax_rows`] of `scale · src` into `dst`: one pass over memory fewer than a copy and
/// [`softmax_rows`], and than a product by `scale` before it (attention's `1/√d`). The same
/// results as those passes: each `scale · x` is rounded to f32 as the product would be, and
/// since multiplying by a positive number keeps the order, the largest product is `scale`
/// times the largest value.
///
/// # Panics
/// If the slices differ in length, or `scale` is not positive and finite.
pub fn softmax_rows_into(
    threads: usize,
    src: &[f32],
    dst: &mut [f32],
    len: usize,
    log: bool,
    scale: f32,
) {
    assert_eq!(
        src.len(),
        dst.len(),
        "softmax source and destination lengths"
    );
    assert!(
        scale > 0.0 && scale.is_finite(),
        "softmax input scale {scale}"
    );
    if len == 0 {
        return;
    }
    let run = |(d, s): (&mut [f32], &[f32])| {
        crate::wide::wide(
            #[inline(always)]
            || softmax_row(OutOfPlace(s, d), log, scale),
        )
    };
    if threads > 1 && dst.len() >= crate::PAR_MIN_WORK {
        dst.par_chunks_mut(len)
            .zip(src.par_chunks(len))
            .for_each(run);
    } else {
        dst.chunks_mut(len).zip(src.chunks(len)).for_each(run);
    }
}

/// The softmax of one row times `scale` (positive), where `row` puts it.
#[inline(always)]
fn softmax_row<'a>(row: impl Elements<'a>, log: bool, scale: f32) {
    let m = scale * lane_max(row.source());
    if log {
        let ls = lane_sum(row.source(), |v| crate::activation::exp(v * scale - m)).ln();
        row.map(|v| v * scale - m - ls);
    } else {
        let out = row.map(|v| crate::activation::exp(v * scale - m));
        let inv = 1.0 / lane_sum(out, |v| v);
        out.iter_mut().for_each(|v| *v *= inv);
    }
}

/// Layer normalisation of every contiguous row of `src` (length `len`) into `dst`: `(x - mean)
/// / sqrt(var + eps) · gamma + beta`. Each row is copied, then normalised in place, split across
/// the threads with the copy.
///
/// # Panics
/// If `gamma` or `beta` is not `len` long, or `src` and `dst` differ in length.
pub fn layer_norm_rows_into(
    threads: usize,
    src: &[f32],
    dst: &mut [f32],
    len: usize,
    gamma: &[f32],
    beta: Option<&[f32]>,
    eps: f32,
) {
    assert_eq!(src.len(), dst.len(), "layer norm lengths");
    assert_eq!(gamma.len(), len, "layer norm scale length");
    if let Some(b) = beta {
        assert_eq!(b.len(), len, "layer norm bias length");
    }
    if len == 0 {
        return;
    }
    let row = |(d, s): (&mut [f32], &[f32])| {
        d.copy_from_slice(s);
        crate::wide::wide(
            #[inline(always)]
            || layer_norm_row(d, gamma, beta, eps),
        )
    };
    if threads > 1 && dst.len() >= crate::PAR_MIN_WORK {
        (dst.par_chunks_mut(len).zip(src.par_chunks(len))).for_each(row);
    } else {
        dst.chunks_mut(len).zip(src.chunks(len)).for_each(row);
    }
}

/// A row's mean and inverse standard deviation, `1 / sqrt(var + eps)`: what layer
/// normalisation applies, and its optional second and third outputs.
#[inline(always)]
pub fn mean_inv_std(r: &[f32], eps: f32) -> (f32, f32) {
    let n = r.len() as f32;
    let mean = lane_sum(r, |v| v) / n;
    let var = lane_sum(r, |v| (v - mean) * (v - mean)) / n;
    (mean, 1.0 / (var + eps).sqrt())
}

#[inline(always)]
fn layer_norm_row(r: &mut [f32], gamma: &[f32], beta: Option<&[f32]>, eps: f32) {
    let (mean, inv) = mean_inv_std(r, eps);
    match beta {
        Some(b) => {
            for ((v, g), bb) in r.iter_mut().zip(gamma).zip(b) {
                *v = (*v - mean) * inv * g + bb;
            }
        }
        None => {
            for (v, g) in r.iter_mut().zip(gamma) {
                *v = (*v - mean) * inv * g;
            }
        }
    }
}

/// RMS normalisation of every row of length `len`, in place: `x / sqrt(mean(x²) + eps) * g`.
pub fn rms_norm_rows(threads: usize, data: &mut [f32], len: usize, gamma: &[f32], eps: f32) {
    assert_eq!(gamma.len(), len, "RMS norm scale length");
    rows(threads, data, len, |r| {
        let inv = 1.0 / (lane_sum(r, |v| v * v) / len as f32 + eps).sqrt();
        for (v, g) in r.iter_mut().zip(gamma) {
            *v = *v * inv * g;
        }
    });
}

/// Independent partial results per lane, so that reductions vectorise (a single running f32
/// sum or max is a serial dependency the compiler may not reorder).
const LANES: usize = 16;

#[inline(always)]
fn lane_sum(r: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = r.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f(v);
        }
    }
    acc.iter().sum::<f32>() + tail.iter().map(|&v| f(v)).sum::<f32>()
}

#[inline(always)]
fn lane_max(r: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = r.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = a.max(v);
        }
    }
    acc.iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_rows_sum_to_one_and_log_matches() {
        let mut a = vec![1.0f32, 2.0, 3.0, -1.0, 0.0, 1000.0];
        let mut b = a.clone();
        softmax_rows(1, &mut a, 3, false);
        softmax_rows(1, &mut b, 3, true);
        assert!((a[0..3].iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!((a[5] - 1.0).abs() < 1e-6);
        for (x, y) in a.iter().zip(&b) {
            assert!((x.ln() - y).abs() < 1e-4 || *x == 0.0);
        }
    }

    #[test]
    fn a_scaled_softmax_is_the_product_then_the_softmax_bit_for_bit() {
        // Negative values, a -inf, a NaN, and products that round, overflow to inf or go
        // subnormal.
        let len = 21;
        let mut x: Vec<f32> = crate::gemm::lcg(3, 3 * len)
            .iter()
            .map(|v| v * 50.0)
            .collect();
        x[4] = f32::NEG_INFINITY;
        x[len + 7] = f32::NAN;
        x[2 * len + 1] = 3e38;
        for scale in [0.125, 0.3, 1.0, 7.7, 1e-40, 1e30] {
            for log in [false, true] {
                let mut want: Vec<f32> = x.iter().map(|v| v * scale).collect();
                softmax_rows(1, &mut want, len, log);
                let mut got = vec![0.0; x.len()];
                softmax_rows_into(2, &x, &mut got, len, log, scale);
                for (w, g) in want.iter().zip(&got) {
                    assert_eq!(w.to_bits(), g.to_bits(), "scale {scale} log {log}");
                }
            }
        }
    }

    #[test]
    fn layer_norm_gives_zero_mean_unit_variance() {
        let x: Vec<f32> = (0..8).map(|v| v as f32 * 3.0).collect();
        let mut a = vec![0.0; 8];
        layer_norm_rows_into(1, &x, &mut a, 8, &[1.0; 8], None, 0.0);
        let mean: f32 = a.iter().sum::<f32>() / 8.0;
        let var: f32 = a.iter().map(|v| v * v).sum::<f32>() / 8.0;
        assert!(mean.abs() < 1e-5 && (var - 1.0).abs() < 1e-4);
    }

    #[test]
    fn rms_norm_gives_unit_mean_square() {
        let mut a: Vec<f32> = (0..40).map(|v| v as f32 - 7.0).collect();
        rms_norm_rows(2, &mut a, 20, &[2.0; 20], 0.0);
        for row in a.chunks(20) {
            let ms: f32 = row.iter().map(|v| v * v).sum::<f32>() / 20.0;
            assert!((ms - 4.0).abs() < 1e-4, "{ms}");
        }
    }

    #[test]
    fn rows_longer_than_the_lanes_match_a_double_precision_reference() {
        // 37 = two full chunks of 16 and a tail of 5. The row maximum, past where `exp`
        // overflows unless the maximum is subtracted, sits in the tail of the first row and in
        // the first chunk of the second.
        let len = 37;
        let mut x: Vec<f32> = crate::gemm::lcg(7, 2 * len)
            .iter()
            .map(|v| v * 8.0)
            .collect();
        x[len - 2] = 100.0;
        x[len + 3] = 100.0;
        for log in [false, true] {
            let mut got = x.clone();
            softmax_rows(2, &mut got, len, log);
            for (row, out) in x.chunks(len).zip(got.chunks(len)) {
                let m = row.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
                let s: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
                for (&v, &o) in row.iter().zip(out) {
                    let want = if log {
                        v as f64 - m - s.ln()
                    } else {
                        (v as f64 - m).exp() / s
                    };
                    assert!(
                        (o as f64 - want).abs() <= 1e-6 * (1.0 + want.abs()),
                        "{o} vs {want}"
                    );
                }
            }
        }
        let (gamma, beta): (Vec<f32>, Vec<f32>) = (0..len)
            .map(|i| (1.0 + i as f32 / 10.0, i as f32 - 3.0))
            .unzip();
        let mut got = vec![0.0; x.len()];
        layer_norm_rows_into(2, &x, &mut got, len, &gamma, Some(&beta), 1e-5);
        for (row, out) in x.chunks(len).zip(got.chunks(len)) {
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / len as f64;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / len as f64;
            for (i, (&v, &o)) in row.iter().zip(out).enumerate() {
                let want =
                    (v as f64 - mean) / (var + 1e-5).sqrt() * gamma[i] as f64 + beta[i] as f64;
                assert!(
                    (o as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "{o} vs {want}"
                );
            }
        }
    }
}
