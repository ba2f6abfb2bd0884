//! Depthwise 2-D convolution (one filter per channel, NCHW): a direct kernel, since each output
//! plane is a small stencil over one input plane and a matrix product would be mostly padding.
//!
//! Per (image, channel) plane the input is first copied once into a zero-padded buffer split by
//! stride phase: with strides `sh`×`sw` it holds `sh*sw` sub-planes, sub-plane `(a, b)` holding
//! padded rows `a, a+sh, ...` and columns `b, b+sw, ...`, all with the same row length `L`. Then
//! output `(oy, ox)` of tap `(ki, kj)` reads one sub-plane at `(oy + ki*dh/sh) * L + ox + kj*dw/sw`,
//! so with the output laid out flat with row length `L` too, every tap is a fixed offset into the
//! buffer and the whole plane is one long bounds-free stencil loop, at any stride, dilation and
//! padding, with no per-row setup (which dominates on the 7x7 and 14x14 planes). Each output
//! vector accumulates all taps in registers in one pass (AVX2/FMA when the CPU has it, detected at
//! run time; a portable loop otherwise); the valid `ow` columns of each row then leave with the
//! fused activation. Planes are split across the thread budget.

use crate::activation::{Activation, Finish};
use crate::conv::Conv2d;
use crate::depthwise_rows;
use rayon::prelude::*;
use std::cell::RefCell;

/// Lanes of the AVX2 kernels' vectors; the flat output is padded to a multiple of it.
const LANES: usize = 8;
/// Zero floats after each sub-plane's last row, for the widest vector's over-reach
/// (`depthwise_rows` reads 16 floats).
const SLACK: usize = 16;

/// What the input plane still needs before the convolution reads it: the producing 1x1
/// convolution's bias and activation, applied as the plane is copied into the phase-split buffer
/// (so the fused kernels make no separate pass over their expanded planes for it).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Pre {
    pub(crate) bias: Option<f32>,
    pub(crate) act: Option<Activation>,
}

impl Pre {
    /// The same for the AVX-512 copies, where the activation is a clamp (or none).
    fn prep(self) -> Option<depthwise_rows::Prep> {
        let clamp = match self.act.map(|a| Finish::of(Some(a))) {
            None => None,
            Some(Finish::Clamp(lo, hi)) => Some((lo, hi)),
            Some(_) => return None,
        };
        Some(depthwise_rows::Prep {
            bias: self.bias,
            clamp,
        })
    }
}

/// The phase-split buffer's geometry and the taps as offsets into it, derived once per call.
#[derive(Clone, Debug, PartialEq)]
struct Layout {
    /// Row length of every sub-plane and of the flat output.
    len: usize,
    /// Rows of every sub-plane.
    rows: usize,
    /// Floats of one sub-plane (with slack for the last vector's over-reach).
    sub: usize,
    /// Flat output length: `oh * len` rounded up to `LANES`.
    flat: usize,
    /// Buffer offset of each tap, in weight order.
    taps: Vec<usize>,
    /// Per column phase `b`: the first input column landing in it, its column in the sub-plane
    /// and how many input columns land there (every `sw`-th).
    runs: Vec<(usize, usize, usize)>,
    /// What the copy depends on besides the layout (`h, w, pt, pl, sh, sw`): buffers split for
    /// an equal layout have their zero padding in the same places.
    key: [usize; 6],
}

impl Layout {
    fn new(p: &Conv2d) -> Layout {
        let col_reach = (p.kw - 1) * p.dw / p.sw;
        let row_reach = (p.kh - 1) * p.dh / p.sh;
        let len = p.ow + col_reach;
        let rows = p.oh + row_reach;
        let flat = (p.oh * len).next_multiple_of(LANES);
        // The last vector reads up to flat - 1 + row_reach*len + col_reach.
        let sub = rows * len + col_reach + SLACK;
        let mut taps = Vec::with_capacity(p.kh * p.kw);
        for ki in 0..p.kh {
            for kj in 0..p.kw {
                let (oi, oj) = (ki * p.dh, kj * p.dw);
                let phase = (oi % p.sh) * p.sw + oj % p.sw;
                taps.push(phase * sub + (oi / p.sh) * len + oj / p.sw);
            }
        }
        let runs = (0..p.sw)
            .map(|b| {
                // Input columns ix0, ix0 + sw, ... have padded column (ix + pl) in phase b.
                let ix0 = (b + p.sw - p.pl % p.sw) % p.sw;
                if ix0 >= p.w {
                    return (0, 0, 0);
                }
                let col0 = (ix0 + p.pl) / p.sw;
                let n = (p.w - ix0).div_ceil(p.sw).min(len.saturating_sub(col0));
                (ix0, col0, n)
            })
            .collect();
        Layout {
            len,
            rows,
            sub,
            flat,
            taps,
            runs,
            key: [p.h, p.w, p.pt, p.pl, p.sh, p.sw],
        }
    }
}

