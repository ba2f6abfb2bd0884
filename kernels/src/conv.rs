//! 2-D convolution (NCHW, f32): 1x1 convolutions as one GEMM, depthwise convolutions directly,
//! everything else as im2col + GEMM; transposed convolution as GEMM + col2im.
//! Bias (and a fused residual) is pre-loaded into the output or added on the way out, and the
//! fused activation runs as an epilogue.

use crate::activation::{Activation, bias_act};
use crate::depthwise::depthwise;
use crate::few_pixels;
use crate::gemm::{Mat, SharedOut, sgemm, sgemm_block};
use crate::igemm::igemm;
use rayon::prelude::*;

/// Geometry of one 2-D convolution; the caller computes the output size (`oh`, `ow`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Conv2d {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    /// Output channels.
    pub m: usize,
    pub kh: usize,
    pub kw: usize,
    pub sh: usize,
    pub sw: usize,
    pub dh: usize,
    pub dw: usize,
    /// Top and left padding (bottom/right padding only shows up in `oh`/`ow`).
    pub pt: usize,
    pub pl: usize,
    pub oh: usize,
    pub ow: usize,
    pub groups: usize,
}

impl Conv2d {
    /// A convolution down a single column (`w`, `kw` and `ow` 1, no left padding: a 1-D
    /// convolution exported as 2-D, as tf2onnx and JAX write them) as the same convolution
    /// along a single row: the same elements in the same order, whose im2col copies runs of a
    /// row where down a column it copied one element at a time. `None` for any other.
    pub fn column_as_row(&self) -> Option<Conv2d> {
        let column = self.w == 1 && self.kw == 1 && self.ow == 1 && self.pl == 0 && self.h > 1;
        column.then_some(Conv2d {
            h: 1,
            w: self.h,
            kh: 1,
            kw: self.kh,
            sh: 1,
            sw: self.sh,
            dh: 1,
            dw: self.dh,
            pt: 0,
            pl: self.pt,
            oh: 1,
            ow: self.oh,
            ..*self
        })
    }

    /// A 1x1 convolution (stride 1, no padding) from `c` to `m` channels at `h`x`w`, batch `n`.
    pub fn pointwise(n: usize, c: usize, m: usize, h: usize, w: usize) -> Conv2d {
        Conv2d {
            n,
            c,
            h,
            w,
            m,
            kh: 1,
            kw: 1,
            sh: 1,
            sw: 1,
            dh: 1,
            dw: 1,
            oh: h,
            ow: w,
            groups: 1,
            ..Default::default()
        }
    }

    /// A 1x1 convolution with stride 1 and no padding: a plain matrix product per image.
    pub fn is_pointwise(&self) -> bool {
        self.kh == 1
            && self.kw == 1
            && self.sh == 1
            && self.sw == 1
            && self.pt == 0
            && self.pl == 0
            && self.oh == self.h
            && self.ow == self.w
    }
    /// One filter per channel.
    pub fn is_depthwise(&self) -> bool {
        self.groups == self.c && self.m == self.c && self.groups > 1
    }
    /// Scratch floats `conv2d` needs for im2col.
    pub fn scratch_len(&self) -> usize {
        if self.is_pointwise() || self.is_depthwise() {
            0
        } else {
            (self.c / self.groups) * self.kh * self.kw * self.oh * self.ow
        }
    }
}

/// Valid output range `[lo, hi)` along one axis for input offset `off = k*d - pad`:
/// the outputs `o` with `0 <= o*s + off < len`.
#[inline]
fn valid_range(off: isize, s: usize, len: usize, out: usize) -> (usize, usize) {
    let s = s as isize;
    let lo = if off >= 0 { 0 } else { ((-off) + s - 1) / s };
    let hi = if (len as isize) - off <= 0 {
        0
    } else {
        ((len as isize - 1 - off) / s + 1).max(0)
    };
    let lo = (lo as usize).min(out);
    (lo, (hi as usize).clamp(lo, out))
}

/// What a convolution adds and applies on its way out: `act(conv + bias + residual)`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Epilogue<'a> {
    /// One value per output channel.
    pub bias: Option<&'a [f32]>,
    /// A tensor of the output's shape (a residual `Add` fused into the convolution).
    pub residual: Option<&'a [f32]>,
    pub act: Option<Activation>,
}

