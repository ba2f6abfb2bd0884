//! Direct convolution on AVX-512 CPUs, for convolutions with a kernel larger than 1x1 (resnet's
//! 3x3 layers and its 7x7 stem): no im2col and no per-call packing of the weights.
//!
//! - The weights are reordered once ([`PackedFilter`]) into blocks of `R` output channels, laid
//!   out in the order the kernel reads them: `[block][input channel][tap][R]`.
//! - Each image's input is copied once into zero-padded planes of one common row length `wq`,
//!   split into `sh × sw` phase planes for strided convolutions. Every tap of the kernel is then
//!   a fixed offset into one of those planes, and the output pixels of a plane, numbered
//!   `y·wq + x`, form one flat index where 16 consecutive pixels are one vector load per tap,
//!   whatever the row length (the `wq - ow` columns past each row are computed and not stored).
//! - A register tile holds `R` output channels × `V` vectors of 16 pixels: per input channel and
//!   tap, `V` loads, `R` broadcast weights and `R·V` fused multiply-adds.
//!
//! Every output element is summed in the same order (input channel, then tap) whatever the
//! thread budget or the batch.

use crate::activation::{Finish, bias_act};
use crate::conv::{Conv2d, Epilogue, copy_strided, scratch_of};
use crate::gemm::SharedOut;
use rayon::prelude::*;

/// Output channels per register tile.
const R: usize = 8;
/// Pixel vectors per register tile.
const V: usize = 3;
const LANES: usize = 16;
/// How far ahead (floats) the weights are prefetched.
const PREFETCH: usize = 1024;

/// Convolution weights reordered for [`direct_conv`]: `[m.div_ceil(R)][c][kh·kw][R]`, zero past
/// the last output channel.
#[derive(PartialEq)]
pub struct PackedFilter {
    m: usize,
    c: usize,
    taps: usize,
    data: Vec<f32>,
}

impl std::fmt::Debug for PackedFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PackedFilter(m {}, c {}, taps {})",
            self.m, self.c, self.taps
        )
    }
}

impl PackedFilter {
    /// Reorders `weight` (`[m, c, kh, kw]`).
    pub fn new(weight: &[f32], m: usize, c: usize, kh: usize, kw: usize) -> PackedFilter {
        let taps = kh * kw;
        assert_eq!(weight.len(), m * c * taps, "filter size");
        let mut data = vec![0.0; m.div_ceil(R) * c * taps * R];
        for (o, filter) in weight.chunks_exact(c * taps).enumerate() {
            let block = &mut data[(o / R) * c * taps * R..];
            for (i, w) in filter.iter().enumerate() {
                block[i * R + o % R] = *w;
            }
        }
        PackedFilter { m, c, taps, data }
    }

    /// Bytes this holds.
    pub fn bytes(&self) -> usize {
        self.data.len() * 4
    }

    /// Whether this is the filter of convolution `p`.
    pub fn fits(&self, p: &Conv2d) -> bool {
        (self.m, self.c, self.taps) == (p.m, p.c, p.kh * p.kw)
    }
}

/// Whether [`direct_conv`] runs convolutions with this kernel, dilation and grouping on this
/// CPU: ungrouped and undilated, a kernel larger than 1x1, a CPU with AVX-512.
pub fn suits(kernel: [usize; 2], dilation: [usize; 2], groups: usize) -> bool {
    groups == 1 && dilation == [1, 1] && kernel[0] * kernel[1] > 1 && crate::avx512f()
}

/// Whether [`direct_conv`] runs `p` (see [`suits`]).
pub fn applies(p: &Conv2d) -> bool {
    suits([p.kh, p.kw], [p.dh, p.dw], p.groups) && p.oh * p.ow > 0
}

/// Where the phase planes of one image lie and how the kernel walks them.
struct Planes {
    /// Row length of every phase plane (and of the flat output index).
    wq: usize,
    /// Rows of a phase plane.
    hq: usize,
    /// Floats per phase plane, with slack for the last vector's overrun.
    plane: usize,
    /// Floats per input channel (all its phase planes).
    channel: usize,
    /// Offset of each tap from the start of its input channel's planes.
    taps: Vec<usize>,
    /// Per phase plane the taps read: its offset and the span of their offsets within it.
    spans: Vec<(usize, usize)>,
    /// Vectors covering the flat output pixels (`oh · wq`).
    vectors: usize,
}

