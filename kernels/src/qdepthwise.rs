//! Depthwise integer convolution: every group one input channel, each of its output channels
//! the exact `i32` sums `Σ (x − zx)·(w − zw)` over its kernel.
//!
//! A matrix product is the wrong shape for this (one row of `kh·kw` per output channel: the
//! packing of the image would cost more than the product). Here each input plane is widened
//! once to `i16` less its zero point, into a buffer padded with zeros (the zero point, less
//! itself) with strided columns split into phases, and each kernel tap adds the contiguous run
//! of the plane under a row of outputs to its sums: a loop of widening multiply-adds that
//! vectorises along the row.

use crate::conv::Conv2d;
use crate::qgemm::Int8;
use crate::wide::wide;
use rayon::prelude::*;
use std::cell::RefCell;

/// Per output channel `c`, its `kh·kw` weights less their zero point, as [`qdepthwise`] reads
/// them: `w` is `[M, 1, kh, kw]` and `zw` one zero point or one per output channel.
///
/// # Panics
/// If `zw` has neither one value nor one per channel.
pub fn centred_filter<T: Int8>(m: usize, w: &[T], zw: &[T]) -> Vec<i16> {
    assert!(
        zw.len() == 1 || zw.len() == m,
        "one zero point or one per channel"
    );
    let taps = w.len() / m.max(1);
    w.iter()
        .enumerate()
        .map(|(i, &v)| {
            let z = zw[if zw.len() == 1 { 0 } else { i / taps }];
            v.unsigned() as i16 - z.unsigned() as i16
        })
        .collect()
}

thread_local! {
    /// One plane padded, and one output plane's sums.
    static SCRATCH: RefCell<(Vec<i16>, Vec<i32>)> = RefCell::default();
}

/// The depthwise convolution of `x` (`[n, C, h, w]`, zero point `zero`) by `w` (from
/// [`centred_filter`], `M = C·k` output channels, `k` per input channel): output plane `(i,
/// c)` of `out` (`[n, M, oh, ow]`) is written by `epilogue(c, sums, plane)`.
///
/// # Panics
/// If `p` is not depthwise (`groups == C`, `M` a multiple of it) or a slice has another size.
pub fn qdepthwise<T: Int8, Y: Send>(
    threads: usize,
    p: &Conv2d,
    x: &[T],
    zero: T,
    w: &[i16],
    out: &mut [Y],
    epilogue: &(impl Fn(usize, &[i32], &mut [Y]) + Sync),
) {
    assert!(
        p.groups == p.c && p.m.is_multiple_of(p.c.max(1)),
        "depthwise geometry"
    );
    let (in_plane, out_plane, taps) = (p.h * p.w, p.oh * p.ow, p.kh * p.kw);
    assert_eq!(x.len(), p.n * p.c * in_plane, "depthwise input size");
    assert_eq!(w.len(), p.m * taps, "depthwise weight size");
    assert_eq!(out.len(), p.n * p.m * out_plane, "depthwise output size");
    if out.is_empty() {
        return;
    }
    let per_input = p.m / p.c;
    // One input plane and its `per_input` output planes.
    let group = |idx: usize, dst: &mut [Y]| {
        let channel = idx % p.c;
        let src = &x[idx * in_plane..][..in_plane];
        SCRATCH.with_borrow_mut(|(padded, sums)| {
            let phase = pad(p, src, zero, padded);
            sums.resize(out_plane, 0);
            for (j, dst) in dst.chunks_exact_mut(out_plane).enumerate() {
                let c = channel * per_input + j;
                plane_sums(p, padded, phase, &w[c * taps..][..taps], sums);
                epilogue(c, sums, dst);
            }
        });
    };
    let groups = p.n * p.c;
    let chunk = per_input * out_plane;
    if threads > 1 && groups > 1 && out.len() * taps >= crate::PAR_MIN_WORK {
        let per_task = (groups / (threads * 8)).clamp(1, 64);
        out.par_chunks_mut(chunk * per_task)
            .enumerate()
            .for_each(|(t, part)| {
                for (i, dst) in part.chunks_mut(chunk).enumerate() {
                    group(t * per_task + i, dst)
                }
            });
    } else {
        for (i, dst) in out.chunks_mut(chunk).enumerate() {
            group(i, dst)
        }
    }
}

