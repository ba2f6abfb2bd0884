//! Quantized 2-D convolution of NHWC uint8 activations by int8 weights, without im2col.
//!
//! In NHWC the `C` channels of one input pixel are contiguous, so the reduction over one kernel
//! tap is a run of bytes of the image itself. The product reads each output position's taps
//! straight from the image (a tap over the padding reads a row of zero points), four channels
//! at a time as `vpdpbusd`'s broadcast operand, against the weights packed once as a
//! [`PackedB`] with the reduction in tap-major order, `k = (ky·kw + kx)·C + c`. Nothing is
//! packed per call, and the output comes out NHWC, `[positions][M]`.
//!
//! With fewer channels (an RGB stem's 3), a tap is not a whole group of four. Where the taps of
//! a kernel row lie side by side (no dilation along x), the reduction runs over whole kernel
//! rows instead: `kw·C` bytes of the image, rounded up to four with zero weights, so
//! `k = ky·run + kx·C + c` ([`pack_filter`] chooses).
//!
//! Where the CPU has AMX, the products run on its tiles (module `amx`), reading the same windows.
//!
//! The weights' zero points must be zero (symmetric int8 weights, as onnxruntime's quantizer
//! writes them); the activations' zero point comes out of the sum as `zx·Σw` per output
//! channel: `Σ (x - zx)·w = Σ x·w - zx·Σ w`.

#[cfg(target_arch = "x86_64")]
mod amx;

use crate::conv::Conv2d;
use crate::qgemm::{LANES, MR, NP, PackedB, SharedOut, vnni};
use rayon::prelude::*;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::{__m256i, _mm256_packs_epi16, _mm256_packus_epi16};

/// Packed weights up to this size are read whole for each tile of output rows.
const L2_WEIGHTS: usize = 256 << 10;

/// The longest kernel row read as one run of bytes.
const RUN_MAX: usize = 64;

/// How a window's reduction is read: `per_row` runs of `len` bytes per kernel row, one per tap
/// (`C` a multiple of 4) or one for the whole row (its `kw·C` bytes rounded up to 4).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Runs {
    per_row: usize,
    len: usize,
}

/// The runs of a convolution with `c` channels, `kw` taps across and dilation `dw` along x;
/// `None` where neither kind fits.
fn runs(c: usize, kw: usize, dw: usize) -> Option<Runs> {
    if c == 0 || kw == 0 {
        None
    } else if c.is_multiple_of(4) {
        Some(Runs {
            per_row: kw,
            len: c,
        })
    } else {
        let len = (kw * c).div_ceil(4) * 4;
        (dw == 1 && len <= RUN_MAX).then_some(Runs { per_row: 1, len })
    }
}

/// Weights `w`, ONNX's `[M][C][kh][kw]` with zero points of zero, packed for [`qconv_nhwc`]
/// of a convolution with dilation `dw` along x; `None` where it cannot compute one.
///
/// # Panics
/// If `w` holds fewer than `M·C·kh·kw` values.
pub fn pack_filter(
    m: usize,
    c: usize,
    (kh, kw): (usize, usize),
    dw: usize,
    w: &[i8],
) -> Option<PackedB> {
    let r = runs(c, kw, dw)?;
    if m == 0 || kh == 0 {
        return None;
    }
    let taps = kh * kw;
    let k = kh * r.per_row * r.len;
    // [M][C][ky][kx] to [ky·run + kx·C + c][M] (the same as tap-major where C is whole
    // groups); the bytes that round a row up keep zero weights.
    let mut cols = vec![0i8; k * m];
    for (j, filter) in w[..m * c * taps].chunks_exact(c * taps).enumerate() {
        for (i, &v) in filter.iter().enumerate() {
            let (ci, ky, kx) = (i / taps, i % taps / kw, i % kw);
            cols[(ky * r.per_row * r.len + kx * c + ci) * m + j] = v;
        }
    }
    Some(PackedB::new(k, m, &cols, (m, 1), &[0i8]))
}

/// Whether [`qconv_nhwc`] computes this convolution with these weights.
pub fn applies(p: &Conv2d, w: &PackedB) -> bool {
    p.groups == 1
        && runs(p.c, p.kw, p.dw).is_some_and(|r| w.k == p.kh * r.per_row * r.len)
        && w.n == p.m
        && w.zero.iter().all(|&z| z == 0)
}

/// How a sum becomes an 8-bit output value, per output channel `j`:
/// `clamp(round(sum as f32 · mult[j] + offset[j]) + zero, lo, hi)`, rounding half to even, in
/// that order of f32 operations (a product, then a sum: no fused multiply-add).
pub struct Requantize<'a> {
    pub mult: &'a [f32],
    pub offset: &'a [f32],
    pub zero: f32,
    /// The output's range (integers; `lo` is the zero point itself with a ReLU fused).
    pub lo: f32,
    pub hi: f32,
}

