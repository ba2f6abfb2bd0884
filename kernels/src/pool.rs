//! 2-D max and average pooling (NCHW, f32), one output plane per task; and max pooling of NHWC
//! activations, one output row per task.

use rayon::prelude::*;

/// Geometry of one 2-D pooling; the caller computes `oh`/`ow` (ceil mode included).
#[derive(Clone, Debug, Default)]
pub struct Pool2d {
    pub planes: usize,
    pub h: usize,
    pub w: usize,
    pub kh: usize,
    pub kw: usize,
    pub sh: usize,
    pub sw: usize,
    pub dh: usize,
    pub dw: usize,
    pub pt: usize,
    pub pl: usize,
    pub pb: usize,
    pub pr: usize,
    pub oh: usize,
    pub ow: usize,
}

fn for_planes<T: Send + Sync>(
    p: &Pool2d,
    input: &[T],
    out: &mut [T],
    threads: usize,
    f: impl Fn(&[T], &mut [T]) + Sync,
) {
    assert_eq!(input.len(), p.planes * p.h * p.w, "pool input size");
    assert_eq!(out.len(), p.planes * p.oh * p.ow, "pool output size");
    let (ip, op) = (p.h * p.w, p.oh * p.ow);
    if op == 0 {
        return;
    }
    if threads > 1 && input.len() >= crate::PAR_MIN_WORK {
        out.par_chunks_mut(op)
            .enumerate()
            .for_each(|(i, o)| f(&input[i * ip..(i + 1) * ip], o));
    } else {
        out.chunks_mut(op)
            .enumerate()
            .for_each(|(i, o)| f(&input[i * ip..(i + 1) * ip], o));
    }
}

/// The window of output position `o` along one axis: the first input index it reads and how
/// many of its `k` taps (`d` apart) fall inside `[0, len)`.
pub fn taps(o: usize, s: usize, d: usize, pad: usize, k: usize, len: usize) -> (usize, usize) {
    let base = (o * s) as isize - pad as isize;
    let d = d as isize;
    let first = if base >= 0 { 0 } else { (-base + d - 1) / d };
    let end = if base >= len as isize {
        0
    } else {
        (k as isize).min((len as isize - base + d - 1) / d)
    };
    if end <= first {
        (0, 0)
    } else {
        ((base + first * d) as usize, (end - first) as usize)
    }
}

pub fn max_pool2d(p: &Pool2d, input: &[f32], out: &mut [f32], threads: usize) {
    let cols: Vec<(usize, usize)> = (0..p.ow)
        .map(|ox| taps(ox, p.sw, p.dw, p.pl, p.kw, p.w))
        .collect();
    for_planes(p, input, out, threads, |x, o| {
        // A compare that compiles to one `max` (no branch); a plane holding a NaN is done again
        // with the compare that lets NaN propagate like the reference implementations.
        let lowest = f32::NEG_INFINITY;
        let saw_nan = max_plane(p, &cols, x, o, lowest, |m, v| if v > m { v } else { m });
        if saw_nan {
            max_plane(p, &cols, x, o, lowest, |m, v| {
                if v > m || v.is_nan() { v } else { m }
            });
        }
    });
}

/// Max pooling of 8-bit (or any ordered) values: exact, as a maximum is one of its inputs.
/// `lowest` is the type's least value (what a window wholly in the padding gives).
pub fn max_pool2d_ord<T: Copy + Ord + Send + Sync>(
    p: &Pool2d,
    input: &[T],
    out: &mut [T],
    lowest: T,
    threads: usize,
) {
    let cols: Vec<(usize, usize)> = (0..p.ow)
        .map(|ox| taps(ox, p.sw, p.dw, p.pl, p.kw, p.w))
        .collect();
    for_planes(p, input, out, threads, |x, o| {
        max_plane(p, &cols, x, o, lowest, Ord::max);
    });
}

