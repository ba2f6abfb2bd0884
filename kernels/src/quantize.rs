//! Quantizing f32 values to uint8, `y = clamp(round(x / scale) + zero)`, worked exactly as
//! QuantizeLinear rounds it, and the quantized residual add of uint8 tensors,
//! `y = Q(max(DQ(a) + DQ(b), floor))`, in the f32 arithmetic of the separate DequantizeLinear,
//! Add, (Relu) and QuantizeLinear ops, so that the fused op gives the same bytes.
//!
//! The compiler's vectorisation of these loops converts and stores 8 values at a time and
//! narrows each vector to bytes on its own; the AVX2 loops here take 32 values at a time and
//! pack four vectors into one store.

use crate::activation::clip;
use crate::qconv::round_even;

/// The quantization parameters of one [`qadd_u8`].
#[derive(Clone, Copy, Debug)]
pub struct QAddParams {
    pub a_scale: f32,
    pub a_zero: i32,
    pub b_scale: f32,
    pub b_zero: i32,
    pub y_scale: f32,
    pub y_zero: f32,
    /// `0` for a fused Relu, else `-∞`.
    pub floor: f32,
}

impl QAddParams {
    /// One output byte, in the arithmetic of the separate ops.
    #[inline(always)]
    pub fn value(&self, a: u8, b: u8) -> u8 {
        let v = (a as i32 - self.a_zero) as f32 * self.a_scale
            + (b as i32 - self.b_zero) as f32 * self.b_scale;
        // `v.max(floor)` as one vector max (NaN gives `floor` either way).
        let v = if v > self.floor { v } else { self.floor };
        quantized(v, self.y_scale, self.y_zero)
    }
}

/// `x` quantized to uint8 by `scale` and `zero` (a whole number) as QuantizeLinear rounds it:
/// NaN gives 0.
#[inline(always)]
pub fn quantized(x: f32, scale: f32, zero: f32) -> u8 {
    let q = x / scale;
    // `clip` is what `_mm256_max_ps(x, lo)` then `_mm256_min_ps(_, hi)` return.
    let v = clip(
        round_even(clip(q, -4_194_304.0, 4_194_304.0)) + zero,
        0.0,
        255.0,
    );
    if q.is_nan() { 0 } else { v as u8 }
}

/// `y[i] = quantized(x[i], scale, zero)` on the calling thread.
///
/// # Panics
/// If the slices differ in length.
pub fn quantize_u8(x: &[f32], scale: f32, zero: f32, y: &mut [u8]) {
    assert_eq!(x.len(), y.len(), "quantize_u8 lengths");
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if crate::activation::avx2_fma() {
        let value = |at: usize| {
            // SAFETY: at + 8 <= y.len() = x.len() (whole blocks only).
            unsafe { avx2::_mm256_loadu_ps(x.as_ptr().add(at)) }
        };
        // SAFETY: the CPU has AVX2; `value` reads within x for every block of y.
        done = unsafe { avx2_blocks(y, scale, zero, value) };
    }
    for (y, &x) in y[done..].iter_mut().zip(&x[done..]) {
        *y = quantized(x, scale, zero);
    }
}

/// `y[i] = p.value(a[i], b[i])` on the calling thread.
///
/// # Panics
/// If the slices differ in length.
pub fn qadd_u8(p: &QAddParams, a: &[u8], b: &[u8], y: &mut [u8]) {
    assert!(a.len() == y.len() && b.len() == y.len(), "qadd_u8 lengths");
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if crate::activation::avx2_fma() {
        // SAFETY: the CPU has AVX2; the slices have y.len() elements (asserted).
        done = unsafe { avx2_qadd(p, a, b, y) };
    }
    for ((y, &a), &b) in y[done..].iter_mut().zip(&a[done..]).zip(&b[done..]) {
        *y = p.value(a, b);
    }
}

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64 as avx2;

