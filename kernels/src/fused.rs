//! A pointwise (1x1) convolution feeding a depthwise one, fused: MobileNet's expansion →
//! depthwise pair. Per (image, block of expanded channels) the 1x1's GEMM writes the block into a
//! cache-sized scratch, and the depthwise kernel reads its planes straight from it, applying the
//! 1x1's bias and activation as it copies them in, so the expanded activation — the widest
//! tensor of the block — is never written out to memory and read back.

use crate::conv::{Conv2d, Epilogue};
use crate::depthwise::{PlaneKernel, Pre};
use crate::gemm::{Mat, sgemm_block};
use rayon::prelude::*;
use std::cell::RefCell;

/// Bytes of expanded planes one task keeps in its scratch: a quarter of a 2 MiB L2 cache. Every
/// block packs the whole input image for its GEMM again, so on large images (112x112, 16
/// channels in) fewer, larger blocks pay: mobilenet_v2 batch 1 on two threads was 2% faster
/// with 512 KiB than with 192 KiB, and no faster with 1 MiB.
const BLOCK_BYTES: usize = 512 << 10;

/// One convolution of the pair: geometry, weights and what it adds and applies on the way out.
#[derive(Clone, Copy, Debug)]
pub struct Stage<'a> {
    pub p: &'a Conv2d,
    pub weight: &'a [f32],
    pub epi: Epilogue<'a>,
}