/// A task's reusable buffers.
#[derive(Default)]
struct Scratch {
    /// Phase-split, zero-padded input plane.
    buf: Vec<f32>,
    /// Flat output plane (row length `len`).
    flat: Vec<f32>,
    /// Layout `buf` was last split for: its padding is still zero.
    split_for: Option<Layout>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// `out[n, c] = act(depthwise(input[n, c], weight[c]) + bias[c])`, `weight` is `[c, 1, kh, kw]`.
/// Requires `p.groups == p.c == p.m`.
pub(crate) fn depthwise(
    p: &Conv2d,
    input: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    act: Option<Activation>,
    out: &mut [f32],
    threads: usize,
) {
    assert!(p.groups == p.c && p.m == p.c, "depthwise geometry");
    let (in_plane, out_plane) = (p.h * p.w, p.oh * p.ow);
    let kk = p.kh * p.kw;
    assert_eq!(input.len(), p.n * p.c * in_plane, "depthwise input size");
    assert_eq!(weight.len(), p.c * kk, "depthwise weight size");
    assert_eq!(out.len(), p.n * p.c * out_plane, "depthwise output size");
    if out_plane == 0 {
        return;
    }
    let k = PlaneKernel::new(p, act);
    let plane = |idx: usize, dst: &mut [f32]| {
        let ch = idx % p.c;
        let src = &input[idx * in_plane..(idx + 1) * in_plane];
        let w = &weight[ch * kk..(ch + 1) * kk];
        k.run(src, Pre::default(), w, bias.map_or(0.0, |b| b[ch]), dst);
    };
    let planes = p.n * p.c;
    if threads > 1 && planes > 1 && out.len() * kk >= crate::PAR_MIN_WORK {
        // Enough planes per task to amortise scheduling, and enough tasks to balance.
        let per_task = (planes / (threads * 8)).clamp(1, 64);
        out.par_chunks_mut(out_plane * per_task)
            .enumerate()
            .for_each(|(t, chunk)| {
                for (i, d) in chunk.chunks_mut(out_plane).enumerate() {
                    plane(t * per_task + i, d)
                }
            });
    } else {
        for (i, d) in out.chunks_mut(out_plane).enumerate() {
            plane(i, d)
        }
    }
}

/// One depthwise geometry, ready to run plane by plane (also from the fused pointwise →
/// depthwise kernel, whose input planes come from a scratch buffer).
pub(crate) struct PlaneKernel<'p> {
    p: &'p Conv2d,
    lay: Layout,
    epi: Finish,
    avx: bool,
    /// A 3x3 stencil at stride 1 or 2 that `depthwise_rows` runs on this CPU.
    rows: bool,
}