/// One plane of max pooling with `pick(max so far, value)`, from `lowest`. Separable: the
/// window's rows are first reduced element by element into one band (which vectorises), then
/// each output takes the maximum of its columns of the band. Returns whether it read a value
/// unequal to itself (a NaN).
fn max_plane<T: Copy + PartialOrd>(
    p: &Pool2d,
    cols: &[(usize, usize)],
    x: &[T],
    o: &mut [T],
    lowest: T,
    pick: impl Fn(T, T) -> T,
) -> bool {
    let mut nan = false;
    let mut band = vec![lowest; p.w];
    for (oy, orow) in o.chunks_exact_mut(p.ow).enumerate() {
        let (y0, ny) = taps(oy, p.sh, p.dh, p.pt, p.kh, p.h);
        if ny == 0 {
            orow.fill(lowest);
            continue;
        }
        band.fill(lowest);
        for t in 0..ny {
            let row = &x[(y0 + t * p.dh) * p.w..][..p.w];
            for (b, &v) in band.iter_mut().zip(row) {
                #[allow(clippy::eq_op)] // v != v: a NaN, for any T
                {
                    nan |= v != v;
                }
                *b = pick(*b, v);
            }
        }
        for (m, &(x0, nx)) in orow.iter_mut().zip(cols) {
            *m = (0..nx).fold(lowest, |a, u| pick(a, band[x0 + u * p.dw]));
        }
    }
    nan
}

/// How many of the `k` taps (`d` apart) of output position `o`'s window lie within the padded
/// extent `padded` (ceil mode may reach past it): the divisor `count_include_pad` counts.
pub fn padded_taps(o: usize, s: usize, d: usize, k: usize, padded: usize) -> usize {
    let start = o * s;
    if start >= padded {
        0
    } else {
        k.min((padded - start).div_ceil(d))
    }
}

/// Average pooling; with `count_include_pad` the divisor counts padding inside the padded
/// input, but never the extra cells that ceil mode adds past it (as onnxruntime does). Only
/// the taps that read the input are visited, so padding and kernel sizes cost nothing.
pub fn avg_pool2d(
    p: &Pool2d,
    input: &[f32],
    out: &mut [f32],
    count_include_pad: bool,
    threads: usize,
) {
    let axis = |n: usize, s: usize, d: usize, pad: usize, k: usize, len: usize, padded: usize| {
        (0..n)
            .map(|o| (taps(o, s, d, pad, k, len), padded_taps(o, s, d, k, padded)))
            .collect::<Vec<_>>()
    };
    let rows = axis(p.oh, p.sh, p.dh, p.pt, p.kh, p.h, p.pt + p.h + p.pb);
    let cols = axis(p.ow, p.sw, p.dw, p.pl, p.kw, p.w, p.pl + p.w + p.pr);
    for_planes(p, input, out, threads, |x, o| {
        for (orow, &((y0, ny), py)) in o.chunks_exact_mut(p.ow).zip(&rows) {
            for (m, &((x0, nx), px)) in orow.iter_mut().zip(&cols) {
                let mut s = 0.0f32;
                for t in 0..ny {
                    let row = &x[(y0 + t * p.dh) * p.w..];
                    for u in 0..nx {
                        s += row[x0 + u * p.dw];
                    }
                }
                let div = if count_include_pad { py * px } else { ny * nx };
                *m = if div == 0 { 0.0 } else { s / div as f32 };
            }
        }
    });
}

/// Max pooling of NHWC activations (`p.planes` is the channel count `C`, one image of
/// `p.h × p.w` pixels after another): each output pixel's `C` maxima are taken over whole
/// input pixels, `C` contiguous values at a time, which vectorises whatever the window.
/// NaN propagates, as in [`max_pool2d`]; a window wholly in the padding gives -inf.
pub fn max_pool2d_nhwc(p: &Pool2d, input: &[f32], out: &mut [f32], threads: usize) {
    // A compare that compiles to one `max`; a row that read a NaN is done again with the
    // compare that lets NaN propagate.
    let propagating = |m: f32, v: f32| if v > m || v.is_nan() { v } else { m };
    max_pool_nhwc(p, input, out, f32::NEG_INFINITY, threads, propagating);
}