impl Requantize<'_> {
    /// The output value of sum `acc` in channel `j`. Written with `max`/`min` rather than
    /// `clamp` and a saturating cast, so that loops over it vectorise.
    #[inline]
    pub fn value(&self, j: usize, acc: i32) -> i32 {
        self.scaled(acc as f32 * self.mult[j] + self.offset[j])
    }

    /// [`value`](Self::value) of sums that all belong to channel `j`, into `out`.
    #[inline]
    pub fn channel<O: Byte>(&self, j: usize, acc: &[i32], out: &mut [O]) {
        let (mult, offset) = (self.mult[j], self.offset[j]);
        for (o, &a) in out.iter_mut().zip(acc) {
            *o = O::from_i32(self.scaled(a as f32 * mult + offset));
        }
    }

    /// A scaled sum rounded, shifted by the zero point and clamped.
    #[inline(always)]
    fn scaled(&self, v: f32) -> i32 {
        // max/min give the bound for NaN, as the vector path does.
        #[allow(clippy::manual_clamp)]
        let v = v.max(self.lo - self.zero).min(self.hi - self.zero);
        let r = round_even(v) + self.zero;
        // SAFETY: r is finite and within lo..=hi, a range of 8-bit values.
        unsafe { r.to_int_unchecked::<i32>() }
    }
}

/// `x` rounded half to even, for `|x| <= 2^22`: adding and taking away 1.5·2^23 leaves no
/// fraction bits, and the addition rounds as the FPU does (to nearest, ties to even). Unlike
/// `round_ties_even` it needs no SSE4.1 (no libm call per element on baseline x86-64).
#[inline(always)]
pub fn round_even(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC) - MAGIC
}

mod sealed {
    pub trait OneByte {}
    impl OneByte for u8 {}
    impl OneByte for i8 {}
}

/// An 8-bit output type: u8 or i8.
pub trait Byte: sealed::OneByte + Copy + Send + Sync + 'static {
    /// From a value in the type's range.
    fn from_i32(v: i32) -> Self;

    /// 16-bit values of the type's range, in two vectors, as bytes with the type's saturation
    /// (`_mm256_packus_epi16` or `_mm256_packs_epi16`).
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[cfg(target_arch = "x86_64")]
    unsafe fn pack(a: __m256i, b: __m256i) -> __m256i;
}
impl Byte for u8 {
    fn from_i32(v: i32) -> u8 {
        v as u8
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn pack(a: __m256i, b: __m256i) -> __m256i {
        _mm256_packus_epi16(a, b)
    }
}
impl Byte for i8 {
    fn from_i32(v: i32) -> i8 {
        v as i8
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn pack(a: __m256i, b: __m256i) -> __m256i {
        _mm256_packs_epi16(a, b)
    }
}

/// `out[r·M + j] = requantized(Σ_{ky,kx,c} (x[img][iy][ix][c] - zx) · w[(ky·kw + kx)·C + c][j])`
/// for every output position `r = (img·oh + oy)·ow + ox` (`iy = oy·sh + ky·dh - pt`, likewise
/// `ix`), split across `threads`.
///
/// # Panics
/// If the convolution does not [`applies`], `x` or `out` has the wrong size, or `rq` has fewer
/// than `M` channels.
pub fn qconv_nhwc<O: Byte>(
    threads: usize,
    p: &Conv2d,
    x: &[u8],
    zx: u8,
    w: &PackedB,
    rq: &Requantize<'_>,
    out: &mut [O],
) {
    assert!(applies(p, w), "qconv_nhwc of {p:?}");
    assert_eq!(x.len(), p.n * p.h * p.w * p.c, "qconv_nhwc input size");
    let rows = p.n * p.oh * p.ow;
    assert_eq!(out.len(), rows * p.m, "qconv_nhwc output size");
    assert!(
        rq.mult.len() >= p.m && rq.offset.len() >= p.m,
        "qconv_nhwc requantization"
    );
    if rows == 0 || p.m == 0 {
        return;
    }
    let runs = runs(p.c, p.kw, p.dw).expect("applies");
    let pad = vec![zx; runs.len];
    let out = SharedOut(out.as_mut_ptr());
    let (vnni, avx2) = (vnni(), crate::qavx2_available());
    #[cfg(target_arch = "x86_64")]
    let amx = amx::applies(w);
    #[cfg(not(target_arch = "x86_64"))]
    let amx = false;
    // Weights that fit in the core's L2 cache are read whole for each row tile, so that the
    // image streams past once; larger ones in blocks of NP panels, each over all the rows.
    let span = if w.data.len() <= L2_WEIGHTS {
        w.panels
    } else {
        NP
    };
    let blocks = w.panels.div_ceil(span);
    // Tasks: blocks of panels by runs of row tiles (AMX's 32 rows, or the VNNI kernel's), at
    // least two per thread.
    let tile_rows = if amx { 32 } else { MR };
    let row_tiles = rows.div_ceil(tile_rows);
    let row_tasks = (2 * threads).div_ceil(blocks).clamp(1, row_tiles);
    let tiles_per = row_tiles.div_ceil(row_tasks);
    let run = |t: usize| {
        let (block, rt) = (t / row_tasks, t % row_tasks);
        let task_rows = tiles_per * tile_rows;
        let rows = (rt * task_rows).min(rows)..((rt + 1) * task_rows).min(rows);
        let panels = block * span..((block + 1) * span).min(w.panels);
        let image = Image {
            p,
            x,
            pad: &pad,
            zx,
            runs,
        };
        if amx {
            // SAFETY: `amx::applies` holds; as below.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                amx::tiles(&image, w, rows, panels, rq, out)
            }
        } else if vnni {
            // SAFETY: the CPU has AVX-512F/BW/VNNI (`vnni`); the operands' sizes are asserted
            // above; tasks write disjoint (rows, panels) tiles of `out`.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                vnni_tiles(&image, w, rows, panels, rq, out)
            }
        } else if avx2 {
            // SAFETY: the CPU has AVX2; as above.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                avx2_tiles(&image, w, rows, panels, rq, out)
            }
        } else {
            portable_tiles(&image, w, rows, panels, rq, out)
        }
    };
    let tasks = blocks * row_tasks;
    if threads > 1 && tasks > 1 && rows * p.m * w.k >= crate::PAR_MIN_WORK {
        (0..tasks).into_par_iter().for_each(run);
    } else {
        (0..tasks).for_each(run);
    }
}

