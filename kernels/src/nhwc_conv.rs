//! 2-D convolution of NHWC f32 activations on AVX-512 or AVX2 CPUs, without im2col.
//!
//! In NHWC the `C` channels of one input pixel are contiguous, so the reduction over one kernel
//! tap is a run of floats of the image itself. A register tile holds up to 6 output positions
//! by up to 64 output channels (4 vectors of 16): per reduction step it broadcasts one input
//! value per position straight from the image (a tap over the padding reads zeros), loads 4
//! vectors of weights and makes 24 fused multiply-adds. Every lane does useful work whatever the
//! image size, and nothing is packed per call: the weights are packed once ([`NhwcFilter`]) in
//! the order the tile reads them, `[16-channel panel][k][16]` with the reduction in tap-major
//! order, `k = (ky·kw + kx)·C + c`. Where every window of a tile lies inside the image across,
//! a whole row of taps is one run of `kw·C` floats of the image and of the weights, so a
//! 3-channel stem reads 21 values per tap row, not 3 per tap. The output comes out NHWC,
//! `[positions][M]`, with the bias, a residual (NHWC, the output's shape) and the activation
//! applied on the way out.
//!
//! On AVX2 (16 vector registers of 8 lanes) a tile is up to 6 positions by one panel, its 16
//! channels as two vectors, on the same packed weights.
//!
//! The reduction runs in blocks whose weights fit in the core's L2 cache beside the tile's
//! input; every output element is summed in the same order (k ascending) whatever the thread
//! budget, the batch or the tile.

use crate::activation::{Finish, bias_act};
use crate::conv::{Conv2d, Epilogue};
use crate::gemm::SharedOut;
use rayon::prelude::*;

const LANES: usize = 16;
/// Output positions per register tile of four panels; tiles of fewer panels hold more
/// ([`rows_for`]), up to `MR_MAX`.
const MR: usize = 6;
const MR_MAX: usize = 12;
/// 16-channel panels per register tile.
const NP: usize = 4;
/// Bytes of packed weights one block (of panels by reduction steps) holds in the core's L2
/// cache while every tile of positions of a task streams past it.
const BLOCK_WEIGHTS: usize = 512 << 10;

/// Convolution weights packed for [`conv_nhwc`]: `[m.div_ceil(16)][kh·kw·c][16]`, zero past the
/// last output channel.
pub struct NhwcFilter {
    m: usize,
    c: usize,
    kh: usize,
    kw: usize,
    data: Vec<f32>,
    /// The Winograd transform of a 3x3 filter for a convolution of stride 1
    /// ([`NhwcFilter::with_winograd`]).
    winograd: Option<Box<crate::winograd::Filter>>,
}

/// Equal weights (the transform follows from them).
impl PartialEq for NhwcFilter {
    fn eq(&self, other: &NhwcFilter) -> bool {
        (self.m, self.c, self.kh, self.kw, &self.data)
            == (other.m, other.c, other.kh, other.kw, &other.data)
    }
}

impl std::fmt::Debug for NhwcFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NhwcFilter(m {}, c {}, {}x{})",
            self.m, self.c, self.kh, self.kw
        )
    }
}

impl NhwcFilter {
    /// Packs `weight` (`[m, c, kh, kw]`, ONNX's order).
    pub fn new(weight: &[f32], m: usize, c: usize, kh: usize, kw: usize) -> NhwcFilter {
        let (taps, k) = (kh * kw, kh * kw * c);
        assert_eq!(weight.len(), m * k, "filter size");
        let mut data = vec![0.0; m.div_ceil(LANES) * k * LANES];
        for (j, filter) in weight.chunks_exact(k.max(1)).enumerate() {
            let panel = &mut data[(j / LANES) * k * LANES..];
            for (i, &w) in filter.iter().enumerate() {
                let (ci, t) = (i / taps, i % taps);
                panel[(t * c + ci) * LANES + j % LANES] = w;
            }
        }
        NhwcFilter {
            m,
            c,
            kh,
            kw,
            data,
            winograd: None,
        }
    }

    /// Packs the matrix `b` (`[k, n]`, row-major) as the weights of the 1x1 convolution that
    /// multiplies rows of `k` values by it (`m = n`, `c = k`): see [`matmul_packed`].
    pub fn of_matrix(b: &[f32], k: usize, n: usize) -> NhwcFilter {
        assert_eq!(b.len(), k * n, "matrix size");
        let mut data = vec![0.0; n.div_ceil(LANES) * k * LANES];
        if n > 0 {
            for (kk, row) in b.chunks_exact(n).enumerate() {
                for (j, &w) in row.iter().enumerate() {
                    data[((j / LANES) * k + kk) * LANES + j % LANES] = w;
                }
            }
        }
        NhwcFilter {
            m: n,
            c: k,
            kh: 1,
            kw: 1,
            data,
            winograd: None,
        }
    }

    pub fn bytes(&self) -> usize {
        self.data.len() * 4 + self.winograd.as_ref().map_or(0, |w| w.bytes())
    }

    /// [`NhwcFilter::new`] for a convolution of stride 1 and dilation 1, with the Winograd
    /// transform of a 3x3 filter that [`winograd`](crate::winograd) takes: the convolution then
    /// runs on it wherever it has enough positions. The transform holds 16 values for every 9
    /// weights, counted in [`NhwcFilter::bytes`].
    pub fn with_winograd(weight: &[f32], m: usize, c: usize, kh: usize, kw: usize) -> NhwcFilter {
        let mut f = NhwcFilter::new(weight, m, c, kh, kw);
        if (kh, kw) == (3, 3) && crate::winograd::Filter::fits(m, c) {
            f.winograd = Some(Box::new(crate::winograd::Filter::new(weight, m, c)));
        }
        f
    }

    /// The weights' shape as ONNX gives it, `[m, c, kh, kw]`.
    pub fn shape(&self) -> [usize; 4] {
        [self.m, self.c, self.kh, self.kw]
    }

    /// Whether these are the weights of convolution `p` (`c` input channels per group).
    pub fn fits(&self, p: &Conv2d) -> bool {
        p.groups > 0 && (p.m, p.c / p.groups, p.kh, p.kw) == (self.m, self.c, self.kh, self.kw)
    }

