//! The depthwise 3x3 stencil at stride 1 or 2 on AVX-512 CPUs, four output rows at a time.
//!
//! At stride 1, output row `oy` reads input rows `oy..oy + 3`, so four output rows read six
//! input rows: each input vector is loaded once and feeds every output row of the group whose
//! stencil covers it (18 loads for 4 × 16 outputs, against 9 per 8 outputs one row at a time on
//! AVX2, where the loads, not the multiply-adds, were the limit). At stride 2 the input is in
//! the four phase planes of `depthwise::Layout`; output row `oy` reads row `oy` of the even-row
//! phases (tap row 0), row `oy` of the odd-row ones (tap row 1) and row `oy + 1` of the even-row
//! ones again (tap row 2), so a group reads 9 rows: 27 loads.
//!
//! Every output is still summed in tap order, starting from the bias, with one fused
//! multiply-add per tap, so it is bit-identical to the AVX2 kernels.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

const LANES: usize = 16;
/// Output rows per group.
const ROWS: usize = 4;

/// Whether [`rows3x3`] at stride `s` can run an `oh`×`ow` output from a buffer of `buf_len`
/// floats holding `s²` phase planes of `sub` floats, rows `len` long.
pub(crate) fn fits(
    s: usize,
    (oh, ow): (usize, usize),
    len: usize,
    sub: usize,
    buf_len: usize,
) -> bool {
    if !(s == 1 || s == 2) || oh < ROWS || ow == 0 || len < ow + 2 / s {
        return false;
    }
    // The last vector of a row starts at column last_x and reads LANES floats from up to 2 / s
    // columns further; the rows reach 2 / s past the last output row.
    let last_x = (ow - 1) / LANES * LANES;
    let reach = (s * s - 1) * sub + (oh - 1 + 2 / s) * len + last_x + 2 / s + LANES;
    reach <= buf_len
}

/// `dst[oy·ow + ox] = bias + Σ w[ki·3 + kj] · input(S·oy + ki, S·ox + kj)` (taps in that order),
/// clamped to `lo..=hi` (max, then min) with `CLAMP`; `dst` holds `oh` rows of `ow`. The padded
/// input is `buf`: at stride 1 one plane, at stride 2 four phase planes of `sub` floats (see
/// `depthwise::Layout`), rows `len` long.
///
/// # Safety
/// The CPU has AVX-512F (`crate::avx512f`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows3x3<const S: usize, const CLAMP: bool>(
    buf: &[f32],
    (len, sub): (usize, usize),
    w: &[f32; 9],
    bias: f32,
    (lo, hi): (f32, f32),
    ow: usize,
    dst: &mut [f32],
) {
    assert!(ow > 0 && dst.len().is_multiple_of(ow), "rows3x3 rows");
    let oh = dst.len() / ow;
    assert!(fits(S, (oh, ow), len, sub, buf.len()), "rows3x3 bounds");
    let wv: [__m512; 9] = std::array::from_fn(|t| _mm512_set1_ps(w[t]));
    let (vb, vlo, vhi) = (_mm512_set1_ps(bias), _mm512_set1_ps(lo), _mm512_set1_ps(hi));
    let (src, out) = (buf.as_ptr(), dst.as_mut_ptr());
    // Where tap column kj of virtual row i of a group starting at output row `top` reads: at
    // stride 1 input row top + i; at stride 2 row top + i / 2 of the phase planes of row
    // parity i % 2 and column parity kj % 2.
    let at = |top: usize, i: usize, kj: usize| match S {
        1 => (top + i) * len + kj,
        _ => ((i % 2) * 2 + kj % 2) * sub + (top + i / 2) * len + kj / 2,
    };
    // Groups start every ROWS rows; the last one ends at the last row, recomputing (and
    // rewriting with the same values) rows the previous group already wrote.
    let mut oy0 = 0;
    loop {
        let top = oy0.min(oh - ROWS);
        let mut x = 0;
        while x < ow {
            let mask = crate::mask16(ow - x);
            let mut a = [vb; ROWS];
            // Output row r reads virtual rows S·r + ki, ki = 0, 1, 2: visiting them in order
            // keeps every output's taps in order.
            for i in 0..S * (ROWS - 1) + 3 {
                for kj in 0..3 {
                    // SAFETY: within `buf` (`fits`, asserted above).
                    let v = unsafe { _mm512_loadu_ps(src.add(at(top, i, kj) + x)) };
                    for (r, acc) in a.iter_mut().enumerate() {
                        if i >= S * r && i - S * r < 3 {
                            *acc = _mm512_fmadd_ps(wv[(i - S * r) * 3 + kj], v, *acc);
                        }
                    }
                }
            }
            for (r, mut v) in a.into_iter().enumerate() {
                if CLAMP {
                    v = _mm512_min_ps(_mm512_max_ps(v, vlo), vhi);
                }
                // SAFETY: the mask keeps columns x..ow of row top + r < oh.
                unsafe { _mm512_mask_storeu_ps(out.add((top + r) * ow + x), mask, v) };
            }
            x += LANES;
        }
        oy0 += ROWS;
        if oy0 >= oh {
            break;
        }
    }
}

