//! Depthwise 2-D convolution (one filter per channel) of NHWC f32 activations, on AVX-512 or
//! AVX2 + FMA CPUs.
//!
//! In NHWC a pixel's channels are contiguous, so a 16-channel panel of one position (one
//! AVX-512 vector, or two AVX2 ones: [`Lanes16`]) makes every lane do useful work whatever the
//! image size: a block of up to 8 output positions (4 on AVX2) of one row keeps one accumulator
//! per position and panel, and each tap adds one weight panel times the input panel the tap
//! reads for each position, straight from the image (no padded copy). Taps over the padding are
//! skipped: a kernel row above or below the image for the whole block, a column left or right
//! of it per position. The weights are those of [`NhwcFilter`] with one input channel:
//! `[16-channel panel][tap][16]`. Bias, a residual (NHWC, the output's shape) and the
//! activation are applied on the way out; each output is summed in tap order whatever the
//! instruction set, the thread budget or the batch.

use crate::activation::{Finish, bias_act};
use crate::conv::{Conv2d, Epilogue};
use crate::gemm::SharedOut;
#[cfg(target_arch = "x86_64")]
use crate::lanes16::{Avx2, Avx512, Lanes16};
use crate::nhwc_conv::NhwcFilter;
use rayon::prelude::*;

const LANES: usize = 16;

/// Whether [`depthwise_nhwc`] computes convolution `p`: one group per channel, one output
/// channel per group.
pub fn applies(p: &Conv2d) -> bool {
    p.c > 0 && p.groups == p.c && p.m == p.c
}

/// Whether this CPU runs [`depthwise_nhwc`] and the fused blocks of `nhwc_block`.
pub fn available() -> bool {
    crate::nhwc_conv::available()
}

/// `out[r·C + j] = act(bias[j] + residual[r·C + j] + Σ_{ky,kx} x[img][iy][ix][j] ·
/// w[j][0][ky][kx])` for every output position `r = (img·oh + oy)·ow + ox` (`iy = oy·sh + ky·dh
/// - pt`, likewise `ix`; zero outside the image), split across `threads`.
///
/// # Panics
/// If the CPU has neither AVX-512F nor AVX2 + FMA ([`available`]), the convolution does not
/// [`applies`], `f` is not its filter, or `x`, the residual or `out` has the wrong size.
pub fn depthwise_nhwc(
    threads: usize,
    p: &Conv2d,
    x: &[f32],
    f: &NhwcFilter,
    epi: Epilogue<'_>,
    out: &mut [f32],
) {
    assert!(available(), "depthwise_nhwc needs AVX-512F or AVX2");
    depthwise_on(crate::avx512f(), threads, p, x, f, epi, out);
}

/// [`depthwise_nhwc`] on the AVX-512 kernel, or on the AVX2 one.
fn depthwise_on(
    avx512: bool,
    threads: usize,
    p: &Conv2d,
    x: &[f32],
    f: &NhwcFilter,
    epi: Epilogue<'_>,
    out: &mut [f32],
) {
    assert!(
        applies(p) && f.fits(p),
        "depthwise_nhwc of {p:?} with {f:?}"
    );
    crate::nhwc_conv::check_operands("depthwise_nhwc", avx512, p, x, epi, out);
    let rows = p.n * p.oh;
    if out.is_empty() {
        return;
    }
    let work = out.len() * p.kh * p.kw;
    let tasks = if threads > 1 && work >= crate::PAR_MIN_WORK {
        (2 * threads).min(rows)
    } else {
        1
    };
    let per = rows.div_ceil(tasks);
    let dst = SharedOut(out.as_mut_ptr());
    let run = |t: usize| {
        for row in (t * per).min(rows)..((t + 1) * per).min(rows) {
            // SAFETY: the CPU has the kernel's instructions (asserted above) and the sizes were
            // checked above; tasks write disjoint output rows.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                if avx512 {
                    output_row_avx512(p, x, f, epi, row, dst)
                } else {
                    output_row_avx2(p, x, f, epi, row, dst)
                }
            }
        }
    };
    if tasks > 1 {
        (0..tasks).into_par_iter().for_each(run);
    } else {
        run(0);
    }
}