    /// Panel `q`'s weights, `[k][16]`.
    pub(crate) fn panel(&self, q: usize) -> &[f32] {
        &self.data[q * self.k() * LANES..][..self.k() * LANES]
    }

    fn panels(&self) -> usize {
        self.m.div_ceil(LANES)
    }

    fn k(&self) -> usize {
        self.kh * self.kw * self.c
    }
}

/// Whether this CPU runs [`conv_nhwc`].
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::avx512f() || crate::activation::avx2_fma()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The checks an NHWC kernel (`what`) makes of a call: the CPU runs its AVX-512 build
/// (`avx512`) or its AVX2 one, and `x`, the epilogue's operands and `out` have `p`'s sizes.
///
/// # Panics
/// If one of them fails.
pub(crate) fn check_operands(
    what: &str,
    avx512: bool,
    p: &Conv2d,
    x: &[f32],
    epi: Epilogue<'_>,
    out: &[f32],
) {
    #[cfg(target_arch = "x86_64")]
    assert!(
        crate::avx512f() || !avx512 && crate::activation::avx2_fma(),
        "{what} on this CPU"
    );
    assert_eq!(x.len(), p.n * p.h * p.w * p.c, "{what} input size");
    assert_eq!(out.len(), p.n * p.oh * p.ow * p.m, "{what} output size");
    if let Some(r) = epi.residual {
        assert_eq!(r.len(), out.len(), "{what} residual size");
    }
    if let Some(b) = epi.bias {
        assert_eq!(b.len(), p.m, "{what} bias size");
    }
}

/// Whether [`conv_nhwc`] computes convolution `p` (ungrouped, with at least one channel).
pub fn applies(p: &Conv2d) -> bool {
    p.groups == 1 && p.c > 0 && p.m > 0
}

/// `out[r·M + j] = act(bias[j] + residual[r·M + j] + Σ_{ky,kx,c} x[img][iy][ix][c] ·
/// w[j][c][ky][kx])` for every output position `r = (img·oh + oy)·ow + ox` (`iy = oy·sh + ky·dh -
/// pt`, likewise `ix`; zero outside the image), split across `threads`.
///
/// # Panics
/// If the CPU lacks AVX-512F and AVX2 ([`available`]), the convolution does not [`applies`], `f`
/// is not its filter, or `x`, the residual or `out` has the wrong size.
pub fn conv_nhwc(
    threads: usize,
    p: &Conv2d,
    x: &[f32],
    f: &NhwcFilter,
    epi: Epilogue<'_>,
    out: &mut [f32],
) {
    assert!(available(), "conv_nhwc needs AVX-512F or AVX2");
    conv_on(crate::avx512f(), threads, p, x, f, epi, out);
}

/// `out[r·n + j] = act(bias[j] + residual[r·n + j] + Σ_kk a[r·k + kk] · b[kk][j])` for the
/// `rows` rows of `a` and the matrix `f` packs ([`NhwcFilter::of_matrix`]): a 1x1 convolution
/// over `rows` positions. The weights are packed once, and each output is summed in the same
/// order whatever `rows` and `threads`.
///
/// # Panics
/// As [`conv_nhwc`]: without AVX-512F or AVX2, or with operands of the wrong size.
pub fn matmul_packed(
    threads: usize,
    a: &[f32],
    rows: usize,
    f: &NhwcFilter,
    epi: Epilogue<'_>,
    out: &mut [f32],
) {
    assert!(f.kh == 1 && f.kw == 1, "{f:?} is not a matrix");
    let p = Conv2d::pointwise(1, f.c, f.m, rows, 1);
    conv_nhwc(threads, &p, a, f, epi, out);
}

/// [`conv_nhwc`] on the AVX-512 kernel, or on the AVX2 one.
fn conv_on(
    avx512: bool,
    threads: usize,
    p: &Conv2d,
    x: &[f32],
    f: &NhwcFilter,
    epi: Epilogue<'_>,
    out: &mut [f32],
) {
    assert!(applies(p) && f.fits(p), "conv_nhwc of {p:?} with {f:?}");
    check_operands("conv_nhwc", avx512, p, x, epi, out);
    #[cfg(target_arch = "x86_64")]
    if let Some(w) = f
        .winograd
        .as_deref()
        .filter(|_| crate::winograd::applies(p))
    {
        // SAFETY: the CPU has AVX-512F, or AVX2 and FMA where !avx512 (checked above); the
        // operands were checked above; `w` is `f`'s.
        unsafe { crate::winograd::conv(avx512, threads, p, x, w, epi, out) };
        return;
    }
    let rows = p.n * p.oh * p.ow;
    if rows == 0 {
        return;
    }
    // Zeros for a tap, or a row of taps, over the padding.
    let zeros = vec![0.0f32; p.kw * p.c];
    let image = Image { p, x, pad: &zeros };
    let k = f.k();
    // Blocks of weights that fit in L2, over which each task's positions stream: the whole
    // reduction for as many panels as fit (each output is then summed and stored once), split
    // only where one register tile's panels alone would not fit.
    let panel_bytes = LANES * 4;
    let kc = (BLOCK_WEIGHTS / (NP * panel_bytes)).min(k);
    let nb = (BLOCK_WEIGHTS / (kc * panel_bytes) / NP * NP).max(NP);
    let row_tiles = rows.div_ceil(MR);
    let groups = f.panels().div_ceil(NP);
    // Tasks over row tiles by groups of NP panels, as even as they divide (`split::grid`). A
    // row task then takes its share of the positions, not of whole tiles of MR, and its tiles
    // are as even as its rows allow ([`tiles`]): two tasks of 49 positions are 25 and 24, not
    // 30 and 19.
    let threads = match rows * p.m * k >= crate::PAR_MIN_WORK {
        true => threads,
        false => 1,
    };
    let (row_tasks, panel_tasks) =
        crate::split::grid(threads, row_tiles, groups, 4 * x.len(), 4 * f.data.len());
    let panels_per = groups.div_ceil(panel_tasks) * NP;
    let dst = SharedOut(out.as_mut_ptr());
    let run = |t: usize| {
        let (rt, pt) = (t / panel_tasks, t % panel_tasks);
        let rows = rows * rt / row_tasks..rows * (rt + 1) / row_tasks;
        let mine = (pt * panels_per).min(f.panels())..((pt + 1) * panels_per).min(f.panels());
        for p0 in mine.clone().step_by(nb) {
            let panels = p0..(p0 + nb).min(mine.end);
            for k0 in (0..k).step_by(kc) {
                let ks = k0..(k0 + kc).min(k);
                // SAFETY: the CPU has AVX-512F, or else AVX2 and FMA (asserted); the sizes
                // were checked above; tasks write disjoint rows or channels of `out`.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    match avx512 {
                        true => tiles(&image, f, rows.clone(), panels.clone(), ks, epi, dst),
                        false => tiles_avx2(&image, f, rows.clone(), panels.clone(), ks, epi, dst),
                    }
                }
            }
        }
    };
    let tasks = row_tasks * panel_tasks;
    if tasks > 1 {
        (0..tasks).into_par_iter().for_each(run);
    } else {
        run(0);
    }
}