/// Writes what the GEMM then accumulates onto: `residual + bias` (either may be absent). Returns
/// whether anything was written.
fn preload(out: &mut [f32], bias: Option<&[f32]>, residual: Option<&[f32]>, plane: usize) -> bool {
    match (bias, residual) {
        (None, None) => return false,
        (Some(b), None) => {
            for (ch, o) in out.chunks_mut(plane).enumerate() {
                o.fill(b[ch % b.len()]);
            }
        }
        (b, Some(r)) => {
            out.copy_from_slice(r);
            if let Some(b) = b {
                for (ch, o) in out.chunks_mut(plane).enumerate() {
                    let v = b[ch % b.len()];
                    o.iter_mut().for_each(|x| *x += v);
                }
            }
        }
    }
    true
}

/// `out[n, m, oh, ow] = act(conv(input, weight) + bias + residual)`; `weight` is
/// `[m, c/groups, kh, kw]`.
pub fn conv2d(
    p: &Conv2d,
    input: &[f32],
    weight: &[f32],
    epi: Epilogue<'_>,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
    threads: usize,
) {
    let rows = p.column_as_row();
    let p = rows.as_ref().unwrap_or(p);
    let k = (p.c / p.groups) * p.kh * p.kw;
    let (in_plane, out_plane) = (p.h * p.w, p.oh * p.ow);
    assert_eq!(input.len(), p.n * p.c * in_plane, "conv2d input size");
    assert_eq!(weight.len(), p.m * k, "conv2d weight size");
    assert_eq!(out.len(), p.n * p.m * out_plane, "conv2d output size");
    if let Some(r) = epi.residual {
        assert_eq!(r.len(), out.len(), "conv2d residual size");
    }
    let Epilogue { bias, act, .. } = epi;
    if p.is_depthwise() {
        match epi.residual {
            None => depthwise(p, input, weight, bias, act, out, threads),
            Some(r) => {
                depthwise(p, input, weight, bias, None, out, threads);
                add_act(out, r, act);
            }
        }
        return;
    }
    if few_pixels::applies(p) {
        few_pixels::conv(p, input, weight, epi, out, scratch, threads);
        return;
    }
    if let Some(nb) = column_block(p) {
        blocked(p, input, weight, epi, out, nb, threads);
        return;
    }
    let preloaded = preload(out, bias, epi.residual, out_plane);
    let (per_in, per_out) = (p.c * in_plane, p.m * out_plane);
    if threads > 1 && p.n >= threads {
        // A batch at least as large as the thread budget: one image per thread, each with its
        // own single-threaded GEMMs, beats splitting small GEMMs across threads.
        out.par_chunks_mut(per_out)
            .enumerate()
            .for_each(|(ni, dst)| {
                IMAGE_SCRATCH.with(|s| {
                    let mut s = s.borrow_mut();
                    conv_image(
                        p,
                        &input[ni * per_in..(ni + 1) * per_in],
                        weight,
                        preloaded,
                        act,
                        dst,
                        &mut s,
                        1,
                    )
                })
            });
    } else {
        for ni in 0..p.n {
            conv_image(
                p,
                &input[ni * per_in..(ni + 1) * per_in],
                weight,
                preloaded,
                act,
                &mut out[ni * per_out..(ni + 1) * per_out],
                scratch,
                threads,
            );
        }
    }
}

/// `out = act(out + residual)`, one pass.
fn add_act(out: &mut [f32], residual: &[f32], act: Option<Activation>) {
    for (o, r) in out.chunks_mut(4096).zip(residual.chunks(4096)) {
        o.iter_mut().zip(r).for_each(|(o, r)| *o += *r);
        bias_act(o, None, act);
    }
}

/// Output columns (pixels) per task of the blocked path: as many as keep a task's output block
/// and its input (or im2col) block within about 256 KiB of cache. `None` (use whole-image GEMMs)
/// for grouped convolutions, and where those blocks would be too narrow to amortise re-packing
/// the weights in every task (wide layers with small images).
fn column_block(p: &Conv2d) -> Option<usize> {
    let pixels = p.oh * p.ow;
    let k = p.c * p.kh * p.kw;
    if p.groups != 1 || pixels == 0 || p.m == 0 || k == 0 {
        return None;
    }
    let fit = (1usize << 16) / (p.m + k);
    if pixels <= fit.max(1) {
        return Some(pixels);
    }
    if fit < 64 {
        return None;
    }
    let blocks = pixels.div_ceil(fit);
    Some(pixels.div_ceil(blocks).next_multiple_of(16).min(pixels))
}