/// [`output_row`] on AVX-512.
///
/// # Safety
/// The CPU has AVX-512F; as [`output_row`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn output_row_avx512(
    p: &Conv2d,
    x: &[f32],
    f: &NhwcFilter,
    epi: Epilogue<'_>,
    row: usize,
    out: SharedOut,
) {
    // SAFETY: this function's contract.
    unsafe { output_row::<Avx512>(p, x, f, epi, row, out) }
}

/// [`output_row`] on AVX2 + FMA.
///
/// # Safety
/// The CPU has AVX2 and FMA; as [`output_row`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn output_row_avx2(
    p: &Conv2d,
    x: &[f32],
    f: &NhwcFilter,
    epi: Epilogue<'_>,
    row: usize,
    out: SharedOut,
) {
    // SAFETY: this function's contract.
    unsafe { output_row::<Avx2>(p, x, f, epi, row, out) }
}

/// Output row `row` (`img·oh + oy`), every channel.
///
/// # Safety
/// The CPU has `V`'s instructions (this is inlined into a function compiled for them); the
/// operands are as [`depthwise_nhwc`] asserts; no one else writes this row of `out`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn output_row<V: Lanes16>(
    p: &Conv2d,
    x: &[f32],
    f: &NhwcFilter,
    epi: Epilogue<'_>,
    row: usize,
    out: SharedOut,
) {
    let (img, oy) = (row / p.oh, row % p.oh);
    // The kernel rows inside the image: iy = y0 + ky·dh in 0..h.
    let y0 = (oy * p.sh) as isize - p.pt as isize;
    let ky0 = if y0 < 0 {
        (-y0 as usize).div_ceil(p.dh)
    } else {
        0
    };
    let ky1 = ((p.h as isize - y0).max(0) as usize)
        .div_ceil(p.dh)
        .min(p.kh);
    // The positions whose windows lie inside the image across: ox in lo..hi.
    let span = (p.kw - 1) * p.dw;
    let lo = p.pl.div_ceil(p.sw).min(p.ow);
    let hi = if p.w + p.pl > span {
        ((p.w + p.pl - span - 1) / p.sw + 1).clamp(lo, p.ow)
    } else {
        lo
    };
    let first = row * p.ow * p.m;
    for q in 0..p.m.div_ceil(LANES) {
        let src = Source::<V> {
            p,
            // SAFETY: image img, channel q·16: within x.
            x: unsafe { x.as_ptr().add(img * p.h * p.w * p.c + q * LANES) },
            w: f.panel(q).as_ptr(),
            // SAFETY: the CPU has V's instructions.
            mask: unsafe { V::mask(p.c - q * LANES) },
            kys: (ky0.min(ky1), ky1),
            y0,
        };
        let at = |ox: usize| first + ox * p.m + q * LANES;
        // SAFETY (all blocks): positions of this row, channels of panel q; the windows of the
        // unchecked blocks lie inside the image across.
        unsafe {
            for ox in (0..lo).chain(hi..p.ow) {
                block::<V, 1, true>(&src, ox, epi, at(ox), out);
            }
            // 8 positions where their accumulators fit in registers: on AVX-512, or where
            // a 3-wide row's sums run a register at a time (`sums_row3`).
            let wide = V::REGISTERS >= 32 || (three_wide(p) && p.sw == 1);
            let mut ox = lo;
            while ox < hi {
                ox += match hi - ox {
                    n if n >= 8 && wide => block::<V, 8, false>(&src, ox, epi, at(ox), out),
                    4.. => block::<V, 4, false>(&src, ox, epi, at(ox), out),
                    2.. => block::<V, 2, false>(&src, ox, epi, at(ox), out),
                    _ => block::<V, 1, false>(&src, ox, epi, at(ox), out),
                };
            }
        }
    }
    if let Finish::Other(act) = Finish::of(epi.act) {
        // SAFETY: this row of `out`, written above by this task alone.
        let done = unsafe { std::slice::from_raw_parts_mut(out.at(first), p.ow * p.m) };
        bias_act(done, None, Some(act));
    }
}

/// What the blocks of one output row and one 16-channel panel read.
#[cfg(target_arch = "x86_64")]
struct Source<'a, V: Lanes16> {
    p: &'a Conv2d,
    /// The image's first pixel, at the panel's first channel.
    x: *const f32,
    /// The panel's weights, `[tap][16]`.
    w: *const f32,
    /// The panel's channels below `C`.
    mask: V::Mask,
    /// The kernel rows inside the image, and the input row kernel row 0 reads.
    kys: (usize, usize),
    y0: isize,
}