impl<'p> PlaneKernel<'p> {
    pub(crate) fn new(p: &'p Conv2d, act: Option<Activation>) -> PlaneKernel<'p> {
        let lay = Layout::new(p);
        let epi = Finish::of(act);
        let rows = (p.kh, p.kw, p.dh, p.dw) == (3, 3, 1, 1)
            && p.sh == p.sw
            && !matches!(epi, Finish::Other(_))
            && depthwise_rows::fits(p.sh, (p.oh, p.ow), lay.len, lay.sub, p.sh * p.sw * lay.sub)
            && crate::avx512f();
        PlaneKernel {
            p,
            lay,
            epi,
            avx: has_avx2_fma(),
            rows,
        }
    }

    /// Output plane `dst` (`oh*ow`) of input plane `src` (`h*w`, with `pre` still to apply)
    /// with the channel's `kh*kw` weights and bias.
    pub(crate) fn run(&self, src: &[f32], pre: Pre, w: &[f32], bias: f32, dst: &mut [f32]) {
        SCRATCH.with(|s| {
            plane_kernel(
                self.p,
                &self.lay,
                src,
                pre,
                w,
                bias,
                self.epi,
                (self.avx, self.rows),
                dst,
                &mut s.borrow_mut(),
            )
        });
    }
}

fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::activation::avx2_fma()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// One output plane from one input plane.
#[allow(clippy::too_many_arguments)]
fn plane_kernel(
    p: &Conv2d,
    lay: &Layout,
    src: &[f32],
    pre: Pre,
    w: &[f32],
    bias: f32,
    epi: Finish,
    (avx, rows): (bool, bool),
    dst: &mut [f32],
    s: &mut Scratch,
) {
    if s.split_for.as_ref() != Some(lay) {
        s.buf.clear();
        s.buf.resize(p.sh * p.sw * lay.sub, 0.0);
        s.flat.clear();
        s.flat.resize(lay.flat, 0.0);
        s.split_for = Some(lay.clone());
    }
    // Every tap reads buf[tap .. tap + flat]: in bounds by construction of `sub`, checked here
    // because the vector kernel relies on it.
    assert!(lay.taps.iter().all(|&t| t + lay.flat <= s.buf.len()) && s.flat.len() == lay.flat);
    #[cfg(target_arch = "x86_64")]
    if rows {
        // SAFETY: the CPU has AVX-512F (checked by `PlaneKernel::new`); the kernel asserts its
        // bounds.
        unsafe { plane_avx512(p, lay, src, pre, w, bias, epi, dst, &mut s.buf) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if avx {
        // SAFETY: the CPU has AVX2 and FMA (checked by the caller); bounds asserted above.
        unsafe { plane_avx2(p, lay, src, pre, w, bias, epi, dst, &mut s.buf, &mut s.flat) };
        return;
    }
    let _ = (avx, rows);
    split_plane(p, lay, src, pre, &mut s.buf);
    stencil(&s.buf, &lay.taps, w, bias, &mut s.flat);
    copy_out(p, lay, epi, &s.flat, dst);
}

/// `plane_kernel` for a 3x3 stencil at stride 1 or 2 on AVX-512 (`depthwise_rows`), compiled for
/// it so the copy into the padded plane is 16 wide too.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn plane_avx512(
    p: &Conv2d,
    lay: &Layout,
    src: &[f32],
    pre: Pre,
    w: &[f32],
    bias: f32,
    epi: Finish,
    dst: &mut [f32],
    buf: &mut [f32],
) {
    split_avx512(p, lay, src, pre, buf);
    let w = <&[f32; 9]>::try_from(w).expect("3x3 weights");
    let shape = (lay.len, lay.sub);
    // SAFETY (all four): the caller checked the CPU; the kernel asserts its bounds.
    match (p.sh, epi) {
        (1, Finish::Clamp(lo, hi)) => unsafe {
            depthwise_rows::rows3x3::<1, true>(buf, shape, w, bias, (lo, hi), p.ow, dst)
        },
        (1, _) => unsafe {
            depthwise_rows::rows3x3::<1, false>(buf, shape, w, bias, (0.0, 0.0), p.ow, dst)
        },
        (_, Finish::Clamp(lo, hi)) => unsafe {
            depthwise_rows::rows3x3::<2, true>(buf, shape, w, bias, (lo, hi), p.ow, dst)
        },
        _ => unsafe {
            depthwise_rows::rows3x3::<2, false>(buf, shape, w, bias, (0.0, 0.0), p.ow, dst)
        },
    }
}

/// `split_plane` with 16-wide copies where the producer's activation is a clamp (or none), at
/// stride 1 or 2; any other activation the portable way.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn split_avx512(p: &Conv2d, lay: &Layout, src: &[f32], pre: Pre, buf: &mut [f32]) {
    match pre.prep() {
        // Stride 1: input row iy is padded row iy + pt, its columns from pl on.
        Some(prep) if p.sh == 1 && p.sw == 1 => {
            let (_, col0, n) = lay.runs[0];
            for (t, row) in (p.pt..lay.rows).zip(src.chunks_exact(p.w)) {
                let at = t * lay.len + col0;
                // SAFETY: the caller checked the CPU.
                unsafe { depthwise_rows::copy_row(&row[..n], &mut buf[at..at + n], prep) };
            }
        }
        // Stride 2: input row iy is row (iy + pt) / 2 of the row phase (iy + pt) % 2; its even
        // columns go to the column phase that column 0 lands in (padded column pl), its odd
        // ones to the other.
        Some(prep) => {
            let b_even = p.pl % 2;
            let ((_, ecol, en), (_, ocol, on)) = (lay.runs[b_even], lay.runs[1 - b_even]);
            for (iy, row) in src.chunks_exact(p.w).enumerate() {
                let (t, a) = ((iy + p.pt) / 2, (iy + p.pt) % 2);
                if t >= lay.rows {
                    break;
                }
                let at = 2 * a * lay.sub + t * lay.len;
                let (phase0, phase1) = buf[at..].split_at_mut(lay.sub);
                let (evens, odds) = match b_even {
                    0 => (&mut phase0[ecol..ecol + en], &mut phase1[ocol..ocol + on]),
                    _ => (&mut phase1[ecol..ecol + en], &mut phase0[ocol..ocol + on]),
                };
                // SAFETY: the caller checked the CPU.
                unsafe { depthwise_rows::split_row(row, evens, odds, prep) };
            }
        }
        _ => split_plane(p, lay, src, pre, buf),
    }
}

/// `plane_kernel` compiled for AVX2: the copy loops vectorise 8 wide too.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn plane_avx2(
    p: &Conv2d,
    lay: &Layout,
    src: &[f32],
    pre: Pre,
    w: &[f32],
    bias: f32,
    epi: Finish,
    dst: &mut [f32],
    buf: &mut [f32],
    flat: &mut [f32],
) {
    split_plane(p, lay, src, pre, buf);
    let nine = (
        <&[usize; 9]>::try_from(&lay.taps[..]),
        <&[f32; 9]>::try_from(w),
    );
    // SAFETY (all three): the caller checked the CPU and the bounds.
    match (nine, epi) {
        ((Ok(taps), Ok(w)), Finish::None) => unsafe {
            stencil9_rows_avx2::<false>(buf, taps, w, bias, (0.0, 0.0), lay, p.ow, dst)
        },
        ((Ok(taps), Ok(w)), Finish::Clamp(lo, hi)) => unsafe {
            stencil9_rows_avx2::<true>(buf, taps, w, bias, (lo, hi), lay, p.ow, dst)
        },
        ((Ok(taps), Ok(w)), _) => {
            unsafe { stencil9_avx2(buf, taps, w, bias, flat) };
            copy_out(p, lay, epi, flat, dst);
        }
        _ => {
            unsafe { stencil_avx2(buf, &lay.taps, w, bias, flat) };
            copy_out(p, lay, epi, flat, dst);
        }
    }
}