/// [`max_pool2d_nhwc`] of 8-bit (or any ordered) values, exact; `lowest` is the type's least
/// value (what a window wholly in the padding gives).
pub fn max_pool2d_nhwc_ord<T: Copy + Ord + Send + Sync>(
    p: &Pool2d,
    input: &[T],
    out: &mut [T],
    lowest: T,
    threads: usize,
) {
    max_pool_nhwc(p, input, out, lowest, threads, Ord::max);
}

/// Max pooling of NHWC values by `pick(max so far, value)` for the rows that read a value
/// unequal to itself (a NaN), by the plain compare for the others.
fn max_pool_nhwc<T: Copy + PartialOrd + Send + Sync>(
    p: &Pool2d,
    input: &[T],
    out: &mut [T],
    lowest: T,
    threads: usize,
    propagating: impl Fn(T, T) -> T + Sync,
) {
    let c = p.planes;
    assert!(c > 0, "max_pool2d_nhwc without channels");
    let images = input.len() / (p.h * p.w * c).max(1);
    assert_eq!(input.len(), images * p.h * p.w * c, "pool input size");
    assert_eq!(out.len(), images * p.oh * p.ow * c, "pool output size");
    let row = p.ow * c;
    if row == 0 {
        return;
    }
    let cols: Vec<(usize, usize)> = (0..p.ow)
        .map(|ox| taps(ox, p.sw, p.dw, p.pl, p.kw, p.w))
        .collect();
    let one_row = |(r, o): (usize, &mut [T])| {
        let (img, oy) = (r / p.oh, r % p.oh);
        let x = &input[img * p.h * p.w * c..][..p.h * p.w * c];
        let rows = taps(oy, p.sh, p.dh, p.pt, p.kh, p.h);
        if max_row_nhwc(
            p,
            (rows, &cols),
            x,
            o,
            lowest,
            |m, v| if v > m { v } else { m },
        ) {
            max_row_nhwc(p, (rows, &cols), x, o, lowest, &propagating);
        }
    };
    if threads > 1 && input.len() >= crate::PAR_MIN_WORK {
        out.par_chunks_mut(row).enumerate().for_each(one_row);
    } else {
        out.chunks_mut(row).enumerate().for_each(one_row);
    }
}

