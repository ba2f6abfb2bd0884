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
    /// `x·sigmoid(x)` (SiLU, Swish with α = 1).
    Silu,
    Tanh,
    /// Exact GELU, `x·Φ(x)`.
    Gelu,
}

impl Activation {
    #[inline(always)]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Activation::Relu => relu(x),
            Activation::LeakyRelu(a) => leaky_relu(x, a),
            Activation::Clip(lo, hi) => clip(x, lo, hi),
            Activation::Sigmoid => sigmoid(x),
            Activation::Gelu => gelu(x),
            Activation::HardSigmoid(a, b) => hard_sigmoid(x, a, b),
            Activation::HardSwish => hard_swish(x),
            Activation::Silu => silu(x),
            Activation::Tanh => tanh(x),
        }
    }

    /// Applies the activation to every element, split across `threads`.
    pub fn apply_slice(self, threads: usize, data: &mut [f32]) {
        if threads > 1 && data.len() >= crate::PAR_MIN_WORK {
            data.par_chunks_mut(chunk(threads, data.len()))
                .for_each(|c| bias_act(c, None, Some(self)));
        } else {
            bias_act(data, None, Some(self));
        }
    }

    /// `dst = act(src)`, split across `threads`: one pass over memory where a copy and
    /// [`apply_slice`](Self::apply_slice) take two. The same results.
    ///
    /// # Panics
    /// If the slices differ in length.
    pub fn apply_into(self, threads: usize, src: &[f32], dst: &mut [f32]) {
        assert_eq!(
            src.len(),
            dst.len(),
            "activation source and destination lengths"
        );
        let run = |(d, s): (&mut [f32], &[f32])| {
            crate::wide::wide(
                #[inline(always)]
                || map_act(OutOfPlace(s, d), None, Some(self)),
            )
        };
        if threads > 1 && dst.len() >= crate::PAR_MIN_WORK {
            let chunk = chunk(threads, dst.len());
            dst.par_chunks_mut(chunk)
                .zip(src.par_chunks(chunk))
                .for_each(run);
        } else {
            run((dst, src));
        }
    }
}

/// Elements per task when `len` elements are split across `threads`.
fn chunk(threads: usize, len: usize) -> usize {
    len.div_ceil(threads * 4).max(4096)
}

/// How a kernel applies a fused activation: clamps (ReLU, Clip) in registers on the way out,
/// any other in a pass after.
#[derive(Clone, Copy)]
pub(crate) enum Finish {
    None,
    Clamp(f32, f32),
    Other(Activation),
}

impl Finish {
    pub(crate) fn of(act: Option<Activation>) -> Finish {
        match act {
            None => Finish::None,
            Some(Activation::Relu) => Finish::Clamp(0.0, f32::INFINITY),
            Some(Activation::Clip(lo, hi)) => Finish::Clamp(lo, hi),
            Some(a) => Finish::Other(a),
        }
    }
}

/// `x = act(x + bias)` over a slice on the calling thread: the epilogue of the convolution
/// kernels, run on a block still in cache. Vectorised as wide as the CPU allows ([`wide`]), with
/// the same results either way.
///
/// [`wide`]: crate::wide::wide
pub fn bias_act(data: &mut [f32], bias: Option<f32>, act: Option<Activation>) {
    if bias.is_none() && act.is_none() {
        return;
    }
    crate::wide::wide(
        #[inline(always)]
        || map_act(InPlace(data), bias, act),
    )
}

/// Whether this CPU has AVX2 and FMA (cached by the standard library) and the cap
/// ([`crate::isa`]) allows them.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn avx2_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && crate::isa::allows(crate::isa::Isa::Avx2)
}

/// Where an elementwise function's results go: back into its input, or into another slice.
pub(crate) trait Elements<'a> {
    /// The values the function reads.
    fn source(&self) -> &[f32];
    /// Writes `f` of every source value; returns where they went.
    fn map(self, f: impl Fn(f32) -> f32) -> &'a mut [f32];
}

