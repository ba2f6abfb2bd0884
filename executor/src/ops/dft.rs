//! DFT and STFT: discrete Fourier transforms of real or complex signals (a last axis of 1 or 2:
//! real, or real and imaginary). Float64 signals are computed in f64 by a mixed-radix FFT over a
//! table of twiddle factors (a prime factor over 64 goes through Bluestein's chirp convolution,
//! so every length costs `O(n log n)`); float32 signals in onnxruntime's float32 arithmetic
//! (`fft_f32`). The inverse of a one-sided spectrum gives a real signal, as numpy's `irfft`
//! does.

use super::elementwise::cast;
use super::fft_f32::{C, Fft};
use super::{input, opt_input};
use crate::error::{OpError, OpResult, shape_err};
use crate::tensor::{DType, Data, MAX_ELEMENTS, Tensor, axis_in, checked_numel};
use std::f64::consts::PI;

#[derive(Clone, Debug, PartialEq)]
pub struct DftAttrs {
    pub inverse: bool,
    pub onesided: bool,
    /// The axis attribute (before opset 20); from opset 20 the axis is input 2 (default -2).
    pub axis: Option<i64>,
}

/// `cos` and `sin` of `2πj/n` for every `j < n`.
struct Twiddles {
    n: usize,
    cos: Vec<f64>,
    sin: Vec<f64>,
}

impl Twiddles {
    fn new(n: usize) -> Twiddles {
        let angle = |j: usize| 2.0 * PI * j as f64 / n as f64;
        Twiddles {
            n,
            cos: (0..n).map(|j| angle(j).cos()).collect(),
            sin: (0..n).map(|j| angle(j).sin()).collect(),
        }
    }

    /// `Σ_t x[t] e^{∓2πi k t / n}` for `k < out` (`+` when `inverse`), reading at most `n`
    /// samples of `x` (zeros past its end).
    fn transform(&self, re: &[f64], im: &[f64], out: usize, inverse: bool) -> (Vec<f64>, Vec<f64>) {
        let n = self.n;
        let len = re.len().min(n);
        let mut x = vec![(0.0, 0.0); n];
        for t in 0..len {
            x[t] = (re[t], im[t]);
        }
        let mut y = vec![(0.0, 0.0); n];
        self.fft(&x, 1, &mut y, 1, inverse);
        y.truncate(out);
        y.into_iter().unzip()
    }

    /// The DFT of the `y.len()` samples `x[0], x[stride], ...` into `y`, a transform of that
    /// length reading this table every `step` entries: mixed radix, splitting by the smallest
    /// prime factor at each level (a prime length is summed directly).
    fn fft(
        &self,
        x: &[(f64, f64)],
        stride: usize,
        y: &mut [(f64, f64)],
        step: usize,
        inverse: bool,
    ) {
        let m = y.len();
        let sign = if inverse { 1.0 } else { -1.0 };
        let w = |j: usize| {
            let j = (j % m) * step;
            (self.cos[j], sign * self.sin[j])
        };
        if m == 1 {
            y[0] = x[0];
            return;
        }
        let p = (2..m)
            .take_while(|p| p * p <= m)
            .find(|p| m.is_multiple_of(*p))
            .unwrap_or(m);
        if p == m && m > DIRECT_PRIME_MAX {
            bluestein(x, stride, y, inverse);
            return;
        }
        if p == m {
            for (k, yk) in y.iter_mut().enumerate() {
                let (mut sr, mut si) = (0.0, 0.0);
                for t in 0..m {
                    let (c, s) = w(k * t);
                    let (a, b) = x[t * stride];
                    sr += a * c - b * s;
                    si += a * s + b * c;
                }
                *yk = (sr, si);
            }
            return;
        }
        // p interleaved sub-transforms of length m / p, then p-point butterflies.
        let q = m / p;
        let mut sub = vec![(0.0, 0.0); m];
        for r in 0..p {
            self.fft(
                &x[r * stride..],
                stride * p,
                &mut sub[r * q..(r + 1) * q],
                step * p,
                inverse,
            );
        }
        for k in 0..q {
            for h in 0..p {
                let at = k + h * q;
                let (mut sr, mut si) = (0.0, 0.0);
                for r in 0..p {
                    let (c, s) = w(r * at);
                    let (a, b) = sub[r * q + k];
                    sr += a * c - b * s;
                    si += a * s + b * c;
                }
                y[at] = (sr, si);
            }
        }
    }