thread_local! {
    /// A task's block of expanded planes.
    static EXPANDED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `out = depthwise(pointwise(input))`, each with its epilogue. Requires a pointwise first stage
/// (1x1, stride 1, no padding, one group), a depthwise second stage over its output, and no
/// residual in either.
pub fn pointwise_depthwise(
    pw: Stage<'_>,
    dw: Stage<'_>,
    input: &[f32],
    out: &mut [f32],
    threads: usize,
) {
    let (p1, p2) = (pw.p, dw.p);
    assert!(
        p1.is_pointwise() && p1.groups == 1 && p2.is_depthwise(),
        "pointwise_depthwise geometry"
    );
    assert!(
        p2.n == p1.n && p2.c == p1.m && (p2.h, p2.w) == (p1.h, p1.w),
        "pointwise_depthwise: the depthwise input is not the pointwise output"
    );
    assert!(pw.epi.residual.is_none() && dw.epi.residual.is_none());
    let (n, k, c, hw) = (p1.n, p1.c, p1.m, p1.h * p1.w);
    let (kk, out_plane) = (p2.kh * p2.kw, p2.oh * p2.ow);
    assert_eq!(input.len(), n * k * hw, "pointwise_depthwise input size");
    assert_eq!(pw.weight.len(), c * k, "pointwise weight size");
    assert_eq!(dw.weight.len(), c * kk, "depthwise weight size");
    assert_eq!(
        out.len(),
        n * c * out_plane,
        "pointwise_depthwise output size"
    );
    if out.is_empty() {
        return;
    }
    // Channels per task: what fits the scratch, in enough blocks of equal size to keep the
    // threads busy and evenly loaded.
    let fit = (BLOCK_BYTES / (4 * hw.max(1))).clamp(6, 64).min(c);
    let mut blocks = c.div_ceil(fit);
    if threads > 1 {
        blocks = (n * blocks)
            .max(2 * threads)
            .next_multiple_of(threads)
            .div_ceil(n);
    }
    let mb = c.div_ceil(blocks.min(c));
    let planes = PlaneKernel::new(p2, dw.epi.act);
    let task = |ni: usize, cb: usize, dst: &mut [f32]| {
        let (c0, rows) = (cb * mb, dst.len() / out_plane);
        let img = &input[ni * k * hw..(ni + 1) * k * hw];
        EXPANDED.with(|e| {
            let mut e = e.borrow_mut();
            e.resize(rows * hw, 0.0);
            let w1 = Mat::row_major(&pw.weight[c0 * k..(c0 + rows) * k], k);
            // SAFETY: w1 is rows×k, img k×hw, and `e` holds rows×hw floats of our own.
            unsafe {
                sgemm_block(
                    rows,
                    hw,
                    k,
                    w1,
                    Mat::row_major(img, hw),
                    e.as_mut_ptr(),
                    hw,
                    false,
                )
            };
            for ((r, plane), o) in e
                .chunks_exact_mut(hw)
                .enumerate()
                .zip(dst.chunks_exact_mut(out_plane))
            {
                let ch = c0 + r;
                let pre = Pre {
                    bias: pw.epi.bias.map(|b| b[ch]),
                    act: pw.epi.act,
                };
                let w2 = &dw.weight[ch * kk..(ch + 1) * kk];
                planes.run(plane, pre, w2, dw.epi.bias.map_or(0.0, |b| b[ch]), o);
            }
        });
    };
    let per_image = c * out_plane;
    if threads > 1 && n * c > mb {
        out.par_chunks_mut(per_image)
            .enumerate()
            .for_each(|(ni, img_out)| {
                img_out
                    .par_chunks_mut(mb * out_plane)
                    .enumerate()
                    .for_each(|(cb, dst)| task(ni, cb, dst))
            });
    } else {
        for (ni, img_out) in out.chunks_mut(per_image).enumerate() {
            for (cb, dst) in img_out.chunks_mut(mb * out_plane).enumerate() {
                task(ni, cb, dst);
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::activation::Activation;
    use crate::conv::conv2d;
    use crate::gemm::lcg;

    /// n, k (input channels), c (expanded channels), h, w, kernel, stride, pad
    const CASES: [[usize; 8]; 4] = [
        [2, 8, 24, 9, 10, 3, 1, 1],
        [1, 16, 96, 20, 21, 3, 2, 1],
        [3, 5, 7, 6, 6, 5, 2, 2],
        [1, 32, 200, 7, 7, 3, 1, 1],
    ];

    fn epi(bias: Option<&[f32]>, act: Option<Activation>) -> Epilogue<'_> {
        Epilogue {
            bias,
            residual: None,
            act,
        }
    }

    /// A square depthwise convolution over the output of `p1`.
    pub(crate) fn depthwise_after(p1: &Conv2d, ks: usize, s: usize, pad: usize) -> Conv2d {
        let out = |len: usize| (len + 2 * pad - ks) / s + 1;
        Conv2d {
            c: p1.m,
            m: p1.m,
            kh: ks,
            kw: ks,
            sh: s,
            sw: s,
            pt: pad,
            pl: pad,
            oh: out(p1.h),
            ow: out(p1.w),
            groups: p1.m,
            ..*p1
        }
    }

    #[test]
    fn matches_the_two_convolutions_run_apart() {
        let relu6 = Some(Activation::Clip(0.0, 6.0));
        for (i, &[n, k, c, h, w, ks, s, pad]) in CASES.iter().enumerate() {
            let p1 = Conv2d::pointwise(n, k, c, h, w);
            let p2 = depthwise_after(&p1, ks, s, pad);
            let x = lcg(1, n * k * h * w);
            let (w1, w2) = (lcg(2, c * k), lcg(3, c * ks * ks));
            let (b1, b2) = (lcg(4, c), lcg(5, c));
            let with_bias = i % 2 == 0;
            let (b1, b2) = (with_bias.then_some(&b1[..]), with_bias.then_some(&b2[..]));
            let act2 = if i == 2 {
                Some(Activation::HardSwish)
            } else {
                relu6
            };
            let mut mid = vec![0.0; n * c * h * w];
            let mut want = vec![0.0; n * c * p2.oh * p2.ow];
            conv2d(&p1, &x, &w1, epi(b1, relu6), &mut mid, &mut Vec::new(), 1);
            conv2d(&p2, &mid, &w2, epi(b2, act2), &mut want, &mut Vec::new(), 1);
            for threads in [1, 2, 3] {
                let mut got = vec![f32::NAN; want.len()];
                pointwise_depthwise(
                    Stage {
                        p: &p1,
                        weight: &w1,
                        epi: epi(b1, relu6),
                    },
                    Stage {
                        p: &p2,
                        weight: &w2,
                        epi: epi(b2, act2),
                    },
                    &x,
                    &mut got,
                    threads,
                );
                for (g, r) in got.iter().zip(&want) {
                    assert!(
                        (g - r).abs() <= 1e-4 * (1.0 + r.abs()),
                        "case {i} threads {threads}: {g} vs {r}"
                    );
                }
            }
        }
    }
}
