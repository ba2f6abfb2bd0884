//! Ungrouped convolutions with few output pixels per image (a short-time Fourier transform
//! written as a 1-D convolution of 257 filters of 512 taps at stride 160 over 5 frames; the last
//! layers of a CNN on a small image): each output is the dot product of a pixel's patch with a
//! filter, which [`crate::dense`] computes reading the weights where they lie. As im2col + GEMM,
//! the pixels are the GEMM's columns, and a handful of them leave most of its vector lanes
//! empty while it packs every weight again on each call.

use crate::activation::bias_act;
use crate::conv::{Conv2d, Epilogue};
use crate::dense;

/// Most output pixels per image this path takes. Above it the GEMM's columns are full enough.
pub const MAX_PIXELS: usize = 6;

/// Whether [`conv`] runs `p` here.
pub fn applies(p: &Conv2d) -> bool {
    p.groups == 1 && p.oh * p.ow <= MAX_PIXELS && dense::available()
}

/// `out[n, m, oh, ow] = act(conv(input, weight) + bias + residual)` for a convolution
/// [`applies`] takes; `weight` is `[m, c, kh, kw]`, `scratch` holds the patches.
pub fn conv(
    p: &Conv2d,
    input: &[f32],
    weight: &[f32],
    epi: Epilogue<'_>,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
    threads: usize,
) {
    let (k, pixels) = (p.c * p.kh * p.kw, p.oh * p.ow);
    let rows = p.n * pixels;
    assert_eq!(input.len(), p.n * p.c * p.h * p.w, "conv input size");
    assert_eq!(out.len(), rows * p.m, "conv output size");
    // One patch row per pixel of every image, then one product for the whole batch: the
    // products of a pixel are the same sums whichever image or batch it is in.
    scratch.resize(rows * k + rows * p.m, 0.0);
    let (patches, products) = scratch.split_at_mut(rows * k);
    for (r, row) in patches.chunks_exact_mut(k).enumerate() {
        let (img, q) = (r / pixels, r % pixels);
        patch(
            p,
            &input[img * p.c * p.h * p.w..][..p.c * p.h * p.w],
            q,
            row,
        );
    }
    dense::dense(patches, weight, (rows, k, p.m), products, threads);
    // Products are [pixel, channel]; the output is [channel, pixel] per image.
    for (img, dst) in out.chunks_exact_mut(p.m * pixels).enumerate() {
        let from = &products[img * pixels * p.m..][..pixels * p.m];
        for (ch, plane) in dst.chunks_exact_mut(pixels).enumerate() {
            for (q, o) in plane.iter_mut().enumerate() {
                *o = from[q * p.m + ch];
            }
            if let Some(r) = epi.residual {
                let at = (img * p.m + ch) * pixels;
                plane.iter_mut().zip(&r[at..]).for_each(|(o, r)| *o += r);
            }
            bias_act(plane, epi.bias.map(|b| b[ch]), epi.act);
        }
    }
}