/// `out = a · f` for `rows` rows of `a` (`f.c` wide, row-major) on this thread: the register
/// tiles alone (AVX-512's, or else AVX2's), for kernels that make many small products of
/// weights that fit in L2.
///
/// # Safety
/// The CPU has AVX-512F, or AVX2 and FMA where `!avx512`; `f` is a matrix (1x1); `a` holds
/// `rows · f.c` floats and `out` `rows · f.m`.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn product_rows(
    avx512: bool,
    a: &[f32],
    rows: usize,
    f: &NhwcFilter,
    out: &mut [f32],
) {
    debug_assert!(a.len() >= rows * f.c && out.len() >= rows * f.m && f.k() == f.c);
    let p = Conv2d::pointwise(1, f.c, f.m, rows, 1);
    let image = Image {
        p: &p,
        x: a,
        pad: &[],
    };
    let none = Epilogue {
        bias: None,
        residual: None,
        act: None,
    };
    let dst = SharedOut(out.as_mut_ptr());
    let (rows, panels, ks) = (0..rows, 0..f.panels(), 0..f.k());
    // SAFETY: this function's contract.
    unsafe {
        match avx512 {
            true => tiles(&image, f, rows, panels, ks, none, dst),
            false => tiles_avx2(&image, f, rows, panels, ks, none, dst),
        }
    }
}

/// The input of one call: the geometry, the NHWC image, and `kw·C` zeros for the padding.
struct Image<'a> {
    p: &'a Conv2d,
    x: &'a [f32],
    pad: &'a [f32],
}

impl Image<'_> {
    /// Where the windows of output rows `r0..r0 + n` start (`n <= MR_MAX`): the image's first
    /// float, and the top-left tap's input row and column (negative over the padding). One
    /// division for the tile, then steps along the output row.
    #[inline(always)]
    fn origins(&self, r0: usize, n: usize) -> [Origin; MR_MAX] {
        let p = self.p;
        let (mut img, pos) = (r0 / (p.oh * p.ow), r0 % (p.oh * p.ow));
        let (mut oy, mut ox) = (pos / p.ow, pos % p.ow);
        let mut out = [(0, 0, 0); MR_MAX];
        for o in out.iter_mut().take(n) {
            *o = (
                img * p.h * p.w * p.c,
                (oy * p.sh) as isize - p.pt as isize,
                (ox * p.sw) as isize - p.pl as isize,
            );
            ox += 1;
            if ox == p.ow {
                ox = 0;
                oy += 1;
                if oy == p.oh {
                    oy = 0;
                    img += 1;
                }
            }
        }
        out
    }

    /// Where the tap `dy, dx` (input rows and columns) from `origin` reads its `C` floats (a row
    /// of taps inside the image across: `kw·C`).
    #[inline(always)]
    fn tap(&self, (base, y0, x0): Origin, dy: isize, dx: isize) -> *const f32 {
        let p = self.p;
        let (iy, ix) = (y0 + dy, x0 + dx);
        if iy < 0 || ix < 0 || iy >= p.h as isize || ix >= p.w as isize {
            return self.pad.as_ptr();
        }
        self.x[base + (iy as usize * p.w + ix as usize) * p.c..].as_ptr()
    }
}

/// Where an output row's window starts: see [`Image::origins`].
type Origin = (usize, isize, isize);

/// One run of a tile's reduction: `len` steps from `kk`, read from tap `(dy, dx)` (input rows
/// and columns from the window's origin) at channel `c0`.
struct Run {
    kk: usize,
    len: usize,
    dy: isize,
    dx: isize,
    c0: usize,
}

/// The runs of reduction block `ks` a tile of windows at `origins` reads (none for a 1x1
/// convolution, which reads the image's rows directly): the rest of one tap's channels, or,
/// where every window lies inside the image across (and taps are adjacent), a whole row of taps,
/// `kw·C` contiguous floats of the image and of the weights.
#[inline(always)]
fn runs<'a>(
    p: &'a Conv2d,
    origins: &[Origin],
    ks: &std::ops::Range<usize>,
) -> impl Iterator<Item = Run> + 'a {
    let inside =
        p.dw == 1 && (origins.iter()).all(|&(_, _, x0)| x0 >= 0 && x0 as usize + p.kw <= p.w);
    let (c, end) = (p.c, ks.end);
    let mut kk = if p.is_pointwise() { end } else { ks.start };
    std::iter::from_fn(move || {
        if kk >= end {
            return None;
        }
        let (t, c0) = (kk / c, kk % c);
        let (ky, kx) = (t / p.kw, t % p.kw);
        let run = if inside && kx == 0 && c0 == 0 {
            p.kw * c
        } else {
            c - c0
        };
        let len = run.min(end - kk);
        let (dy, dx) = ((ky * p.dh) as isize, (kx * p.dw) as isize);
        let item = Run {
            kk,
            len,
            dy,
            dx,
            c0,
        };
        kk += len;
        Some(item)
    })
}