/// Output positions `ox..ox + N` of a row and one panel (the first at `out[at]`, the others
/// `M` floats apart); returns `N`. `CHECKED` skips the taps left or right of the image.
///
/// # Safety
/// As [`output_row`]; `ox + N <= ow`; all windows lie inside the image across unless
/// `CHECKED`; no one else writes these outputs.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn block<V: Lanes16, const N: usize, const CHECKED: bool>(
    src: &Source<'_, V>,
    ox: usize,
    epi: Epilogue<'_>,
    at: usize,
    out: SharedOut,
) -> usize {
    let (p, mask) = (src.p, src.mask);
    let row3 = !CHECKED && three_wide(p);
    // SAFETY: this function's contract.
    unsafe {
        let acc = match p.sw {
            1 if row3 => sums_row3::<V, N, 1>(src, ox),
            2 if row3 => sums_row3::<V, N, 2>(src, ox),
            _ => sums::<V, N, CHECKED>(src, ox),
        };
        // The panel's channels of the bias (M values) under the mask.
        let bias = epi
            .bias
            .map(|b| V::load_masked(mask, b.as_ptr().add(at % p.m)));
        let clamp = match Finish::of(epi.act) {
            Finish::Clamp(lo, hi) => Some((V::splat(lo), V::splat(hi))),
            _ => None,
        };
        for (i, mut v) in acc.into_iter().enumerate() {
            let at = at + i * p.m;
            if let Some(b) = bias {
                v = v.add(b);
            }
            if let Some(res) = epi.residual {
                // The residual has the output's size (asserted by `depthwise_nhwc`).
                v = v.add(V::load_masked(mask, res.as_ptr().add(at)));
            }
            if let Some((lo, hi)) = clamp {
                v = v.clamp(lo, hi);
            }
            // Output position ox + i, the panel's channels: this function's contract.
            v.store_masked(mask, out.at(at));
        }
    }
    N
}

/// The sums of output positions `ox..ox + N` of one panel, tap by tap in order.
///
/// # Safety
/// As [`block`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn sums<V: Lanes16, const N: usize, const CHECKED: bool>(
    src: &Source<'_, V>,
    ox: usize,
) -> [V; N] {
    let p = src.p;
    let (c, w) = (p.c as isize, p.w as isize);
    let step = p.sw * p.c;
    let x0 = (ox * p.sw) as isize - p.pl as isize;
    // SAFETY: the CPU has V's instructions.
    let mut acc = [unsafe { V::zero() }; N];
    for ky in src.kys.0..src.kys.1 {
        let iy = src.y0 + (ky * p.dh) as isize;
        for kx in 0..p.kw {
            let ix = x0 + (kx * p.dw) as isize;
            // SAFETY: tap ky·kw + kx of the panel's weights.
            let wv = unsafe { V::load(src.w.add((ky * p.kw + kx) * LANES)) };
            // SAFETY (offset): pixel (iy, ix) of the image, inside it where read below.
            let tap = src.x.wrapping_offset((iy * w + ix) * c);
            for (i, acc) in acc.iter_mut().enumerate() {
                if CHECKED && !(0..w).contains(&(ix + (i * p.sw) as isize)) {
                    continue;
                }
                // SAFETY: position ox + i's tap lies inside the image (checked, or this
                // function's contract); the mask keeps to its channels.
                *acc = unsafe {
                    let xv = V::load_masked(src.mask, tap.wrapping_add(i * step));
                    acc.fmadd(xv, wv)
                };
            }
        }
    }
    acc
}

/// Whether the windows' rows are 3 taps side by side, which [`sums_row3`] computes (inside the
/// image, at stride 1 or 2).
#[cfg(target_arch = "x86_64")]
fn three_wide(p: &Conv2d) -> bool {
    p.kw == 3 && p.dw == 1
}