impl Planes {
    fn new(p: &Conv2d) -> Planes {
        let wq = p.ow + (p.kw - 1) / p.sw;
        let hq = p.oh + (p.kh - 1) / p.sh;
        let plane = (hq + 1) * wq + LANES;
        let taps: Vec<usize> = (0..p.kh)
            .flat_map(|i| (0..p.kw).map(move |j| (i, j)))
            .map(|(i, j)| ((i % p.sh) * p.sw + j % p.sw) * plane + (i / p.sh) * wq + j / p.sw)
            .collect();
        let spans = (0..p.sh * p.sw)
            .filter_map(|ph| {
                let within = taps
                    .iter()
                    .filter(|&&t| t / plane == ph)
                    .map(|&t| t % plane);
                Some((ph * plane, within.max()? + 1))
            })
            .collect();
        Planes {
            wq,
            hq,
            plane,
            channel: p.sh * p.sw * plane,
            taps,
            spans,
            vectors: (p.oh * wq).div_ceil(LANES),
        }
    }

    /// Output element (within a channel) of flat pixel `q`, or of the first valid pixel after it.
    fn out_index(&self, p: &Conv2d, q: usize) -> usize {
        ((q / self.wq) * p.ow + (q % self.wq).min(p.ow)).min(p.oh * p.ow)
    }

    /// Copies input channel `x` (`h × w`) into its phase plane `ph`, zeros in the padding.
    fn fill(&self, p: &Conv2d, x: &[f32], ph: usize, plane: &mut [f32]) {
        let (a, b) = (ph / p.sw, ph % p.sw);
        plane[self.hq * self.wq..].fill(0.0);
        for (r, row) in plane[..self.hq * self.wq]
            .chunks_exact_mut(self.wq)
            .enumerate()
        {
            let iy = (r * p.sh + a) as isize - p.pt as isize;
            if iy < 0 || iy >= p.h as isize {
                row.fill(0.0);
                continue;
            }
            let src = &x[iy as usize * p.w..(iy as usize + 1) * p.w];
            // Columns `col` read input column `col·sw + b - pl`: valid for [lo, hi).
            let lo = p.pl.saturating_sub(b).div_ceil(p.sw).min(self.wq);
            let hi = ((p.w + p.pl).saturating_sub(b).div_ceil(p.sw)).clamp(lo, self.wq);
            row[..lo].fill(0.0);
            row[hi..].fill(0.0);
            if hi == lo {
                continue;
            }
            copy_strided(&mut row[lo..hi], &src[lo * p.sw + b - p.pl..], p.sw);
        }
    }
}

/// `out = act(conv(input, filter) + bias + residual)` for a convolution that [`applies`];
/// `scratch` receives the batch's phase planes.
pub fn direct_conv(
    p: &Conv2d,
    input: &[f32],
    filter: &PackedFilter,
    epi: Epilogue<'_>,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
    threads: usize,
) {
    assert!(applies(p), "direct_conv on {p:?}");
    assert!(filter.fits(p), "direct_conv filter {filter:?} for {p:?}");
    let (in_plane, out_plane) = (p.h * p.w, p.oh * p.ow);
    assert_eq!(input.len(), p.n * p.c * in_plane, "direct_conv input size");
    assert_eq!(out.len(), p.n * p.m * out_plane, "direct_conv output size");
    if let Some(r) = epi.residual {
        assert_eq!(r.len(), out.len(), "direct_conv residual size");
    }
    let pl = Planes::new(p);
    // Images at a time: their phase planes (about the size of their input) within a bound.
    let group = (SCRATCH_BYTES / (p.c * pl.channel * 4).max(1)).clamp(1, p.n);
    let group = if group >= threads {
        group / threads * threads
    } else {
        group
    };
    for n0 in (0..p.n).step_by(group) {
        let n1 = (n0 + group).min(p.n);
        let part = Conv2d { n: n1 - n0, ..*p };
        let epi = Epilogue {
            residual: epi
                .residual
                .map(|r| &r[n0 * p.m * out_plane..n1 * p.m * out_plane]),
            ..epi
        };
        images(
            &part,
            &pl,
            &input[n0 * p.c * in_plane..n1 * p.c * in_plane],
            filter,
            epi,
            &mut out[n0 * p.m * out_plane..n1 * p.m * out_plane],
            scratch,
            threads,
        );
    }
}