/// What a copy into the padded plane applies to each value: the producing convolution's bias,
/// then its clamp (ReLU or Clip: max, then min, as `Activation::Clip`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Prep {
    pub(crate) bias: Option<f32>,
    pub(crate) clamp: Option<(f32, f32)>,
}

impl Prep {
    /// `v` with the bias added, then clamped.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    fn apply(self, mut v: __m512) -> __m512 {
        if let Some(b) = self.bias {
            v = _mm512_add_ps(v, _mm512_set1_ps(b));
        }
        if let Some((lo, hi)) = self.clamp {
            v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(lo)), _mm512_set1_ps(hi));
        }
        v
    }
}

/// `dst[i] = prep(src[i])`, 16 at a time with a masked last vector: the rows of the small
/// planes (7, 14, 28 wide) are otherwise mostly a scalar remainder loop.
///
/// # Safety
/// The CPU has AVX-512F (`crate::avx512f`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn copy_row(src: &[f32], dst: &mut [f32], prep: Prep) {
    assert_eq!(src.len(), dst.len(), "copy_row lengths");
    let n = src.len();
    let mut i = 0;
    while i < n {
        let mask = crate::mask16(n - i);
        // SAFETY: the mask keeps elements i..n of both slices.
        let v = prep.apply(unsafe { _mm512_maskz_loadu_ps(mask, src.as_ptr().add(i)) });
        // SAFETY: as above.
        unsafe { _mm512_mask_storeu_ps(dst.as_mut_ptr().add(i), mask, v) };
        i += LANES;
    }
}

/// `evens[j] = prep(src[2j])` and `odds[j] = prep(src[2j + 1])`: one input row split into its
/// two column phases for a stride-2 stencil, 16 of each at a time.
///
/// # Safety
/// The CPU has AVX-512F (`crate::avx512f`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn split_row(src: &[f32], evens: &mut [f32], odds: &mut [f32], prep: Prep) {
    assert!(
        evens.len() <= src.len().div_ceil(2) && odds.len() <= src.len() / 2,
        "split_row lengths"
    );
    let keep = |n: usize, j: usize| crate::mask16(n.saturating_sub(j));
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    let mut j = 0;
    while j < evens.len().max(odds.len()) {
        // SAFETY: the masks keep elements 2j.. of src, and j.. of evens and odds, in bounds.
        unsafe {
            let s = src.as_ptr().wrapping_add(2 * j);
            let lo_half = _mm512_maskz_loadu_ps(keep(src.len(), 2 * j), s);
            let hi_half =
                _mm512_maskz_loadu_ps(keep(src.len(), 2 * j + LANES), s.wrapping_add(LANES));
            let e = prep.apply(_mm512_permutex2var_ps(lo_half, even, hi_half));
            let o = prep.apply(_mm512_permutex2var_ps(lo_half, odd, hi_half));
            _mm512_mask_storeu_ps(evens.as_mut_ptr().wrapping_add(j), keep(evens.len(), j), e);
            _mm512_mask_storeu_ps(odds.as_mut_ptr().wrapping_add(j), keep(odds.len(), j), o);
        }
        j += LANES;
    }
}
