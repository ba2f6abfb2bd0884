//! [`qconv_nhwc`](super::qconv_nhwc)'s products on AMX tiles ([`crate::qamx`]): register
//! tiles of 32 output positions by 32 channels.
//!
//! An A tile is 16 output positions by 64 bytes of the reduction. Where the channels are whole
//! groups of 64, a group lies within one tap, and 16 positions along one output row whose
//! windows lie inside the image read each group at a fixed stride (`sw·C` bytes): the tile
//! loads straight from the image, at the group's offset within the window. So does any run of
//! positions of a pointwise convolution with stride 1 and no padding, whose input pixels are
//! its output positions. Other positions (across output rows, over the padding, the last ones)
//! are copied to a stage, a row of the reduction each, as im2col would lay them out.

use super::{Byte, Image, RUN_MAX, Requantize, Requantize16};
use crate::qamx::{self, Rows, TILE_K, TILE_ROWS};
use crate::qgemm::{LANES, PackedB, Share, SharedOut};
use std::ops::Range;

/// The fewest rows of a last register tile worth computing on AMX (its 32 rows cost as much
/// whatever their number); fewer run on the VNNI kernel.
const MIN_ROWS: usize = 8;

/// Whether the AMX kernel takes a convolution with these weights: there is a reduction, and
/// the process can use the tiles.
pub(super) fn applies(w: &PackedB) -> bool {
    w.kp > 0 && qamx::available()
}

/// Per group of 64 reductions, its offset in bytes from a window's top-left tap in the image;
/// `None` where a group may span two taps (channels not whole groups of 64).
fn window_offsets(image: &Image<'_>, groups: usize) -> Option<Vec<usize>> {
    let p = image.p;
    p.c.is_multiple_of(TILE_K).then(|| {
        (0..groups)
            .map(|g| {
                let (tap, c0) = (g * TILE_K / p.c, g * TILE_K % p.c);
                let (ky, kx) = (tap / p.kw, tap % p.kw);
                (ky * p.dh * p.w + kx * p.dw) * p.c + c0
            })
            .collect()
    })
}

/// Where output positions `r..r + 16` read their windows straight from the image: the byte
/// of the first one's top-left tap, and the stride from one to the next; `None` where they
/// do not (across output rows, or over the padding).
fn direct(image: &Image<'_>, r: usize) -> Option<(usize, usize)> {
    let p = image.p;
    let pointwise = p.kh == 1 && p.kw == 1 && p.sh == 1 && p.sw == 1;
    if pointwise && p.pt == 0 && p.pl == 0 && p.oh == p.h && p.ow == p.w {
        return Some((r * p.c, p.c));
    }
    let (img, pos) = (r / (p.oh * p.ow), r % (p.oh * p.ow));
    let (oy, ox) = (pos / p.ow, pos % p.ow);
    let y0 = (oy * p.sh).checked_sub(p.pt)?;
    let x0 = (ox * p.sw).checked_sub(p.pl)?;
    let inside = ox + TILE_ROWS <= p.ow
        && y0 + (p.kh - 1) * p.dh < p.h
        && x0 + (TILE_ROWS - 1) * p.sw + (p.kw - 1) * p.dw < p.w;
    inside.then_some((((img * p.h + y0) * p.w + x0) * p.c, p.sw * p.c))
}

/// Copies the windows of output positions `rows` to `stage`, a row of `width` bytes each, in
/// the weights' reduction order (the bytes past the reduction are left as they are).
///
/// # Safety
/// The CPU has AVX-512F and BW.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn fill(image: &Image<'_>, rows: Range<usize>, width: usize, stage: &mut [u8]) {
    let (p, runs) = (image.p, image.runs);
    let mut bytes = [0u8; RUN_MAX];
    for (r, window) in rows.zip(stage.chunks_exact_mut(width)) {
        let origin = image.origin(r);
        for ky in 0..p.kh {
            for kx in 0..runs.per_row {
                let run = image.run(origin, (ky, kx), &mut bytes);
                let to = &mut window[(ky * runs.per_row + kx) * runs.len..][..runs.len];
                // SAFETY: the CPU has AVX-512F and BW (the contract).
                unsafe { copy(run, to) };
            }
        }
    }
}

/// `to.copy_from_slice(from)` 64 bytes at a time, the last ones masked: a kernel row of a few
/// channels is one masked load and store, where `memcpy` is a call.
///
/// # Safety
/// The CPU has AVX-512F and BW.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn copy(from: &[u8], to: &mut [u8]) {
    use std::arch::x86_64::*;
    assert_eq!(from.len(), to.len());
    for (from, to) in from.chunks(64).zip(to.chunks_mut(64)) {
        let mask: __mmask64 = u64::MAX >> (64 - from.len());
        // SAFETY: the mask reads and writes the chunks' bytes alone.
        unsafe {
            let v = _mm512_maskz_loadu_epi8(mask, from.as_ptr().cast());
            _mm512_mask_storeu_epi8(to.as_mut_ptr().cast(), mask, v);
        }
    }
}