/// Most bytes of phase planes `direct_conv` holds at once.
const SCRATCH_BYTES: usize = 16 << 20;

/// `direct_conv` on images whose phase planes all fit in `scratch`.
#[allow(clippy::too_many_arguments)]
fn images(
    p: &Conv2d,
    pl: &Planes,
    input: &[f32],
    filter: &PackedFilter,
    epi: Epilogue<'_>,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
    threads: usize,
) {
    let (in_plane, out_plane) = (p.h * p.w, p.oh * p.ow);
    let scratch = scratch_of(scratch, p.n * p.c * pl.channel);
    let parallel =
        threads > 1 && p.n * p.m * out_plane * p.c * pl.taps.len() >= crate::PAR_MIN_WORK;
    let phases = p.sh * p.sw;
    let fill = |(i, dst): (usize, &mut [f32])| {
        let ch = i / phases;
        pl.fill(
            p,
            &input[ch * in_plane..(ch + 1) * in_plane],
            i % phases,
            dst,
        )
    };
    if parallel {
        scratch.par_chunks_mut(pl.plane).enumerate().for_each(fill);
    } else {
        scratch.chunks_mut(pl.plane).enumerate().for_each(fill);
    }
    let blocks = p.m.div_ceil(R);
    let (chunks, oc_chunks) = split(p, pl, threads);
    let per_chunk = pl.vectors.div_ceil(chunks);
    let per_oc_chunk = blocks.div_ceil(oc_chunks);
    let dst = SharedOut(out.as_mut_ptr());
    let planes = &scratch[..];
    let taps = pl.taps.len();
    let finish = Finish::of(epi.act);
    // A task is one image's pixel chunk × a range of channel blocks: per block, its tiles sweep
    // the chunk, whose phase planes stay in cache while the blocks' weights stream past.
    let task = |t: usize| {
        let (ni, ch, oc) = (
            t / (chunks * oc_chunks),
            (t / oc_chunks) % chunks,
            t % oc_chunks,
        );
        let x = &planes[ni * p.c * pl.channel..(ni + 1) * p.c * pl.channel];
        let (va, vb) = (ch * per_chunk, ((ch + 1) * per_chunk).min(pl.vectors));
        for ob in oc * per_oc_chunk..((oc + 1) * per_oc_chunk).min(blocks) {
            let w = &filter.data[ob * p.c * taps * R..(ob + 1) * p.c * taps * R];
            let o0 = ob * R;
            let rows = R.min(p.m - o0);
            let bias: [f32; R] = std::array::from_fn(|r| match epi.bias {
                Some(b) if r < rows => b[o0 + r],
                _ => 0.0,
            });
            let base = (ni * p.m + o0) * out_plane;
            let out = Out {
                at: dst.at(base),
                residual: epi.residual.map(|r| r[base..].as_ptr()),
                finish,
                rows,
            };
            let mut v0 = va;
            while v0 < vb {
                let nv = V.min(vb - v0);
                // SAFETY: `x` holds the image's phase planes, whose slack covers every
                // vector's reads; `w` is this block's weights; the stores go to this task's
                // channels and pixels.
                unsafe { block(p, pl, x, w, &bias, v0 * LANES, nv, &out) };
                if let Finish::Other(act) = finish {
                    let (a, b) = (
                        pl.out_index(p, v0 * LANES),
                        pl.out_index(p, (v0 + nv) * LANES),
                    );
                    for r in 0..rows {
                        let at = base + r * out_plane + a;
                        // SAFETY: this task's channel `o0 + r`, elements [a, b) just written.
                        let o = unsafe { std::slice::from_raw_parts_mut(dst.at(at), b - a) };
                        bias_act(o, None, Some(act));
                    }
                }
                v0 += nv;
            }
        }
    };
    let tasks = p.n * chunks * oc_chunks;
    if parallel {
        (0..tasks).into_par_iter().for_each(task);
    } else {
        (0..tasks).for_each(task);
    }
}

/// Bytes of one image's phase planes a task keeps in cache while its channel blocks sweep them.
const CHUNK_BYTES: usize = 384 << 10;