/// The valid `ow` columns of each flat output row, with the fused activation.
#[inline(always)]
fn copy_out(p: &Conv2d, lay: &Layout, epi: Finish, flat: &[f32], dst: &mut [f32]) {
    for (d, s) in dst.chunks_exact_mut(p.ow).zip(flat.chunks(lay.len)) {
        let s = &s[..p.ow];
        match epi {
            Finish::Clamp(lo, hi) => d
                .iter_mut()
                .zip(s)
                .for_each(|(d, s)| *d = Activation::Clip(lo, hi).apply(*s)),
            Finish::None => d.copy_from_slice(s),
            Finish::Other(a) => d.iter_mut().zip(s).for_each(|(d, s)| *d = a.apply(*s)),
        }
    }
}

/// Copies one input plane into its phase-split buffer (see the module comment). Only the
/// positions input values land in are written; the rest is zero padding, the same for every
/// plane of a layout.
#[inline(always)]
fn split_plane(p: &Conv2d, lay: &Layout, src: &[f32], pre: Pre, buf: &mut [f32]) {
    // Each common case its own loop, so the copies stay vector loops (no call per row either).
    match (pre.bias, pre.act) {
        (None, None) => split_plane_with(p, lay, src, buf, |x| x),
        (Some(b), Some(Activation::Clip(lo, hi))) => {
            split_plane_with(p, lay, src, buf, |x| Activation::Clip(lo, hi).apply(x + b))
        }
        (Some(b), Some(Activation::Relu)) => {
            split_plane_with(p, lay, src, buf, |x| Activation::Relu.apply(x + b))
        }
        (b, act) => split_plane_with(p, lay, src, buf, |x| {
            let x = b.map_or(x, |b| x + b);
            act.map_or(x, |a| a.apply(x))
        }),
    }
}

