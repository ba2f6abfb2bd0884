//! 3x3 stride-1 convolutions of NHWC activations by Winograd's minimal filtering F(2×2, 3×3)
//! (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", 2016), on AVX-512 or
//! AVX2.
//!
//! Each 2×2 block of outputs ("tile") comes from the 4×4 input block under it: the input block
//! is transformed (`V = Bᵀ d B`, additions only), multiplied elementwise by the transformed
//! filter (`U = G g Gᵀ`, once per model) and transformed back (`Y = Aᵀ M A`). Over channels
//! the elementwise products are 16 matrix products, `[tiles × C] · [C × M]`: 16 products of
//! a reduction of `C` for 4 outputs where the direct convolution makes 36, 2.25 times fewer
//! multiply-adds. The products run on the NHWC kernel's register tiles
//! ([`crate::nhwc_conv`]), on the transformed filters packed as its 1x1 filters. The
//! transforms are written once over [`Lanes16`] (16 channels as one AVX-512 vector or two AVX2
//! ones).
//!
//! The tiles go in chunks whose transformed inputs and products stay in L2 (a thread's chunk:
//! transform, 16 products, transform back), as many chunks as divide evenly across the
//! threads. It applies where the convolution is compute-bound: enough positions
//! ([`MIN_POSITIONS`]: all of resnet50's 3x3 stride-1 layers but the 7x7 ones at batch 1),
//! channels in whole vectors, and `C + M ≤ 1024`. The filter's transform (16 values for 9)
//! is made with the packed filter ([`NhwcFilter::with_winograd`]), for the stride-1 layers.
//! The results differ from the direct sum's by rounding, within a few 1e-6 of the output's
//! magnitude; every output is computed the same way whatever the threads or the batch.

use crate::activation::{Finish, bias_act};
use crate::conv::{Conv2d, Epilogue};
use crate::gemm::SharedOut;
#[cfg(target_arch = "x86_64")]
use crate::lanes16::{Avx2, Avx512, Lanes16};
use crate::nhwc_conv::NhwcFilter;
use rayon::prelude::*;
use std::ops::Range;

const LANES: usize = 16;
/// Output positions below which the direct kernel runs: too few tiles to pay for reading the
/// transformed weights (16/9 the bytes). A 14x14 image's 196 pays: resnet50's 3x3 256 layers
/// at batch 1 on two threads (`COTENANT_PROFILE=node`, a Xeon) take 4.0–4.1 ms in all
/// against 4.8 direct. The 7x7 ones at batch 1 (49) do not: 1.05 ms against 1.45 on AVX-512,
/// 1.8 against 2.5 on AVX2.
pub(crate) const MIN_POSITIONS: usize = 196;
/// Bytes of transformed input and products a chunk of tiles keeps in L2: enough that a
/// 14x14 image splits in one chunk a thread, not four chunks that each read the weights.
const CHUNK_BYTES: usize = 1536 << 10;

/// The transformed filter: `U = G g Gᵀ` for every output and input channel, as 16 `C × M`
/// matrices (element `(i, j)` of the 4×4 transform in matrix `4i + j`), packed for the NHWC
/// kernel.
#[derive(PartialEq)]
pub(crate) struct Filter {
    mats: Vec<NhwcFilter>,
}

impl Filter {
    /// Whether a filter of `m` outputs by `c` inputs of 3×3 is transformed: whole vectors of
    /// channels, and at most 512 + 512 (`gemm_rate`, a Xeon, batch 8 on two threads: 3x3 256
    /// at 14x14 1.66 times the direct kernel's speed, 3x3 512 at 7x7 1.1 times).
    pub(crate) fn fits(m: usize, c: usize) -> bool {
        m > 0 && c > 0 && m.is_multiple_of(LANES) && c.is_multiple_of(LANES) && c + m <= 1024
    }

