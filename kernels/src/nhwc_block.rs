//! MobileNet's inverted residual block on NHWC activations, fused: expansion 1x1 → depthwise →
//! projection 1x1 (+ residual), or the first two alone, computed band of output rows by band.
//!
//! In NHWC the rows of an image are contiguous, so a band of rows of any stage is a smaller
//! image of its own: per band the expansion ([`conv_nhwc`]) writes the input rows the band's
//! depthwise windows read into a scratch, the depthwise convolution ([`depthwise_nhwc`]) reads
//! them from there into a second scratch, and the projection reads that and writes the band's
//! output rows. Neither wide tensor (up to 4.8 MiB per image for mobilenet_v2) goes out to
//! memory, and every stage reads what the same thread has just written. The expanded rows two
//! bands share (the depthwise window's overlap) are kept, not computed again.
//!
//! Each task takes one range of output rows of one image and walks it in bands; every element
//! is computed as the three kernels compute it for the whole image (their sums do not depend on
//! which positions a call covers), so the output does not depend on the thread budget or the
//! batch.

use crate::conv::{Conv2d, Epilogue};
use crate::gemm::SharedOut;
use crate::nhwc_conv::{NhwcFilter, conv_nhwc};
use crate::nhwc_depthwise::{self, depthwise_nhwc};
use rayon::prelude::*;
use std::cell::RefCell;

/// Bytes of one band's expanded rows: a quarter of a 2 MiB L2 cache.
const BAND_BYTES: usize = 512 << 10;

thread_local! {
    /// A thread's expanded rows and depthwise output rows.
    static BANDS: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// One convolution of the block: its geometry, its packed weights and its epilogue.
#[derive(Clone, Copy, Debug)]
pub struct NhwcStage<'a> {
    pub p: &'a Conv2d,
    pub filter: &'a NhwcFilter,
    pub epi: Epilogue<'a>,
}

/// Whether [`inverted_residual_nhwc`] computes these stages: 1x1 stride-1 unpadded ungrouped
/// expansion (and projection) around a depthwise convolution, chained shape to shape, each with
/// its filter, only the last with a residual.
pub fn applies(ex: &NhwcStage<'_>, dw: &NhwcStage<'_>, pr: Option<&NhwcStage<'_>>) -> bool {
    let pointwise = |s: &NhwcStage<'_>| {
        s.p.is_pointwise() && s.p.groups == 1 && s.p.c > 0 && s.filter.fits(s.p)
    };
    let (p1, p2) = (ex.p, dw.p);
    let pair = pointwise(ex)
        && nhwc_depthwise::applies(p2)
        && dw.filter.fits(p2)
        && (p2.n, p2.c, p2.h, p2.w) == (p1.n, p1.m, p1.oh, p1.ow)
        && ex.epi.residual.is_none();
    pair && pr.is_none_or(|pr| {
        pointwise(pr)
            && dw.epi.residual.is_none()
            && (pr.p.n, pr.p.c, pr.p.h, pr.p.w) == (p2.n, p2.m, p2.oh, p2.ow)
    })
}