    /// The real signal of length `n` whose one-sided spectrum starts with `re`/`im` (numpy's
    /// `irfft`: the imaginary parts of the DC and Nyquist bins do not count).
    fn inverse_real(&self, re: &[f64], im: &[f64]) -> Vec<f64> {
        let n = self.n;
        let at = |k: usize| {
            (
                re.get(k).copied().unwrap_or(0.0),
                im.get(k).copied().unwrap_or(0.0),
            )
        };
        let mut full = vec![(0.0, 0.0); n];
        full[0] = (at(0).0, 0.0);
        for k in 1..n.div_ceil(2) {
            let (r, i) = at(k);
            (full[k], full[n - k]) = ((r, i), (r, -i));
        }
        if n.is_multiple_of(2) {
            full[n / 2] = (at(n / 2).0, 0.0);
        }
        let mut y = vec![(0.0, 0.0); n];
        self.fft(&full, 1, &mut y, 1, true);
        y.into_iter().map(|(r, _)| r / n as f64).collect()
    }
}

/// Prime lengths up to this are summed directly; longer ones go through [`bluestein`].
const DIRECT_PRIME_MAX: usize = 64;

fn mul((a, b): (f64, f64), (c, d): (f64, f64)) -> (f64, f64) {
    (a * c - b * d, a * d + b * c)
}

/// The DFT of the `y.len()` samples `x[0], x[stride], ...` into `y` by Bluestein's algorithm:
/// with `kt = (k² + t² − (k−t)²) / 2` the transform is a convolution with a chirp, computed by
/// power-of-two FFTs at least twice as long, so a large prime length costs `O(m log m)`, not
/// the direct sum's `O(m²)` (a model asking for a transform a million samples long, prime,
/// would otherwise hold a worker for hours).
fn bluestein(x: &[(f64, f64)], stride: usize, y: &mut [(f64, f64)], inverse: bool) {
    let m = y.len();
    let sign = if inverse { 1.0 } else { -1.0 };
    // chirp[j] = e^{±πi j²/m}, with j² taken mod 2m so that the angle stays exact.
    let mut chirp = Vec::with_capacity(m);
    let mut square = 0usize;
    for j in 0..m {
        let angle = sign * PI * square as f64 / m as f64;
        chirp.push((angle.cos(), angle.sin()));
        square = (square + 2 * j + 1) % (2 * m);
    }
    let len = (2 * m - 1).next_power_of_two();
    let table = Twiddles::new(len);
    let conj = |(a, b): (f64, f64)| (a, -b);
    // The chirp's conjugate at offsets -(m-1)..m, circularly.
    let mut kernel = vec![(0.0, 0.0); len];
    kernel[0] = conj(chirp[0]);
    for j in 1..m {
        kernel[j] = conj(chirp[j]);
        kernel[len - j] = conj(chirp[j]);
    }
    let mut kernel_spectrum = vec![(0.0, 0.0); len];
    table.fft(&kernel, 1, &mut kernel_spectrum, 1, false);
    let mut signal = kernel;
    signal.fill((0.0, 0.0));
    for t in 0..m {
        signal[t] = mul(x[t * stride], chirp[t]);
    }
    let mut spectrum = vec![(0.0, 0.0); len];
    table.fft(&signal, 1, &mut spectrum, 1, false);
    for (s, k) in spectrum.iter_mut().zip(&kernel_spectrum) {
        *s = mul(*s, *k);
    }
    table.fft(&spectrum, 1, &mut signal, 1, true);
    let scale = 1.0 / len as f64;
    for (k, yk) in y.iter_mut().enumerate() {
        let (a, b) = mul(chirp[k], signal[k]);
        *yk = (a * scale, b * scale);
    }
}

/// A positive transform length from a scalar integer input.
fn length(t: &Tensor, what: &str) -> OpResult<usize> {
    match t.to_i64_vec()?.as_slice() {
        [v] if *v > 0 && (*v as u64) <= MAX_ELEMENTS as u64 => Ok(*v as usize),
        v => shape_err(format!("{what} must be one positive integer, got {v:?}")),
    }
}

fn float_input(x: &Tensor, op: &str) -> OpResult<()> {
    match x.dtype() {
        DType::F32 | DType::F64 => Ok(()),
        d => Err(OpError::DType(format!("{op} of {d:?}"))),
    }
}