/// [`sums`] of a 3-wide kernel at stride `S` (1 or 2) and dilation 1 across, windows inside
/// the image: neighbouring positions share taps, so each kernel row loads its `S·(N - 1) + 3`
/// input panels once (not `3·N` loads), each while it serves the positions whose taps read it
/// (a whole row of panels would not fit in AVX2's registers). On AVX2 each half of the panel
/// runs on its own: with both, the accumulators of 4 positions and the row's weights did not
/// fit in the 16 registers, and the weights went to the stack. The same products in the same
/// order.
///
/// # Safety
/// As [`block`], unchecked; `N <= 8`, `S <= 2`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn sums_row3<V: Lanes16, const N: usize, const S: usize>(
    src: &Source<'_, V>,
    ox: usize,
) -> [V; N] {
    let p = src.p;
    let (c, w) = (p.c as isize, p.w as isize);
    let x0 = (ox * S) as isize - p.pl as isize;
    // SAFETY: the CPU has V's instructions.
    let zero = unsafe { V::part_zero() };
    let mut parts = [[zero; N]; 2];
    // One part of the lanes at a time (each half on AVX2), so that N accumulators, a kernel
    // row's three weights and one input panel stay in registers.
    for (h, acc) in parts.iter_mut().enumerate().take(V::PARTS) {
        let lanes = h * (LANES / V::PARTS);
        for ky in src.kys.0..src.kys.1 {
            let iy = src.y0 + (ky * p.dh) as isize;
            // SAFETY: taps 3·ky.. of the panel's weights, this part's lanes.
            let wv: [V::Part; 3] = std::array::from_fn(|kx| unsafe {
                V::part_load(src.w.add((ky * 3 + kx) * LANES + lanes))
            });
            // SAFETY (offset): pixels x0..x0 + S·(N - 1) + 3 of row iy lie inside the image.
            let row = src.x.wrapping_offset((iy * w + x0) * c + lanes as isize);
            // Input panel j serves position i through tap kx = j - S·i: each accumulator
            // still takes its taps in ascending order, and one input panel is live at a time.
            for j in 0..S * (N - 1) + 3 {
                // SAFETY: as above; the mask keeps to the panel's channels.
                let xv = unsafe { V::part_load_masked(src.mask, h, row.wrapping_add(j * p.c)) };
                for (kx, &wv) in wv.iter().enumerate() {
                    if j >= kx && (j - kx) % S == 0 && (j - kx) / S < N {
                        let acc = &mut acc[(j - kx) / S];
                        // SAFETY: the CPU has V's instructions.
                        *acc = unsafe { V::part_fmadd(*acc, xv, wv) };
                    }
                }
            }
        }
    }
    // SAFETY: the CPU has V's instructions.
    std::array::from_fn(|i| unsafe { V::join([parts[0][i], parts[1][i]]) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nhwc_conv::tests::check_against_the_reference;

    #[test]
    fn matches_the_tap_by_tap_convolution() {
        if crate::skip_without(available(), "AVX-512F or AVX2 + FMA") {
            return;
        }
        // (n, c, h, w, m, k, stride, dilation, pad top-left, bottom-right); m is ignored.
        let cases = [
            (1, 32, 9, 11, 0, 3, 1, 1, 1, 1),
            (2, 20, 7, 7, 0, 3, 2, 1, 1, 1),
            (1, 144, 10, 10, 0, 3, 2, 1, 0, 1),
            (1, 5, 6, 17, 0, 5, 1, 1, 2, 2),
            (3, 48, 4, 4, 0, 3, 1, 2, 2, 2),
            (1, 16, 3, 20, 0, 3, 1, 1, 0, 0),
            (1, 20, 5, 41, 0, 3, 2, 1, 1, 1),
            (1, 40, 2, 2, 0, 3, 1, 1, 1, 1),
            // Rows of 8-position blocks whose last panel has one half (24 channels) or part
            // of one (12) on AVX2.
            (1, 24, 4, 20, 0, 3, 1, 1, 1, 1),
            (2, 12, 3, 19, 0, 3, 1, 1, 1, 1),
        ];
        assert!(!applies(&crate::test_conv((1, 4, 3, 3, 4, 3, 1, 1, 1, 1))));
        for case in cases {
            let mut p = crate::test_conv(case);
            (p.m, p.groups) = (p.c, p.c);
            check_against_the_reference(&p, depthwise_nhwc);
            // The AVX2 kernel too, where the AVX-512 one ran above.
            #[cfg(target_arch = "x86_64")]
            if crate::avx512f() && crate::activation::avx2_fma() {
                fn avx2(
                    t: usize,
                    p: &Conv2d,
                    x: &[f32],
                    f: &NhwcFilter,
                    e: Epilogue<'_>,
                    o: &mut [f32],
                ) {
                    depthwise_on(false, t, p, x, f, e, o)
                }
                check_against_the_reference(&p, avx2);
            }
        }
    }
}