    /// From weights `[m][c][3][3]`.
    pub(crate) fn new(weight: &[f32], m: usize, c: usize) -> Filter {
        assert_eq!(weight.len(), m * c * 9, "Winograd filter size");
        let mut mats = vec![vec![0.0f32; c * m]; 16];
        for (o, filter) in weight.chunks_exact(c * 9).enumerate() {
            for (ci, g) in filter.chunks_exact(9).enumerate() {
                // G g column by column (gg[col][i]), then each row i of G g by Gᵀ.
                let gg = [0, 1, 2].map(|col| transform_g([g[col], g[3 + col], g[6 + col]]));
                for i in 0..4 {
                    for (j, u) in transform_g(gg.map(|col| col[i])).into_iter().enumerate() {
                        mats[4 * i + j][ci * m + o] = u;
                    }
                }
            }
        }
        Filter {
            mats: mats
                .iter()
                .map(|u| NhwcFilter::of_matrix(u, c, m))
                .collect(),
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        self.mats.iter().map(NhwcFilter::bytes).sum()
    }
}

/// `G·[a, b, c]` with `G = [[1, 0, 0], [½, ½, ½], [½, -½, ½], [0, 0, 1]]`.
fn transform_g([a, b, c]: [f32; 3]) -> [f32; 4] {
    [a, 0.5 * (a + b + c), 0.5 * (a - b + c), c]
}

/// Whether [`conv`] takes convolution `p`.
pub(crate) fn applies(p: &Conv2d) -> bool {
    (p.kh, p.kw, p.sh, p.sw, p.dh, p.dw, p.groups) == (3, 3, 1, 1, 1, 1, 1)
        && Filter::fits(p.m, p.c)
        && p.n * p.oh * p.ow >= MIN_POSITIONS
}

/// Convolution `p` (as [`applies`]) of NHWC `x` by `f` into NHWC `out`, with the epilogue, on
/// AVX-512 or else on AVX2.
///
/// # Safety
/// The CPU has AVX-512F, or AVX2 and FMA where `!avx512`; the operands have the sizes `p` gives
/// (as `conv_nhwc` asserts), `f` is `p`'s filter.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn conv(
    avx512: bool,
    threads: usize,
    p: &Conv2d,
    x: &[f32],
    f: &Filter,
    epi: Epilogue<'_>,
    out: &mut [f32],
) {
    let tiles = p.n * p.oh.div_ceil(2) * p.ow.div_ceil(2);
    let most = (CHUNK_BYTES / (16 * 4 * (p.c + p.m))).max(1);
    let mut chunks = tiles.div_ceil(most);
    if threads > 1 {
        chunks = chunks.div_ceil(threads) * threads;
    }
    let per = tiles.div_ceil(chunks);
    let chunks = tiles.div_ceil(per);
    let dst = SharedOut(out.as_mut_ptr());
    let run = |(v, prod): &mut (Vec<f32>, Vec<f32>), chunk: usize| {
        let first = chunk * per;
        let n = per.min(tiles - first);
        let (v, prod) = (
            crate::grown(v, 16 * n * p.c),
            crate::grown(prod, 16 * n * p.m),
        );
        let tiles = first..first + n;
        // SAFETY: the CPU has the instructions (this function's contract); the buffers hold
        // 16 matrices of `n` rows; chunks write disjoint tiles of `out`.
        unsafe {
            match avx512 {
                true => transform_input_avx512(p, x, tiles.clone(), v),
                false => transform_input_avx2(p, x, tiles.clone(), v),
            }
            for (xi, f) in f.mats.iter().enumerate() {
                let (a, c) = (
                    &v[xi * n * p.c..][..n * p.c],
                    &mut prod[xi * n * p.m..][..n * p.m],
                );
                crate::nhwc_conv::product_rows(avx512, a, n, f, c);
            }
            match avx512 {
                true => transform_output_avx512(p, prod, tiles, epi, dst),
                false => transform_output_avx2(p, prod, tiles, epi, dst),
            }
        }
    };
    // One job a thread, its chunks in turn in the thread's own buffers.
    let jobs = threads.clamp(1, chunks);
    let job = |j: usize| {
        SCRATCH.with_borrow_mut(|buffers| {
            (j * chunks / jobs..(j + 1) * chunks / jobs).for_each(|chunk| run(buffers, chunk))
        })
    };
    match jobs {
        1 => job(0),
        _ => (0..jobs).into_par_iter().for_each(job),
    }
}

thread_local! {
    /// Each thread's transformed inputs and products, kept between calls (at most
    /// [`CHUNK_BYTES`]) so that a layer does not fault in fresh pages every run.
    static SCRATCH: std::cell::RefCell<(Vec<f32>, Vec<f32>)> = const {
        std::cell::RefCell::new((Vec::new(), Vec::new()))
    };
}