/// `split_plane` with `f` applied to every value copied.
#[inline(always)]
fn split_plane_with(
    p: &Conv2d,
    lay: &Layout,
    src: &[f32],
    buf: &mut [f32],
    f: impl Fn(f32) -> f32,
) {
    // Padded row y = iy + pt is row t = y / sh of row phase a = y % sh.
    let (mut t, mut a) = (p.pt / p.sh, p.pt % p.sh);
    for row in src.chunks_exact(p.w) {
        if t >= lay.rows {
            break;
        }
        for (b, &(ix0, col0, n)) in lay.runs.iter().enumerate() {
            let at = (a * p.sw + b) * lay.sub + t * lay.len + col0;
            let dst = &mut buf[at..at + n];
            match p.sw {
                1 => dst
                    .iter_mut()
                    .zip(&row[ix0..ix0 + n])
                    .for_each(|(d, s)| *d = f(*s)),
                2 => {
                    // Pairs, so the loop vectorises (a de-interleaving shuffle).
                    let src = &row[ix0..];
                    let full = (src.len() / 2).min(n);
                    for (d, pair) in dst[..full].iter_mut().zip(src.chunks_exact(2)) {
                        *d = f(pair[0]);
                    }
                    if full < n {
                        dst[full] = f(src[2 * full]);
                    }
                }
                sw => dst
                    .iter_mut()
                    .zip(row[ix0..].iter().step_by(sw))
                    .for_each(|(d, s)| *d = f(*s)),
            }
        }
        a += 1;
        if a == p.sh {
            a = 0;
            t += 1;
        }
    }
}

/// `flat[q] = bias + sum_t w[t] * buf[taps[t] + q]`, portable.
fn stencil(buf: &[f32], taps: &[usize], w: &[f32], bias: f32, flat: &mut [f32]) {
    const BLOCK: usize = 64;
    for (bi, acc) in flat.chunks_mut(BLOCK).enumerate() {
        let q0 = bi * BLOCK;
        acc.fill(bias);
        for (&t, &wv) in taps.iter().zip(w) {
            let src = &buf[t + q0..t + q0 + acc.len()];
            acc.iter_mut().zip(src).for_each(|(a, x)| *a += wv * x);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn stencil_avx2(buf: &[f32], taps: &[usize], w: &[f32], bias: f32, flat: &mut [f32]) {
    use std::arch::x86_64::*;
    debug_assert!(flat.len().is_multiple_of(LANES));
    let vb = _mm256_set1_ps(bias);
    let base = buf.as_ptr();
    let dp = flat.as_mut_ptr();
    let n = flat.len();
    let mut q = 0;
    // Four vectors per pass: one weight broadcast feeds four independent FMA chains.
    while q + 4 * LANES <= n {
        let (mut a0, mut a1, mut a2, mut a3) = (vb, vb, vb, vb);
        for (&t, &wv) in taps.iter().zip(w) {
            let wv = _mm256_set1_ps(wv);
            // SAFETY: t + q + 4*LANES <= t + n <= buf.len() (asserted by the caller).
            unsafe {
                let s = base.add(t + q);
                a0 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(s), a0);
                a1 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(s.add(LANES)), a1);
                a2 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(s.add(2 * LANES)), a2);
                a3 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(s.add(3 * LANES)), a3);
            }
        }
        // SAFETY: q + 4*LANES <= n = flat.len().
        unsafe {
            _mm256_storeu_ps(dp.add(q), a0);
            _mm256_storeu_ps(dp.add(q + LANES), a1);
            _mm256_storeu_ps(dp.add(q + 2 * LANES), a2);
            _mm256_storeu_ps(dp.add(q + 3 * LANES), a3);
        }
        q += 4 * LANES;
    }
    while q < n {
        let mut a0 = vb;
        for (&t, &wv) in taps.iter().zip(w) {
            // SAFETY: as above, n is a multiple of LANES.
            unsafe {
                a0 = _mm256_fmadd_ps(_mm256_set1_ps(wv), _mm256_loadu_ps(base.add(t + q)), a0);
            }
        }
        // SAFETY: q + LANES <= n.
        unsafe { _mm256_storeu_ps(dp.add(q), a0) };
        q += LANES;
    }
}