/// DFT's geometry: the signal axis, its length, the transform length and the output shape.
pub(crate) fn dft_shape(
    a: &DftAttrs,
    inputs: &[Option<&Tensor>],
) -> OpResult<(usize, usize, Vec<usize>)> {
    let x = input(inputs, 0)?;
    let r = x.rank();
    if r < 2 || !matches!(x.shape[r - 1], 1 | 2) {
        return shape_err(format!(
            "DFT input must end in an axis of 1 (real) or 2 (complex), got {:?}",
            x.shape
        ));
    }
    let axis = match (a.axis, opt_input(inputs, 2)) {
        (Some(v), _) => v,
        (None, Some(t)) => match t.to_i64_vec()?.as_slice() {
            [v] => *v,
            v => return shape_err(format!("DFT axis must be one integer, got {v:?}")),
        },
        (None, None) => -2,
    };
    let axis = axis_in(axis, r)?;
    if axis == r - 1 {
        return shape_err("DFT axis is the real/imaginary axis");
    }
    let len = x.shape[axis];
    let n = match opt_input(inputs, 1).filter(|t| !t.is_empty()) {
        Some(t) => length(t, "dft_length")?,
        None if a.inverse && a.onesided => {
            let n = 2 * len.saturating_sub(1);
            if n == 0 {
                return shape_err("DFT: an inverse one-sided spectrum of one bin has no length");
            }
            n
        }
        None if len == 0 => return shape_err("DFT of an empty signal"),
        None => len,
    };
    let mut out = x.shape.clone();
    (out[axis], out[r - 1]) = match (a.inverse, a.onesided) {
        (false, true) => (n / 2 + 1, 2),
        (true, true) => (n, 1),
        _ => (n, 2),
    };
    checked_numel(&out)?;
    Ok((axis, n, out))
}

/// DFT over one axis of a real or complex signal.
pub fn dft(a: &DftAttrs, inputs: &[Option<&Tensor>]) -> OpResult<Tensor> {
    let x = input(inputs, 0)?;
    float_input(x, "DFT")?;
    let (axis, n, out_shape) = dft_shape(a, inputs)?;
    let r = x.rank();
    let (c, len, out_len) = (x.shape[r - 1], x.shape[axis], out_shape[axis]);
    let outer: usize = x.shape[..axis].iter().product();
    let inner: usize = x.shape[axis + 1..r - 1].iter().product();
    let v = x.to_f64_vec();
    let tw = Twiddles::new(n);
    // A float32 signal takes onnxruntime's float32 arithmetic (`fft_f32`), the one-sided
    // inverse aside (onnxruntime has none).
    let float32 =
        (x.dtype() == DType::F32 && !(a.inverse && a.onesided)).then(|| Fft::new(n, a.inverse));
    let c_out = out_shape[r - 1];
    let mut y = vec![0.0; checked_numel(&out_shape)?];
    let (mut re, mut im) = (vec![0.0; len], vec![0.0; len]);
    for o in 0..outer {
        for i in 0..inner {
            for t in 0..len {
                let at = ((o * len + t) * inner + i) * c;
                re[t] = v[at];
                im[t] = if c == 2 { v[at + 1] } else { 0.0 };
            }
            let line: Vec<(f64, f64)> = if a.inverse && a.onesided {
                tw.inverse_real(&re, &im)
                    .into_iter()
                    .map(|s| (s, 0.0))
                    .collect()
            } else if let Some(fft) = &float32 {
                let line: Vec<C> = re
                    .iter()
                    .zip(&im)
                    .map(|(&p, &q)| C::new(p as f32, q as f32))
                    .collect();
                fft.transform(&line, out_len)
                    .into_iter()
                    .map(|c| (f64::from(c.re), f64::from(c.im)))
                    .collect()
            } else {
                let (yr, yi) = tw.transform(&re, &im, out_len, a.inverse);
                let scale = if a.inverse { 1.0 / n as f64 } else { 1.0 };
                yr.into_iter()
                    .zip(yi)
                    .map(|(p, q)| (p * scale, q * scale))
                    .collect()
            };
            for (k, (p, q)) in line.into_iter().enumerate() {
                let at = ((o * out_len + k) * inner + i) * c_out;
                y[at] = p;
                if c_out == 2 {
                    y[at + 1] = q;
                }
            }
        }
    }
    Ok(cast(&Tensor::new(out_shape, Data::F64(y))?, x.dtype()))
}