/// The whole blocks of 32 elements of `y`: `y[at + l] = quantized(value(at)[l], scale, zero)`
/// for `at` each multiple of 8 and `l` below 8; returns how many elements it wrote.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn avx2_blocks(
    y: &mut [u8],
    scale: f32,
    zero: f32,
    value: impl Fn(usize) -> avx2::__m256,
) -> usize {
    use avx2::*;
    // The zero point joins as an integer; callers pass a byte's.
    if !(zero == zero.round() && (0.0..=255.0).contains(&zero)) {
        return 0;
    }
    let (scale, zero, big) = (
        _mm256_set1_ps(scale),
        _mm256_set1_epi32(zero as i32),
        _mm256_set1_ps(4_194_304.0),
    );
    // Packing (within 128-bit lanes) leaves 4-byte groups of values 0-3 of vectors 0, 1, 2, 3,
    // then values 4-7 of each: this permutation puts the 32 in order.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let blocks = y.len() / 32;
    for blk in 0..blocks {
        let at = blk * 32;
        let vals: [__m256i; 4] = std::array::from_fn(|i| {
            let q = _mm256_div_ps(value(at + 8 * i), scale);
            // Above 2^22 as 2^22, so that the conversion cannot overflow upwards; `min`
            // returns its second operand, NaN, for NaN. The conversion rounds to nearest,
            // ties to even, and gives i32::MIN for NaN and for what lies below its range;
            // the saturating packs then clamp to 0..=255, as `quantized` clips.
            let q = _mm256_min_ps(big, q);
            _mm256_add_epi32(_mm256_cvtps_epi32(q), zero)
        });
        let words = [
            _mm256_packs_epi32(vals[0], vals[1]),
            _mm256_packs_epi32(vals[2], vals[3]),
        ];
        let bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(words[0], words[1]), order);
        // SAFETY: bytes at..at + 32 lie within y.
        unsafe { _mm256_storeu_si256(y.as_mut_ptr().add(at).cast(), bytes) };
    }
    blocks * 32
}