/// Rows `rows` by the output channels of `panels`, over reduction block `ks`, a tile of rows
/// at a time.
///
/// # Safety
/// The CPU has AVX-512F; the operands are as [`conv_nhwc`] asserts; no one else writes these
/// rows of `out`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn tiles(
    image: &Image<'_>,
    f: &NhwcFilter,
    rows: std::ops::Range<usize>,
    panels: std::ops::Range<usize>,
    ks: std::ops::Range<usize>,
    epi: Epilogue<'_>,
    out: SharedOut,
) {
    // The (rows, panels) tiles that exist: as many rows as `rows_for` allows.
    macro_rules! tile {
        ($o:expr, $r0:expr, $mr:expr, $p0:expr, $np:expr; $($r:literal: $($p:literal)*;)*) => {
            match ($mr, $np) {
                $($(($r, $p) => tile::<$r, $p>(image, ($r0, $o), f, $p0, ks.clone(), epi, out),)*)*
                (mr, np) => unreachable!("no tile of {mr} rows by {np} panels"),
            }
        };
    }
    // Panels in groups of as even a size as fit (9 as 3 of 3, not 4, 4 and 1), and as many
    // rows per tile as the group leaves registers for.
    let groups = panels.len().div_ceil(NP);
    let per = panels.len().div_ceil(groups);
    let mr = rows_for(per);
    // Tiles of as even a size as fit: 49 rows as 4 of 6 and 5 of 5, not 8 of 6 and 1 of 1
    // (a 1-row tile loads a weight vector per multiply-add).
    let (start, len) = (rows.start, rows.len());
    let count = len.div_ceil(mr);
    for t in 0..count {
        let r = start + t * len / count;
        let n = start + (t + 1) * len / count - r;
        let origins = if image.p.is_pointwise() {
            [(0, 0, 0); MR_MAX]
        } else {
            image.origins(r, n)
        };
        for p0 in panels.clone().step_by(per) {
            let np = (panels.end - p0).min(per);
            // SAFETY: as this function's contract; rows r..r + n are output rows, panels
            // p0..p0 + np are within f.
            unsafe {
                tile!(&origins, r, n, p0, np;
                    1: 1 2 3 4; 2: 1 2 3 4; 3: 1 2 3 4; 4: 1 2 3 4; 5: 1 2 3 4; 6: 1 2 3 4;
                    7: 1 2 3; 8: 1 2 3; 9: 1 2; 10: 1 2; 11: 1 2; 12: 1 2;)
            }
        }
    }
}

/// Output rows per register tile of `panels` panels: its accumulators, one weight vector per
/// panel and the broadcast input fill at most 29 of the 32 vector registers.
fn rows_for(panels: usize) -> usize {
    match panels {
        4.. => MR,
        3 => 8,
        _ => MR_MAX,
    }
}

/// `R` output rows from `r0` (their windows at `origins`) by the `P` panels from `p0`, over
/// reduction block `ks`: the block starting at 0 starts from zero, later ones add to what `out`
/// holds, and the last one applies the epilogue.
///
/// # Safety
/// As [`tiles`], with rows `r0..r0 + R` output rows and panels `p0..p0 + P` within `f`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn tile<const R: usize, const P: usize>(
    image: &Image<'_>,
    (r0, origins): (usize, &[Origin; MR_MAX]),
    f: &NhwcFilter,
    p0: usize,
    ks: std::ops::Range<usize>,
    epi: Epilogue<'_>,
    out: SharedOut,
) {
    use std::arch::x86_64::*;
    let (p, k, m) = (image.p, f.k(), f.m);
    let masks: [__mmask16; P] = std::array::from_fn(|q| crate::mask16(m - (p0 + q) * LANES));
    let at = |r: usize, q: usize| out.at((r0 + r) * m + (p0 + q) * LANES);
    let mut acc = [[_mm512_setzero_ps(); P]; R];
    if ks.end == k {
        // The lines this tile will store (and the residual it will add), asked for now so that
        // they arrive while it computes: a layer's output is often a buffer last touched a run
        // ago, in no cache (`gemm_rate --cold`, a 1x1 64 → 256 layer at 56x56 on a Xeon: 1.25
        // ms writing to such buffers without these prefetches, 1.06–1.10 with them, 0.80–0.86
        // writing to one buffer again and again). A line no other core holds arrives
        // exclusive, so the stores need no second request.
        for r in 0..R {
            for q in 0..P {
                _mm_prefetch::<_MM_HINT_T0>(at(r, q) as *const i8);
                if let Some(res) = epi.residual {
                    let line = res.as_ptr().wrapping_add((r0 + r) * m + (p0 + q) * LANES);
                    _mm_prefetch::<_MM_HINT_T0>(line as *const i8);
                }
            }
        }
    }
    if ks.start > 0 {
        for (r, acc) in acc.iter_mut().enumerate() {
            for (q, acc) in acc.iter_mut().enumerate() {
                // SAFETY: row r0 + r, channels of panel p0 + q under its mask: within `out`.
                *acc = unsafe { _mm512_maskz_loadu_ps(masks[q], at(r, q)) };
            }
        }
    }
    // SAFETY: panel p0 starts within f.data (this function's contract).
    let wp = unsafe { f.data.as_ptr().add(p0 * k * LANES) };
    let c = p.c;
    if p.is_pointwise() {
        // A plain matrix product: position r's input is row r of the image.
        // SAFETY: rows r0..r0 + R are output rows, and so input rows; c0 + len <= C.
        let taps: [*const f32; R] =
            std::array::from_fn(|r| unsafe { image.x.as_ptr().add((r0 + r) * c + ks.start) });
        // SAFETY: k indices ks of panels p0..p0 + P lie within f.data.
        acc = unsafe { products(acc, taps, wp.add(ks.start * LANES), k * LANES, ks.len()) };
    }
    // Windows along one output row, every tap inside the image across: each tap of row r lies
    // r·sw·C floats after row 0's, or all of them in the padding (a tap row above or below the
    // image). Finding each row's tap apart, with four bounds checks, weighs on a 3-channel
    // stem, whose tiles have 27 reduction steps.
    let (first, last) = (origins[0], origins[R - 1]);
    let along = first.0 == last.0
        && first.1 == last.1
        && first.2 >= 0
        && last.2 + (((p.kw - 1) * p.dw) as isize) < p.w as isize;
    for Run {
        kk,
        len,
        dy,
        dx,
        c0,
    } in runs(p, &origins[..R], &ks)
    {
        // SAFETY: each tap is C floats, and each row of taps of a window inside the image
        // across kw·C, of the image or of the padding; c0 + len <= the run. Along one row
        // (`along`), row r's tap is row 0's moved by r windows, within the image's row.
        let taps: [*const f32; R] = match along {
            true => {
                let t0 = image.tap(first, dy, dx);
                let stride = if std::ptr::eq(t0, image.pad.as_ptr()) {
                    0
                } else {
                    p.sw * c
                };
                std::array::from_fn(|r| unsafe { t0.add(r * stride + c0) })
            }
            false => std::array::from_fn(|r| unsafe { image.tap(origins[r], dy, dx).add(c0) }),
        };
        // SAFETY: k indices kk..kk + len of panels p0..p0 + P lie within f.data.
        acc = unsafe { products(acc, taps, wp.add(kk * LANES), k * LANES, len) };
    }
    if ks.end < k {
        // SAFETY: as below, the rows and channels of this tile.
        unsafe { store(acc, at, &masks) };
        return;
    }
    // SAFETY: the mask reads channels of panel p0 + q below m of the bias (m values).
    let bias: [_; P] = std::array::from_fn(|q| {
        epi.bias
            .map(|b| unsafe { _mm512_maskz_loadu_ps(masks[q], b.as_ptr().add((p0 + q) * LANES)) })
    });
    let finish = Finish::of(epi.act);
    let (lo, hi) = match finish {
        Finish::Clamp(lo, hi) => (_mm512_set1_ps(lo), _mm512_set1_ps(hi)),
        _ => (
            _mm512_set1_ps(f32::NEG_INFINITY),
            _mm512_set1_ps(f32::INFINITY),
        ),
    };
    for (r, row) in acc.iter_mut().enumerate() {
        for (q, v) in row.iter_mut().enumerate() {
            if let Some(b) = bias[q] {
                *v = _mm512_add_ps(*v, b);
            }
            if let Some(res) = epi.residual {
                // SAFETY: the residual has the output's size (asserted by `conv_nhwc`).
                let rv = unsafe {
                    _mm512_maskz_loadu_ps(
                        masks[q],
                        res.as_ptr().add((r0 + r) * m + (p0 + q) * LANES),
                    )
                };
                *v = _mm512_add_ps(*v, rv);
            }
            if let Finish::Clamp(..) = finish {
                // max/min return their second operand for NaN: the lower bound, as the scalar
                // activations give.
                *v = _mm512_min_ps(_mm512_max_ps(*v, lo), hi);
            }
        }
    }
    // SAFETY: row r0 + r, channels of panel p0 + q under its mask: within `out`, written by
    // this task alone.
    unsafe { store(acc, at, &masks) };
    if let Finish::Other(act) = finish {
        let (j0, j1) = (p0 * LANES, ((p0 + P) * LANES).min(m));
        // SAFETY: as the stores above (rows r0..r0 + R, channels j0..j1).
        unsafe { activate_rows(act, R, m, j0..j1, |r| at(r, 0)) };
    }
}