/// The input of one call: the geometry, the NHWC bytes, a run of zero points for the
/// padding, and how the reduction is read.
struct Image<'a> {
    p: &'a Conv2d,
    x: &'a [u8],
    pad: &'a [u8],
    zx: u8,
    runs: Runs,
}

impl Image<'_> {
    /// Where output row `r`'s window starts: the image's first byte, and the top-left tap's
    /// input row and column (negative over the padding).
    #[inline(always)]
    fn origin(&self, r: usize) -> (usize, isize, isize) {
        let p = self.p;
        let (img, pos) = (r / (p.oh * p.ow), r % (p.oh * p.ow));
        let (oy, ox) = (pos / p.ow, pos % p.ow);
        (
            img * p.h * p.w * p.c,
            (oy * p.sh) as isize - p.pt as isize,
            (ox * p.sw) as isize - p.pl as isize,
        )
    }

    /// The `C` bytes tap `(ky, kx)` of the window at `origin` reads.
    #[inline(always)]
    fn tap(&self, (base, y0, x0): (usize, isize, isize), ky: usize, kx: usize) -> &[u8] {
        let p = self.p;
        let (iy, ix) = (y0 + (ky * p.dh) as isize, x0 + (kx * p.dw) as isize);
        if iy < 0 || ix < 0 || iy >= p.h as isize || ix >= p.w as isize {
            return self.pad;
        }
        &self.x[base + (iy as usize * p.w + ix as usize) * p.c..][..p.c]
    }

    /// The run of bytes `(ky, kx)` of the window at `origin` reads: a tap's `C` bytes, or a
    /// whole kernel row's (`kx` = 0). A row that reaches over the padding (or past the end of
    /// `x`, with the bytes that round it up) is copied to `stage` with zero points.
    #[inline(always)]
    fn run<'s>(
        &'s self,
        origin: (usize, isize, isize),
        (ky, kx): (usize, usize),
        stage: &'s mut [u8; RUN_MAX],
    ) -> &'s [u8] {
        if self.p.c.is_multiple_of(4) {
            return self.tap(origin, ky, kx);
        }
        let (p, len) = (self.p, self.runs.len);
        let (base, y0, x0) = origin;
        let iy = y0 + (ky * p.dh) as isize;
        if iy < 0 || iy >= p.h as isize {
            return self.pad;
        }
        let row = base + iy as usize * p.w * p.c;
        if x0 >= 0 && x0 as usize + p.kw <= p.w {
            let start = row + x0 as usize * p.c;
            if start + len <= self.x.len() {
                return &self.x[start..start + len];
            }
        }
        stage[..len].fill(self.zx);
        for kx in 0..p.kw {
            let ix = x0 + kx as isize;
            if ix >= 0 && ix < p.w as isize {
                let from = row + ix as usize * p.c;
                stage[kx * p.c..][..p.c].copy_from_slice(&self.x[from..from + p.c]);
            }
        }
        &stage[..len]
    }
}

/// The portable kernel: rows `rows` by the columns of `panels`.
fn portable_tiles<O: Byte>(
    image: &Image<'_>,
    w: &PackedB,
    rows: std::ops::Range<usize>,
    panels: std::ops::Range<usize>,
    rq: &Requantize<'_>,
    out: SharedOut<O>,
) {
    let (p, kp, n) = (image.p, w.kp, w.n);
    let mut acc = [0i32; LANES];
    for panel in panels {
        let j0 = panel * LANES;
        let width = (n - j0).min(LANES);
        let bp = &w.data[panel * kp * LANES..(panel + 1) * kp * LANES];
        let mut stage = [0u8; RUN_MAX];
        for r in rows.clone() {
            let origin = image.origin(r);
            acc.fill(0);
            for ky in 0..p.kh {
                for kx in 0..image.runs.per_row {
                    let taps = image.run(origin, (ky, kx), &mut stage);
                    let k0 = (ky * image.runs.per_row + kx) * image.runs.len;
                    for (q, xs) in taps.chunks_exact(4).enumerate() {
                        let group = &bp[(k0 / 4 + q) * 4 * LANES..][..4 * LANES];
                        for (l, o) in acc.iter_mut().enumerate() {
                            let ws = &group[l * 4..l * 4 + 4];
                            let s = (0..4).fold(0i32, |s, i| s + xs[i] as i32 * ws[i] as i32);
                            *o = o.wrapping_add(s);
                        }
                    }
                }
            }
            let zx = image.zx as i32;
            // SAFETY: r < rows and j0 + width <= n: within the output; this task alone writes
            // this tile.
            let o = unsafe { out.row(r, n, j0, width) };
            for (l, (o, &v)) in o.iter_mut().zip(&acc[..width]).enumerate() {
                let sum = v.wrapping_sub(zx.wrapping_mul(w.sums[j0 + l]));
                *o = O::from_i32(rq.value(j0 + l, sum));
            }
        }
    }
}