/// Where tile `t` lies: its image, and its top-left output row and column.
fn tile_at(p: &Conv2d, t: usize) -> (usize, usize, usize) {
    let (ty, tx) = (p.oh.div_ceil(2), p.ow.div_ceil(2));
    let (img, rest) = (t / (ty * tx), t % (ty * tx));
    (img, rest / tx * 2, rest % tx * 2)
}

/// [`transform_input`] on AVX-512.
///
/// # Safety
/// The CPU has AVX-512F; as [`transform_input`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn transform_input_avx512(p: &Conv2d, x: &[f32], tiles: Range<usize>, v: &mut [f32]) {
    // SAFETY: this function's contract.
    unsafe { transform_input::<Avx512>(p, x, tiles, v) }
}

/// [`transform_input`] on AVX2.
///
/// # Safety
/// The CPU has AVX2 and FMA; as [`transform_input`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn transform_input_avx2(p: &Conv2d, x: &[f32], tiles: Range<usize>, v: &mut [f32]) {
    // SAFETY: this function's contract.
    unsafe { transform_input::<Avx2>(p, x, tiles, v) }
}

/// `V = Bᵀ d B` of each tile of `tiles` (its 4×4 input block `d`, zeros over the padding),
/// 16 channels at a time, into `v` as 16 matrices of `tiles.len()` rows by `C`. Plain loops,
/// inlined into a function compiled for `L`'s instructions: a closure would not take them and
/// would pass its vectors through memory.
///
/// # Safety
/// The CPU has `L`'s instructions; `x` is `p`'s input; `v` holds `16 · tiles.len() · C` floats.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn transform_input<L: Lanes16>(p: &Conv2d, x: &[f32], tiles: Range<usize>, v: &mut [f32]) {
    let (c, n) = (p.c, tiles.len());
    for (i, t) in tiles.enumerate() {
        let (img, oy, ox) = tile_at(p, t);
        let (y0, x0) = (oy as isize - p.pt as isize, ox as isize - p.pl as isize);
        for c0 in (0..c).step_by(LANES) {
            // SAFETY: the CPU has L's instructions (the contract).
            let mut d = [[unsafe { L::zero() }; 4]; 4];
            for (r, row) in d.iter_mut().enumerate() {
                let y = y0 + r as isize;
                if !(0..p.h as isize).contains(&y) {
                    continue;
                }
                for (s, d) in row.iter_mut().enumerate() {
                    let xx = x0 + s as isize;
                    if (0..p.w as isize).contains(&xx) {
                        let at = ((img * p.h + y as usize) * p.w + xx as usize) * c + c0;
                        // SAFETY: pixel (y, xx) of image img lies within x; c0 + 16 <= C.
                        *d = unsafe { L::load(x.as_ptr().add(at)) };
                    }
                }
            }
            // Bᵀ down the columns, then across the rows: V = (Bᵀ (Bᵀ d)ᵀ)ᵀ.
            // SAFETY: the CPU has L's instructions.
            let e = transpose(unsafe { bt(d) });
            // SAFETY: as above.
            let f = transpose(unsafe { bt(e) });
            for (r, row) in f.iter().enumerate() {
                for (s, &vec) in row.iter().enumerate() {
                    let at = ((4 * r + s) * n + i) * c + c0;
                    // SAFETY: matrix 4r + s, row i, channels c0.. lie within v.
                    unsafe { vec.store(v.as_mut_ptr().add(at)) };
                }
            }
        }
    }
}

/// A 4 × 4 block of vectors transposed.
#[inline(always)]
fn transpose<V: Copy>(d: [[V; 4]; 4]) -> [[V; 4]; 4] {
    let mut t = d;
    for (r, row) in d.iter().enumerate() {
        for (s, &v) in row.iter().enumerate() {
            t[s][r] = v;
        }
    }
    t
}

/// `Bᵀ d`: rows `d0 - d2`, `d1 + d2`, `d2 - d1`, `d1 - d3`.
///
/// # Safety
/// The CPU has `L`'s instructions (always inlined into a caller compiled for them).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn bt<L: Lanes16>(d: [[L; 4]; 4]) -> [[L; 4]; 4] {
    let mut e = d;
    for j in 0..4 {
        // SAFETY: the contract.
        unsafe {
            e[0][j] = d[0][j].sub(d[2][j]);
            e[1][j] = d[1][j].add(d[2][j]);
            e[2][j] = d[2][j].sub(d[1][j]);
            e[3][j] = d[1][j].sub(d[3][j]);
        }
    }
    e
}