/// The whole 32-byte blocks of [`qadd_u8`]; returns how many elements it wrote.
///
/// # Safety
/// The CPU has AVX2; `a`, `b` and `y` have one length.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn avx2_qadd(p: &QAddParams, a: &[u8], b: &[u8], y: &mut [u8]) -> usize {
    use avx2::*;
    let (sa, sb, floor) = (
        _mm256_set1_ps(p.a_scale),
        _mm256_set1_ps(p.b_scale),
        _mm256_set1_ps(p.floor),
    );
    let (za, zb) = (_mm256_set1_epi32(p.a_zero), _mm256_set1_epi32(p.b_zero));
    let value = |at: usize| {
        // SAFETY: bytes at..at + 8 lie within a and b (this function's contract, whole blocks).
        let (av, bv) = unsafe {
            (
                _mm_loadl_epi64(a.as_ptr().add(at).cast()),
                _mm_loadl_epi64(b.as_ptr().add(at).cast()),
            )
        };
        let af = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(av), za));
        let bf = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(bv), zb));
        let v = _mm256_add_ps(_mm256_mul_ps(af, sa), _mm256_mul_ps(bf, sb));
        _mm256_max_ps(v, floor)
    };
    // SAFETY: the CPU has AVX2; `value` reads within a and b for every block of y.
    unsafe { avx2_blocks(y, p.y_scale, p.y_zero, value) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantizing_32_at_a_time_gives_the_bytes_of_one_at_a_time() {
        let mut x: Vec<f32> = (0..32 * 5 + 7).map(|i| (i as f32 - 80.0) * 0.37).collect();
        // Halves either side of an even number, NaN, infinities, past the clip, past 2^22.
        let edge = [
            2.5,
            3.5,
            -2.5,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e9,
            -1e9,
        ];
        x[3..3 + edge.len()].copy_from_slice(&edge);
        x[40..40 + edge.len()].copy_from_slice(&edge);
        // The last two zero points are no byte's: the vector loop leaves them to the scalar.
        let params = [
            (1.0, 0.0),
            (0.5, 128.0),
            (0.1, 255.0),
            (3.0, 7.0),
            (0.5, 3.5),
            (1.0, 300.0),
        ];
        for (scale, zero) in params {
            let mut y = vec![9u8; x.len()];
            quantize_u8(&x, scale, zero, &mut y);
            for (i, (&y, &x)) in y.iter().zip(&x).enumerate() {
                assert_eq!(
                    y,
                    quantized(x, scale, zero),
                    "element {i}: {x} by {scale}, {zero}"
                );
            }
        }
        assert_eq!(
            [2.5, 3.5, -0.5, f32::NAN, 1e9].map(|x| quantized(x, 1.0, 1.0)),
            [3, 5, 1, 0, 255]
        );
    }

    #[test]
    fn quotients_near_half_integers_round_as_the_division_does() {
        // Values a few units in the last place either side of each (n + 1/2)·scale, and of
        // whole multiples: where a quotient computed any other way than by division (a
        // product by the reciprocal) could round to the other integer.
        let scales = [
            0.1,
            1.0 / 3.0,
            2.0 / 255.0,
            0.007_812_5,
            3.0,
            1e-3,
            7.3e-5,
            1e30,
            1e-38,
            3e-39,
            0.0,
            f32::INFINITY,
            f32::NAN,
        ];
        for scale in scales {
            let mut x = Vec::new();
            for n in -300..300 {
                for base in [(n as f32 + 0.5) * scale, n as f32 * scale] {
                    let mut v = base;
                    for _ in 0..4 {
                        v = v.next_down();
                    }
                    for _ in 0..9 {
                        x.push(v);
                        v = v.next_up();
                    }
                }
            }
            for zero in [0.0, 128.0] {
                let mut y = vec![0u8; x.len()];
                quantize_u8(&x, scale, zero, &mut y);
                for (i, (&y, &x)) in y.iter().zip(&x).enumerate() {
                    assert_eq!(
                        y,
                        quantized(x, scale, zero),
                        "element {i}: {x:e} by {scale:e}"
                    );
                }
            }
        }
    }

    /// `qadd_u8` of `a` and `b` gives `QAddParams::value`'s bytes under each of `params`:
    /// (a_scale, a_zero, b_scale, b_zero, y_scale, y_zero, floor).
    fn adds_as_the_scalar_ops(a: &[u8], b: &[u8], params: &[(f32, i32, f32, i32, f32, f32, f32)]) {
        for &(a_scale, a_zero, b_scale, b_zero, y_scale, y_zero, floor) in params {
            let p = QAddParams {
                a_scale,
                a_zero,
                b_scale,
                b_zero,
                y_scale,
                y_zero,
                floor,
            };
            let mut y = vec![7u8; a.len()];
            qadd_u8(&p, a, b, &mut y);
            for (i, &v) in y.iter().enumerate() {
                assert_eq!(v, p.value(a[i], b[i]), "{} + {} with {p:?}", a[i], b[i]);
            }
        }
    }

    #[test]
    fn every_pair_of_bytes_adds_as_the_separate_ops() {
        let (a, b): (Vec<u8>, Vec<u8>) = (0..=255u8)
            .flat_map(|a| (0..=255u8).map(move |b| (a, b)))
            .unzip();
        // Scales whose quotients land on halves (the output scale twice an input's), and
        // onnxruntime-like ones.
        let params = [
            (0.5, 128, 0.5, 128, 1.0, 128.0, f32::NEG_INFINITY),
            (0.25, 0, 0.5, 7, 0.5, 3.0, 0.0),
            (
                0.023_529_412,
                131,
                0.015_686_275,
                118,
                0.031_372_55,
                127.0,
                0.0,
            ),
            (0.1, 3, 0.2, 250, 0.3, 10.0, f32::NEG_INFINITY),
        ];
        adds_as_the_scalar_ops(&a, &b, &params);
    }

    #[test]
    fn the_vector_loop_gives_the_bytes_of_the_scalar_one() {
        let n = 32 * 9 + 13;
        let a: Vec<u8> = (0..n).map(|i| (i * 7919 % 256) as u8).collect();
        let b: Vec<u8> = (0..n).map(|i| (i * 104_729 % 256) as u8).collect();
        let params = [
            (0.02, 128, 0.03, 120, 0.04, 130.0, f32::NEG_INFINITY),
            (0.02, 128, 0.03, 120, 0.04, 0.0, 0.0),
            // Saturating both ways, and halves to round to even.
            (1.0, 0, 1.0, 0, 2.0, 3.0, f32::NEG_INFINITY),
            (0.5, 255, 0.25, 0, 0.001, 100.0, f32::NEG_INFINITY),
            // A NaN scale: every byte 0.
            (0.1, 3, 0.1, 3, f32::NAN, 5.0, 0.0),
        ];
        adds_as_the_scalar_ops(&a, &b, &params);
        // The halves: 1 + 2 = 3 over 2 is 1.5, rounded to 2; 1 + 4 = 5 over 2, 2.5 to 2.
        let p = QAddParams {
            a_scale: 1.0,
            a_zero: 0,
            b_scale: 1.0,
            b_zero: 0,
            y_scale: 2.0,
            y_zero: 0.0,
            floor: f32::NEG_INFINITY,
        };
        assert_eq!((p.value(1, 2), p.value(1, 4), p.value(0, 0)), (2, 2, 0));
    }
}