/// `out = project(depthwise(expand(x)))`, each with its epilogue (or `depthwise(expand(x))`
/// without a projection), NHWC in and out.
///
/// # Panics
/// If the CPU has neither AVX-512F nor AVX2 + FMA, the stages do not [`applies`], or `x`, the residual or `out`
/// has the wrong size.
pub fn inverted_residual_nhwc(
    ex: NhwcStage<'_>,
    dw: NhwcStage<'_>,
    pr: Option<NhwcStage<'_>>,
    x: &[f32],
    out: &mut [f32],
    threads: usize,
) {
    assert!(
        nhwc_depthwise::available(),
        "inverted_residual_nhwc needs AVX-512F or AVX2"
    );
    assert!(
        applies(&ex, &dw, pr.as_ref()),
        "inverted_residual_nhwc of {:?}, {:?}, {:?}",
        ex.p,
        dw.p,
        pr.map(|s| s.p)
    );
    let (p1, p2) = (ex.p, dw.p);
    let last = pr.as_ref().map_or(p2, |s| s.p);
    assert_eq!(
        x.len(),
        p1.n * p1.h * p1.w * p1.c,
        "inverted_residual_nhwc input size"
    );
    let row = last.ow * last.m;
    assert_eq!(
        out.len(),
        p2.n * p2.oh * row,
        "inverted_residual_nhwc output size"
    );
    let end = pr.map_or(dw.epi, |s| s.epi);
    if let Some(r) = end.residual {
        assert_eq!(r.len(), out.len(), "inverted_residual_nhwc residual size");
    }
    if out.is_empty() {
        return;
    }
    let ranges = threads.div_ceil(p2.n).min(p2.oh);
    // Stage by stage where the rows split unevenly and the expanded tensor is no larger than
    // a band's scratch could grow to (two of BAND_BYTES).
    let expanded_bytes = 4 * p1.n * p1.oh * p1.ow * p1.m;
    if ranges > 1 && p2.h > 0 && expanded_bytes <= 2 * BAND_BYTES && uneven(p2, ranges) {
        staged(threads, (&ex, &dw, pr.as_ref()), x, out);
        return;
    }
    // Output rows per band: as many as keep the expanded rows they read within BAND_BYTES.
    let expanded_row = p2.w * p2.c * 4;
    let band = (BAND_BYTES / expanded_row / p2.sh).max(1).min(p2.oh);
    // Row ranges per image: one per thread when the batch is smaller than the budget, no
    // more. Each range expands the rows its first and last windows share with its neighbours
    // again: a 7x7 block as four ranges of 2, 2, 2 and 1 rows expands 13 rows for 7, and one
    // of two threads does 4 rows and expands 7; as two ranges of 4 and 3 rows they expand 5
    // and 4 (mobilenet_v2's 7x7 blocks on two threads were slower than on one).
    let per = p2.oh.div_ceil(ranges);
    let dst = SharedOut(out.as_mut_ptr());
    let run = |t: usize| {
        let (img, k) = (t / ranges, t % ranges);
        let rows = (k * per).min(p2.oh)..((k + 1) * per).min(p2.oh);
        BANDS.with(|b| {
            let (expanded, depthwise) = &mut *b.borrow_mut();
            let mut kept = 0..0;
            for oy0 in rows.clone().step_by(band) {
                let oys = oy0..(oy0 + band).min(rows.end);
                // SAFETY: tasks write disjoint rows of `out`: this band's, of image img.
                let band_out = unsafe {
                    std::slice::from_raw_parts_mut(
                        dst.at((img * p2.oh + oys.start) * row),
                        oys.len() * row,
                    )
                };
                kept = one_band(
                    (&ex, &dw, pr.as_ref()),
                    x,
                    img,
                    oys,
                    kept,
                    (expanded, depthwise),
                    band_out,
                );
            }
        });
    };
    let tasks = p2.n * ranges;
    if threads > 1 {
        (0..tasks).into_par_iter().for_each(run);
    } else {
        (0..tasks).for_each(run);
    }
}

/// Whether splitting each image's output rows into `ranges` leaves the busiest range with a
/// tenth more work than an even share: its share of the input rows to expand (the rows its
/// windows share with its neighbours are expanded by both) and of the output rows, weighed
/// alike (the expansion and the projection make about as many multiply-adds). On two threads
/// mobilenet_v2's 7x7 blocks come to 1.29 (5 and 4 input rows of 7, 4 and 3 output rows), its
/// 14x14 blocks of stride 2 to 1.14, and its 14x14 blocks of stride 1 to 1.07.
fn uneven(p: &Conv2d, ranges: usize) -> bool {
    let per = p.oh.div_ceil(ranges);
    let share = |k: usize| {
        let (a, b) = ((k * per).min(p.oh), ((k + 1) * per).min(p.oh));
        if a == b {
            return 0.0;
        }
        let first = (a * p.sh).saturating_sub(p.pt);
        let reach = ((b - 1) * p.sh + (p.kh - 1) * p.dh + 1).saturating_sub(p.pt);
        let inputs = reach.min(p.h).saturating_sub(first);
        (inputs as f64 / p.h as f64 + (b - a) as f64 / p.oh as f64) / 2.0
    };
    let busiest = (0..ranges).map(share).fold(0.0, f64::max);
    busiest * ranges as f64 > 1.1
}