/// The `c·kh·kw` taps of output pixel `q` of one image, channel by channel and row by row as
/// the weights hold them: the input value each reads, 0 in the padding.
fn patch(p: &Conv2d, img: &[f32], q: usize, row: &mut [f32]) {
    let (oy, ox) = (q / p.ow, q % p.ow);
    let y0 = (oy * p.sh) as isize - p.pt as isize;
    let x0 = (ox * p.sw) as isize - p.pl as isize;
    for (ci, taps) in row.chunks_exact_mut(p.kh * p.kw).enumerate() {
        let plane = &img[ci * p.h * p.w..][..p.h * p.w];
        for (ki, dst) in taps.chunks_exact_mut(p.kw).enumerate() {
            let iy = y0 + (ki * p.dh) as isize;
            if iy < 0 || iy >= p.h as isize {
                dst.fill(0.0);
                continue;
            }
            let src = &plane[iy as usize * p.w..][..p.w];
            let inside = p.dw == 1 && x0 >= 0 && x0 as usize + p.kw <= p.w;
            if inside {
                dst.copy_from_slice(&src[x0 as usize..][..p.kw]);
                continue;
            }
            for (kj, d) in dst.iter_mut().enumerate() {
                let ix = x0 + (kj * p.dw) as isize;
                *d = if ix >= 0 && ix < p.w as isize {
                    src[ix as usize]
                } else {
                    0.0
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activation::Activation;
    use crate::conv::conv2d_reference;
    use crate::gemm::lcg;

    fn stft(n: usize, samples: usize) -> Conv2d {
        // 257 filters of 512 taps at stride 160 along a row.
        Conv2d {
            n,
            c: 1,
            h: 1,
            w: samples,
            m: 257,
            kh: 1,
            kw: 512,
            sh: 1,
            sw: 160,
            dh: 1,
            dw: 1,
            oh: 1,
            ow: (samples - 512) / 160 + 1,
            groups: 1,
            ..Default::default()
        }
    }

    /// Through `conv2d`, which takes this path where [`applies`] (and the GEMM on CPUs
    /// without AVX2, where the same checks then hold for it).
    fn run(p: &Conv2d, epi: Epilogue<'_>, x: &[f32], w: &[f32], threads: usize) -> Vec<f32> {
        let mut out = vec![f32::NAN; p.n * p.m * p.oh * p.ow];
        crate::conv::conv2d(p, x, w, epi, &mut out, &mut Vec::new(), threads);
        out
    }

    #[test]
    fn few_pixel_convolutions_match_the_reference() {
        let cases = [
            stft(1, 1280),
            stft(3, 1000),
            // A 3x3 layer on a 2x3 image, padded (every tap row and column clipped somewhere).
            crate::test_conv((2, 70, 2, 3, 33, 3, 1, 1, 1, 1)),
            // Strided, dilated, padded past the image on one side.
            crate::test_conv((1, 5, 9, 7, 17, 3, 3, 2, 2, 0)),
            // A 1x1 convolution of a 2x2 image (one tap per channel).
            crate::test_conv((2, 40, 2, 2, 9, 1, 1, 1, 0, 0)),
        ];
        for p in cases {
            assert_eq!(applies(&p), dense::available(), "{p:?}");
            let x = lcg(1, p.n * p.c * p.h * p.w);
            let w = lcg(2, p.m * p.c * p.kh * p.kw);
            let (b, r) = (lcg(3, p.m), lcg(4, p.n * p.m * p.oh * p.ow));
            let mut want = vec![0.0; r.len()];
            conv2d_reference(&p, &x, &w, Some(&b), &mut want);
            let act = Activation::Clip(-0.5, 0.5);
            let epi = Epilogue {
                bias: Some(&b),
                residual: Some(&r),
                act: Some(act),
            };
            let got = run(&p, epi, &x, &w, 2);
            for ((g, want), r) in got.iter().zip(&want).zip(&r) {
                let want = act.apply(want + r);
                assert!(
                    (g - want).abs() < 1e-4 * (1.0 + want.abs()),
                    "{p:?}: {g} vs {want}"
                );
            }
        }
    }

    /// An image's outputs are the same sums alone or in a batch, on any number of threads.
    #[test]
    fn outputs_do_not_depend_on_the_batch_or_the_threads() {
        let p = stft(3, 1280);
        let x = lcg(1, p.n * p.w);
        let w = lcg(2, p.m * p.kw);
        let all = run(&p, Epilogue::default(), &x, &w, 1);
        for threads in [2, 3] {
            assert!(run(&p, Epilogue::default(), &x, &w, threads) == all);
        }
        let one = stft(1, 1280);
        let last = run(&one, Epilogue::default(), &x[2 * p.w..], &w, 2);
        assert!(last[..] == all[2 * p.m * p.ow..]);
    }
}
