//! MobileNet's inverted residual block fused whole: expansion 1x1 → depthwise → projection 1x1
//! (+ residual), computed band of output rows by band of output rows. Per band the expansion
//! writes the input rows the band needs (all expanded channels) into a scratch, the depthwise
//! convolution reads them from there (applying the expansion's bias and activation as it copies
//! them in), and the projection reads the depthwise output from a second scratch: neither of the
//! two wide tensors is written out to memory, and the projection reads only what the same thread
//! has just computed (split by channels instead, each thread would read half its input from the
//! other core's cache).
//!
//! Each thread takes one range of output rows of an image and walks it in bands that fit its
//! cache; the expanded rows that two bands share (the depthwise window's overlap) are kept, not
//! computed again. Every element is computed exactly as it would be for any other split into
//! ranges and bands: the GEMMs' sums do not depend on how many columns a call covers, and the
//! depthwise stencil's on where the plane starts. So the output does not depend on the thread
//! budget or on the batch.

use crate::activation::bias_act;
use crate::conv::Conv2d;
use crate::depthwise::{PlaneKernel, Pre};
use crate::fused::Stage;
use crate::gemm::{Mat, SharedOut, sgemm_block};
use rayon::prelude::*;
use std::cell::RefCell;

/// Bytes of one band's expanded and depthwise-output rows: a quarter of a 2 MiB L2 cache.
const BAND_BYTES: usize = 512 << 10;