/// STFT's geometry: frame step, frame length (the transform length), the window (ones
/// without one) and the output shape `[batch, frames, bins, 2]`.
pub(crate) fn stft_shape(
    onesided: bool,
    inputs: &[Option<&Tensor>],
) -> OpResult<(usize, usize, Vec<f64>, Vec<usize>)> {
    let x = input(inputs, 0)?;
    // onnxruntime reads a signal without the last axis as real, as exporters write it.
    if !(x.rank() == 2 || x.rank() == 3 && matches!(x.shape[2], 1 | 2)) {
        return shape_err(format!(
            "STFT signal must be [batch, length] or [batch, length, 1 or 2], got {:?}",
            x.shape
        ));
    }
    let step = length(input(inputs, 1)?, "frame_step")?;
    let window = opt_input(inputs, 2).filter(|t| !t.is_empty());
    if let Some(w) = window
        && w.rank() != 1
    {
        return shape_err(format!("STFT window must be 1-D, got {:?}", w.shape));
    }
    let frame = match (opt_input(inputs, 3).filter(|t| !t.is_empty()), window) {
        (Some(t), _) => length(t, "frame_length")?,
        (None, Some(w)) => w.len(),
        (None, None) => x.shape[1],
    };
    if frame == 0 || frame > x.shape[1] {
        return shape_err(format!(
            "STFT frames of {frame} over a signal of {}",
            x.shape[1]
        ));
    }
    let window = match window {
        Some(w) => w.to_f64_vec(),
        None => vec![1.0; frame],
    };
    let frames = 1 + (x.shape[1] - frame) / step;
    let bins = if onesided { frame / 2 + 1 } else { frame };
    let out = vec![x.shape[0], frames, bins, 2];
    checked_numel(&out)?;
    Ok((step, frame, window, out))
}