/// Output rows `rows` by the channels of `panels`: 32 × 32 register tiles on AMX, and a last
/// few rows on the VNNI kernel.
///
/// # Safety
/// [`applies`] holds; the operands are as [`qconv_nhwc`](super::qconv_nhwc) asserts; no one
/// else writes these tiles of `out`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn tiles<O: Byte>(
    image: &Image<'_>,
    w: &PackedB,
    rows: Range<usize>,
    panels: Range<usize>,
    rq: &Requantize<'_>,
    out: SharedOut<O>,
) {
    // A reduction that is not whole groups of 64 ends in a group whose A bytes past it are
    // zeros (the stage's), so the B bytes it reads there (the next panel's) add nothing. The
    // last panel has no next one: it is read from a copy padded with zeros.
    let groups = w.kp.div_ceil(TILE_K);
    let width = groups * TILE_K;
    let last = w.panels - 1;
    let padded_last = (width > w.kp && panels.contains(&last)).then(|| {
        let mut panel = vec![0i8; width * LANES];
        panel[..w.kp * LANES].copy_from_slice(&w.data[last * w.kp * LANES..][..w.kp * LANES]);
        panel
    });
    let panel = |q: usize| match &padded_last {
        Some(padded) if q == last => padded.as_ptr(),
        _ => qamx::panel(w, q),
    };
    let tail = rows.len() % (2 * TILE_ROWS);
    let amx_end = match tail {
        t if t > 0 && t < MIN_ROWS => rows.end - t,
        _ => rows.end,
    };
    if amx_end > rows.start {
        let offsets = window_offsets(image, groups);
        // SAFETY: panels lie within w (the contract).
        let requantize: Vec<Requantize16> = (panels.clone())
            .map(|q| unsafe { Requantize16::new(rq, w, image.zx, q) })
            .collect();
        let mut stage = vec![0u8; 2 * TILE_ROWS * width];
        let mut sums = [0i32; 4 * TILE_ROWS * LANES];
        // SAFETY: `applies` implies `available`; the tile state is released below, and
        // nothing in between uses tiles.
        unsafe { qamx::configure() };
        for i in (rows.start..amx_end).step_by(2 * TILE_ROWS) {
            let valid = |h: usize| (amx_end.saturating_sub(i + h * TILE_ROWS)).min(TILE_ROWS);
            let halves: [Rows<'_>; 2] = std::array::from_fn(|h| {
                let r0 = i + h * TILE_ROWS;
                let straight = offsets.as_deref().filter(|_| valid(h) == TILE_ROWS);
                match straight.and_then(|o| Some((o, direct(image, r0)?))) {
                    Some((offsets, (at, stride))) => Rows {
                        base: image.x[at..].as_ptr(),
                        stride,
                        offsets: Some(offsets),
                    },
                    None => {
                        let half = &mut stage[h * TILE_ROWS * width..][..TILE_ROWS * width];
                        // SAFETY: the CPU has AVX-512F and BW (`applies`).
                        unsafe { fill(image, r0..r0 + valid(h), width, half) };
                        Rows {
                            base: half.as_ptr(),
                            stride: width,
                            offsets: None,
                        }
                    }
                }
            });
            for p in panels.clone().step_by(2) {
                // An odd last panel is multiplied twice, its second sums left unread.
                let pair = [p, (p + 1).min(panels.end - 1)];
                // SAFETY: the tiles are configured; each half's 16 rows read `groups` groups
                // of 64 bytes within the image (`direct`: every tap of the 16 windows lies
                // inside it) or the stage (16 rows of `width` bytes); each panel's `width / 4`
                // groups of 16 × 4 bytes lie within w.data (a panel before the last reads
                // into the next) or the padded copy of the last.
                unsafe { qamx::products(halves, pair.map(panel), groups, &mut sums, Share::NONE) };
                for (q, quarter) in sums.chunks_exact(TILE_ROWS * LANES).enumerate() {
                    let (h, panel) = (q / 2, p + q % 2);
                    if panel >= panels.end {
                        continue;
                    }
                    let requantize = &requantize[panel - panels.start];
                    let r0 = i + h * TILE_ROWS;
                    for (r, acc) in quarter.chunks_exact(LANES).take(valid(h)).enumerate() {
                        // SAFETY: row r0 + r < amx_end is an output row of this task.
                        unsafe {
                            let acc = std::arch::x86_64::_mm512_loadu_si512(acc.as_ptr().cast());
                            requantize.store(acc, out, r0 + r)
                        };
                    }
                }
            }
        }
        // SAFETY: releases the tile state configured above.
        unsafe { qamx::release() };
    }
    if amx_end < rows.end {
        // SAFETY: as this function's contract (AMX implies the VNNI kernel's CPU features).
        unsafe { super::vnni_tiles(image, w, amx_end..rows.end, panels, rq, out) };
    }
}