/// The AVX2 kernel: rows `rows` by the columns of `panels`, a panel at a time, each by tiles
/// of rows, with the fast products where the weights allow them.
///
/// # Safety
/// The CPU has AVX2; the operands are as [`qconv_nhwc`] asserts; no one else writes these
/// tiles of `out`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn avx2_tiles<O: Byte>(
    image: &Image<'_>,
    w: &PackedB,
    rows: std::ops::Range<usize>,
    panels: std::ops::Range<usize>,
    rq: &Requantize<'_>,
    out: SharedOut<O>,
) {
    use crate::qavx2::{Narrow, Wide};
    // SAFETY: as this function's contract; Narrow only where w's pairs pass its bound.
    unsafe {
        if w.narrow {
            avx2_products::<Narrow, O>(image, w, rows, panels, rq, out)
        } else {
            avx2_products::<Wide, O>(image, w, rows, panels, rq, out)
        }
    }
}

/// The most rows of an AVX2 tile.
const AVX2_ROWS: usize = 4;

/// [`avx2_tiles`] by the products `K`.
///
/// # Safety
/// As [`avx2_tiles`]; `w` passes `K`'s bound.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn avx2_products<K: crate::qavx2::Products, O: Byte>(
    image: &Image<'_>,
    w: &PackedB,
    rows: std::ops::Range<usize>,
    panels: std::ops::Range<usize>,
    rq: &Requantize<'_>,
    out: SharedOut<O>,
) {
    // The runs of a tile's rows, worked out once for all the panels: two divisions a row for
    // the window (as much as the products of a small reduction), and an RGB stem's border rows
    // staged with zero points. `taps[i][r]`: run `i` (`ky·per_row + kx`) of row `r`.
    let per_row = image.runs.per_row;
    let count = image.p.kh * per_row;
    let staged = !image.p.c.is_multiple_of(4);
    let mut stage = vec![[0u8; RUN_MAX]; if staged { count * AVX2_ROWS } else { 1 }];
    let mut taps = vec![[std::ptr::null::<u8>(); AVX2_ROWS]; count];
    let mut r = rows.start;
    while r < rows.end {
        let mr = (rows.end - r).min(K::ROWS).min(AVX2_ROWS);
        let origins: [_; AVX2_ROWS] = std::array::from_fn(|i| image.origin(r + i.min(mr - 1)));
        for (i, run) in taps.iter_mut().enumerate() {
            for (row, (tap, &origin)) in run.iter_mut().zip(&origins).enumerate() {
                let s = if staged { i * AVX2_ROWS + row } else { 0 };
                *tap = image
                    .run(origin, (i / per_row, i % per_row), &mut stage[s])
                    .as_ptr();
            }
        }
        for panel in panels.clone() {
            let tile = (r, panel, taps.as_slice());
            // SAFETY: as this function's contract; rows r..r + mr are output rows, whose runs
            // (in the image, its padding or `stage`, untouched until the next tile) `taps`
            // holds.
            unsafe {
                match mr {
                    4 => avx2_tile::<K, 4, O>(image, w, tile, rq, out),
                    3 => avx2_tile::<K, 3, O>(image, w, tile, rq, out),
                    2 => avx2_tile::<K, 2, O>(image, w, tile, rq, out),
                    _ => avx2_tile::<K, 1, O>(image, w, tile, rq, out),
                }
            }
        }
        r += mr;
    }
}

/// `R` output rows from `r0` (`taps[i][r]` row `r`'s run `i`, `len` bytes each) by panel
/// `panel`, on AVX2.
///
/// # Safety
/// As [`avx2_products`], with rows `r0..r0 + R` output rows, `panel` within `w` and `taps`
/// pointing at their runs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn avx2_tile<K: crate::qavx2::Products, const R: usize, O: Byte>(
    image: &Image<'_>,
    w: &PackedB,
    (r0, panel, taps): (usize, usize, &[[*const u8; AVX2_ROWS]]),
    rq: &Requantize<'_>,
    out: SharedOut<O>,
) {
    use std::arch::x86_64::_mm256_setzero_si256;
    let (kp, n, j0) = (w.kp, w.n, panel * LANES);
    let width = (n - j0).min(LANES);
    // SAFETY: the panel starts within w.data (this function's contract).
    let bp = unsafe { w.data.as_ptr().add(panel * kp * LANES) };
    let groups = image.runs.len / 4;
    // SAFETY: the CPU has AVX2.
    let mut acc = unsafe { K::zeros::<R>() };
    for (i, run) in taps.iter().enumerate() {
        let rows: [*const u8; R] = std::array::from_fn(|r| run[r]);
        // SAFETY: each run is `len` bytes; blocks i·groups.. of the panel lie within it.
        acc = unsafe { K::products::<R>(acc, rows, bp.add(i * groups * 4 * LANES), groups) };
    }
    // SAFETY: rows r0..r0 + R are output rows, columns j0..j0 + width <= n: within the output,
    // written by this task alone; the CPU has AVX2.
    unsafe {
        let mut cols = [[_mm256_setzero_si256(); 2]; R];
        for (c, acc) in cols.iter_mut().zip(&acc) {
            *c = K::columns(acc);
        }
        avx2_requantize(cols, image.zx, w, rq, (out, r0, j0, width));
    }
}