/// Convolution as tasks over (image, pixel block, output-channel block): each task im2cols its
/// pixel block (1x1 convolutions read the input in place), runs a one-thread GEMM into its
/// output block and adds the bias (and residual) and applies the activation while the block is
/// still in cache. Channel blocks only split the work when there are fewer pixel blocks than
/// threads (small images at batch 1), and then into as few as give each thread one: every
/// channel block packs the same input block again (mobilenet_v2 batch 1 is ~3% faster than
/// with four blocks per thread).
fn blocked(
    p: &Conv2d,
    input: &[f32],
    weight: &[f32],
    epi: Epilogue<'_>,
    out: &mut [f32],
    nb: usize,
    threads: usize,
) {
    let k = p.c * p.kh * p.kw;
    let (in_plane, pixels) = (p.h * p.w, p.oh * p.ow);
    let nblocks = pixels.div_ceil(nb);
    let mut mb = p.m;
    if threads > 1 && p.n * nblocks < threads {
        let want = threads.div_ceil(p.n * nblocks);
        mb = p.m.div_ceil(want).next_multiple_of(8).max(16).min(p.m);
    }
    let mblocks = p.m.div_ceil(mb);
    let tasks = p.n * nblocks * mblocks;
    let pointwise = p.is_pointwise();
    let dst = SharedOut(out.as_mut_ptr());
    let task = |t: usize| {
        let (ni, bj, bm) = (
            t / (nblocks * mblocks),
            (t / mblocks) % nblocks,
            t % mblocks,
        );
        let (j0, r0) = (bj * nb, bm * mb);
        let (cols, rows) = (nb.min(pixels - j0), mb.min(p.m - r0));
        let img = &input[ni * p.c * in_plane..(ni + 1) * p.c * in_plane];
        let base = (ni * p.m + r0) * pixels + j0;
        // Element (r, j) of this task's block is at base + r*pixels + j, r < rows, j < cols: the
        // blocks of different tasks are disjoint and all lie within `out`.
        let row = |r: usize| {
            // SAFETY: see above; each row slice lives only while this task touches that row.
            unsafe { std::slice::from_raw_parts_mut(dst.at(base + r * pixels), cols) }
        };
        let wm = Mat::row_major(&weight[r0 * k..(r0 + rows) * k], k);
        let run = |b: Mat<'_>| {
            // SAFETY: operands hold rows×k and k×cols; the destination block is this task's.
            unsafe { sgemm_block(rows, cols, k, wm, b, dst.at(base), pixels, false) }
        };
        if pointwise {
            run(Mat {
                data: &img[j0..],
                rs: in_plane,
                cs: 1,
            });
        } else {
            IMAGE_SCRATCH.with(|s| {
                let mut s = s.borrow_mut();
                s.resize(k * cols, 0.0);
                im2col_block(p, img, j0, j0 + cols, &mut s);
                run(Mat::row_major(&s, cols));
            });
        }
        for r in 0..rows {
            let dst = row(r);
            if let Some(res) = epi.residual {
                let at = base + r * pixels;
                dst.iter_mut()
                    .zip(&res[at..at + cols])
                    .for_each(|(o, x)| *o += *x);
            }
            bias_act(dst, epi.bias.map(|b| b[r0 + r]), epi.act);
        }
    };
    assert_eq!(out.len(), p.n * p.m * pixels);
    if threads > 1 && tasks > 1 && p.n * p.m * pixels * k >= crate::PAR_MIN_WORK {
        (0..tasks).into_par_iter().for_each(task);
    } else {
        (0..tasks).for_each(task);
    }
}

/// Unfolds output pixels `[j0, j1)` of one image into `[c*kh*kw, j1 - j0]`.
fn im2col_block(p: &Conv2d, x: &[f32], j0: usize, j1: usize, col: &mut [f32]) {
    for (r, row) in col.chunks_exact_mut(j1 - j0).enumerate() {
        im2col_row(p, x, r, j0, j1, row);
    }
}