pub(crate) struct InPlace<'a>(pub(crate) &'a mut [f32]);

impl<'a> Elements<'a> for InPlace<'a> {
    #[inline(always)]
    fn source(&self) -> &[f32] {
        self.0
    }
    #[inline(always)]
    fn map(self, f: impl Fn(f32) -> f32) -> &'a mut [f32] {
        self.0.iter_mut().for_each(|x| *x = f(*x));
        self.0
    }
}

/// Source, destination (of one length).
pub(crate) struct OutOfPlace<'a>(pub(crate) &'a [f32], pub(crate) &'a mut [f32]);

impl<'a> Elements<'a> for OutOfPlace<'a> {
    #[inline(always)]
    fn source(&self) -> &[f32] {
        self.0
    }
    #[inline(always)]
    fn map(self, f: impl Fn(f32) -> f32) -> &'a mut [f32] {
        self.1.iter_mut().zip(self.0).for_each(|(d, &x)| *d = f(x));
        self.1
    }
}

/// `act(x + bias)` of every element. Matching outside the loops lets each arm vectorise.
#[inline(always)]
fn map_act<'a>(data: impl Elements<'a>, bias: Option<f32>, act: Option<Activation>) {
    #[inline(always)]
    fn each<'a>(data: impl Elements<'a>, bias: Option<f32>, f: impl Fn(f32) -> f32) {
        match bias {
            Some(b) => data.map(|x| f(x + b)),
            None => data.map(f),
        };
    }
    match act {
        None => each(data, bias, |x| x),
        Some(Activation::Relu) => each(data, bias, relu),
        Some(Activation::LeakyRelu(a)) => each(data, bias, move |x| leaky_relu(x, a)),
        Some(Activation::Clip(lo, hi)) => each(data, bias, move |x| clip(x, lo, hi)),
        Some(Activation::Sigmoid) => each(data, bias, sigmoid),
        Some(Activation::HardSigmoid(a, b)) => each(data, bias, move |x| hard_sigmoid(x, a, b)),
        Some(Activation::HardSwish) => each(data, bias, hard_swish),
        Some(Activation::Silu) => each(data, bias, silu),
        Some(Activation::Tanh) => each(data, bias, tanh),
        Some(Activation::Gelu) => each(data, bias, gelu),
    }
}

/// `max(x, 0)`, NaN giving 0 like `f32::max`; written as a compare so it is one vector max.
#[inline(always)]
fn relu(x: f32) -> f32 {
    if x > 0.0 { x } else { 0.0 }
}

/// `x.max(lo).min(hi)` (NaN gives `lo`), as compares that vectorise to one max and one min.
#[inline(always)]
pub fn clip(x: f32, lo: f32, hi: f32) -> f32 {
    let v = if x > lo { x } else { lo };
    if v < hi { v } else { hi }
}

#[inline(always)]
fn leaky_relu(x: f32, a: f32) -> f32 {
    if x < 0.0 { a * x } else { x }
}

#[inline(always)]
fn hard_sigmoid(x: f32, a: f32, b: f32) -> f32 {
    (a * x + b).clamp(0.0, 1.0)
}

#[inline(always)]
fn hard_swish(x: f32) -> f32 {
    x * (x / 6.0 + 0.5).clamp(0.0, 1.0)
}

#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