/// Output row `r0 + r`'s `width` elements from column `j0` = the columns' sums in `cols[r]`
/// (columns `j0..j0 + 16`) requantized as [`Requantize::value`] works it, eight columns at a
/// time where the panel is whole. One call for the tile's rows: they share the panel's
/// constants.
///
/// # Safety
/// The CPU has AVX2; `j0` starts a panel of `w`, `width` is its columns below `w.n`, and rows
/// `r0..r0 + R` are output rows that no one else writes meanwhile.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn avx2_requantize<O: Byte, const R: usize>(
    cols: [[std::arch::x86_64::__m256i; 2]; R],
    zx: u8,
    w: &PackedB,
    rq: &Requantize<'_>,
    (out, r0, j0, width): (SharedOut<O>, usize, usize, usize),
) {
    use std::arch::x86_64::*;
    let zx = zx as i32;
    // SAFETY: as this function's contract.
    let row = |r: usize| unsafe { out.row(r0 + r, w.n, j0, width) };
    if width < LANES {
        for (r, cols) in cols.iter().enumerate() {
            let out = row(r);
            let mut sums = [0i32; LANES];
            // SAFETY: sums holds 16 i32, two vectors of 8.
            unsafe {
                _mm256_storeu_si256(sums.as_mut_ptr().cast(), cols[0]);
                _mm256_storeu_si256(sums.as_mut_ptr().add(8).cast(), cols[1]);
            }
            for (l, (o, &v)) in out.iter_mut().zip(&sums).enumerate() {
                let sum = v.wrapping_sub(zx.wrapping_mul(w.sums[j0 + l]));
                *o = O::from_i32(rq.value(j0 + l, sum));
            }
        }
        return;
    }
    let (lo, hi) = (
        _mm256_set1_ps(rq.lo - rq.zero),
        _mm256_set1_ps(rq.hi - rq.zero),
    );
    // `rq.zero` is a whole number within the type's range.
    let zero = _mm256_set1_epi32(rq.zero as i32);
    // The panel's constants, columns 8h..8h + 8 in half h: zx·Σw, the multiplier, the offset.
    let consts: [[__m256i; 3]; 2] = std::array::from_fn(|h| {
        let j = j0 + 8 * h;
        // SAFETY: columns j..j + 8 lie within the panel (w.sums holds whole panels) and below
        // w.n <= mult.len(), offset.len() (asserted in `qconv_nhwc`): the panel is whole.
        unsafe {
            let sums = _mm256_loadu_si256(w.sums.as_ptr().add(j).cast());
            [
                _mm256_mullo_epi32(_mm256_set1_epi32(zx), sums),
                _mm256_castps_si256(_mm256_loadu_ps(rq.mult.as_ptr().add(j))),
                _mm256_castps_si256(_mm256_loadu_ps(rq.offset.as_ptr().add(j))),
            ]
        }
    });
    // Row r's 16 values as 16-bit integers, in the order `_mm256_packs_epi32` leaves them.
    let words = |r: usize| {
        let v: [__m256i; 2] = std::array::from_fn(|h| {
            let [zx_sums, mult, offset] = consts[h];
            let sum = _mm256_sub_epi32(cols[r][h], zx_sums);
            let v = _mm256_mul_ps(_mm256_cvtepi32_ps(sum), _mm256_castsi256_ps(mult));
            let v = _mm256_add_ps(v, _mm256_castsi256_ps(offset));
            // max/min return their second operand for NaN: the bound.
            let v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
            // Rounds to nearest, ties to even (the default rounding mode); whole numbers add
            // exactly.
            _mm256_add_epi32(_mm256_cvtps_epi32(v), zero)
        });
        _mm256_packs_epi32(v[0], v[1])
    };
    // Packing (within 128-bit lanes) leaves 4-byte groups of columns 0-3 and 8-11 of row a,
    // the same of row b, then columns 4-7 and 12-15 of each: this permutation puts row a's 16
    // in the low half, row b's in the high half.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for r in (0..R).step_by(2) {
        let (a, b) = (words(r), words((r + 1).min(R - 1)));
        // SAFETY: the CPU has AVX2.
        let bytes = _mm256_permutevar8x32_epi32(unsafe { O::pack(a, b) }, order);
        // SAFETY: each row holds 16 one-byte elements (a whole panel).
        unsafe {
            _mm_storeu_si128(row(r).as_mut_ptr().cast(), _mm256_castsi256_si128(bytes));
            if r + 1 < R {
                let high = _mm256_extracti128_si256::<1>(bytes);
                _mm_storeu_si128(row(r + 1).as_mut_ptr().cast(), high);
            }
        }
    }
}

/// The VNNI kernel: rows `rows` by the columns of `panels`, a tile of rows at a time by all
/// of the panels.
///
/// # Safety
/// The CPU has AVX-512F, BW and VNNI; the operands are as [`qconv_nhwc_map`] asserts; no one
/// else writes these tiles of `out`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn vnni_tiles<O: Byte>(
    image: &Image<'_>,
    w: &PackedB,
    rows: std::ops::Range<usize>,
    panels: std::ops::Range<usize>,
    rq: &Requantize<'_>,
    out: SharedOut<O>,
) {
    macro_rules! tiles {
        ($r0:expr, $mr:expr, $p0:expr, $np:expr, $($r:literal)*) => {
            match ($mr, $np) {
                $(
                    ($r, 4) => tile::<$r, 4, O>(image, w, $r0, $p0, rq, out),
                    ($r, 3) => tile::<$r, 3, O>(image, w, $r0, $p0, rq, out),
                    ($r, 2) => tile::<$r, 2, O>(image, w, $r0, $p0, rq, out),
                    ($r, _) => tile::<$r, 1, O>(image, w, $r0, $p0, rq, out),
                )*
                _ => unreachable!("tiles have 1 to {MR} rows"),
            }
        };
    }
    let mut r = rows.start;
    while r < rows.end {
        let mr = (rows.end - r).min(MR);
        for p0 in panels.clone().step_by(NP) {
            let np = (panels.end - p0).min(NP);
            // SAFETY: as this function's contract; rows r..r + mr are output rows, panels
            // p0..p0 + np are within w.
            unsafe { tiles!(r, mr, p0, np, 6 5 4 3 2 1) }
        }
        r += mr;
    }
}