/// Row `r` (input channel, kernel row, kernel column) of the im2col matrix, output pixels
/// `[j0, j1)`: the input pixel each one reads through that tap, 0 in the padding.
fn im2col_row<T: Copy + Default>(
    p: &Conv2d,
    x: &[T],
    r: usize,
    j0: usize,
    j1: usize,
    row: &mut [T],
) {
    let ci = r / (p.kh * p.kw);
    let ki = (r / p.kw) % p.kh;
    let kj = r % p.kw;
    let plane = &x[ci * p.h * p.w..(ci + 1) * p.h * p.w];
    let offy = (ki * p.dh) as isize - p.pt as isize;
    let offx = (kj * p.dw) as isize - p.pl as isize;
    let (ylo, yhi) = valid_range(offy, p.sh, p.h, p.oh);
    let (xlo, xhi) = valid_range(offx, p.sw, p.w, p.ow);
    let mut q = j0;
    while q < j1 {
        let (oy, ox0) = (q / p.ow, q % p.ow);
        let ox1 = p.ow.min(ox0 + (j1 - q));
        let dst = &mut row[q - j0..q - j0 + (ox1 - ox0)];
        q += ox1 - ox0;
        if oy < ylo || oy >= yhi {
            dst.fill(T::default());
            continue;
        }
        let iy = (oy as isize * p.sh as isize + offy) as usize;
        let src = &plane[iy * p.w..(iy + 1) * p.w];
        let lo = xlo.clamp(ox0, ox1);
        let hi = xhi.clamp(lo, ox1);
        dst[..lo - ox0].fill(T::default());
        dst[hi - ox0..].fill(T::default());
        if hi == lo {
            continue;
        }
        let ix0 = (lo as isize * p.sw as isize + offx) as usize;
        copy_strided(&mut dst[lo - ox0..hi - ox0], &src[ix0..], p.sw);
    }
}

/// The first `len` floats of `scratch`, grown as needed but never shrunk (so not zeroed again
/// each time convolutions of other sizes take turns with it): callers overwrite all of it.
pub(crate) fn scratch_of(scratch: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if scratch.len() < len {
        scratch.resize(len, 0.0);
    }
    &mut scratch[..len]
}

/// `dst[i] = src[i * stride]`.
pub(crate) fn copy_strided<T: Copy>(dst: &mut [T], src: &[T], stride: usize) {
    if stride == 1 {
        dst.copy_from_slice(&src[..dst.len()]);
    } else {
        dst.iter_mut()
            .zip(src.iter().step_by(stride))
            .for_each(|(d, s)| *d = *s);
    }
}