/// `act` of channels `cols` of `rows` output rows `m` wide, the first row's at `at(0)`: one
/// call over them all where they are whole rows and so contiguous (a 16-channel stem's tile
/// makes one call for its 12 rows, not 12 calls of one vector each), else one call a row.
///
/// # Safety
/// `at(r)` points at channel `cols.start` of row `r`, and each row's channels `cols` are valid
/// for writes by this task alone.
#[inline(always)]
unsafe fn activate_rows(
    act: crate::activation::Activation,
    rows: usize,
    m: usize,
    cols: std::ops::Range<usize>,
    at: impl Fn(usize) -> *mut f32,
) {
    if cols.len() == m {
        // SAFETY: whole rows, one after another (this function's contract).
        bias_act(
            unsafe { std::slice::from_raw_parts_mut(at(0), rows * m) },
            None,
            Some(act),
        );
        return;
    }
    for r in 0..rows {
        // SAFETY: this function's contract.
        bias_act(
            unsafe { std::slice::from_raw_parts_mut(at(r), cols.len()) },
            None,
            Some(act),
        );
    }
}

/// Stores tile `acc` at `at(r, q)` under each panel's mask. Always inlined into the tile,
/// whose AVX-512 it then compiles with (a `#[target_feature]` function cannot be
/// `inline(always)`; called, it cost the short 1x1 layers up to a fifth of their time).
///
/// # Safety
/// The CPU has AVX-512F; `at(r, q)` is valid for writes of the lanes of `masks[q]`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn store<const R: usize, const P: usize>(
    acc: [[std::arch::x86_64::__m512; P]; R],
    at: impl Fn(usize, usize) -> *mut f32,
    masks: &[std::arch::x86_64::__mmask16; P],
) {
    use std::arch::x86_64::*;
    for (r, row) in acc.iter().enumerate() {
        for (q, &v) in row.iter().enumerate() {
            // SAFETY: this function's contract.
            unsafe { _mm512_mask_storeu_ps(at(r, q), masks[q], v) };
        }
    }
}

/// `acc[r][q] += Σ_i taps[r][i] · w[q·stride + i·16..][..16]` for `i < len`. A function of
/// its own, taking and returning the accumulators by value, so that they stay in registers
/// (inline in `tile`, they were stored to the stack on every step: half the speed). Tiles of
/// four panels take four steps a loop iteration: their loop keeps the three panels' pointers
/// past the first on the stack, reloaded every iteration, and the unrolled loop pays that a
/// quarter as often (`gemm_rate`, a Xeon: the BERT and resnet50 shapes 10–25% faster). Tiles
/// of fewer panels hold more rows, whose unrolled loop spills accumulators instead.
///
/// # Safety
/// The CPU has AVX-512F; each `taps[r]` holds `len` floats, and `w` holds panel `q`'s `len`
/// vectors at `q·stride` for `q < P`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn products<const R: usize, const P: usize>(
    mut acc: [[std::arch::x86_64::__m512; P]; R],
    taps: [*const f32; R],
    w: *const f32,
    stride: usize,
    len: usize,
) -> [[std::arch::x86_64::__m512; P]; R] {
    use std::arch::x86_64::*;
    let step = |acc: &mut [[__m512; P]; R], i: usize| {
        // SAFETY: i < len (this function's contract).
        let wv: [__m512; P] =
            std::array::from_fn(|q| unsafe { _mm512_loadu_ps(w.add(q * stride + i * LANES)) });
        for (r, acc) in acc.iter_mut().enumerate() {
            // SAFETY: i < len.
            let xv = _mm512_set1_ps(unsafe { *taps[r].add(i) });
            for (acc, &wv) in acc.iter_mut().zip(&wv) {
                *acc = _mm512_fmadd_ps(xv, wv, *acc);
            }
        }
    };
    let mut i = 0;
    while P == NP && i + 4 <= len {
        step(&mut acc, i);
        step(&mut acc, i + 1);
        step(&mut acc, i + 2);
        step(&mut acc, i + 3);
        i += 4;
    }
    while i < len {
        step(&mut acc, i);
        i += 1;
    }
    acc
}