/// How the work is cut: (pixel chunks per image, channel-block ranges per chunk). Where an
/// image's input outweighs the weights (large images, few channels), the threads split its
/// pixels, in chunks whose input stays in cache; otherwise they split the channel blocks (each
/// thread then reads only its share of the weights).
fn split(p: &Conv2d, pl: &Planes, threads: usize) -> (usize, usize) {
    let input = p.c * pl.channel * 4;
    let weights = p.m * p.c * pl.taps.len() * 4;
    let spread = if p.n.is_multiple_of(threads) {
        1
    } else {
        threads
    };
    if input > weights {
        let chunks = input.div_ceil(CHUNK_BYTES).next_multiple_of(spread);
        (chunks.min(pl.vectors.div_ceil(V)), 1)
    } else {
        (1, spread.min(p.m.div_ceil(R)))
    }
}

/// Where a tile's results go: the first of its `rows` output channels in this image, the
/// residual at the same place (if any), and what the tile applies on the way out (a clamp; any
/// other activation is applied afterwards).
#[derive(Clone, Copy)]
struct Out {
    at: *mut f32,
    residual: Option<*const f32>,
    finish: Finish,
    rows: usize,
}

/// One register tile: `nv ≤ V` vectors from flat pixel `q0`, the block's (up to) `R` channels.
///
/// # Safety
/// As in `direct_conv`'s task: `x` and `w` cover the tile's reads, and `out` this task's block.
#[allow(clippy::too_many_arguments)]
unsafe fn block(
    p: &Conv2d,
    pl: &Planes,
    x: &[f32],
    w: &[f32],
    bias: &[f32; R],
    q0: usize,
    nv: usize,
    out: &Out,
) {
    // SAFETY: forwarded; `applies` checked AVX-512.
    unsafe {
        match nv {
            3 => tile::<3>(p, pl, x, w, bias, q0, out),
            2 => tile::<2>(p, pl, x, w, bias, q0, out),
            _ => tile::<1>(p, pl, x, w, bias, q0, out),
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const NV: usize>(
    p: &Conv2d,
    pl: &Planes,
    x: &[f32],
    w: &[f32],
    bias: &[f32; R],
    q0: usize,
    out: &Out,
) {
    use std::arch::x86_64::*;
    // SAFETY: the caller guarantees the bounds (see `direct_conv`) and AVX-512.
    unsafe {
        let mut acc: [[__m512; NV]; R] = std::array::from_fn(|r| [_mm512_set1_ps(bias[r]); NV]);
        let mut wp = w.as_ptr();
        let xs = x.as_ptr().add(q0);
        for ci in 0..p.c {
            let xc = xs.add(ci * pl.channel);
            // What this tile reads of the input channel after next, fetched while this one
            // computes (the tiles sweep every channel, too much for the L1 cache).
            let next = xc.wrapping_add(2 * pl.channel);
            for &(start, span) in pl.spans.iter().filter(|_| ci + 2 < p.c) {
                for off in (start..start + span + NV * LANES).step_by(LANES) {
                    _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(off) as *const i8);
                }
            }
            for &t in &pl.taps {
                // The weights are read once per tile, often straight from memory (resnet50's
                // 7x7 layers: 9.4 MiB per layer, 49 pixels): fetch them well ahead.
                _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH) as *const i8);
                let xt = xc.add(t);
                let v: [__m512; NV] = std::array::from_fn(|j| _mm512_loadu_ps(xt.add(j * LANES)));
                for row in acc.iter_mut() {
                    let b = _mm512_set1_ps(*wp);
                    wp = wp.add(1);
                    for (a, v) in row.iter_mut().zip(&v) {
                        *a = _mm512_fmadd_ps(b, *v, *a);
                    }
                }
            }
        }
        store(p, pl, acc, q0, out);
    }
}