/// `R` output rows from `r0` by the `P` panels from `p0`.
///
/// # Safety
/// As [`vnni_tiles`], with rows `r0..r0 + R` output rows and panels `p0..p0 + P` within `w`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn tile<const R: usize, const P: usize, O: Byte>(
    image: &Image<'_>,
    w: &PackedB,
    r0: usize,
    p0: usize,
    rq: &Requantize<'_>,
    out: SharedOut<O>,
) {
    use std::arch::x86_64::*;
    let (p, kp) = (image.p, w.kp);
    let origins: [_; R] = std::array::from_fn(|r| image.origin(r0 + r));
    let mut acc = [[_mm512_setzero_si512(); P]; R];
    let mut stage = [[0u8; RUN_MAX]; R];
    // SAFETY: panel p0 starts within w.data (this function's contract).
    let bp = unsafe { w.data.as_ptr().add(p0 * kp * LANES) };
    let Runs { per_row, len } = image.runs;
    for ky in 0..p.kh {
        for kx in 0..per_row {
            let taps: [*const u8; R] =
                std::array::from_fn(|r| image.run(origins[r], (ky, kx), &mut stage[r]).as_ptr());
            let g0 = (ky * per_row + kx) * len / 4;
            for q in 0..len / 4 {
                let mut bv = [_mm512_setzero_si512(); P];
                for (pp, v) in bv.iter_mut().enumerate() {
                    // SAFETY: group g0 + q < kp / 4 of panels p0..p0 + P lies within w.data
                    // ([panel][kp / 4][64 bytes]).
                    *v = unsafe {
                        _mm512_loadu_si512(bp.add((pp * kp + (g0 + q) * 4) * LANES).cast())
                    };
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: each run is `len` bytes (of the image, the padding or the stage),
                    // 4q + 4 <= len.
                    let xv = unsafe { taps[r].add(4 * q).cast::<i32>().read_unaligned() };
                    let av = _mm512_set1_epi32(xv);
                    for (acc, &bv) in acc.iter_mut().zip(&bv) {
                        *acc = _mm512_dpbusd_epi32(*acc, av, bv);
                    }
                }
            }
        }
    }
    for q in 0..P {
        // SAFETY: panel p0 + q lies within w (this function's contract).
        let panel = unsafe { Requantize16::new(rq, w, image.zx, p0 + q) };
        for (r, acc) in acc.iter().enumerate() {
            // SAFETY: row r0 + r is an output row (this function's contract), written by
            // this task alone.
            unsafe { panel.store(acc[q], out, r0 + r) };
        }
    }
}

/// The requantization of one panel's 16 channels at a time, as [`Requantize::value`] works it.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Requantize16 {
    /// `zx · Σw` per channel.
    correction: std::arch::x86_64::__m512i,
    mult: std::arch::x86_64::__m512,
    offset: std::arch::x86_64::__m512,
    zero: std::arch::x86_64::__m512,
    lo: std::arch::x86_64::__m512,
    hi: std::arch::x86_64::__m512,
    /// The channels of the panel that are output channels.
    lanes: std::arch::x86_64::__mmask16,
    j0: usize,
    n: usize,
}