thread_local! {
    /// A thread's expanded rows and depthwise output rows.
    static BANDS: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// `out = project(depthwise(expand(input)))`, each with its epilogue; only the projection may
/// carry a residual (of the output's shape). Requires 1x1 stride-1 unpadded ungrouped
/// expansion and projection around a depthwise convolution, chained shape to shape.
pub fn inverted_residual(
    ex: Stage<'_>,
    dw: Stage<'_>,
    pr: Stage<'_>,
    input: &[f32],
    out: &mut [f32],
    threads: usize,
) {
    let (p1, p2, p3) = (ex.p, dw.p, pr.p);
    let pointwise = |p: &Conv2d| p.is_pointwise() && p.groups == 1;
    assert!(
        pointwise(p1) && p2.is_depthwise() && pointwise(p3),
        "inverted_residual geometry"
    );
    assert!(
        p2.n == p1.n && p2.c == p1.m && (p2.h, p2.w) == (p1.h, p1.w),
        "inverted_residual: the depthwise input is not the expansion output"
    );
    assert!(
        p3.n == p1.n && p3.c == p2.m && (p3.h, p3.w) == (p2.oh, p2.ow),
        "inverted_residual: the projection input is not the depthwise output"
    );
    assert!(ex.epi.residual.is_none() && dw.epi.residual.is_none());
    let (n, k, c, m) = (p1.n, p1.c, p1.m, p3.m);
    assert!(
        k > 0 && c > 0,
        "inverted_residual: no input or expanded channels"
    );
    assert_eq!(
        input.len(),
        n * k * p1.h * p1.w,
        "inverted_residual input size"
    );
    assert_eq!(ex.weight.len(), c * k, "expansion weight size");
    assert_eq!(dw.weight.len(), c * p2.kh * p2.kw, "depthwise weight size");
    assert_eq!(pr.weight.len(), m * c, "projection weight size");
    assert_eq!(
        out.len(),
        n * m * p2.oh * p2.ow,
        "inverted_residual output size"
    );
    if let Some(r) = pr.epi.residual {
        assert_eq!(r.len(), out.len(), "inverted_residual residual size");
    }
    if out.is_empty() {
        return;
    }
    // Row ranges per image: enough to give every thread one.
    let parts = if threads > 1 {
        threads.div_ceil(n).min(p2.oh)
    } else {
        1
    };
    let dst = SharedOut(out.as_mut_ptr());
    let task = |t: usize| {
        let (ni, part) = (t / parts, t % parts);
        let rows = (p2.oh * part / parts, p2.oh * (part + 1) / parts);
        BANDS.with(|b| {
            let (expanded, depthwise) = &mut *b.borrow_mut();
            // SAFETY: tasks write disjoint rows of `out` (image `ni`, output rows `rows`).
            unsafe { row_range(ex, dw, pr, input, ni, rows, dst, expanded, depthwise) }
        });
    };
    if n * parts > 1 && threads > 1 {
        (0..n * parts).into_par_iter().for_each(task);
    } else {
        (0..n * parts).for_each(task);
    }
}

/// Input rows `[lo, hi)` the depthwise convolution reads for output rows `[a, b)`.
fn input_rows(p: &Conv2d, a: usize, b: usize) -> (usize, usize) {
    let first = a as isize * p.sh as isize - p.pt as isize;
    let last = (b as isize - 1) * p.sh as isize - p.pt as isize + ((p.kh - 1) * p.dh) as isize;
    let clamp = |v: isize| v.clamp(0, p.h as isize) as usize;
    let lo = clamp(first);
    (lo, clamp(last + 1).max(lo))
}

/// Output rows `[r0, r1)` of image `ni`, band by band.
///
/// # Safety
/// No other thread accesses those rows of `out` (every output channel) meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn row_range(
    ex: Stage<'_>,
    dw: Stage<'_>,
    pr: Stage<'_>,
    input: &[f32],
    ni: usize,
    (r0, r1): (usize, usize),
    out: SharedOut,
    expanded: &mut Vec<f32>,
    depthwise: &mut Vec<f32>,
) {
    let (p1, p2, p3) = (ex.p, dw.p, pr.p);
    let (k, c, m) = (p1.c, p1.m, p3.m);
    let (w, hw, ow, out_plane) = (p2.w, p2.h * p2.w, p2.ow, p2.oh * p2.ow);
    let img = &input[ni * k * hw..(ni + 1) * k * hw];
    // Output rows per band, and the most input rows a band reads.
    let band = (BAND_BYTES / (4 * c * (p2.sh * w + ow))).clamp(1, r1 - r0);
    let cap = (band - 1) * p2.sh + (p2.kh - 1) * p2.dh + 1;
    expanded.resize(c * cap * w, 0.0);
    depthwise.resize(c * band * ow, 0.0);
    // Input rows [e0, e1) are at rows [0, e1 - e0) of every channel's slot in `expanded`.
    let (mut e0, mut e1) = (0, 0);
    let mut a = r0;
    while a < r1 {
        let b = (a + band).min(r1);
        let (lo, hi) = input_rows(p2, a, b);
        if lo >= e1 {
            (e0, e1) = (lo, lo);
        } else if lo > e0 {
            for slot in expanded.chunks_exact_mut(cap * w) {
                slot.copy_within((lo - e0) * w..(e1 - e0) * w, 0);
            }
            e0 = lo;
        }
        if hi > e1 {
            let w1 = Mat::row_major(ex.weight, k);
            let x = Mat {
                data: &img[e1 * w..],
                rs: hw,
                cs: 1,
            };
            let at = (e1 - e0) * w;
            // SAFETY: w1 is c×k, x k×(hi-e1)*w; every channel's slot holds cap ≥ hi - e0 rows.
            unsafe {
                sgemm_block(
                    c,
                    (hi - e1) * w,
                    k,
                    w1,
                    x,
                    expanded[at..].as_mut_ptr(),
                    cap * w,
                    false,
                )
            };
            e1 = hi;
        }
        // The band as a depthwise convolution of its own over input rows [lo, hi). A band
        // whose windows lie wholly in the bottom padding reads no rows (lo = hi = h): any top
        // padding then gives its outputs the bias alone.
        let sub = Conv2d {
            n: 1,
            h: hi - lo,
            pt: (lo + p2.pt).saturating_sub(a * p2.sh),
            oh: b - a,
            ..*p2
        };
        let planes = PlaneKernel::new(&sub, dw.epi.act);
        let (kk, band_px) = (p2.kh * p2.kw, (b - a) * ow);
        for (ch, (slot, d)) in expanded
            .chunks_exact(cap * w)
            .zip(depthwise.chunks_exact_mut(band_px))
            .enumerate()
        {
            // The expansion's bias and activation are applied as the depthwise kernel copies its
            // rows in, so the rows kept for the next band stay as the GEMM wrote them.
            let src = &slot[(lo - e0) * w..(hi - e0) * w];
            let pre = Pre {
                bias: ex.epi.bias.map(|b| b[ch]),
                act: ex.epi.act,
            };
            let b2 = dw.epi.bias.map_or(0.0, |b| b[ch]);
            planes.run(src, pre, &dw.weight[ch * kk..(ch + 1) * kk], b2, d);
        }
        let base = ni * m * out_plane + a * ow;
        // SAFETY: projection weights are m×c, the band c×band_px; the destination rows are
        // this task's (the caller's contract).
        unsafe {
            sgemm_block(
                m,
                band_px,
                c,
                Mat::row_major(pr.weight, c),
                Mat::row_major(&depthwise[..c * band_px], band_px),
                out.at(base),
                out_plane,
                false,
            )
        };
        for r in 0..m {
            let at = base + r * out_plane;
            // SAFETY: as above.
            let row = unsafe { std::slice::from_raw_parts_mut(out.at(at), band_px) };
            if let Some(res) = pr.epi.residual {
                row.iter_mut()
                    .zip(&res[at..at + band_px])
                    .for_each(|(o, x)| *o += *x);
            }
            bias_act(row, pr.epi.bias.map(|b| b[r]), pr.epi.act);
        }
        a = b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activation::Activation;
    use crate::conv::{Epilogue, conv2d};
    use crate::fused::tests::depthwise_after;
    use crate::gemm::lcg;

    /// n, k (input channels), c (expanded), m (output channels), h, w, kernel, stride, pad
    const CASES: [[usize; 9]; 7] = [
        [2, 8, 24, 8, 9, 10, 3, 1, 1],
        [1, 16, 96, 24, 56, 56, 3, 1, 1],
        [1, 24, 144, 32, 56, 56, 3, 2, 1],
        [3, 5, 7, 6, 6, 6, 5, 2, 2],
        [1, 32, 200, 40, 7, 7, 3, 1, 1],
        [2, 4, 12, 4, 1, 9, 3, 1, 1],
        // padding wider than the kernel: the first and last rows read only padding
        [1, 4, 8, 4, 1, 5, 3, 1, 6],
    ];

    fn epi<'a>(
        bias: Option<&'a [f32]>,
        residual: Option<&'a [f32]>,
        act: Option<Activation>,
    ) -> Epilogue<'a> {
        Epilogue {
            bias,
            residual,
            act,
        }
    }

    fn bias(with: bool, b: &[f32]) -> Option<&[f32]> {
        with.then_some(b)
    }

    /// Against the three convolutions run one after the other, and bit for bit against itself
    /// on other thread budgets and with each image run alone.
    #[test]
    fn matches_the_three_convolutions_and_not_the_split() {
        let relu6 = Some(Activation::Clip(0.0, 6.0));
        for (i, &[n, k, c, m, h, w, ks, s, pad]) in CASES.iter().enumerate() {
            let p1 = Conv2d::pointwise(n, k, c, h, w);
            let p2 = depthwise_after(&p1, ks, s, pad);
            let p3 = Conv2d::pointwise(n, c, m, p2.oh, p2.ow);
            let x = lcg(1, n * k * h * w);
            let (w1, w2, w3) = (lcg(2, c * k), lcg(3, c * ks * ks), lcg(4, m * c));
            let (b1, b2, b3) = (lcg(5, c), lcg(6, c), lcg(7, m));
            let with_bias = i % 2 == 0;
            let res = lcg(8, n * m * p2.oh * p2.ow);
            let residual = (i % 3 != 1).then_some(&res[..]);
            let act3 = (i == 3).then_some(Activation::Relu);
            // The expansion's activation is applied as the depthwise kernel copies its input.
            let act1 = match i {
                4 => Some(Activation::HardSwish),
                5 => Some(Activation::Relu),
                _ => relu6,
            };
            let mut mid = vec![0.0; n * c * h * w];
            let mut mid2 = vec![0.0; n * c * p2.oh * p2.ow];
            let mut want = vec![0.0; res.len()];
            let s = &mut Vec::new();
            conv2d(
                &p1,
                &x,
                &w1,
                epi(bias(with_bias, &b1), None, act1),
                &mut mid,
                s,
                1,
            );
            conv2d(
                &p2,
                &mid,
                &w2,
                epi(bias(with_bias, &b2), None, relu6),
                &mut mid2,
                s,
                1,
            );
            conv2d(
                &p3,
                &mid2,
                &w3,
                epi(bias(with_bias, &b3), residual, act3),
                &mut want,
                s,
                1,
            );
            let run = |n: usize, x: &[f32], residual: Option<&[f32]>, threads: usize| {
                let (p1, p2, p3) = (Conv2d { n, ..p1 }, Conv2d { n, ..p2 }, Conv2d { n, ..p3 });
                let mut got = vec![f32::NAN; n * m * p2.oh * p2.ow];
                inverted_residual(
                    Stage {
                        p: &p1,
                        weight: &w1,
                        epi: epi(bias(with_bias, &b1), None, act1),
                    },
                    Stage {
                        p: &p2,
                        weight: &w2,
                        epi: epi(bias(with_bias, &b2), None, relu6),
                    },
                    Stage {
                        p: &p3,
                        weight: &w3,
                        epi: epi(bias(with_bias, &b3), residual, act3),
                    },
                    x,
                    &mut got,
                    threads,
                );
                got
            };
            let one = run(n, &x, residual, 1);
            for (g, r) in one.iter().zip(&want) {
                assert!(
                    (g - r).abs() <= 1e-4 * (1.0 + r.abs()),
                    "case {i}: {g} vs {r}"
                );
            }
            for threads in [2, 3, 4] {
                assert!(
                    run(n, &x, residual, threads) == one,
                    "case {i}: {threads} threads differ from one"
                );
            }
            let (per_in, per_out) = (k * h * w, m * p2.oh * p2.ow);
            let last = n - 1;
            let alone = run(
                1,
                &x[last * per_in..],
                residual.map(|r| &r[last * per_out..]),
                2,
            );
            assert!(
                alone == one[last * per_out..],
                "case {i}: the last image alone differs"
            );
        }
    }
}