/// `stencil_avx2` for a 3x3 filter, the common case: the nine weights stay in registers and
/// the tap offsets in locals, so the loop is loads and FMAs only.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn stencil9_avx2(buf: &[f32], taps: &[usize; 9], w: &[f32; 9], bias: f32, flat: &mut [f32]) {
    use std::arch::x86_64::*;
    debug_assert!(flat.len().is_multiple_of(LANES));
    let vb = _mm256_set1_ps(bias);
    let wv: [__m256; 9] = std::array::from_fn(|t| _mm256_set1_ps(w[t]));
    let src: [*const f32; 9] = std::array::from_fn(|t| buf.as_ptr().wrapping_add(taps[t]));
    let dp = flat.as_mut_ptr();
    let n = flat.len();
    let mut q = 0;
    while q + 2 * LANES <= n {
        let (mut a0, mut a1) = (vb, vb);
        for t in 0..9 {
            // SAFETY: taps[t] + q + 2*LANES <= taps[t] + n <= buf.len() (asserted by the caller).
            unsafe {
                let s = src[t].add(q);
                a0 = _mm256_fmadd_ps(wv[t], _mm256_loadu_ps(s), a0);
                a1 = _mm256_fmadd_ps(wv[t], _mm256_loadu_ps(s.add(LANES)), a1);
            }
        }
        // SAFETY: q + 2*LANES <= n = flat.len().
        unsafe {
            _mm256_storeu_ps(dp.add(q), a0);
            _mm256_storeu_ps(dp.add(q + LANES), a1);
        }
        q += 2 * LANES;
    }
    if q < n {
        let mut a0 = vb;
        for t in 0..9 {
            // SAFETY: as above; n is a multiple of LANES, so one vector remains.
            unsafe { a0 = _mm256_fmadd_ps(wv[t], _mm256_loadu_ps(src[t].add(q)), a0) };
        }
        // SAFETY: q + LANES == n.
        unsafe { _mm256_storeu_ps(dp.add(q), a0) };
    }
}