#[cfg(target_arch = "x86_64")]
impl Requantize16 {
    /// Panel `panel`'s channels of `w` and `rq`, of an input with zero point `zx`.
    ///
    /// # Safety
    /// The CPU has AVX-512F; `panel < w.panels`; `rq` holds `w.n` channels.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn new(rq: &Requantize<'_>, w: &PackedB, zx: u8, panel: usize) -> Requantize16 {
        use std::arch::x86_64::*;
        let (j0, n) = (panel * LANES, w.n);
        let width = (n - j0).min(LANES);
        let lanes: __mmask16 = if width == LANES { !0 } else { (1 << width) - 1 };
        // SAFETY: w.sums holds panels × 16 entries; mult and offset hold n, of which the mask
        // reads j0..j0 + width.
        let (sums, mult, offset) = unsafe {
            (
                _mm512_loadu_si512(w.sums.as_ptr().add(j0).cast()),
                _mm512_maskz_loadu_ps(lanes, rq.mult.as_ptr().add(j0)),
                _mm512_maskz_loadu_ps(lanes, rq.offset.as_ptr().add(j0)),
            )
        };
        Requantize16 {
            correction: _mm512_mullo_epi32(_mm512_set1_epi32(zx as i32), sums),
            mult,
            offset,
            zero: _mm512_set1_ps(rq.zero),
            lo: _mm512_set1_ps(rq.lo - rq.zero),
            hi: _mm512_set1_ps(rq.hi - rq.zero),
            lanes,
            j0,
            n,
        }
    }

    /// Output row `row`'s channels of the panel from their sums `acc`.
    ///
    /// # Safety
    /// The CPU has AVX-512F and BW; `row` is a row of `out` (`n` channels a row) that no one
    /// else writes meanwhile.
    #[target_feature(enable = "avx512f,avx512bw")]
    #[inline]
    unsafe fn store<O: Byte>(
        &self,
        acc: std::arch::x86_64::__m512i,
        out: SharedOut<O>,
        row: usize,
    ) {
        use std::arch::x86_64::*;
        let v = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc, self.correction));
        let v = _mm512_add_ps(_mm512_mul_ps(v, self.mult), self.offset);
        // max/min return their second operand for NaN: the bound.
        let v = _mm512_min_ps(_mm512_max_ps(v, self.lo), self.hi);
        let v = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
        let v = _mm512_cvttps_epi32(_mm512_add_ps(v, self.zero));
        // SAFETY: the contract; the mask writes the panel's output channels; O is one byte.
        unsafe {
            let width = (self.n - self.j0).min(LANES);
            let o = out.row(row, self.n, self.j0, width).as_mut_ptr();
            _mm512_mask_cvtepi32_storeu_epi8(o.cast(), self.lanes, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_bytes as bytes;

    /// The convolution tap by tap, NHWC in and out, of ONNX's `[M][C][kh][kw]` weights.
    fn reference(p: &Conv2d, x: &[u8], zx: u8, w: &[i8]) -> Vec<i32> {
        let taps = p.kh * p.kw;
        let mut out = vec![0i32; p.n * p.oh * p.ow * p.m];
        for img in 0..p.n {
            for oy in 0..p.oh {
                for ox in 0..p.ow {
                    let r = (img * p.oh + oy) * p.ow + ox;
                    for j in 0..p.m {
                        let mut s = 0i32;
                        for t in 0..taps {
                            let (ky, kx) = (t / p.kw, t % p.kw);
                            let iy = (oy * p.sh + ky * p.dh) as isize - p.pt as isize;
                            let ix = (ox * p.sw + kx * p.dw) as isize - p.pl as isize;
                            for c in 0..p.c {
                                let v =
                                    if iy < 0 || ix < 0 || iy >= p.h as isize || ix >= p.w as isize
                                    {
                                        zx
                                    } else {
                                        x[((img * p.h + iy as usize) * p.w + ix as usize) * p.c + c]
                                    };
                                let wv = w[(j * p.c + c) * taps + t];
                                s += (v as i32 - zx as i32) * wv as i32;
                            }
                        }
                        out[r * p.m + j] = s;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn matches_the_tap_by_tap_convolution() {
        // (n, c, h, w, m, k, stride, dilation, pad top-left, bottom-right)
        let cases = [
            (2, 8, 5, 6, 20, 3, 1, 1, 1, 1),
            (1, 4, 7, 7, 70, 3, 2, 1, 1, 0),
            (3, 12, 6, 5, 16, 1, 1, 1, 0, 0),
            (1, 16, 9, 9, 33, 3, 1, 2, 2, 2),
            (2, 4, 4, 4, 5, 2, 2, 1, 0, 1),
            (1, 64, 3, 3, 64, 3, 1, 1, 1, 1),
            // Weights over L2_WEIGHTS: read in blocks of panels.
            (1, 128, 4, 4, 260, 3, 1, 1, 1, 1),
            // Fewer channels than a group: whole kernel rows, an RGB stem's among them.
            (2, 3, 11, 10, 64, 7, 2, 1, 3, 3),
            (1, 3, 9, 9, 20, 3, 1, 1, 1, 1),
            (1, 1, 6, 7, 5, 5, 1, 1, 2, 2),
            (1, 5, 6, 6, 17, 3, 2, 1, 1, 0),
            // The last windows end at the image's last byte, their rows rounded up past it.
            (1, 3, 9, 9, 8, 3, 1, 1, 0, 0),
            // Whole groups of 64 channels (AMX's tiles): rows shorter than a tile, rows with
            // windows inside the image at stride 1 and 2 and dilated, an odd last panel, a
            // pointwise convolution read straight across rows and images, and channels that
            // are not whole groups.
            (2, 64, 7, 9, 40, 3, 1, 1, 1, 1),
            (1, 64, 20, 21, 48, 3, 1, 1, 1, 1),
            (1, 128, 6, 40, 33, 3, 2, 1, 1, 1),
            (1, 64, 18, 18, 20, 3, 1, 2, 2, 2),
            (2, 64, 9, 9, 64, 1, 1, 1, 0, 0),
            (3, 128, 5, 34, 16, 1, 2, 1, 0, 0),
            (1, 32, 8, 8, 24, 2, 1, 1, 0, 1),
        ];
        for case in cases {
            let p = crate::test_conv(case);
            let (n, c, h, w, m, k) = (p.n, p.c, p.h, p.w, p.m, p.kh);
            let x = bytes(n * h * w * c, 3);
            // Full-range weights, and 7-bit ones (AVX2's narrow products).
            let full: Vec<i8> = bytes(k * k * c * m, 7).iter().map(|&b| b as i8).collect();
            let seven: Vec<i8> = full.iter().map(|&v| v >> 1).collect();
            for (wt, narrow) in [(full, false), (seven, true)] {
                let packed = pack_filter(m, c, (k, k), p.dw, &wt).expect("a packing");
                assert!(applies(&p, &packed), "{p:?}");
                assert_eq!(packed.narrow, narrow, "{p:?}");
                // Scales that spread the sums over the whole range and past it, and a NaN offset.
                let scale = 0.5 / (k * k * c) as f32;
                let mult: Vec<f32> = (0..m).map(|j| scale * (1 + j % 5) as f32).collect();
                let mut offset: Vec<f32> = (0..m).map(|j| j as f32 * 0.75 - 20.0).collect();
                offset[m / 2] = f32::NAN;
                let ranges = [
                    (0u8, 0.0, 0.0, 255.0),
                    (131, 3.0, 3.0, 255.0),
                    (255, -5.0, -128.0, 127.0),
                ];
                for (zx, zero, lo, hi) in ranges {
                    let rq = Requantize {
                        mult: &mult,
                        offset: &offset,
                        zero,
                        lo,
                        hi,
                    };
                    let sums = reference(&p, &x, zx, &wt);
                    let want: Vec<i32> = (sums.iter().enumerate())
                        .map(|(i, &v)| rq.value(i % m, v))
                        .collect();
                    assert!(want.iter().any(|&v| v != want[0]), "outputs that vary");
                    // Outputs of the type whose range this is.
                    let paths = match lo < 0.0 {
                        true => every_path::<i8>(&p, &x, zx, &packed, &rq),
                        false => every_path::<u8>(&p, &x, zx, &packed, &rq),
                    };
                    for (path, got) in paths {
                        assert_eq!(got, want, "{path}: {p:?} zx {zx}");
                    }
                }
            }
        }
    }

    /// The outputs of `qconv_nhwc` on 1 and 3 threads, of the portable tiles and of each vector
    /// kernel the CPU runs (AVX2, VNNI, AMX), each named.
    fn every_path<O: Byte + Into<i32>>(
        p: &Conv2d,
        x: &[u8],
        zx: u8,
        packed: &PackedB,
        rq: &Requantize<'_>,
    ) -> Vec<(String, Vec<i32>)> {
        let len = p.n * p.oh * p.ow * p.m;
        let fresh = || vec![O::from_i32(7); len];
        let ints = |v: Vec<O>| v.into_iter().map(Into::into).collect::<Vec<i32>>();
        let mut paths = Vec::new();
        for threads in [1, 3] {
            let mut got = fresh();
            qconv_nhwc(threads, p, x, zx, packed, rq, &mut got);
            paths.push((format!("{threads} threads"), ints(got)));
        }
        let rows = 0..p.n * p.oh * p.ow;
        let runs = runs(p.c, p.kw, p.dw).expect("runs");
        let pad = vec![zx; runs.len];
        let image = Image {
            p,
            x,
            pad: &pad,
            zx,
            runs,
        };
        let panels = 0..packed.panels;
        let mut got = fresh();
        for block in panels.clone().step_by(NP) {
            let ps = block..(block + NP).min(packed.panels);
            let out = SharedOut(got.as_mut_ptr());
            portable_tiles(&image, packed, rows.clone(), ps, rq, out);
        }
        paths.push(("portable".to_string(), ints(got)));
        #[cfg(target_arch = "x86_64")]
        if crate::qavx2_available() {
            let mut got = fresh();
            let out = SharedOut(got.as_mut_ptr());
            // SAFETY: the CPU has AVX2; the operands are as qconv_nhwc asserts.
            unsafe { avx2_tiles(&image, packed, rows.clone(), panels.clone(), rq, out) };
            paths.push(("AVX2".to_string(), ints(got)));
        }
        #[cfg(target_arch = "x86_64")]
        if vnni() {
            let mut got = fresh();
            let out = SharedOut(got.as_mut_ptr());
            // SAFETY: the CPU has AVX-512F/BW/VNNI; as above.
            unsafe { vnni_tiles(&image, packed, rows.clone(), panels.clone(), rq, out) };
            paths.push(("VNNI".to_string(), ints(got)));
        }
        #[cfg(target_arch = "x86_64")]
        if amx::applies(packed) {
            let mut got = fresh();
            let out = SharedOut(got.as_mut_ptr());
            // SAFETY: `amx::applies` holds; as above.
            unsafe { amx::tiles(&image, packed, rows, panels, rq, out) };
            paths.push(("AMX".to_string(), ints(got)));
        }
        paths
    }

    #[test]
    fn refuses_what_it_cannot_compute() {
        let p = Conv2d::pointwise(1, 3, 8, 4, 4);
        let w = pack_filter(8, 3, (1, 1), 1, &[1i8; 24]).expect("a row of 3 bytes, rounded to 4");
        assert!(applies(&p, &w), "3 channels: one run of a kernel row");
        let unrounded = PackedB::new(3, 8, &[1i8; 24], (8, 1), &[0i8]);
        assert!(
            !applies(&p, &unrounded),
            "a reduction not rounded up to whole groups"
        );
        let wide = Conv2d {
            kh: 3,
            kw: 3,
            dh: 2,
            dw: 2,
            oh: 0,
            ow: 0,
            ..p
        };
        assert!(
            !applies(&wide, &PackedB::new(27, 8, &[1i8; 216], (8, 1), &[0i8])),
            "3 channels, dilated taps"
        );
        assert!(pack_filter(8, 3, (3, 3), 2, &[1i8; 216]).is_none());
        assert!(
            pack_filter(8, 3, (1, 30), 1, &[1i8; 720]).is_none(),
            "a row over {RUN_MAX} bytes"
        );
        assert!(!applies(&Conv2d { groups: 3, ..p }, &w), "groups");
        let p4 = Conv2d { c: 4, ..p };
        assert!(applies(
            &p4,
            &PackedB::new(4, 8, &[1i8; 32], (8, 1), &[0i8])
        ));
        let shifted = PackedB::new(4, 8, &[1i8; 32], (8, 1), &[3i8]);
        assert!(!applies(&p4, &shifted), "a weight zero point");
    }
}