thread_local! {
    /// im2col scratch of a rayon worker converting one image of a batch.
    static IMAGE_SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One image: per group, im2col (unless 1x1) and a GEMM onto the pre-loaded bias and residual
/// (when `preloaded`), then the activation while the output is still in cache.
#[allow(clippy::too_many_arguments)]
fn conv_image(
    p: &Conv2d,
    img: &[f32],
    weight: &[f32],
    preloaded: bool,
    act: Option<Activation>,
    dst: &mut [f32],
    scratch: &mut Vec<f32>,
    threads: usize,
) {
    let (cg, mg) = (p.c / p.groups, p.m / p.groups);
    let k = cg * p.kh * p.kw;
    let (in_plane, out_plane) = (p.h * p.w, p.oh * p.ow);
    let scratch = scratch_of(scratch, p.scratch_len());
    for g in 0..p.groups {
        let wg = &weight[g * mg * k..(g + 1) * mg * k];
        let xg = &img[g * cg * in_plane..(g + 1) * cg * in_plane];
        let b = if p.is_pointwise() {
            Mat::row_major(xg, in_plane)
        } else {
            im2col(p, xg, scratch, threads);
            Mat::row_major(scratch, out_plane)
        };
        let dg = &mut dst[g * mg * out_plane..(g + 1) * mg * out_plane];
        sgemm(
            threads,
            mg,
            out_plane,
            k,
            Mat::row_major(wg, k),
            b,
            dg,
            out_plane,
            preloaded,
        );
    }
    if let Some(a) = act {
        a.apply_slice(threads, dst);
    }
}

/// Unfolds one group of one image into `[cg*kh*kw, oh*ow]` (padding as zeros), rows split
/// across the threads.
fn im2col<T: Copy + Default + Send + Sync>(p: &Conv2d, x: &[T], col: &mut [T], threads: usize) {
    let out_plane = p.oh * p.ow;
    let fill_row = |(r, row): (usize, &mut [T])| im2col_row(p, x, r, 0, out_plane, row);
    if threads > 1 && col.len() >= crate::PAR_MIN_WORK {
        col.par_chunks_mut(out_plane).enumerate().for_each(fill_row);
    } else {
        col.chunks_mut(out_plane).enumerate().for_each(fill_row);
    }
}

/// Integer convolution: `x` and `weight` (`[m, c/groups, kh, kw]`) hold 8-bit values with their
/// zero points subtracted, and the padding is zero in that domain; `out[n, m, oh, ow]` is the
/// exact `i32` sum (see `igemm`).
pub fn conv2d_integer(p: &Conv2d, x: &[i16], weight: &[i16], out: &mut [i32], threads: usize) {
    let (cg, mg) = (p.c / p.groups, p.m / p.groups);
    let k = cg * p.kh * p.kw;
    let (in_plane, out_plane) = (p.h * p.w, p.oh * p.ow);
    let mut col = vec![0i16; k * out_plane];
    for (img, dst) in x
        .chunks_exact(p.c * in_plane)
        .zip(out.chunks_exact_mut(p.m * out_plane))
        .take(p.n)
    {
        for g in 0..p.groups {
            let xg = &img[g * cg * in_plane..(g + 1) * cg * in_plane];
            im2col(p, xg, &mut col, threads);
            igemm(
                threads,
                mg,
                out_plane,
                k,
                &weight[g * mg * k..(g + 1) * mg * k],
                &col,
                &mut dst[g * mg * out_plane..(g + 1) * mg * out_plane],
            );
        }
    }
}

/// Transposed convolution: `weight` is `[c, m/groups, kh, kw]`, `p.m` the output channels and
/// `p.oh`/`p.ow` the full output size (including output padding). `p.pt`/`p.pl` are the pads
/// cropped from the top/left of the full result.
pub fn conv_transpose2d(
    p: &Conv2d,
    input: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
    threads: usize,
) {
    let (cg, mg) = (p.c / p.groups, p.m / p.groups);
    let kk = p.kh * p.kw;
    let (in_plane, out_plane) = (p.h * p.w, p.oh * p.ow);
    assert_eq!(
        input.len(),
        p.n * p.c * in_plane,
        "conv_transpose2d input size"
    );
    assert_eq!(weight.len(), p.c * mg * kk, "conv_transpose2d weight size");
    assert_eq!(
        out.len(),
        p.n * p.m * out_plane,
        "conv_transpose2d output size"
    );
    if !preload(out, bias, None, out_plane) {
        out.fill(0.0);
    }
    let scratch = scratch_of(scratch, mg * kk * in_plane);
    for ni in 0..p.n {
        for g in 0..p.groups {
            let xg = &input[(ni * p.c + g * cg) * in_plane..(ni * p.c + (g + 1) * cg) * in_plane];
            let wg = &weight[g * cg * mg * kk..(g + 1) * cg * mg * kk];
            sgemm(
                threads,
                mg * kk,
                in_plane,
                cg,
                Mat::transposed(wg, mg * kk),
                Mat::row_major(xg, in_plane),
                scratch,
                in_plane,
                false,
            );
            let dst =
                &mut out[(ni * p.m + g * mg) * out_plane..(ni * p.m + (g + 1) * mg) * out_plane];
            let col: &[f32] = scratch;
            let plane = |(co, oplane): (usize, &mut [f32])| {
                let taps = &col[co * kk * in_plane..(co + 1) * kk * in_plane];
                col2im_plane(p, taps, oplane);
            };
            // One thread runs here, not in the pool: a hop into it costs more than a plane.
            if threads > 1 {
                dst.par_chunks_mut(out_plane).enumerate().for_each(plane);
            } else {
                dst.chunks_mut(out_plane).enumerate().for_each(plane);
            }
        }
    }
}

/// Adds one output channel's taps (`kh·kw` rows of the input plane's size, each the input
/// scaled by one weight) into its output plane, each input pixel at `stride·i + dilation·k -
/// pad`: per tap and input row, the range of input columns that land inside, found once.
fn col2im_plane(p: &Conv2d, taps: &[f32], oplane: &mut [f32]) {
    for (t, row) in taps.chunks_exact(p.h * p.w).enumerate() {
        let (ki, kj) = (t / p.kw, t % p.kw);
        let offy = (ki * p.dh) as isize - p.pt as isize;
        let offx = (kj * p.dw) as isize - p.pl as isize;
        let (ylo, yhi) = valid_range(offy, p.sh, p.oh, p.h);
        let (xlo, xhi) = valid_range(offx, p.sw, p.ow, p.w);
        if xlo == xhi {
            continue;
        }
        for iy in ylo..yhi {
            let oy = (iy as isize * p.sh as isize + offy) as usize;
            let ox0 = (xlo as isize * p.sw as isize + offx) as usize;
            let orow = &mut oplane[oy * p.ow + ox0..(oy + 1) * p.ow];
            let src = &row[iy * p.w + xlo..iy * p.w + xhi];
            if p.sw == 1 {
                orow.iter_mut().zip(src).for_each(|(o, v)| *o += v);
            } else {
                orow.iter_mut()
                    .step_by(p.sw)
                    .zip(src)
                    .for_each(|(o, v)| *o += v);
            }
        }
    }
}

/// Direct reference convolution for tests.
pub fn conv2d_reference(
    p: &Conv2d,
    input: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    let (cg, mg) = (p.c / p.groups, p.m / p.groups);
    for ni in 0..p.n {
        for co in 0..p.m {
            let g = co / mg;
            for oy in 0..p.oh {
                for ox in 0..p.ow {
                    let mut s = bias.map_or(0.0, |b| b[co]) as f64;
                    for ci in 0..cg {
                        for ki in 0..p.kh {
                            for kj in 0..p.kw {
                                let iy = (oy * p.sh + ki * p.dh) as isize - p.pt as isize;
                                let ix = (ox * p.sw + kj * p.dw) as isize - p.pl as isize;
                                if iy < 0 || ix < 0 || iy as usize >= p.h || ix as usize >= p.w {
                                    continue;
                                }
                                let xv = input[((ni * p.c + g * cg + ci) * p.h + iy as usize)
                                    * p.w
                                    + ix as usize];
                                let wv = weight[((co * cg + ci) * p.kh + ki) * p.kw + kj];
                                s += xv as f64 * wv as f64;
                            }
                        }
                    }
                    out[((ni * p.m + co) * p.oh + oy) * p.ow + ox] = s as f32;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::lcg;

    fn check(p: Conv2d) {
        check_with(&p, true, None, 2);
    }

    fn check_with(p: &Conv2d, with_bias: bool, act: Option<Activation>, threads: usize) {
        let x = lcg(1, p.n * p.c * p.h * p.w);
        let w = lcg(2, p.m * (p.c / p.groups) * p.kh * p.kw);
        let b = lcg(3, p.m);
        let res = lcg(4, p.n * p.m * p.oh * p.ow);
        let bias = with_bias.then_some(&b[..]);
        for residual in [None, Some(&res[..])] {
            // Poisoned: every element must be written.
            let mut got = vec![f32::NAN; res.len()];
            let mut want = got.clone();
            let epi = Epilogue {
                bias,
                residual,
                act,
            };
            conv2d(p, &x, &w, epi, &mut got, &mut Vec::new(), threads);
            conv2d_reference(p, &x, &w, bias, &mut want);
            for (i, v) in want.iter_mut().enumerate() {
                *v += residual.map_or(0.0, |r| r[i]);
                if let Some(a) = act {
                    *v = a.apply(*v);
                }
            }
            for (g, r) in got.iter().zip(&want) {
                assert!(
                    (g - r).abs() < 1e-4 * (1.0 + r.abs()),
                    "{p:?} bias {with_bias} residual {} {act:?} threads {threads}: {g} vs {r}",
                    residual.is_some()
                );
            }
        }
    }

    fn blocked_cases() -> Vec<(Conv2d, bool, Option<Activation>)> {
        let relu6 = Some(Activation::Clip(0.0, 6.0));
        vec![
            // 1x1 over several pixel blocks (mobilenet expansion, batch 2)
            (geom(2, 32, 40, 96, 1, 1, 1, 0, 1), true, relu6),
            (geom(1, 24, 33, 144, 1, 1, 1, 0, 1), false, None),
            // 1x1 on a small image at batch 1: split over output-channel blocks
            (geom(1, 160, 7, 960, 1, 1, 1, 0, 1), true, relu6),
            (
                geom(1, 96, 6, 40, 1, 1, 1, 0, 1),
                true,
                Some(Activation::HardSwish),
            ),
            // more channels to fewer at batch 1 (mobilenet projections), odd sizes
            (geom(1, 962, 7, 160, 1, 1, 1, 0, 1), true, None),
            (geom(1, 145, 13, 24, 1, 1, 1, 0, 1), false, relu6),
            // im2col per pixel block (a first 3x3 stride-2 layer), odd sizes
            (geom(3, 3, 80, 32, 3, 2, 1, 1, 1), true, relu6),
            (
                geom(1, 5, 37, 12, 5, 2, 2, 3, 1),
                false,
                Some(Activation::Relu),
            ),
            // pixel blocks that do not share evenly between threads (resnet50's 28x28
            // expansions with their residual: 7 blocks)
            (
                geom(1, 128, 28, 512, 1, 1, 1, 0, 1),
                true,
                Some(Activation::Relu),
            ),
            // too wide to block: the whole-image GEMM path
            (geom(2, 600, 10, 600, 1, 1, 1, 0, 1), true, relu6),
            (geom(1, 100, 9, 300, 3, 1, 1, 1, 1), false, None),
        ]
    }

    #[test]
    fn blocked_paths_match_reference() {
        for (p, bias, act) in &blocked_cases() {
            for threads in [1, 2, 3] {
                check_with(p, *bias, *act, threads);
            }
        }
    }

    /// However the blocks fall between threads, every output is computed the same way.
    #[test]
    fn blocked_outputs_do_not_depend_on_the_threads() {
        for (p, bias, act) in &blocked_cases() {
            let x = lcg(1, p.n * p.c * p.h * p.w);
            let w = lcg(2, p.m * p.c * p.kh * p.kw);
            let (b, r) = (lcg(3, p.m), lcg(4, p.n * p.m * p.oh * p.ow));
            let epi = Epilogue {
                bias: bias.then_some(&b[..]),
                residual: Some(&r),
                act: *act,
            };
            let run = |threads| {
                let mut out = vec![f32::NAN; r.len()];
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build();
                pool.expect("pool")
                    .install(|| conv2d(p, &x, &w, epi, &mut out, &mut Vec::new(), threads));
                out
            };
            let one = run(1);
            for threads in [2, 3, 4] {
                assert!(
                    run(threads) == one,
                    "{p:?}: {threads} threads differ from one"
                );
            }
        }
    }

    /// A square-kernel convolution of an `h × (h + 1)` image with `pad` on every side.
    #[allow(clippy::too_many_arguments)]
    fn geom(
        n: usize,
        c: usize,
        h: usize,
        m: usize,
        k: usize,
        s: usize,
        d: usize,
        pad: usize,
        groups: usize,
    ) -> Conv2d {
        Conv2d {
            groups,
            ..crate::test_conv((n, c, h, h + 1, m, k, s, d, pad, pad))
        }
    }

    #[test]
    fn general_pointwise_depthwise_and_grouped_match_reference() {
        check(geom(2, 3, 9, 4, 3, 1, 1, 1, 1));
        check(geom(1, 4, 10, 6, 3, 2, 1, 1, 2));
        check(geom(2, 8, 7, 16, 1, 1, 1, 0, 1));
        check(geom(1, 8, 7, 16, 1, 2, 1, 0, 1));
        check(geom(2, 6, 11, 6, 3, 1, 1, 1, 6));
        check(geom(1, 6, 11, 6, 3, 2, 2, 2, 6));
        check(geom(1, 3, 12, 5, 5, 3, 2, 3, 1));
        check(geom(1, 64, 28, 64, 3, 1, 1, 1, 1));
    }

    /// 1-D convolutions down a column (`w` = 1) run as rows: the same outputs as the reference.
    #[test]
    fn convolutions_down_a_column_match_reference() {
        let column = |c: usize, m: usize, kh: usize, sh: usize, dh: usize, pt: usize, groups| {
            let (h, pb) = (23, 1);
            Conv2d {
                n: 2,
                c,
                h,
                w: 1,
                m,
                kh,
                kw: 1,
                sh,
                sw: 1,
                dh,
                dw: 1,
                pt,
                pl: 0,
                oh: (h + pt + pb - dh * (kh - 1) - 1) / sh + 1,
                ow: 1,
                groups,
            }
        };
        for p in [
            column(5, 7, 5, 1, 1, 0, 1),
            column(5, 7, 5, 2, 2, 3, 1),
            column(6, 6, 3, 1, 1, 1, 6),
            column(4, 8, 1, 1, 1, 0, 2),
        ] {
            assert!(p.column_as_row().is_some());
            check_with(&p, true, Some(Activation::Relu), 2);
        }
    }

    #[test]
    fn transpose_is_adjoint_of_convolution() {
        // <conv(x), y> == <x, conv_transpose(y)> for the same weights and geometry: 3x3 with
        // stride 2, padding and groups; 2x2 at stride 2 (an upsampling, taps never overlap);
        // dilated and padded; stride past the kernel (outputs no tap reaches).
        for p in [
            geom(1, 4, 6, 6, 3, 2, 1, 1, 2),
            geom(2, 5, 7, 3, 2, 2, 1, 0, 1),
            geom(1, 3, 9, 4, 3, 1, 2, 2, 1),
            geom(1, 2, 8, 3, 2, 3, 1, 1, 1),
        ] {
            let x = lcg(1, p.n * p.c * p.h * p.w);
            let w = lcg(2, p.m * (p.c / p.groups) * p.kh * p.kw);
            let y = lcg(3, p.n * p.m * p.oh * p.ow);
            let mut cx = vec![0.0; y.len()];
            conv2d_reference(&p, &x, &w, None, &mut cx);
            // The transpose maps m channels back to c, the weights' layout [m, c/g, k, k] as is.
            let t = Conv2d {
                c: p.m,
                h: p.oh,
                w: p.ow,
                m: p.c,
                oh: p.h,
                ow: p.w,
                ..p
            };
            for threads in [1, 2] {
                let mut ty = vec![f32::NAN; x.len()];
                conv_transpose2d(&t, &y, &w, None, &mut ty, &mut Vec::new(), threads);
                let dot = |a: &[f32], b: &[f32]| -> f64 {
                    a.iter()
                        .zip(b)
                        .map(|(a, b)| f64::from(*a) * f64::from(*b))
                        .sum()
                };
                let (a, b) = (dot(&cx, &y), dot(&x, &ty));
                assert!((a - b).abs() < 1e-3 * (1.0 + a.abs()), "{p:?}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn integer_convolution_matches_reference() {
        for p in [
            geom(2, 3, 9, 4, 3, 1, 1, 1, 1),
            geom(1, 4, 10, 6, 3, 2, 1, 1, 2),
            geom(1, 6, 11, 6, 3, 2, 2, 2, 6),
            geom(1, 8, 7, 16, 1, 1, 1, 0, 1),
        ] {
            let x = crate::igemm::ints(p.n * p.c * p.h * p.w, 1);
            let w = crate::igemm::ints(p.m * (p.c / p.groups) * p.kh * p.kw, 2);
            let wide = |v: &[i16]| v.iter().map(|&v| v as f32).collect::<Vec<f32>>();
            let mut want = vec![0.0f32; p.n * p.m * p.oh * p.ow];
            conv2d_reference(&p, &wide(&x), &wide(&w), None, &mut want);
            for threads in [1, 2] {
                let mut got = vec![0i32; want.len()];
                conv2d_integer(&p, &x, &w, &mut got, threads);
                // Sums below 2^24: the f32 reference is exact.
                assert_eq!(wide_i32(&got), want, "{p:?}");
            }
        }
    }

    fn wide_i32(v: &[i32]) -> Vec<f32> {
        v.iter().map(|&v| v as f32).collect()
    }
}