/// The three stages one after the other over the whole batch, each split across `threads`
/// as its kernel splits it: for the blocks whose rows do not split evenly ([`uneven`]). The
/// kernels split an image's expansion and projection by output channels or positions, evenly;
/// the wide tensors go through the calling thread's scratch.
fn staged(
    threads: usize,
    (ex, dw, pr): (&NhwcStage<'_>, &NhwcStage<'_>, Option<&NhwcStage<'_>>),
    x: &[f32],
    out: &mut [f32],
) {
    let (p1, p2) = (ex.p, dw.p);
    // Taken, not borrowed: a thread that runs another block while it waits for this one's
    // tasks finds its scratch empty, and grows its own.
    let (mut expanded, mut depthwise) = BANDS.with(|b| std::mem::take(&mut *b.borrow_mut()));
    let wide = p1.n * p1.oh * p1.ow * p1.m;
    let expanded_all = crate::grown(&mut expanded, wide);
    conv_nhwc(threads, p1, x, ex.filter, ex.epi, expanded_all);
    match pr {
        None => depthwise_nhwc(threads, p2, expanded_all, dw.filter, dw.epi, out),
        Some(pr) => {
            let depthwise_all = crate::grown(&mut depthwise, p2.n * p2.oh * p2.ow * p2.m);
            depthwise_nhwc(threads, p2, expanded_all, dw.filter, dw.epi, depthwise_all);
            conv_nhwc(threads, pr.p, depthwise_all, pr.filter, pr.epi, out);
        }
    }
    BANDS.with(|b| *b.borrow_mut() = (expanded, depthwise));
}

/// Output rows `oys` of image `img` into `out` (those rows alone). `expanded` holds the
/// expanded input rows `kept` from the band before; returns the rows it holds now.
fn one_band(
    (ex, dw, pr): (&NhwcStage<'_>, &NhwcStage<'_>, Option<&NhwcStage<'_>>),
    x: &[f32],
    img: usize,
    oys: std::ops::Range<usize>,
    kept: std::ops::Range<usize>,
    (expanded, depthwise): (&mut Vec<f32>, &mut Vec<f32>),
    out: &mut [f32],
) -> std::ops::Range<usize> {
    let (p1, p2) = (ex.p, dw.p);
    // The input rows the band's windows read, within the image.
    let first = (oys.start * p2.sh).saturating_sub(p2.pt);
    let reach = (oys.end - 1) * p2.sh + (p2.kh - 1) * p2.dh + 1;
    let need = first..reach.saturating_sub(p2.pt).min(p2.h).max(first);
    let row = p2.w * p2.c;
    // Keep the rows the band before computed that this one reads; compute the rest.
    let keep = need.start.max(kept.start)..kept.end.max(need.start);
    let len = need.len() * row;
    if expanded.len() < len {
        expanded.resize(len, 0.0);
    }
    if !keep.is_empty() {
        expanded.copy_within(
            (keep.start - kept.start) * row..(keep.end - kept.start) * row,
            0,
        );
    }
    let fresh = keep.end.max(need.start)..need.end;
    if !fresh.is_empty() {
        let p = Conv2d {
            n: 1,
            h: fresh.len(),
            oh: fresh.len(),
            ..*p1
        };
        let input = &x[((img * p1.h + fresh.start) * p1.w * p1.c)..][..fresh.len() * p1.w * p1.c];
        let at = (fresh.start - need.start) * row;
        conv_nhwc(
            1,
            &p,
            input,
            ex.filter,
            ex.epi,
            &mut expanded[at..][..fresh.len() * row],
        );
    }
    // The depthwise convolution over the rows held: an image of need.len() rows, whose top
    // padding is what remains of the window above row need.start.
    let p = Conv2d {
        n: 1,
        h: need.len(),
        pt: p2.pt + need.start - oys.start * p2.sh,
        oh: oys.len(),
        ..*p2
    };
    // The band's rows of the residual, which has the output's shape.
    let at = |m: usize| (img * p2.oh + oys.start) * p2.ow * m;
    match pr {
        None => depthwise_nhwc(
            1,
            &p,
            &expanded[..len],
            dw.filter,
            residual_rows(dw.epi, at(p2.m), out.len()),
            out,
        ),
        Some(pr) => {
            // Grown, never shrunk: a shorter band after a longer one fills nothing in.
            let n = oys.len() * p2.ow * p2.m;
            if depthwise.len() < n {
                depthwise.resize(n, 0.0);
            }
            let depthwise = &mut depthwise[..n];
            depthwise_nhwc(1, &p, &expanded[..len], dw.filter, dw.epi, depthwise);
            let p = Conv2d {
                n: 1,
                h: oys.len(),
                oh: oys.len(),
                ..*pr.p
            };
            conv_nhwc(
                1,
                &p,
                depthwise,
                pr.filter,
                residual_rows(pr.epi, at(pr.p.m), out.len()),
                out,
            );
        }
    }
    need
}

/// Epilogue `e` with its residual cut to `len` floats from `at`.
fn residual_rows(e: Epilogue<'_>, at: usize, len: usize) -> Epilogue<'_> {
    Epilogue {
        residual: e.residual.map(|r| &r[at..][..len]),
        ..e
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activation::Activation;
    use crate::nhwc_conv::tests::values;

    fn conv(n: usize, c: usize, h: usize, m: usize, k: usize, s: usize, groups: usize) -> Conv2d {
        let pad = k / 2;
        let mut p = crate::test_conv((n, c, h, h, m, k, s, 1, pad, pad));
        p.groups = groups;
        p
    }

    /// The fused block against its three kernels one after the other, bit for bit, with and
    /// without the projection, over batches, thread budgets, strides and images whose bands
    /// split (the 40x40 image's expanded rows exceed a band).
    #[test]
    fn matches_the_stages_one_after_the_other() {
        if crate::skip_without(nhwc_depthwise::available(), "AVX-512F or AVX2 + FMA") {
            return;
        }
        // (n, input channels, image, expanded, output channels, stride, residual)
        for (n, k, h, e, m, s, res) in [
            (1, 8, 9, 24, 8, 1, true),
            (2, 16, 10, 48, 20, 2, false),
            (3, 5, 7, 40, 5, 1, true),
            (1, 24, 40, 144, 24, 1, true),
            (1, 16, 41, 96, 24, 2, false),
            // Rows that split unevenly: the stages one after the other on two threads.
            (1, 32, 7, 96, 32, 1, true),
            (1, 32, 14, 96, 48, 2, false),
        ] {
            let p1 = conv(n, k, h, e, 1, 1, 1);
            let p2 = conv(n, e, h, e, 3, s, e);
            let p3 = conv(n, e, p2.oh, m, 1, 1, 1);
            let x = values(n * h * h * k, 1);
            let (w1, w2, w3) = (values(e * k, 2), values(e * 9, 3), values(m * e, 4));
            let (b1, b2, b3) = (values(e, 5), values(e, 6), values(m, 7));
            let residual = values(n * p3.oh * p3.ow * m, 8);
            let filters = (
                NhwcFilter::new(&w1, e, k, 1, 1),
                NhwcFilter::new(&w2, e, 1, 3, 3),
                NhwcFilter::new(&w3, m, e, 1, 1),
            );
            let relu6 = Some(Activation::Clip(0.0, 6.0));
            let stage = |p, filter, bias, residual, act| NhwcStage {
                p,
                filter,
                epi: Epilogue {
                    bias: Some(bias),
                    residual,
                    act,
                },
            };
            let ex = stage(&p1, &filters.0, &b1, None, relu6);
            let dw = stage(&p2, &filters.1, &b2, None, relu6);
            let pr = stage(&p3, &filters.2, &b3, res.then_some(&residual[..]), None);
            let mut mid = vec![0.0; n * h * h * e];
            conv_nhwc(1, &p1, &x, &filters.0, ex.epi, &mut mid);
            let mut pair = vec![0.0; n * p2.oh * p2.ow * e];
            depthwise_nhwc(1, &p2, &mid, &filters.1, dw.epi, &mut pair);
            let mut block = vec![0.0; n * p3.oh * p3.ow * m];
            conv_nhwc(1, &p3, &pair, &filters.2, pr.epi, &mut block);
            for threads in [1, 2, 3] {
                let mut got = vec![f32::NAN; pair.len()];
                inverted_residual_nhwc(ex, dw, None, &x, &mut got, threads);
                assert_eq!(got, pair, "pair {:?} threads {threads}", p2);
                let mut got = vec![f32::NAN; block.len()];
                inverted_residual_nhwc(ex, dw, Some(pr), &x, &mut got, threads);
                assert_eq!(got, block, "block {:?} threads {threads}", p2);
            }
            assert!(!applies(&dw, &ex, None), "the stages in the wrong order");
            if (n, h) == (1, 7) {
                assert!(uneven(&p2, 2) && !uneven(&conv(1, e, 14, e, 3, 1, e), 2));
            }
        }
    }
}
