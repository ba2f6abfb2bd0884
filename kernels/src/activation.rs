//! Pointwise activations, applied in place. The same enum describes an activation fused into a
//! Conv/Gemm/MatMul epilogue by the executor's fusion pass.

use rayon::prelude::*;

/// An activation that can run in place on a producer's output.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    Relu,
    LeakyRelu(f32),
    Clip(f32, f32),
    Sigmoid,
    HardSigmoid(f32, f32),
    HardSwish,
    Tanh,
    /// Exact GELU, `x·Φ(x)`.
    Gelu,
}

impl Activation {
    #[inline(always)]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Activation::Relu => x.max(0.0),
            Activation::LeakyRelu(a) => {
                if x < 0.0 {
                    a * x
                } else {
                    x
                }
            }
            Activation::Clip(lo, hi) => x.max(lo).min(hi),
            Activation::Sigmoid => sigmoid(x),
            Activation::Gelu => gelu(x),
            Activation::HardSigmoid(a, b) => (a * x + b).clamp(0.0, 1.0),
            Activation::HardSwish => x * (x / 6.0 + 0.5).clamp(0.0, 1.0),
            Activation::Tanh => x.tanh(),
        }
    }

    /// Applies the activation to every element, split across `threads`.
    pub fn apply_slice(self, threads: usize, data: &mut [f32]) {
        // Matching outside the loop lets each arm vectorise.
        fn run(threads: usize, data: &mut [f32], f: impl Fn(f32) -> f32 + Sync) {
            if threads > 1 && data.len() >= crate::PAR_MIN_WORK {
                let chunk = data.len().div_ceil(threads * 4).max(4096);
                data.par_chunks_mut(chunk)
                    .for_each(|c| c.iter_mut().for_each(|x| *x = f(*x)));
            } else {
                data.iter_mut().for_each(|x| *x = f(*x));
            }
        }
        match self {
            Activation::Relu => run(threads, data, |x| x.max(0.0)),
            Activation::LeakyRelu(a) => {
                run(threads, data, move |x| if x < 0.0 { a * x } else { x })
            }
            Activation::Clip(lo, hi) => run(threads, data, move |x| x.max(lo).min(hi)),
            Activation::Sigmoid => run(threads, data, sigmoid),
            Activation::HardSigmoid(a, b) => {
                run(threads, data, move |x| (a * x + b).clamp(0.0, 1.0))
            }
            Activation::HardSwish => run(threads, data, |x| x * (x / 6.0 + 0.5).clamp(0.0, 1.0)),
            Activation::Tanh => run(threads, data, f32::tanh),
            Activation::Gelu => run(threads, data, gelu),
        }
    }
}

#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// Applies `f` to every element in place, split across `threads`.
pub fn map_inplace(threads: usize, data: &mut [f32], f: impl Fn(f32) -> f32 + Sync + Send) {
    if threads > 1 && data.len() >= crate::PAR_MIN_WORK {
        let chunk = data.len().div_ceil(threads * 4).max(4096);
        data.par_chunks_mut(chunk)
            .for_each(|c| c.iter_mut().for_each(|x| *x = f(*x)));
    } else {
        data.iter_mut().for_each(|x| *x = f(*x));
    }
}

/// `e^x` in f32 without calls (so loops over it vectorise): Cody–Waite range reduction and the
/// Cephes polynomial, about 2 ulp. Inputs are clamped to the finite range.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5·2^23 rounds to the nearest integer without a call.
    const ROUND: f32 = 12_582_912.0;
    let orig = x;
    let x = x.clamp(-87.0, 88.0);
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = (((((1.987_569_2e-4 * r + 1.398_2e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5)
        * r
        * r
        + r
        + 1.0;
    let v = p * f32::from_bits(((n as i32 + 127) as u32) << 23);
    // Underflow is 0 (a select, so the loop still vectorises).
    if orig < -87.0 { 0.0 } else { v }
}

/// Error function: Abramowitz–Stegun 7.1.26 (absolute error below 1.5e-7), vectorisable.
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly = ((((1.061_405_4 * t - 1.453_152_1) * t + 1.421_413_8) * t - 0.284_496_74) * t
        + 0.254_829_6)
        * t;
    let y = 1.0 - poly * exp(-a * a);
    if x < 0.0 { -y } else { y }
}

/// GELU with the exact (erf) form.
#[inline(always)]
pub fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_known_values() {
        for &(x, e) in &[
            (0.0f32, 0.0f32),
            (0.5, 0.520_499_9),
            (1.0, 0.842_700_8),
            (-2.0, -0.995_322_3),
            (3.5, 0.999_999_3),
            (5.0, 1.0),
        ] {
            assert!((erf(x) - e).abs() < 1e-6, "erf({x}) = {} want {e}", erf(x));
        }
    }

    #[test]
    fn fast_exp_is_accurate() {
        let mut x = -80.0f32;
        while x < 80.0 {
            let (g, w) = (exp(x), (x as f64).exp());
            assert!(
                ((g as f64 - w) / w).abs() < 1e-6,
                "exp({x}) = {g}, want {w}"
            );
            x += 0.173;
        }
    }

    #[test]
    fn activations_match_definitions() {
        let xs = [-3.0f32, -0.5, 0.0, 0.5, 3.0, 7.0];
        for &x in &xs {
            assert_eq!(Activation::Relu.apply(x), if x > 0.0 { x } else { 0.0 });
            assert_eq!(Activation::Clip(0.0, 6.0).apply(x), x.clamp(0.0, 6.0));
            assert!((Activation::Sigmoid.apply(x) - 1.0 / (1.0 + (-x).exp())).abs() < 1e-7);
            assert!(
                (Activation::HardSwish.apply(x) - x * ((x + 3.0).clamp(0.0, 6.0) / 6.0)).abs()
                    < 1e-6
            );
        }
        let mut v: Vec<f32> = (0..100_000).map(|i| i as f32 - 50_000.0).collect();
        Activation::Relu.apply_slice(2, &mut v);
        assert!(v.iter().all(|&x| x >= 0.0));
    }
}
