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
            other => run(threads, data, move |x| other.apply(x)),
        }
    }
}

#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
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

/// Error function (Abramowitz–Stegun 7.1.26 is too coarse for 1e-4 checks; this is the
/// rational approximation used by common libm implementations, accurate to ~1e-7 in f32).
pub fn erf(x: f32) -> f32 {
    libm_erf(x as f64) as f32
}

fn libm_erf(x: f64) -> f64 {
    // W. J. Cody's rational Chebyshev approximations, via the complementary error function.
    let ax = x.abs();
    let r = if ax < 0.5 {
        let t = x * x;
        let p = [
            3.209_377_589_138_469_4e3,
            3.774_852_376_853_02e2,
            1.138_641_541_510_501_6e2,
            3.161_123_743_870_565_6,
            1.857_777_061_846_031_5e-1,
        ];
        let q = [
            2.844_236_833_439_170_6e3,
            1.282_616_526_077_372_3e3,
            2.440_246_379_344_441_7e2,
            2.360_129_095_234_412_2e1,
            1.0,
        ];
        let num = (((p[4] * t + p[3]) * t + p[2]) * t + p[1]) * t + p[0];
        let den = (((q[4] * t + q[3]) * t + q[2]) * t + q[1]) * t + q[0];
        return x * num / den;
    } else if ax < 4.0 {
        let p = [
            1.230_339_354_797_997_2e3,
            2.051_078_377_826_071_6e3,
            1.712_047_612_634_070_7e3,
            8.819_522_212_417_69e2,
            2.986_351_381_974_001e2,
            6.611_919_063_714_163e1,
            8.883_149_794_388_377,
            5.641_884_969_886_701e-1,
            2.153_115_354_744_038_3e-8,
        ];
        let q = [
            1.230_339_354_803_749_5e3,
            3.439_367_674_143_721_6e3,
            4.362_619_090_143_247e3,
            3.290_799_235_733_459_7e3,
            1.621_389_574_566_690_3e3,
            5.371_811_018_620_098_5e2,
            1.176_939_508_913_124_9e2,
            1.574_492_611_070_983_4e1,
            1.0,
        ];
        let mut num = p[8];
        let mut den = q[8];
        for i in (0..8).rev() {
            num = num * ax + p[i];
            den = den * ax + q[i];
        }
        (-ax * ax).exp() * num / den
    } else {
        let p = [
            -6.587_491_615_298_378e-4,
            -1.608_378_514_874_227_5e-2,
            -1.257_817_261_112_292_6e-1,
            -3.603_448_999_498_044_5e-1,
            -3.053_266_349_612_323_6e-1,
            -1.631_538_713_730_709_8e-2,
        ];
        let q = [
            2.335_204_976_268_691_8e-3,
            6.051_834_131_244_132e-2,
            5.279_051_029_514_284e-1,
            1.872_952_849_923_460_4,
            2.568_520_192_289_822,
            1.0,
        ];
        let z = 1.0 / (ax * ax);
        let mut num = p[5];
        let mut den = q[5];
        for i in (0..5).rev() {
            num = num * z + p[i];
            den = den * z + q[i];
        }
        let r = z * num / den;
        (-ax * ax).exp() / ax * (1.0 / std::f64::consts::PI.sqrt() + r)
    };
    // r is erfc(|x|) here.
    if x >= 0.0 { 1.0 - r } else { r - 1.0 }
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
            (3.5, 0.999_999_26),
            (5.0, 1.0),
        ] {
            assert!((erf(x) - e).abs() < 1e-6, "erf({x}) = {} want {e}", erf(x));
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