/// `stencil9_avx2` straight into the output rows (`dst`, `ow` wide), clamped in registers
/// with `CLAMP`: no flat buffer and no pass copying it out. Each output's chain of FMAs is the
/// one `stencil9_avx2` computes, and the clamp is `Activation::Clip`'s (max, then min).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn stencil9_rows_avx2<const CLAMP: bool>(
    buf: &[f32],
    taps: &[usize; 9],
    w: &[f32; 9],
    bias: f32,
    (lo, hi): (f32, f32),
    lay: &Layout,
    ow: usize,
    dst: &mut [f32],
) {
    use std::arch::x86_64::*;
    if dst.is_empty() {
        return;
    }
    assert!(
        ow > 0 && dst.len().is_multiple_of(ow),
        "stencil9_rows_avx2 rows"
    );
    let oh = dst.len() / ow;
    // A row's last vector reads past its `ow` columns, at most to (oh-1)*len + ow + 7; `sub`
    // leaves room for that after every tap (see `Layout::new`).
    let reach = taps.iter().max().copied().unwrap_or(0) + (oh - 1) * lay.len + ow + LANES;
    assert!(reach <= buf.len(), "stencil9_rows_avx2 bounds");
    let vb = _mm256_set1_ps(bias);
    let (vlo, vhi) = (_mm256_set1_ps(lo), _mm256_set1_ps(hi));
    let wv: [__m256; 9] = std::array::from_fn(|t| _mm256_set1_ps(w[t]));
    let src: [*const f32; 9] = std::array::from_fn(|t| buf.as_ptr().wrapping_add(taps[t]));
    let rem = ow % LANES;
    let tail = _mm256_setr_epi32(
        -((rem > 0) as i32),
        -((rem > 1) as i32),
        -((rem > 2) as i32),
        -((rem > 3) as i32),
        -((rem > 4) as i32),
        -((rem > 5) as i32),
        -((rem > 6) as i32),
        0,
    );
    let vector = |q: usize| {
        let mut a = vb;
        for t in 0..9 {
            // SAFETY: q + LANES <= reach - taps[t] (asserted above).
            unsafe { a = _mm256_fmadd_ps(wv[t], _mm256_loadu_ps(src[t].add(q)), a) };
        }
        if CLAMP {
            _mm256_min_ps(_mm256_max_ps(a, vlo), vhi)
        } else {
            a
        }
    };
    for (oy, row) in dst.chunks_exact_mut(ow).enumerate() {
        let q0 = oy * lay.len;
        let mut x = 0;
        while x + LANES <= ow {
            // SAFETY: x + LANES <= ow = row.len().
            unsafe { _mm256_storeu_ps(row.as_mut_ptr().add(x), vector(q0 + x)) };
            x += LANES;
        }
        if rem > 0 {
            // SAFETY: the mask writes only lanes x..ow of the row.
            unsafe { _mm256_maskstore_ps(row.as_mut_ptr().add(x), tail, vector(q0 + x)) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::conv2d_reference;
    use crate::gemm::lcg;

    #[allow(clippy::too_many_arguments)]
    fn geom(
        n: usize,
        c: usize,
        (h, w): (usize, usize),
        (kh, kw): (usize, usize),
        (sh, sw): (usize, usize),
        (dh, dw): (usize, usize),
        // top, left, bottom, right
        pads: [usize; 4],
    ) -> Conv2d {
        Conv2d {
            n,
            c,
            h,
            w,
            m: c,
            kh,
            kw,
            sh,
            sw,
            dh,
            dw,
            pt: pads[0],
            pl: pads[1],
            oh: (h + pads[0] + pads[2] - dh * (kh - 1) - 1) / sh + 1,
            ow: (w + pads[1] + pads[3] - dw * (kw - 1) - 1) / sw + 1,
            groups: c,
        }
    }

    fn check(p: &Conv2d, act: Option<Activation>, with_bias: bool, avx: bool, threads: usize) {
        let x = lcg(1, p.n * p.c * p.h * p.w);
        let w = lcg(2, p.c * p.kh * p.kw);
        let b = lcg(3, p.c);
        let bias = with_bias.then_some(&b[..]);
        let mut want = vec![0.0; p.n * p.c * p.oh * p.ow];
        conv2d_reference(p, &x, &w, bias, &mut want);
        if let Some(a) = act {
            want.iter_mut().for_each(|v| *v = a.apply(*v));
        }
        // Poison the output: every element must be written.
        let mut got = vec![f32::NAN; want.len()];
        if avx {
            depthwise(p, &x, &w, bias, act, &mut got, threads);
        } else {
            // The portable path, whatever the CPU.
            let lay = Layout::new(p);
            let (ip, op) = (p.h * p.w, p.oh * p.ow);
            let kk = p.kh * p.kw;
            let mut scratch = Scratch::default();
            for (i, d) in got.chunks_mut(op).enumerate() {
                let ch = i % p.c;
                plane_kernel(
                    p,
                    &lay,
                    &x[i * ip..(i + 1) * ip],
                    Pre::default(),
                    &w[ch * kk..(ch + 1) * kk],
                    bias.map_or(0.0, |b| b[ch]),
                    Finish::of(act),
                    (false, false),
                    d,
                    &mut scratch,
                );
            }
        }
        for (i, (g, r)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - r).abs() <= 1e-5 * (1.0 + r.abs()),
                "{p:?} act {act:?} bias {with_bias} avx {avx}: [{i}] {g} vs {r}"
            );
        }
    }

    #[test]
    fn matches_reference_over_strides_pads_dilations_and_sizes() {
        let cases = [
            // mobilenet-like 3x3, stride 1 and 2, pad 1
            geom(1, 3, (8, 8), (3, 3), (1, 1), (1, 1), [1, 1, 1, 1]),
            geom(2, 5, (7, 7), (3, 3), (1, 1), (1, 1), [1, 1, 1, 1]),
            geom(2, 4, (14, 14), (3, 3), (2, 2), (1, 1), [1, 1, 1, 1]),
            geom(1, 3, (15, 13), (3, 3), (2, 2), (1, 1), [1, 1, 1, 1]),
            geom(1, 2, (56, 56), (3, 3), (1, 1), (1, 1), [1, 1, 1, 1]),
            geom(1, 2, (113, 111), (3, 3), (2, 2), (1, 1), [1, 1, 1, 1]),
            // no padding, asymmetric padding, padding larger than the kernel reach
            geom(1, 3, (9, 10), (3, 3), (1, 1), (1, 1), [0, 0, 0, 0]),
            geom(1, 3, (9, 10), (3, 3), (2, 2), (1, 1), [0, 1, 1, 0]),
            geom(1, 2, (6, 5), (3, 3), (1, 1), (1, 1), [3, 4, 2, 5]),
            // 5x5, non-square kernels, unequal strides, dilation
            geom(1, 3, (17, 19), (5, 5), (1, 1), (1, 1), [2, 2, 2, 2]),
            geom(1, 3, (17, 19), (5, 5), (2, 2), (1, 1), [2, 2, 2, 2]),
            geom(1, 3, (11, 12), (1, 3), (1, 2), (1, 1), [0, 1, 0, 1]),
            geom(1, 3, (12, 11), (3, 1), (2, 1), (1, 1), [1, 0, 1, 0]),
            geom(1, 3, (16, 16), (3, 3), (1, 1), (2, 2), [2, 2, 2, 2]),
            geom(1, 3, (16, 17), (3, 3), (2, 3), (3, 2), [1, 2, 3, 0]),
            geom(1, 2, (20, 20), (3, 3), (3, 3), (1, 1), [1, 1, 1, 1]),
            // 1x1 depthwise (a per-channel scale), a single output pixel, 1-D (height 1)
            geom(1, 4, (5, 6), (1, 1), (1, 1), (1, 1), [0, 0, 0, 0]),
            geom(1, 4, (3, 3), (3, 3), (1, 1), (1, 1), [0, 0, 0, 0]),
            geom(3, 4, (1, 37), (1, 5), (1, 2), (1, 1), [0, 2, 0, 2]),
            // many planes across threads, batch > 1
            geom(4, 40, (10, 9), (3, 3), (1, 1), (1, 1), [1, 1, 1, 1]),
        ];
        let acts = [
            None,
            Some(Activation::Clip(0.0, 6.0)),
            Some(Activation::Clip(-0.25, 0.5)),
            Some(Activation::Relu),
            Some(Activation::HardSwish),
        ];
        for p in &cases {
            for act in acts {
                for bias in [true, false] {
                    check(p, act, bias, true, 1);
                    check(p, act, bias, false, 1);
                }
            }
            check(p, Some(Activation::Clip(0.0, 6.0)), true, true, 2);
        }
    }

    #[test]
    fn the_avx512_rows_match_the_avx2_stencil_bit_for_bit() {
        if crate::skip_without(crate::avx512f() && has_avx2_fma(), "AVX-512F or AVX2") {
            return;
        }
        let mut compared = 0;
        for (h, w) in [
            (4, 1),
            (5, 7),
            (7, 7),
            (9, 14),
            (14, 15),
            (6, 16),
            (8, 17),
            (28, 28),
            (5, 33),
            (9, 56),
        ] {
            for (pads, s) in [[1, 1, 1, 1], [0, 0, 0, 0], [2, 0, 1, 3]]
                .into_iter()
                .flat_map(|p| [(p, 1), (p, 2)])
            {
                if h + pads[0] + pads[2] < 3 || w + pads[1] + pads[3] < 3 {
                    continue;
                }
                let p = geom(1, 1, (h, w), (3, 3), (s, s), (1, 1), pads);
                let x = lcg(7 + h as u64, h * w);
                let wt = lcg(8, 9);
                for act in [None, Some(Activation::Clip(0.0, 6.0))] {
                    let k = PlaneKernel::new(&p, act);
                    if !k.rows {
                        continue;
                    }
                    let pre = Pre {
                        bias: Some(0.1),
                        act: Some(Activation::Relu),
                    };
                    let run = |rows: bool| {
                        let mut out = vec![f32::NAN; p.oh * p.ow];
                        let mut scratch = Scratch::default();
                        plane_kernel(
                            &p,
                            &k.lay,
                            &x,
                            pre,
                            &wt,
                            0.3,
                            k.epi,
                            (true, rows),
                            &mut out,
                            &mut scratch,
                        );
                        out
                    };
                    let (wide, narrow) = (run(true), run(false));
                    assert!(
                        wide.iter()
                            .zip(&narrow)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{h}x{w} pads {pads:?} stride {s} {act:?}"
                    );
                    compared += 1;
                }
            }
        }
        assert!(
            compared >= 50,
            "only {compared} geometries ran the AVX-512 rows"
        );
    }

    #[test]
    fn matches_the_generic_grouped_path() {
        // The same weights through conv2d as a grouped convolution the general path handles
        // (two channels per group), channel by channel, agree with the depthwise kernel.
        let p = geom(2, 6, (12, 13), (3, 3), (2, 2), (1, 1), [1, 1, 1, 1]);
        let x = lcg(4, p.n * p.c * p.h * p.w);
        let w = lcg(5, p.c * 9);
        let b = lcg(6, p.c);
        let mut dw = vec![0.0; p.n * p.c * p.oh * p.ow];
        depthwise(&p, &x, &w, Some(&b), None, &mut dw, 2);
        // Grouped with 2 input channels per group: zero the cross-channel weights.
        let g = Conv2d { groups: 3, ..p };
        let mut wg = vec![0.0; p.c * 2 * 9];
        for co in 0..p.c {
            let ci = co % 2;
            wg[(co * 2 + ci) * 9..(co * 2 + ci + 1) * 9].copy_from_slice(&w[co * 9..(co + 1) * 9]);
        }
        let mut grouped = vec![0.0; dw.len()];
        let epi = crate::conv::Epilogue {
            bias: Some(&b),
            ..Default::default()
        };
        crate::conv::conv2d(&g, &x, &wg, epi, &mut grouped, &mut Vec::new(), 2);
        for (a, r) in dw.iter().zip(&grouped) {
            assert!((a - r).abs() <= 1e-5 * (1.0 + r.abs()), "{a} vs {r}");
        }
    }
}