#[inline(always)]
fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// `f` of every element of `data` in place, split across `threads`, each piece compiled for the
/// widest vectors the CPU has ([`wide`](crate::wide::wide)): for a call-free, inlinable `f`
/// (such as [`erf`] or [`tanh`]) a vector loop, with the results of the scalar one.
pub fn map_inplace(threads: usize, data: &mut [f32], f: impl Fn(f32) -> f32 + Sync + Send) {
    let run = |c: &mut [f32]| {
        crate::wide::wide(
            #[inline(always)]
            || InPlace(c).map(&f),
        );
    };
    if threads > 1 && data.len() >= crate::PAR_MIN_WORK {
        data.par_chunks_mut(chunk(threads, data.len()))
            .for_each(run);
    } else {
        run(data);
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
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    // The polynomial by Estrin's scheme: its dependency chain is half of Horner's, and a
    // vectorised loop over it is bound by that chain (the scheduler fills before the units do).
    let (r2, r4) = (r * r, (r * r) * (r * r));
    let p = (1.666_666_5e-1 * r + 0.5)
        + (8.333_452e-3 * r + 4.166_579_6e-2) * r2
        + (1.987_569_2e-4 * r + 1.398_2e-3) * r4;
    let p = p * r2 + r + 1.0;
    // `t`'s low mantissa bits hold `n` (two's complement): 2^n from integer operations on them,
    // since a float-to-int cast (`n as i32`, saturating) does not vectorise.
    let v = p * f32::from_bits((t.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127)) << 23);
    // Underflow is 0 (a select, so the loop still vectorises).
    if orig < -87.0 { 0.0 } else { v }
}

/// Error function: Abramowitz–Stegun 7.1.26 (absolute error below 1.5e-7), vectorisable.
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    // Estrin's scheme, as in `exp`.
    let (t2, t4) = (t * t, (t * t) * (t * t));
    let poly = ((0.254_829_6 - 0.284_496_74 * t)
        + (1.421_413_8 - 1.453_152_1 * t) * t2
        + 1.061_405_4 * t4)
        * t;
    let y = 1.0 - poly * exp(-a * a);
    if x < 0.0 { -y } else { y }
}

/// Hyperbolic tangent without calls, so loops over it vectorise (the standard library's calls
/// libm per element): an odd polynomial below 0.625 in magnitude, where `1 - 2/(e^2x + 1)`
/// would cancel, and that form above it (Cephes' `tanhf`), within 3e-7 relative. NaN stays NaN.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let a = x.abs();
    let z = x * x;
    let small =
        ((((-5.704_988_7e-3 * z + 2.063_909e-2) * z - 5.373_971_6e-2) * z + 1.333_144_2e-1) * z
            - 3.333_328e-1)
            * z
            * a
            + a;
    // e^2a saturates at e^88 (`exp` clamps), where the quotient is 0 and the result 1.
    let large = 1.0 - 2.0 / (exp(2.0 * a) + 1.0);
    let y = if a < 0.625 { small } else { large };
    y.copysign(x)
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
    fn tanh_is_accurate_and_odd() {
        // Either side of the switch at 0.625, tiny values (where relative error shows), the
        // saturated tail and the special values.
        let mut xs = vec![
            0.0f32,
            -0.0,
            1e-30,
            1e-8,
            0.624_999_9,
            0.625,
            9.0,
            44.0,
            45.0,
            1e30,
        ];
        xs.extend((0..20_000).map(|i| i as f32 * 7.3e-4));
        for &x in &xs {
            for x in [x, -x] {
                let (g, w) = (tanh(x), (x as f64).tanh());
                let err = if w == 0.0 {
                    g as f64
                } else {
                    (g as f64 - w) / w
                };
                assert!(err.abs() < 3e-7, "tanh({x}) = {g}, want {w}");
                assert_eq!(g.is_sign_negative(), x.is_sign_negative(), "tanh({x}) sign");
            }
        }
        assert_eq!(tanh(f32::INFINITY), 1.0);
        assert_eq!(tanh(f32::NEG_INFINITY), -1.0);
        assert!(tanh(f32::NAN).is_nan());
    }

    #[test]
    fn map_inplace_gives_the_scalar_results() {
        let xs: Vec<f32> = (0..100_003)
            .map(|i| (i as f32 - 50_000.0) * 1.3e-4)
            .collect();
        for f in [erf, tanh] {
            let mut v = xs.clone();
            map_inplace(2, &mut v, f);
            let want: Vec<f32> = xs.iter().map(|&x| f(x)).collect();
            assert_eq!(v, want);
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
            let silu = x / (1.0 + (-x).exp());
            assert!((Activation::Silu.apply(x) - silu).abs() <= 1e-6 * (1.0 + silu.abs()));
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
