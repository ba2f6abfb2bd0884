//! The float32 FFT of onnxruntime's CPU DFT and STFT kernels, operation for operation.
//!
//! Those kernels compute in float32: a radix-2 FFT over twiddles `e^(∓2πij/n)` taken at float32
//! angles (π rounded to float32), and for other lengths Bluestein's chirp-z convolution, whose
//! chirp `e^(∓iπk²/n)` has its angle `πk²/n` rounded at every step. At `k²` in the tens of
//! thousands those angles are off by 1e-4 radians, which moves a whisper-style log-mel
//! spectrogram by 5e-4 of its scale from the exact transform. Models are checked against
//! onnxruntime, so float32 signals take its arithmetic here; float64 ones keep the exact
//! transform in `dft`.

/// A float32 complex number.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct C {
    pub re: f32,
    pub im: f32,
}

impl C {
    pub fn new(re: f32, im: f32) -> C {
        C { re, im }
    }

    fn mul(self, o: C) -> C {
        C::new(
            self.re * o.re - self.im * o.im,
            self.re * o.im + self.im * o.re,
        )
    }

    fn add(self, o: C) -> C {
        C::new(self.re + o.re, self.im + o.im)
    }

    fn scale(self, s: f32) -> C {
        C::new(self.re * s, self.im * s)
    }

    fn div(self, s: f32) -> C {
        C::new(self.re / s, self.im / s)
    }

    fn conj(self) -> C {
        C::new(self.re, -self.im)
    }
}

/// π as onnxruntime's kernels hold it (its 3.14159265 and `M_PI` round to this float).
const PI: f32 = std::f32::consts::PI;

fn bit_reverse(i: usize, bits: u32) -> usize {
    if bits == 0 {
        0
    } else {
        i.reverse_bits() >> (usize::BITS - bits)
    }
}

/// The radix-2 twiddles of length `n`, stored at bit-reversed positions.
fn twiddles(n: usize, inverse: bool) -> Vec<C> {
    let bits = n.trailing_zeros();
    let velocity = if inverse { 1.0f32 } else { -1.0 } * (2.0 * PI) / n as f32;
    let mut v = vec![C::default(); n];
    for i in 0..n {
        let angle = i as f32 * velocity;
        v[bit_reverse(i, bits)] = C::new(angle.cos(), angle.sin());
    }
    v
}

/// The radix-2 transform of `x` (`n` long, a power of two) with twiddles `v`, unscaled.
fn radix2(x: &[C], v: &[C]) -> Vec<C> {
    let n = x.len();
    let bits = n.trailing_zeros();
    let mut y: Vec<C> = (0..n).map(|i| x[bit_reverse(i, bits)]).collect();
    let mut size = 2;
    let mut stage_bits = 0;
    while size <= n {
        let half = size / 2;
        stage_bits += 1;
        for k in 0..half {
            let (first, second) = (
                v[bit_reverse(k, stage_bits)],
                v[bit_reverse(half + k, stage_bits)],
            );
            for j in (0..n).step_by(size) {
                let (even, odd) = (y[j + k], y[j + k + half]);
                y[j + k] = even.add(first.mul(odd));
                y[j + k + half] = even.add(second.mul(odd));
            }
        }
        size <<= 1;
    }
    y
}

/// A transform of one length and direction, its tables built once.
pub(crate) enum Fft {
    Radix2 {
        inverse: bool,
        v: Vec<C>,
    },
    Bluestein {
        n: usize,
        inverse: bool,
        /// Forward twiddles of the padded length, which onnxruntime's three inner
        /// transforms all use (the inverse one reads its output reversed).
        v: Vec<C>,
        chirp: Vec<C>,
        /// The transform of the conjugate chirp, wrapped around the padded length.
        chirp_fft: Vec<C>,
    },
}

impl Fft {
    pub fn new(n: usize, inverse: bool) -> Fft {
        if n <= 1 || n.is_power_of_two() {
            return Fft::Radix2 {
                inverse,
                v: twiddles(n.max(1), inverse),
            };
        }
        let m = (2 * n - 1).next_power_of_two();
        let direction = if inverse { 1.0f32 } else { -1.0 };
        let chirp: Vec<C> = (0..n)
            .map(|k| {
                let angle = direction * PI * k as f32 * k as f32 / n as f32;
                C::new(angle.cos(), angle.sin())
            })
            .collect();
        let mut b = vec![C::default(); m];
        for (b, c) in b.iter_mut().zip(&chirp) {
            *b = c.conj();
        }
        for k in m - n + 1..m {
            b[k] = b[m - k];
        }
        let v = twiddles(m, false);
        let chirp_fft = radix2(&b, &v);
        Fft::Bluestein {
            n,
            inverse,
            v,
            chirp,
            chirp_fft,
        }
    }

    /// The first `bins` values of the transform of `x`, zero past its end (at most the
    /// transform's length of it is read); an inverse transform is divided by its length.
    pub fn transform(&self, x: &[C], bins: usize) -> Vec<C> {
        match self {
            Fft::Radix2 { inverse, v } => {
                let n = v.len();
                let mut padded = vec![C::default(); n];
                let take = x.len().min(n);
                padded[..take].copy_from_slice(&x[..take]);
                let mut y = radix2(&padded, v);
                if *inverse {
                    y.iter_mut().for_each(|c| *c = c.div(n as f32));
                }
                y.truncate(bins);
                y
            }
            Fft::Bluestein {
                n,
                inverse,
                v,
                chirp,
                chirp_fft,
            } => {
                let m = v.len();
                let mut a = vec![C::default(); m];
                for ((a, &x), &c) in a.iter_mut().zip(x).zip(chirp) {
                    *a = x.mul(c);
                }
                let mut a = radix2(&a, v);
                for (a, &b) in a.iter_mut().zip(chirp_fft) {
                    *a = a.mul(b);
                }
                let conv: Vec<C> = radix2(&a, v).into_iter().map(|c| c.div(m as f32)).collect();
                let scale = if *inverse { 1.0 / *n as f32 } else { 1.0 };
                (0..bins.min(*n))
                    .map(|i| {
                        let c = if i == 0 { conv[0] } else { conv[m - i] };
                        c.mul(chirp[i]).scale(scale)
                    })
                    .collect()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both paths agree with the transform's definition to float32 accuracy.
    #[test]
    fn transforms_match_the_direct_sum() {
        for n in [1, 2, 8, 3, 12, 400] {
            let x: Vec<C> = (0..n)
                .map(|t| C::new(((t * 7 + 3) % 11) as f32 - 5.0, ((t * 5) % 7) as f32 - 3.0))
                .collect();
            for inverse in [false, true] {
                let y = Fft::new(n, inverse).transform(&x, n);
                let sign = if inverse { 1.0 } else { -1.0 };
                let scale = if inverse { 1.0 / n as f64 } else { 1.0 };
                for (k, got) in y.iter().enumerate() {
                    let (mut re, mut im) = (0.0f64, 0.0f64);
                    for (t, v) in x.iter().enumerate() {
                        let a = sign * 2.0 * std::f64::consts::PI * (k * t % n) as f64 / n as f64;
                        re += f64::from(v.re) * a.cos() - f64::from(v.im) * a.sin();
                        im += f64::from(v.re) * a.sin() + f64::from(v.im) * a.cos();
                    }
                    let tolerance = 1e-4 * n as f64;
                    assert!(
                        (f64::from(got.re) - re * scale).abs() < tolerance,
                        "n {n} k {k}"
                    );
                    assert!(
                        (f64::from(got.im) - im * scale).abs() < tolerance,
                        "n {n} k {k}"
                    );
                }
            }
        }
    }
}
