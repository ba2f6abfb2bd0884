//! Row-wise normalisations: softmax / log-softmax and layer normalisation over the last axis.

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
        let m = r.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let mut s = 0.0f32;
        for v in r.iter_mut() {
            *v -= m;
            if !log {
                *v = crate::activation::exp(*v);
                s += *v;
            } else {
                s += crate::activation::exp(*v);
            }
        }
        if log {
            let ls = s.ln();
            r.iter_mut().for_each(|v| *v -= ls);
        } else {
            let inv = 1.0 / s;
            r.iter_mut().for_each(|v| *v *= inv);
        }
    });
}

/// Layer normalisation of every row of length `len`, in place: `(x - mean) / sqrt(var + eps) * g + b`.
pub fn layer_norm_rows(
    threads: usize,
    data: &mut [f32],
    len: usize,
    gamma: &[f32],
    beta: Option<&[f32]>,
    eps: f32,
) {
    assert_eq!(gamma.len(), len, "layer norm scale length");
    rows(threads, data, len, |r| {
        let n = r.len() as f32;
        let mean = r.iter().sum::<f32>() / n;
        let var = r.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
        let inv = 1.0 / (var + eps).sqrt();
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
    });
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
    fn layer_norm_gives_zero_mean_unit_variance() {
        let mut a: Vec<f32> = (0..8).map(|v| v as f32 * 3.0).collect();
        layer_norm_rows(1, &mut a, 8, &[1.0; 8], None, 0.0);
        let mean: f32 = a.iter().sum::<f32>() / 8.0;
        let var: f32 = a.iter().map(|v| v * v).sum::<f32>() / 8.0;
        assert!(mean.abs() < 1e-5 && (var - 1.0).abs() < 1e-4);
    }
}