/// [`transform_output`] on AVX-512.
///
/// # Safety
/// The CPU has AVX-512F; as [`transform_output`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn transform_output_avx512(
    p: &Conv2d,
    prod: &[f32],
    tiles: Range<usize>,
    epi: Epilogue<'_>,
    out: SharedOut,
) {
    // SAFETY: this function's contract.
    unsafe { transform_output::<Avx512>(p, prod, tiles, epi, out) }
}

/// [`transform_output`] on AVX2.
///
/// # Safety
/// The CPU has AVX2 and FMA; as [`transform_output`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn transform_output_avx2(
    p: &Conv2d,
    prod: &[f32],
    tiles: Range<usize>,
    epi: Epilogue<'_>,
    out: SharedOut,
) {
    // SAFETY: this function's contract.
    unsafe { transform_output::<Avx2>(p, prod, tiles, epi, out) }
}

/// `Y = Aᵀ M A` of each tile of `tiles` from the products `prod` (16 matrices of
/// `tiles.len()` rows by `M`), with the epilogue, into the tile's outputs inside the image.
///
/// # Safety
/// The CPU has `L`'s instructions; `out` is `p`'s output, no one else writes these tiles; the
/// epilogue's bias holds `M` values and its residual the output's size.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn transform_output<L: Lanes16>(
    p: &Conv2d,
    prod: &[f32],
    tiles: Range<usize>,
    epi: Epilogue<'_>,
    out: SharedOut,
) {
    let (m, n) = (p.m, tiles.len());
    let finish = Finish::of(epi.act);
    let (lo, hi) = match finish {
        Finish::Clamp(lo, hi) => (lo, hi),
        _ => (f32::NEG_INFINITY, f32::INFINITY),
    };
    // SAFETY (every block below): the CPU has L's instructions (the contract).
    let (lo, hi) = unsafe { (L::splat(lo), L::splat(hi)) };
    for (i, t) in tiles.enumerate() {
        let (img, oy, ox) = tile_at(p, t);
        for m0 in (0..m).step_by(LANES) {
            let zero = unsafe { L::zero() };
            let mut g = [zero; 16];
            for (xi, g) in g.iter_mut().enumerate() {
                // SAFETY: matrix xi, row i, channels m0.. lie within prod.
                *g = unsafe { L::load(prod.as_ptr().add((xi * n + i) * m + m0)) };
            }
            // Aᵀ down the columns (m0 + m1 + m2, m1 - m2 - m3), then across the rows.
            let mut y = [[zero; 2]; 2];
            for (a, y) in y.iter_mut().enumerate() {
                let mut r = [zero; 4];
                for (j, r) in r.iter_mut().enumerate() {
                    let (m0, m1, m2, m3) = (g[j], g[4 + j], g[8 + j], g[12 + j]);
                    *r = unsafe {
                        match a {
                            0 => m0.add(m1).add(m2),
                            _ => m1.sub(m2).sub(m3),
                        }
                    };
                }
                unsafe {
                    y[0] = r[0].add(r[1]).add(r[2]);
                    y[1] = r[1].sub(r[2]).sub(r[3]);
                }
            }
            let bias = match epi.bias {
                // SAFETY: the bias holds M values (this function's contract).
                Some(b) => unsafe { L::load(b.as_ptr().add(m0)) },
                None => zero,
            };
            for (a, row) in y.iter().enumerate() {
                for (b, &v) in row.iter().enumerate() {
                    if oy + a >= p.oh || ox + b >= p.ow {
                        continue;
                    }
                    let at = ((img * p.oh + oy + a) * p.ow + ox + b) * m + m0;
                    let mut v = v;
                    unsafe {
                        if epi.bias.is_some() {
                            v = v.add(bias);
                        }
                        if let Some(res) = epi.residual {
                            // SAFETY: the residual has the output's size.
                            v = v.add(L::load(res.as_ptr().add(at)));
                        }
                        if let Finish::Clamp(..) = finish {
                            // NaN gives the lower bound, as the direct kernel does.
                            v = v.clamp(lo, hi);
                        }
                        // SAFETY: output pixel (oy + a, ox + b) of image img, channels m0..m0 +
                        // 16: within out, this tile's alone.
                        v.store(out.at(at));
                    }
                }
            }
        }
        if let Finish::Other(act) = finish {
            // Each output row of the tile: its one or two pixels' channels, contiguous, in one
            // call, not one a vector.
            for a in 0..2 {
                if oy + a >= p.oh {
                    continue;
                }
                let at = ((img * p.oh + oy + a) * p.ow + ox) * m;
                let pixels = (p.ow - ox).min(2);
                // SAFETY: pixels (oy + a, ox..ox + pixels) of image img, all channels, just
                // written by this tile alone.
                bias_act(
                    unsafe { std::slice::from_raw_parts_mut(out.at(at), pixels * m) },
                    None,
                    Some(act),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nhwc_conv::conv_nhwc;
    use crate::nhwc_conv::tests::{check_against_the_reference, values};

    fn available() -> bool {
        !crate::skip_without(crate::nhwc_conv::available(), "AVX-512F or AVX2 + FMA")
    }

    #[test]
    fn matches_the_tap_by_tap_convolution() {
        if !available() {
            return;
        }
        // (n, c, h, w, m, k, stride, dilation, pad top-left, bottom-right): odd sizes (tiles
        // over the edge), no padding, padding on two sides only, a batch of three, and the
        // wider filters.
        let cases = [
            (1, 16, 16, 16, 16, 3, 1, 1, 1, 1),
            (2, 32, 13, 11, 48, 3, 1, 1, 1, 1),
            (1, 64, 20, 17, 64, 3, 1, 1, 0, 0),
            (3, 16, 10, 10, 32, 3, 1, 1, 2, 0),
            (1, 128, 16, 16, 128, 3, 1, 1, 1, 1),
            (1, 256, 16, 16, 64, 3, 1, 1, 1, 1),
        ];
        for case in cases {
            let p = crate::test_conv(case);
            assert!(applies(&p), "{p:?}");
            check_against_the_reference(&p, conv_nhwc);
            // The AVX2 transforms and products too, where the AVX-512 ones ran above.
            #[cfg(target_arch = "x86_64")]
            if crate::avx512f() && crate::activation::avx2_fma() {
                check_against_the_reference(&p, crate::nhwc_conv::tests::conv_nhwc_avx2);
            }
        }
        // Not taken: strides, dilations, channels not in whole vectors, too wide a filter, too
        // few positions.
        for case in [
            (1, 16, 32, 32, 16, 3, 2, 1, 1, 1),
            (1, 16, 32, 32, 16, 3, 1, 2, 2, 2),
            (1, 24, 32, 32, 16, 3, 1, 1, 1, 1),
            (1, 512, 32, 32, 528, 3, 1, 1, 1, 1),
            (1, 16, 13, 13, 16, 3, 1, 1, 1, 1),
            (1, 16, 32, 32, 16, 1, 1, 1, 0, 0),
        ] {
            assert!(!applies(&crate::test_conv(case)), "{case:?}");
        }
    }

    #[test]
    fn sums_are_the_same_whatever_the_threads_or_batch() {
        if !available() {
            return;
        }
        let one = crate::test_conv((1, 32, 17, 16, 48, 3, 1, 1, 1, 1));
        let four = Conv2d { n: 4, ..one };
        assert!(applies(&one));
        let plane = (17 * 16 * 32, 17 * 16 * 48);
        let x = values(4 * plane.0, 5);
        let wt = values(48 * 32 * 9, 9);
        let filter = NhwcFilter::with_winograd(&wt, 48, 32, 3, 3);
        for threads in [1, 2, 3] {
            let mut batch = vec![0.0; 4 * plane.1];
            conv_nhwc(threads, &four, &x, &filter, Epilogue::default(), &mut batch);
            for img in 0..4 {
                let mut single = vec![0.0; plane.1];
                let xi = &x[img * plane.0..(img + 1) * plane.0];
                conv_nhwc(1, &one, xi, &filter, Epilogue::default(), &mut single);
                assert_eq!(
                    single,
                    batch[img * plane.1..(img + 1) * plane.1],
                    "image {img}, {threads} threads"
                );
            }
        }
    }
}