/// Stores a tile's sums (`acc`, vectors from flat pixel `q0`) into their output rows: the
/// residual added and the clamp applied on the way, the lanes past each row's end left out.
/// Kept out of `tile`, and handed the sums by value, so that the accumulators stay in registers
/// there (indexed in place, LLVM kept a copy in memory in step with every multiply-add).
///
/// # Safety
/// As for `tile`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline(never)]
unsafe fn store<const NV: usize>(
    p: &Conv2d,
    pl: &Planes,
    acc: [[std::arch::x86_64::__m512; NV]; R],
    q0: usize,
    out: &Out,
) {
    use std::arch::x86_64::*;
    // SAFETY: the caller guarantees the bounds (see `direct_conv`) and AVX-512.
    unsafe {
        let plane = (p.oh * p.ow) as isize;
        for (j, _) in acc[0].iter().enumerate() {
            let qv = q0 + j * LANES;
            let mut y = qv / pl.wq;
            while y < p.oh && y * pl.wq < qv + LANES {
                let lo = (y * pl.wq).max(qv) - qv;
                let hi = (y * pl.wq + p.ow).min(qv + LANES).saturating_sub(qv);
                if hi > lo {
                    let mask: __mmask16 = (((1u32 << hi) - 1) & !((1u32 << lo) - 1)) as u16;
                    let shift = (y * p.ow) as isize - (y * pl.wq) as isize + qv as isize;
                    for (r, row) in acc.iter().enumerate().take(out.rows) {
                        let at = r as isize * plane + shift;
                        let mut v = row[j];
                        if let Some(res) = out.residual {
                            let r = _mm512_maskz_loadu_ps(mask, res.wrapping_offset(at));
                            v = _mm512_add_ps(v, r);
                        }
                        if let Finish::Clamp(lo, hi) = out.finish {
                            v = _mm512_max_ps(v, _mm512_set1_ps(lo));
                            v = _mm512_min_ps(v, _mm512_set1_ps(hi));
                        }
                        _mm512_mask_storeu_ps(out.at.wrapping_offset(at), mask, v);
                    }
                }
                y += 1;
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const NV: usize>(
    _: &Conv2d,
    _: &Planes,
    _: &[f32],
    _: &[f32],
    _: &[f32; R],
    _: usize,
    _: &Out,
) {
    unreachable!("direct_conv needs AVX-512")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activation::Activation;
    use crate::conv::conv2d_reference;
    use crate::gemm::lcg;

    /// n, c, h, w, m, kh, kw, sh, sw, top, left, bottom, right padding
    const CASES: [[usize; 13]; 13] = [
        // resnet's 3x3 layers, stride 1 and 2, odd sizes
        [2, 16, 14, 13, 20, 3, 3, 1, 1, 1, 1, 1, 1],
        [1, 5, 15, 16, 9, 3, 3, 2, 2, 1, 1, 1, 1],
        // the 7x7 stride-2 stem
        [1, 3, 30, 29, 10, 7, 7, 2, 2, 3, 3, 3, 3],
        // 5x5 with uneven padding on every side
        [2, 4, 11, 9, 7, 5, 5, 1, 1, 2, 1, 0, 3],
        // 1x3 and 3x1 kernels, different strides per axis
        [1, 6, 9, 12, 5, 1, 3, 1, 2, 0, 1, 0, 1],
        [3, 2, 10, 7, 3, 3, 1, 2, 1, 1, 0, 1, 0],
        // stride larger than the kernel, no padding
        [1, 3, 13, 14, 4, 2, 2, 3, 3, 0, 0, 0, 0],
        // padding wider than the kernel: whole rows and columns of outputs in the padding
        [1, 2, 5, 6, 3, 3, 3, 1, 1, 4, 4, 4, 4],
        // a one-row image; one input and one output channel
        [2, 7, 1, 20, 9, 3, 3, 1, 1, 1, 1, 1, 1],
        [1, 1, 8, 8, 1, 3, 3, 1, 1, 1, 1, 1, 1],
        // an input larger than one chunk of cache: the pixels are split
        [1, 24, 72, 70, 8, 3, 3, 1, 1, 1, 1, 1, 1],
        // weights larger than the input, channels not a multiple of the register tile
        [1, 64, 7, 7, 44, 3, 3, 1, 1, 1, 1, 1, 1],
        // a batch whose phase planes exceed the scratch bound: run in groups of images
        [4, 32, 190, 190, 2, 3, 3, 1, 1, 1, 1, 1, 1],
    ];

    fn geometry(&[n, c, h, w, m, kh, kw, sh, sw, pt, pl, pb, pr]: &[usize; 13]) -> Conv2d {
        Conv2d {
            n,
            c,
            h,
            w,
            m,
            kh,
            kw,
            sh,
            sw,
            dh: 1,
            dw: 1,
            pt,
            pl,
            oh: (h + pt + pb - kh) / sh + 1,
            ow: (w + pl + pr - kw) / sw + 1,
            groups: 1,
        }
    }

    struct Operands {
        x: Vec<f32>,
        w: Vec<f32>,
        bias: Vec<f32>,
        residual: Vec<f32>,
    }

    impl Operands {
        fn new(p: &Conv2d) -> Operands {
            Operands {
                x: lcg(1, p.n * p.c * p.h * p.w),
                w: lcg(2, p.m * p.c * p.kh * p.kw),
                bias: lcg(3, p.m),
                residual: lcg(4, p.n * p.m * p.oh * p.ow),
            }
        }

        fn run(&self, p: &Conv2d, epi: Epilogue<'_>, threads: usize) -> Vec<f32> {
            let f = PackedFilter::new(&self.w, p.m, p.c, p.kh, p.kw);
            // Poisoned: every element must be written.
            let mut out = vec![f32::NAN; p.n * p.m * p.oh * p.ow];
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build();
            pool.expect("pool")
                .install(|| direct_conv(p, &self.x, &f, epi, &mut out, &mut Vec::new(), threads));
            out
        }
    }

    /// On a CPU without AVX-512 the direct convolution never runs (the callers take the im2col
    /// path), which is all these tests can check there.
    fn runs_here(p: &Conv2d) -> bool {
        let here = applies(p);
        assert_eq!(here, crate::avx512f());
        here
    }

    #[test]
    fn matches_reference() {
        let acts = [None, Some(Activation::Relu), Some(Activation::HardSwish)];
        for (i, case) in CASES.iter().enumerate() {
            let p = geometry(case);
            if !runs_here(&p) {
                continue;
            }
            let o = Operands::new(&p);
            let (bias, residual) = (i % 2 == 0, i % 3 == 0);
            let act = acts[i % 3];
            let mut want = vec![0.0; o.residual.len()];
            conv2d_reference(&p, &o.x, &o.w, bias.then_some(&o.bias[..]), &mut want);
            for (j, v) in want.iter_mut().enumerate() {
                *v += if residual { o.residual[j] } else { 0.0 };
                *v = act.map_or(*v, |a| a.apply(*v));
            }
            let epi = Epilogue {
                bias: bias.then_some(&o.bias),
                residual: residual.then_some(&o.residual),
                act,
            };
            for threads in [1, 2, 3] {
                let got = o.run(&p, epi, threads);
                for (g, r) in got.iter().zip(&want) {
                    assert!(
                        (g - r).abs() <= 1e-4 * (1.0 + r.abs()),
                        "case {i} {p:?} threads {threads}: {g} vs {r}"
                    );
                }
            }
        }
    }

    /// Every output is summed in the same order whatever the thread budget, and an image's
    /// outputs do not depend on the other images of its batch.
    #[test]
    fn outputs_do_not_depend_on_threads_or_batch() {
        for case in &CASES {
            let p = geometry(case);
            if !runs_here(&p) {
                continue;
            }
            let o = Operands::new(&p);
            let epi = Epilogue {
                bias: Some(&o.bias),
                residual: Some(&o.residual),
                act: Some(Activation::Relu),
            };
            let one = o.run(&p, epi, 1);
            for threads in [2, 3, 4] {
                assert!(o.run(&p, epi, threads) == one, "{p:?} on {threads} threads");
            }
            // The last image alone.
            let last = Conv2d { n: 1, ..p };
            let (per_in, per_out) = (p.c * p.h * p.w, p.m * p.oh * p.ow);
            let alone = Operands {
                x: o.x[(p.n - 1) * per_in..].to_vec(),
                w: o.w.clone(),
                bias: o.bias.clone(),
                residual: o.residual[(p.n - 1) * per_out..].to_vec(),
            };
            let epi = Epilogue {
                bias: Some(&alone.bias),
                residual: Some(&alone.residual),
                ..epi
            };
            assert!(
                alone.run(&last, epi, 2)[..] == one[(p.n - 1) * per_out..],
                "{p:?}: the last image alone"
            );
        }
    }
}