/// [`tiles`] on AVX2: tiles of up to [`MR`] rows by one panel.
///
/// # Safety
/// The CPU has AVX2 and FMA; the operands are as [`conv_nhwc`] asserts; no one else writes
/// these rows of `out`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tiles_avx2(
    image: &Image<'_>,
    f: &NhwcFilter,
    rows: std::ops::Range<usize>,
    panels: std::ops::Range<usize>,
    ks: std::ops::Range<usize>,
    epi: Epilogue<'_>,
    out: SharedOut,
) {
    let p = image.p;
    // The runs of a row tile, their taps looked up once for all its panels.
    let mut table: Vec<TapRun> = Vec::new();
    let (start, len) = (rows.start, rows.len());
    let count = len.div_ceil(MR);
    for t in 0..count {
        let r = start + t * len / count;
        let n = start + (t + 1) * len / count - r;
        table.clear();
        if !p.is_pointwise() {
            let origins = image.origins(r, n);
            for run in runs(p, &origins[..n], &ks) {
                // SAFETY: as in `tile`: each of the tile's windows reads `len` floats at its
                // tap from channel c0.
                let taps = std::array::from_fn(|i| unsafe {
                    image.tap(origins[i.min(n - 1)], run.dy, run.dx).add(run.c0)
                });
                table.push((run.kk, run.len, taps));
            }
        }
        for p0 in panels.clone() {
            let o = (r, &table[..]);
            // SAFETY: as this function's contract; rows r..r + n are output rows, panel p0 is
            // within f.
            unsafe {
                // A last panel of at most 8 channels (24 = 16 + 8) takes one vector's
                // products, not two.
                macro_rules! tile {
                    ($($r:literal)*) => {
                        match (n, f.m - p0 * LANES <= 8) {
                            $(($r, false) => tile_avx2::<$r, 2>(image, o, f, p0, ks.clone(), epi, out),
                            ($r, true) => tile_avx2::<$r, 1>(image, o, f, p0, ks.clone(), epi, out),)*
                            (n, _) => unreachable!("no AVX2 tile of {n} rows"),
                        }
                    };
                }
                tile!(1 2 3 4 5 6)
            }
        }
    }
}

/// A run of an AVX2 row tile's reduction (`len` steps from `kk`) with its taps: where each of
/// the tile's windows reads its `len` floats (rows past the tile's repeat its last).
type TapRun = (usize, usize, [*const f32; MR]);

/// [`tile`] on AVX2: `R` output rows from `r0` by panel `p0`, its 16 channels as two vectors
/// (`H = 2`), or its first 8 as one (`H = 1`, a panel of at most 8 channels).
///
/// # Safety
/// As [`tiles_avx2`], with rows `r0..r0 + R` output rows, panel `p0` within `f`, and `table` the
/// runs of block `ks` of those rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn tile_avx2<const R: usize, const H: usize>(
    image: &Image<'_>,
    (r0, table): (usize, &[TapRun]),
    f: &NhwcFilter,
    p0: usize,
    ks: std::ops::Range<usize>,
    epi: Epilogue<'_>,
    out: SharedOut,
) {
    use std::arch::x86_64::*;
    let (p, k, m, j0) = (image.p, f.k(), f.m, p0 * LANES);
    // Lanes below `width` of 8: a mask for maskload/maskstore.
    let mask = |width: usize| {
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_cmpgt_epi32(_mm256_set1_epi32(width.min(8) as i32), lanes)
    };
    let masks = [mask(m - j0), mask((m - j0).saturating_sub(8))];
    // A whole panel's loads and stores need no masks (a masked store costs several plain ones
    // on some CPUs: as much as the products of a small reduction).
    let whole = m - j0 >= LANES;
    // SAFETY (load, store): callers pass 8 floats of a row of 16 channels of panel p0 in an
    // `m`-wide array (bias, residual, out), of which the mask keeps those below m.
    let load = |at: *const f32, h: usize| unsafe {
        if whole {
            _mm256_loadu_ps(at)
        } else {
            _mm256_maskload_ps(at, masks[h])
        }
    };
    let store = |at: *mut f32, h: usize, v: __m256| unsafe {
        if whole {
            _mm256_storeu_ps(at, v)
        } else {
            _mm256_maskstore_ps(at, masks[h], v)
        }
    };
    let at = |r: usize, h: usize| out.at((r0 + r) * m + j0 + h * 8);
    let mut acc = [[_mm256_setzero_ps(); H]; R];
    if ks.start > 0 {
        for (r, acc) in acc.iter_mut().enumerate() {
            for (h, acc) in acc.iter_mut().enumerate() {
                // Row r0 + r, channels of panel p0: within `out`.
                *acc = load(at(r, h), h);
            }
        }
    }
    // SAFETY: panel p0 starts within f.data (this function's contract).
    let wp = unsafe { f.data.as_ptr().add(p0 * k * LANES) };
    let c = p.c;
    if p.is_pointwise() {
        // SAFETY: rows r0..r0 + R are output rows, and so input rows; c0 + len <= C.
        let taps: [*const f32; R] =
            std::array::from_fn(|r| unsafe { image.x.as_ptr().add((r0 + r) * c + ks.start) });
        // SAFETY: k indices ks of panel p0 lie within f.data.
        acc = unsafe { products_avx2(acc, taps, wp.add(ks.start * LANES), ks.len()) };
    }
    for &(kk, len, ref taps) in table {
        let taps: [*const f32; R] = std::array::from_fn(|r| taps[r]);
        // SAFETY: k indices kk..kk + len of panel p0 lie within f.data; each tap holds `len`
        // floats (`TapRun`).
        acc = unsafe { products_avx2(acc, taps, wp.add(kk * LANES), len) };
    }
    let last = ks.end == k;
    let finish = Finish::of(epi.act);
    if last {
        let (lo, hi) = match finish {
            Finish::Clamp(lo, hi) => (_mm256_set1_ps(lo), _mm256_set1_ps(hi)),
            _ => (
                _mm256_set1_ps(f32::NEG_INFINITY),
                _mm256_set1_ps(f32::INFINITY),
            ),
        };
        for (r, row) in acc.iter_mut().enumerate() {
            for (h, v) in row.iter_mut().enumerate() {
                if let Some(b) = epi.bias {
                    // The bias holds m values (the mask keeps to them).
                    *v = _mm256_add_ps(*v, load(b.as_ptr().wrapping_add(j0 + h * 8), h));
                }
                if let Some(res) = epi.residual {
                    // The residual has the output's size (asserted by `conv_nhwc`).
                    let at = res.as_ptr().wrapping_add((r0 + r) * m + j0 + h * 8);
                    *v = _mm256_add_ps(*v, load(at, h));
                }
                if let Finish::Clamp(..) = finish {
                    // max/min return their second operand for NaN: the lower bound.
                    *v = _mm256_min_ps(_mm256_max_ps(*v, lo), hi);
                }
            }
        }
    }
    for (r, row) in acc.iter().enumerate() {
        for (h, &v) in row.iter().enumerate() {
            // Row r0 + r, channels of panel p0: within `out`, written by this task alone.
            store(at(r, h), h, v);
        }
    }
    if let (true, Finish::Other(act)) = (last, finish) {
        let j1 = (j0 + LANES).min(m);
        // SAFETY: as the stores above (rows r0..r0 + R, channels j0..j1).
        unsafe { activate_rows(act, R, m, j0..j1, |r| at(r, 0)) };
    }
}