/// STFT: the DFT of every windowed frame of each signal.
pub fn stft(onesided: bool, inputs: &[Option<&Tensor>]) -> OpResult<Tensor> {
    let x = input(inputs, 0)?;
    float_input(x, "STFT")?;
    let (step, frame, window, out) = stft_shape(onesided, inputs)?;
    let c = x.shape.get(2).copied().unwrap_or(1);
    let (len, frames, bins) = (x.shape[1], out[1], out[2]);
    if let Data::F32(v) = &x.data {
        let fft = Fft::new(frame, false);
        let window: Vec<f32> = window.iter().map(|&w| w as f32).collect();
        let mut y = Vec::with_capacity(checked_numel(&out)?);
        let mut line = vec![C::default(); frame];
        for b in 0..x.shape[0] {
            for f in 0..frames {
                for (t, (l, &w)) in line.iter_mut().zip(&window).enumerate() {
                    let p = f * step + t;
                    *l = match p < len {
                        true => {
                            let at = (b * len + p) * c;
                            C::new(v[at] * w, if c == 2 { v[at + 1] * w } else { 0.0 })
                        }
                        false => C::default(),
                    };
                }
                y.extend(fft.transform(&line, bins).iter().flat_map(|c| [c.re, c.im]));
            }
        }
        return Tensor::f32(out, y);
    }
    let v = x.to_f64_vec();
    let tw = Twiddles::new(frame);
    let mut y = Vec::with_capacity(checked_numel(&out)?);
    for b in 0..x.shape[0] {
        for f in 0..frames {
            let begin = f * step;
            let (re, im): (Vec<f64>, Vec<f64>) = window
                .iter()
                .enumerate()
                .map(|(t, &w)| match begin + t {
                    p if p < len => {
                        let at = (b * len + p) * c;
                        (v[at] * w, if c == 2 { v[at + 1] * w } else { 0.0 })
                    }
                    _ => (0.0, 0.0),
                })
                .unzip();
            let (yr, yi) = tw.transform(&re, &im, bins, false);
            y.extend(yr.into_iter().zip(yi).flat_map(|(p, q)| [p, q]));
        }
    }
    Ok(cast(&Tensor::new(out, Data::F64(y))?, x.dtype()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f64s(shape: Vec<usize>, v: Vec<f64>) -> Tensor {
        Tensor::new(shape, Data::F64(v)).unwrap()
    }

    fn ints(v: i64) -> Tensor {
        Tensor::i64(vec![], vec![v]).unwrap()
    }

    /// The FFT agrees with the DFT's definition at lengths of every kind of factorisation.
    #[test]
    fn fft_matches_the_direct_sum() {
        for n in [
            1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 25, 30, 49, 64, 67, 97, 100, 134, 400, 1031,
        ] {
            let tw = Twiddles::new(n);
            let re: Vec<f64> = (0..n).map(|t| ((t * 7 + 3) % 11) as f64 - 5.0).collect();
            let im: Vec<f64> = (0..n).map(|t| ((t * 5 + 1) % 7) as f64 - 3.0).collect();
            for inverse in [false, true] {
                let (yr, yi) = tw.transform(&re, &im, n, inverse);
                let sign = if inverse { 1.0 } else { -1.0 };
                for k in 0..n {
                    let (mut sr, mut si) = (0.0, 0.0);
                    for t in 0..n {
                        let a = sign * 2.0 * PI * (k * t % n) as f64 / n as f64;
                        sr += re[t] * a.cos() - im[t] * a.sin();
                        si += re[t] * a.sin() + im[t] * a.cos();
                    }
                    assert!((yr[k] - sr).abs() < 1e-9 * n as f64, "n {n} k {k}");
                    assert!((yi[k] - si).abs() < 1e-9 * n as f64, "n {n} k {k}");
                }
            }
        }
    }

    #[test]
    fn transforms_invert_and_refuse_malformed_shapes() {
        let x = f64s(vec![1, 4, 1], vec![1.0, 2.0, 0.0, -1.0]);
        let fwd = DftAttrs {
            inverse: false,
            onesided: false,
            axis: Some(1),
        };
        let spec = dft(&fwd, &[Some(&x)]).unwrap();
        assert_eq!(spec.shape, vec![1, 4, 2]);
        let s = spec.to_f64_vec();
        // X[0] = 2, X[1] = 1 - 3i.
        assert!(
            (s[0] - 2.0).abs() < 1e-12 && (s[2] - 1.0).abs() < 1e-12 && (s[3] + 3.0).abs() < 1e-12
        );
        let inv = DftAttrs {
            inverse: true,
            ..fwd.clone()
        };
        let back = dft(&inv, &[Some(&spec)]).unwrap().to_f64_vec();
        for (t, want) in [1.0, 2.0, 0.0, -1.0].iter().enumerate() {
            assert!((back[2 * t] - want).abs() < 1e-12 && back[2 * t + 1].abs() < 1e-12);
        }
        // One-sided there and back.
        let half = DftAttrs {
            onesided: true,
            ..fwd.clone()
        };
        let spec = dft(&half, &[Some(&x)]).unwrap();
        assert_eq!(spec.shape, vec![1, 3, 2]);
        let real = dft(
            &DftAttrs {
                inverse: true,
                ..half
            },
            &[Some(&spec)],
        )
        .unwrap();
        assert_eq!(real.shape, vec![1, 4, 1]);
        for (g, w) in real.to_f64_vec().iter().zip([1.0, 2.0, 0.0, -1.0]) {
            assert!((g - w).abs() < 1e-12);
        }
        // The last axis, a bad length, a wrong last axis.
        let last = DftAttrs {
            axis: Some(2),
            ..fwd.clone()
        };
        assert!(dft(&last, &[Some(&x)]).is_err());
        assert!(dft(&fwd, &[Some(&x), Some(&ints(0))]).is_err());
        assert!(dft(&fwd, &[Some(&x), Some(&ints(1 << 40))]).is_err());
        let three = f64s(vec![1, 3], vec![0.0; 3]);
        assert!(dft(&fwd, &[Some(&three)]).is_err());
        // STFT: frames of 2, step 2 over 4 samples; a frame longer than the signal.
        let frames = stft(true, &[Some(&x), Some(&ints(2)), None, Some(&ints(2))]).unwrap();
        assert_eq!(frames.shape, vec![1, 2, 2, 2]);
        for (g, w) in frames.to_f64_vec().iter().zip([3.0, 0.0, -1.0, 0.0]) {
            assert!((g - w).abs() < 1e-12);
        }
        assert!(stft(true, &[Some(&x), Some(&ints(2)), None, Some(&ints(5))]).is_err());
        assert!(stft(true, &[Some(&x), Some(&ints(0))]).is_err());
        // A real signal without its last axis, as onnxruntime reads it; other ranks refused.
        let flat = Tensor::new(vec![1, 4], x.data.clone()).unwrap();
        let same = stft(true, &[Some(&flat), Some(&ints(2)), None, Some(&ints(2))]).unwrap();
        assert_eq!(same, frames);
        let one = f64s(vec![4], vec![0.0; 4]);
        assert!(stft(true, &[Some(&one), Some(&ints(2)), None, Some(&ints(2))]).is_err());
        let wide = f64s(vec![1, 4, 3], vec![0.0; 12]);
        assert!(stft(true, &[Some(&wide), Some(&ints(2)), None, Some(&ints(2))]).is_err());
    }
}