/// One output row of [`max_pool2d_nhwc`] from image `x` (the window's input rows and each
/// output column's input columns as [`taps`] gives them); whether it read a NaN.
fn max_row_nhwc<T: Copy + PartialOrd>(
    p: &Pool2d,
    ((y0, ny), cols): ((usize, usize), &[(usize, usize)]),
    x: &[T],
    o: &mut [T],
    lowest: T,
    pick: impl Fn(T, T) -> T,
) -> bool {
    let c = p.planes;
    let mut nan = false;
    for (m, &(x0, nx)) in o.chunks_exact_mut(c).zip(cols) {
        m.fill(lowest);
        for iy in (0..ny).map(|i| y0 + i * p.dh) {
            for ix in (0..nx).map(|j| x0 + j * p.dw) {
                let v = &x[(iy * p.w + ix) * c..][..c];
                for (m, &v) in m.iter_mut().zip(v) {
                    #[allow(clippy::eq_op)]
                    let unequal = v != v;
                    nan |= unequal;
                    *m = pick(*m, v);
                }
            }
        }
    }
    nan
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Square pools over two planes: (h, w, kernel, stride, dilation, padding, extra padding at
    /// the end): padding, dilation, and the end padding ceil mode adds.
    const CASES: [(usize, usize, usize, usize, usize, usize, usize); 5] = [
        (9, 11, 3, 2, 1, 1, 0),
        (8, 8, 2, 2, 1, 0, 1),
        (7, 10, 3, 1, 2, 2, 0),
        (5, 5, 5, 3, 1, 2, 1),
        (1, 1, 3, 1, 1, 1, 0),
    ];

    /// Small integers in `p`'s two input planes.
    fn planes(p: &Pool2d) -> Vec<f32> {
        (0..2 * p.h * p.w)
            .map(|i| ((i * 37) % 23) as f32 - 11.0)
            .collect()
    }

    /// The geometry of `case` of [`CASES`], with `past` more output rows than fit the padded
    /// input (a ceil-mode window reaching past it).
    fn square(
        (h, w, k, s, d, pad, extra): (usize, usize, usize, usize, usize, usize, usize),
        past: usize,
    ) -> Pool2d {
        let out = |len: usize| (len + 2 * pad + extra - d * (k - 1) - 1) / s + 1;
        Pool2d {
            planes: 2,
            h,
            w,
            kh: k,
            kw: k,
            sh: s,
            sw: s,
            dh: d,
            dw: d,
            pt: pad,
            pl: pad,
            pb: pad + extra,
            pr: pad + extra,
            oh: out(h) + past,
            ow: out(w),
        }
    }

    /// Every output of `max_pool2d` against the window maximum taken tap by tap.
    #[test]
    fn max_matches_brute_force_with_padding_dilation_and_ceil() {
        for case in CASES {
            let p = square(case, 0);
            let (h, w, k, s, d, pad) = (p.h, p.w, p.kh, p.sh, p.dh, p.pt);
            let x = planes(&p);
            let mut got = vec![0.0; 2 * p.oh * p.ow];
            max_pool2d(&p, &x, &mut got, 2);
            for (i, g) in got.iter().enumerate() {
                let (pl, oy, ox) = (i / (p.oh * p.ow), (i / p.ow) % p.oh, i % p.ow);
                let mut want = f32::NEG_INFINITY;
                for ki in 0..k {
                    for kj in 0..k {
                        let iy = (oy * s + ki * d) as isize - pad as isize;
                        let ix = (ox * s + kj * d) as isize - pad as isize;
                        if iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < w {
                            want = want.max(x[pl * h * w + iy as usize * w + ix as usize]);
                        }
                    }
                }
                assert_eq!(*g, want, "{p:?} output {i}");
            }
            // The same on 8-bit values (these are all within i8).
            let xi: Vec<i8> = x.iter().map(|&v| v as i8).collect();
            let mut got_i = vec![0i8; got.len()];
            max_pool2d_ord(&p, &xi, &mut got_i, i8::MIN, 2);
            let want_i: Vec<i8> = got.iter().map(|&v| v as i8).collect();
            assert_eq!(got_i, want_i, "{p:?} on int8");
            // The same in NHWC: the two planes as the channels of one image.
            fn nhwc<T: Copy>(v: &[T], hw: usize) -> Vec<T> {
                (0..2 * hw).map(|i| v[(i % 2) * hw + i / 2]).collect()
            }
            let mut got_nhwc = vec![0.0; got.len()];
            max_pool2d_nhwc(&p, &nhwc(&x, h * w), &mut got_nhwc, 2);
            assert_eq!(got_nhwc, nhwc(&got, p.oh * p.ow), "{p:?} in NHWC");
            let mut got_nhwc_i = vec![0i8; got.len()];
            max_pool2d_nhwc_ord(&p, &nhwc(&xi, h * w), &mut got_nhwc_i, i8::MIN, 2);
            assert_eq!(
                got_nhwc_i,
                nhwc(&want_i, p.oh * p.ow),
                "{p:?} in NHWC on int8"
            );
        }
        let p = Pool2d {
            planes: 1,
            h: 2,
            w: 2,
            kh: 2,
            kw: 2,
            sh: 1,
            sw: 1,
            dh: 1,
            dw: 1,
            oh: 1,
            ow: 1,
            ..Default::default()
        };
        let mut o = [0.0];
        max_pool2d(&p, &[1.0, f32::NAN, 3.0, 2.0], &mut o, 1);
        assert!(o[0].is_nan());
        max_pool2d_nhwc(&p, &[1.0, f32::NAN, 3.0, 2.0], &mut o, 1);
        assert!(o[0].is_nan());
    }

    #[test]
    fn max_and_avg_on_a_small_plane() {
        let x: Vec<f32> = (0..16).map(|v| v as f32).collect();
        let p = Pool2d {
            planes: 1,
            h: 4,
            w: 4,
            kh: 2,
            kw: 2,
            sh: 2,
            sw: 2,
            dh: 1,
            dw: 1,
            oh: 2,
            ow: 2,
            ..Default::default()
        };
        let mut o = vec![0.0; 4];
        max_pool2d(&p, &x, &mut o, 1);
        assert_eq!(o, vec![5.0, 7.0, 13.0, 15.0]);
        avg_pool2d(&p, &x, &mut o, false, 1);
        assert_eq!(o, vec![2.5, 4.5, 10.5, 12.5]);
        let p = Pool2d {
            kh: 3,
            kw: 3,
            sh: 1,
            sw: 1,
            pt: 1,
            pl: 1,
            pb: 1,
            pr: 1,
            oh: 4,
            ow: 4,
            ..p
        };
        let mut o = vec![0.0; 16];
        avg_pool2d(&p, &x, &mut o, true, 1);
        assert!((o[0] - (0.0 + 1.0 + 4.0 + 5.0) / 9.0).abs() < 1e-6);
        avg_pool2d(&p, &x, &mut o, false, 1);
        assert!((o[0] - 2.5).abs() < 1e-6);
    }

    /// Every output of `avg_pool2d` against the average taken tap by tap over the padded
    /// window, with and without counting the padding; and windows of a billion taps a side over
    /// a 2x2 input, which visit only the values they read.
    #[test]
    fn avg_matches_brute_force_and_skips_the_padding() {
        for case in CASES {
            // A ceil-mode window may reach one stride past the padded input.
            let p = square(case, 1);
            let (h, w, k, s, d, pad, pb) = (p.h, p.w, p.kh, p.sh, p.dh, p.pt, p.pb);
            let x = planes(&p);
            for include in [false, true] {
                let mut got = vec![0.0; 2 * p.oh * p.ow];
                avg_pool2d(&p, &x, &mut got, include, 2);
                for (i, g) in got.iter().enumerate() {
                    let (pl, oy, ox) = (i / (p.oh * p.ow), (i / p.ow) % p.oh, i % p.ow);
                    let (mut sum, mut read, mut padded) = (0.0f32, 0, 0);
                    for ki in 0..k {
                        for kj in 0..k {
                            let (py, px) = (oy * s + ki * d, ox * s + kj * d);
                            if py >= pad + h + pb || px >= pad + w + pb {
                                continue;
                            }
                            padded += 1;
                            let (iy, ix) = (py as isize - pad as isize, px as isize - pad as isize);
                            if iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < w {
                                sum += x[pl * h * w + iy as usize * w + ix as usize];
                                read += 1;
                            }
                        }
                    }
                    let div = if include { padded } else { read };
                    let want = if div == 0 { 0.0 } else { sum / div as f32 };
                    assert_eq!(*g, want, "{p:?} count_include_pad {include} output {i}");
                }
            }
        }
        let huge = 1 << 30;
        let p = Pool2d {
            planes: 1,
            h: 2,
            w: 2,
            kh: huge,
            kw: huge,
            sh: huge,
            sw: huge,
            dh: 1,
            dw: 1,
            pt: huge - 1,
            pl: huge - 1,
            pb: huge - 1,
            pr: huge - 1,
            oh: 2,
            ow: 2,
        };
        let mut o = vec![0.0; 4];
        avg_pool2d(&p, &[1.0, 2.0, 3.0, 4.0], &mut o, false, 1);
        // Each window reads one value: the first ends, the second starts, on the input.
        assert_eq!(o, vec![1.0, 2.0, 3.0, 4.0]);
        avg_pool2d(&p, &[1.0, 2.0, 3.0, 4.0], &mut o, true, 1);
        let taps = huge as f32 * huge as f32;
        assert_eq!(o, vec![1.0 / taps, 2.0 / taps, 3.0 / taps, 4.0 / taps]);
    }
}