/// [`products`] on AVX2 for one panel (its first `8·H` channels):
/// `acc[r][h] += Σ_i taps[r][i] · w[i·16 + 8h..][..8]`.
///
/// # Safety
/// The CPU has AVX2 and FMA; each `taps[r]` holds `len` floats, and `w` holds `len` rows of 16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn products_avx2<const R: usize, const H: usize>(
    mut acc: [[std::arch::x86_64::__m256; H]; R],
    taps: [*const f32; R],
    w: *const f32,
    len: usize,
) -> [[std::arch::x86_64::__m256; H]; R] {
    use std::arch::x86_64::*;
    for i in 0..len {
        // SAFETY: i < len (this function's contract).
        let wv: [__m256; H] =
            std::array::from_fn(|h| unsafe { _mm256_loadu_ps(w.add(i * LANES + 8 * h)) });
        for (r, acc) in acc.iter_mut().enumerate() {
            // SAFETY: i < len.
            let xv = _mm256_set1_ps(unsafe { *taps[r].add(i) });
            for (acc, &wv) in acc.iter_mut().zip(&wv) {
                *acc = _mm256_fmadd_ps(xv, wv, *acc);
            }
        }
    }
    acc
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::activation::Activation;

    pub(crate) fn values(len: usize, seed: u32) -> Vec<f32> {
        crate::test_bytes(len, seed)
            .iter()
            .map(|&b| b as f32 / 64.0 - 2.0)
            .collect()
    }

    /// The convolution tap by tap, NHWC in and out, in f64 (`groups` groups of channels).
    pub(crate) fn reference(p: &Conv2d, x: &[f32], w: &[f32], epi: &Epilogue<'_>) -> Vec<f32> {
        let rows = p.n * p.oh * p.ow;
        let (cg, mg) = (p.c / p.groups, p.m / p.groups);
        let mut out = vec![0.0f32; rows * p.m];
        for r in 0..rows {
            let (img, oy, ox) = (r / (p.oh * p.ow), r / p.ow % p.oh, r % p.ow);
            for j in 0..p.m {
                let mut s = epi.bias.map_or(0.0, |b| b[j] as f64);
                for ci in 0..cg {
                    for ky in 0..p.kh {
                        for kx in 0..p.kw {
                            let iy = (oy * p.sh + ky * p.dh) as isize - p.pt as isize;
                            let ix = (ox * p.sw + kx * p.dw) as isize - p.pl as isize;
                            if iy < 0 || ix < 0 || iy >= p.h as isize || ix >= p.w as isize {
                                continue;
                            }
                            let xi = ((img * p.h + iy as usize) * p.w + ix as usize) * p.c
                                + j / mg * cg
                                + ci;
                            let wi = ((j * cg + ci) * p.kh + ky) * p.kw + kx;
                            s += x[xi] as f64 * w[wi] as f64;
                        }
                    }
                }
                let s = s as f32 + epi.residual.map_or(0.0, |res| res[r * p.m + j]);
                out[r * p.m + j] = epi.act.map_or(s, |a| a.apply(s));
            }
        }
        out
    }

    #[test]
    fn matches_the_tap_by_tap_convolution() {
        if crate::skip_without(available(), "AVX-512F or AVX2") {
            return;
        }
        // (n, c, h, w, m, k, stride, dilation, pad top-left, bottom-right)
        let cases = [
            (2, 8, 5, 6, 20, 3, 1, 1, 1, 1),
            (1, 3, 11, 11, 64, 7, 2, 1, 3, 3),
            (1, 5, 7, 7, 70, 3, 2, 1, 1, 0),
            (3, 12, 6, 5, 16, 1, 1, 1, 0, 0),
            (1, 16, 9, 9, 33, 3, 1, 2, 2, 2),
            (2, 4, 4, 4, 5, 2, 2, 1, 0, 1),
            (1, 64, 3, 3, 64, 3, 1, 1, 1, 1),
            // Weights past BLOCK_WEIGHTS: blocks of panels, and a reduction of 2700 in blocks
            // (2048 and 652) that end inside a tap.
            (1, 100, 4, 4, 600, 3, 1, 1, 1, 1),
            (2, 1000, 2, 3, 130, 1, 1, 1, 0, 0),
            (1, 2100, 2, 3, 20, 1, 1, 1, 0, 0),
            (1, 300, 3, 4, 40, 3, 1, 1, 1, 1),
            // A stem of 16 channels: tiles of whole rows, activated in one call.
            (1, 3, 15, 15, 16, 3, 2, 1, 1, 1),
        ];
        for case in cases {
            check_against_the_reference(&crate::test_conv(case), conv_nhwc);
            // The AVX2 kernel too, where the AVX-512 one ran above.
            #[cfg(target_arch = "x86_64")]
            if crate::avx512f() && crate::activation::avx2_fma() {
                check_against_the_reference(&crate::test_conv(case), conv_nhwc_avx2);
            }
        }
    }

    /// [`conv_nhwc`] on the AVX2 kernels, on a CPU that also has AVX-512.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn conv_nhwc_avx2(
        t: usize,
        p: &Conv2d,
        x: &[f32],
        f: &NhwcFilter,
        e: Epilogue<'_>,
        o: &mut [f32],
    ) {
        conv_on(false, t, p, x, f, e, o)
    }

    /// An NHWC kernel's outputs for convolution `p` against [`reference`], with four
    /// epilogues, on 1 and 3 threads.
    pub(crate) fn check_against_the_reference(
        p: &Conv2d,
        kernel: fn(usize, &Conv2d, &[f32], &NhwcFilter, Epilogue<'_>, &mut [f32]),
    ) {
        let (n, c, h, w, m, k) = (p.n, p.c, p.h, p.w, p.m, p.kh);
        let cg = c / p.groups;
        let x = values(n * h * w * c, 3);
        let wt = values(m * cg * k * k, 7);
        let bias = values(m, 11);
        let res = values(n * p.oh * p.ow * m, 13);
        // With the Winograd transform: the convolutions it takes (stride 1) run on it.
        let filter = NhwcFilter::with_winograd(&wt, m, cg, k, k);
        let epilogues = [
            Epilogue::default(),
            Epilogue {
                bias: Some(&bias),
                residual: Some(&res),
                act: Some(Activation::Relu),
            },
            Epilogue {
                bias: Some(&bias),
                residual: None,
                act: Some(Activation::Sigmoid),
            },
            Epilogue {
                bias: None,
                residual: None,
                act: Some(Activation::Clip(-0.5, 0.5)),
            },
            Epilogue {
                bias: Some(&bias),
                residual: None,
                act: Some(Activation::HardSwish),
            },
        ];
        for epi in epilogues {
            let want = reference(p, &x, &wt, &epi);
            for threads in [1, 3] {
                let mut got = vec![f32::NAN; want.len()];
                kernel(threads, p, &x, &filter, epi, &mut got);
                let tol = 1e-4 * (cg * k * k) as f32;
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - e).abs() <= tol,
                        "{p:?} {epi:?} threads {threads} at {i}: {g} vs {e}"
                    );
                }
            }
        }
    }

    #[test]
    fn sums_are_the_same_whatever_the_threads_or_batch() {
        if crate::skip_without(available(), "AVX-512F or AVX2") {
            return;
        }
        let one = Conv2d {
            n: 1,
            c: 40,
            h: 9,
            w: 9,
            m: 48,
            kh: 3,
            kw: 3,
            sh: 1,
            sw: 1,
            dh: 1,
            dw: 1,
            pt: 1,
            pl: 1,
            oh: 9,
            ow: 9,
            groups: 1,
        };
        let four = Conv2d { n: 4, ..one };
        let x = values(4 * 9 * 9 * 40, 5);
        let wt = values(48 * 40 * 9, 9);
        let filter = NhwcFilter::new(&wt, 48, 40, 3, 3);
        let mut batch = vec![0.0; 4 * 81 * 48];
        conv_nhwc(2, &four, &x, &filter, Epilogue::default(), &mut batch);
        for img in 0..4 {
            let mut single = vec![0.0; 81 * 48];
            let xi = &x[img * 81 * 40..(img + 1) * 81 * 40];
            conv_nhwc(1, &one, xi, &filter, Epilogue::default(), &mut single);
            assert_eq!(
                single,
                batch[img * 81 * 48..(img + 1) * 81 * 48],
                "image {img}"
            );
        }
    }

    #[test]
    fn a_packed_matrix_multiplies_rows_as_a_pointwise_convolution() {
        if crate::skip_without(available(), "AVX-512F or AVX2") {
            return;
        }
        // (rows, k, n): one row, tails of panels and of row tiles, a reduction past one block.
        for (rows, k, n) in [
            (1, 1, 1),
            (7, 33, 17),
            (13, 64, 48),
            (3, 2100, 20),
            (20, 5, 100),
            // One row, split over panels.
            (1, 300, 700),
        ] {
            let (a, b, bias) = (values(rows * k, 1), values(k * n, 2), values(n, 3));
            let f = NhwcFilter::of_matrix(&b, k, n);
            let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
            assert_eq!(f, NhwcFilter::new(&bt, n, k, 1, 1), "({rows}, {k}, {n})");
            let epi = Epilogue {
                bias: Some(&bias),
                residual: None,
                act: Some(Activation::Relu),
            };
            let mut all = vec![f32::NAN; rows * n];
            matmul_packed(3, &a, rows, &f, epi, &mut all);
            for r in 0..rows {
                let mut one = vec![f32::NAN; n];
                matmul_packed(1, &a[r * k..][..k], 1, &f, epi, &mut one);
                assert_eq!(one, all[r * n..][..n], "({rows}, {k}, {n}) row {r}");
                for (j, &got) in one.iter().enumerate() {
                    let sum: f64 = (0..k)
                        .map(|i| a[r * k + i] as f64 * b[i * n + j] as f64)
                        .sum();
                    let want = (sum + bias[j] as f64).max(0.0) as f32;
                    assert!((got - want).abs() <= 1e-4 * k as f32, "{got} vs {want}");
                }
            }
        }
    }
}