/// `src` (one plane) less `zero` as `i16`, into `padded` with the convolution's padding (and
/// whatever the last output reaches past the input) as zeros. Each padded row is stored as
/// `sw` phases of `phase` values, columns `φ, φ + sw, ...` in phase `φ`, so that a tap reads
/// the columns under a row of outputs contiguously at any stride. Returns `phase`.
fn pad<T: Int8>(p: &Conv2d, src: &[T], zero: T, padded: &mut Vec<i16>) -> usize {
    let rows = (p.oh - 1) * p.sh + (p.kh - 1) * p.dh + 1;
    let width = (p.ow - 1) * p.sw + (p.kw - 1) * p.dw + 1;
    let (s, phase) = (p.sw, width.div_ceil(p.sw));
    padded.clear();
    padded.resize(rows * s * phase, 0);
    let z = zero.unsigned() as i16;
    if p.w == 0 {
        return phase;
    }
    let lines = padded.chunks_exact_mut(s * phase).skip(p.pt);
    for (dst, row) in lines.zip(src.chunks_exact(p.w)) {
        for (f, dst) in dst.chunks_exact_mut(phase).enumerate() {
            // The first input column in phase `f`, and where it goes in it.
            let first = (f + s - p.pl % s) % s;
            let Some(dst) = dst.get_mut((first + p.pl) / s..) else {
                continue;
            };
            let src = row.iter().skip(first).step_by(s);
            wide(
                #[inline(always)]
                || {
                    for (d, &v) in dst.iter_mut().zip(src) {
                        *d = v.unsigned() as i16 - z;
                    }
                },
            );
        }
    }
    phase
}

/// The sums of one output plane: each tap's weight times the padded plane under it.
fn plane_sums(p: &Conv2d, padded: &[i16], phase: usize, w: &[i16], sums: &mut [i32]) {
    let line = p.sw * phase;
    wide(
        #[inline(always)]
        || {
            for (oy, row) in sums.chunks_exact_mut(p.ow).enumerate() {
                row.fill(0);
                for ky in 0..p.kh {
                    let src = &padded[(oy * p.sh + ky * p.dh) * line..][..line];
                    for kx in 0..p.kw {
                        let (wv, from) = (w[ky * p.kw + kx] as i32, kx * p.dw);
                        let src = &src[from % p.sw * phase + from / p.sw..];
                        for (s, &v) in row.iter_mut().zip(src) {
                            *s += v as i32 * wv;
                        }
                    }
                }
            }
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sums by definition, from the unpadded input.
    fn reference(p: &Conv2d, x: &[u8], zx: u8, w: &[i16]) -> Vec<i32> {
        let per = p.m / p.c;
        let mut out = vec![0; p.n * p.m * p.oh * p.ow];
        for n in 0..p.n {
            for c in 0..p.m {
                let plane = &x[(n * p.c + c / per) * p.h * p.w..][..p.h * p.w];
                for oy in 0..p.oh {
                    for ox in 0..p.ow {
                        let mut s = 0;
                        for ky in 0..p.kh {
                            for kx in 0..p.kw {
                                let iy = (oy * p.sh + ky * p.dh) as isize - p.pt as isize;
                                let ix = (ox * p.sw + kx * p.dw) as isize - p.pl as isize;
                                let inside = (0..p.h as isize).contains(&iy)
                                    && (0..p.w as isize).contains(&ix);
                                let v = match inside {
                                    true => plane[iy as usize * p.w + ix as usize] as i32,
                                    false => zx as i32,
                                };
                                s += (v - zx as i32) * w[(c * p.kh + ky) * p.kw + kx] as i32;
                            }
                        }
                        out[((n * p.m + c) * p.oh + oy) * p.ow + ox] = s;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn matches_the_definition_over_strides_dilations_paddings_and_multipliers() {
        // (n, c, h, w, per-channel multiplier, kernel, stride, dilation, pads t/l/b/r)
        let cases = [
            (1, 3, 7, 9, 1, (3, 3), 1, 1, [1, 1, 1, 1]),
            (2, 4, 8, 8, 1, (3, 3), 2, 1, [0, 0, 1, 1]),
            (1, 2, 9, 6, 2, (5, 3), 1, 2, [2, 1, 0, 3]),
            (1, 5, 4, 11, 1, (1, 4), 3, 1, [0, 2, 0, 0]),
            (3, 1, 1, 1, 3, (1, 1), 1, 1, [0, 0, 0, 0]),
        ];
        let mut seed = 5u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 23) as u8
        };
        for (n, c, h, w, per, (kh, kw), s, d, [pt, pl, pb, pr]) in cases {
            let oh = (h + pt + pb - (kh - 1) * d - 1) / s + 1;
            let ow = (w + pl + pr - (kw - 1) * d - 1) / s + 1;
            let p = Conv2d {
                n,
                c,
                h,
                w,
                m: c * per,
                kh,
                kw,
                sh: s,
                sw: s,
                dh: d,
                dw: d,
                pt,
                pl,
                oh,
                ow,
                groups: c,
            };
            let x: Vec<u8> = (0..n * c * h * w).map(|_| next()).collect();
            let wq: Vec<u8> = (0..p.m * kh * kw).map(|_| next()).collect();
            let zw: Vec<u8> = (0..p.m).map(|_| next()).collect();
            let wc = centred_filter(p.m, &wq, &zw);
            let want = reference(&p, &x, 131, &wc);
            for threads in [1, 2] {
                let mut got = vec![0; want.len()];
                qdepthwise(threads, &p, &x, 131, &wc, &mut got, &|_, s, o| {
                    o.copy_from_slice(s)
                });
                assert_eq!(got, want, "{p:?}, {threads} threads");
            }
        }
    }
}
