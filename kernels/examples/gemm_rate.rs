//! GFLOP/s of `sgemm`, `conv2d` and the int8 `qgemm` and `qconv` on shapes from the zoo models, on 1 and 2
//! threads:
//! `cargo run --release -p cotenant-kernels --example gemm_rate [-- --batch N] [--only NAME]
//! [--gemms] [--cold]`. `--gemms`: the GEMMs alone. `--cold`: the NHWC convolutions and the packed and qgemm7 rows read their weights from memory, not from a cache
//! (each call takes the next of enough copies to overflow the last-level cache), as the
//! convolutions of a model whose weights exceed the cache do at batch 1; the NHWC
//! convolutions also write to buffers out of every cache, as a model's layers do.
//! A tool for tuning the kernels; the model-level comparison is `cargo xtask bench executor`.
use cotenant_kernels::activation::Activation;
use cotenant_kernels::conv::{Conv2d, Epilogue, conv2d};
use cotenant_kernels::direct_conv::{PackedFilter, applies, direct_conv};
use cotenant_kernels::gemm::{Mat, sgemm};
use cotenant_kernels::nhwc_conv::{self, NhwcFilter, conv_nhwc};
use cotenant_kernels::nhwc_depthwise::depthwise_nhwc;
use cotenant_kernels::qconv::{self, Requantize, qconv_nhwc};
use cotenant_kernels::qgemm::{PackedA, PackedB, qgemm};
use std::time::Instant;

/// As the agent runs: large buffers on cache lines.
#[global_allocator]
static ALLOC: cotenant_kernels::line_alloc::LineAligned = cotenant_kernels::line_alloc::LineAligned;

const GEMMS: [(usize, usize, usize, &str); 8] = [
    (12, 1024, 512, "t5 ffn, 12 tokens"),
    (64, 3136, 576, "resnet50 3x3 im2col 56x56"),
    (512, 196, 4608, "resnet50 3x3 im2col 14x14"),
    (128, 768, 768, "bert qkv, batch 1"),
    (128, 3072, 768, "bert ffn1, batch 1"),
    (1024, 768, 768, "bert qkv, batch 8"),
    (1024, 768, 3072, "bert ffn2, batch 8"),
    (1024, 1024, 1024, "square 1024"),
];

/// (input channels, image size, output channels, kernel size, stride, name)
const CONVS: [(usize, usize, usize, usize, usize, &str); 30] = [
    (64, 56, 64, 3, 1, "3x3 64 56x56"),
    (128, 56, 128, 3, 2, "3x3 s2 128 56->28"),
    (256, 28, 256, 3, 2, "3x3 s2 256 28->14"),
    (512, 14, 512, 3, 2, "3x3 s2 512 14->7"),
    (128, 28, 128, 3, 1, "3x3 128 28x28"),
    (256, 14, 256, 3, 1, "3x3 256 14x14"),
    (512, 7, 512, 3, 1, "3x3 512 7x7"),
    (64, 56, 256, 1, 1, "1x1 64->256 56x56"),
    (256, 56, 64, 1, 1, "1x1 256->64 56x56"),
    (1024, 14, 256, 1, 1, "1x1 1024->256 14x14"),
    (256, 14, 1024, 1, 1, "1x1 256->1024 14x14"),
    (2048, 7, 512, 1, 1, "1x1 2048->512 7x7"),
    (512, 7, 2048, 1, 1, "1x1 512->2048 7x7"),
    (3, 224, 64, 7, 2, "7x7 stem"),
    (3, 224, 32, 3, 2, "mbv2 3x3 stem"),
    (3, 224, 16, 3, 2, "lcnet 3x3 stem"),
    // mobilenet_v2's projections (expanded channels -> block output)
    (32, 112, 16, 1, 1, "mbv2 1x1 32->16 112"),
    (144, 56, 24, 1, 1, "mbv2 1x1 144->24 56"),
    (192, 28, 32, 1, 1, "mbv2 1x1 192->32 28"),
    (384, 14, 64, 1, 1, "mbv2 1x1 384->64 14"),
    (576, 14, 96, 1, 1, "mbv2 1x1 576->96 14"),
    (960, 7, 160, 1, 1, "mbv2 1x1 960->160 7"),
    (960, 7, 320, 1, 1, "mbv2 1x1 960->320 7"),
    (320, 7, 1280, 1, 1, "mbv2 1x1 320->1280 7"),
    // mobilenet_v2's expansions (block input -> expanded channels)
    (16, 112, 96, 1, 1, "mbv2 1x1 16->96 112"),
    (24, 56, 144, 1, 1, "mbv2 1x1 24->144 56"),
    (32, 28, 192, 1, 1, "mbv2 1x1 32->192 28"),
    (64, 14, 384, 1, 1, "mbv2 1x1 64->384 14"),
    (96, 14, 576, 1, 1, "mbv2 1x1 96->576 14"),
    (160, 7, 960, 1, 1, "mbv2 1x1 160->960 7"),
];

/// mobilenet_v2's depthwise 3x3 convolutions: (channels, image size, stride, name).
const DEPTHWISE: [(usize, usize, usize, &str); 6] = [
    (32, 112, 1, "dw 32 112"),
    (96, 112, 2, "dw s2 96 112->56"),
    (144, 56, 1, "dw 144 56"),
    (192, 28, 1, "dw 192 28"),
    (576, 14, 1, "dw 576 14"),
    (960, 7, 1, "dw 960 7"),
];

/// Convolutions of a few output pixels (`few_pixels`): the mel spectrogram's STFT (one channel,
/// 257 filters of 512 taps at stride 160 over 1280 samples) and a 3x3 layer on a 2x2 image.
fn few_pixel_convs() -> [(Conv2d, &'static str); 2] {
    let stft = Conv2d {
        w: 1280,
        kw: 512,
        sw: 160,
        ow: 5,
        ..geometry(1, 1, 1, 257, 1, 1, 1)
    };
    [
        (stft, "stft 512 taps, 5 frames"),
        (geometry(1, 512, 2, 512, 3, 1, 1), "3x3 512 2x2"),
    ]
}

/// A few-pixel convolution by `conv2d` (which takes `few_pixels` for it), against the im2col
/// GEMM it replaced and the direct convolution where that applies.
fn few_pixels(p: &Conv2d, name: &str, threads: usize) {
    let k = p.c * p.kh * p.kw;
    let pixels = p.oh * p.ow;
    let x: Vec<f32> = (0..p.c * p.h * p.w)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let w: Vec<f32> = (0..p.m * k)
        .map(|i| ((i * 104729) % 997) as f32 / 997.0 - 0.5)
        .collect();
    let mut out = vec![0f32; p.m * pixels];
    let mut scratch = Vec::new();
    let flops = 2.0 * (p.m * pixels * k) as f64;
    let report = |what: &str, s: f64| {
        println!(
            "{threads}t {what:7} {name:28} {:7.1} GFLOP/s {:8.3} ms",
            flops / s / 1e9,
            s * 1e3
        )
    };
    report(
        "conv",
        time(flops, || {
            conv2d(
                p,
                &x,
                &w,
                Epilogue::default(),
                &mut out,
                &mut scratch,
                threads,
            )
        }),
    );
    // The product alone as a GEMM of the weights by an im2col matrix (of arbitrary values).
    let col = vec![0.25f32; k * pixels];
    report(
        "im2col",
        time(flops, || {
            sgemm(
                threads,
                p.m,
                pixels,
                k,
                Mat::row_major(&w, k),
                Mat::row_major(&col, pixels),
                &mut out,
                pixels,
                false,
            )
        }),
    );
    if applies(p) {
        let f = PackedFilter::new(&w, p.m, p.c, p.kh, p.kw);
        report(
            "direct",
            time(flops, || {
                direct_conv(
                    p,
                    &x,
                    &f,
                    Epilogue::default(),
                    &mut out,
                    &mut scratch,
                    threads,
                )
            }),
        );
    }
}

/// `len` weights in the 7-bit range of onnxruntime's `reduce_range`.
fn seven_bit(len: usize) -> Vec<i8> {
    (0..len).map(|i| (i * 104_729 % 127) as i8 - 63).collect()
}

/// A square convolution with "same" padding.
fn geometry(
    n: usize,
    c: usize,
    h: usize,
    m: usize,
    kk: usize,
    stride: usize,
    groups: usize,
) -> Conv2d {
    let pad = kk / 2;
    let oh = (h + 2 * pad - kk) / stride + 1;
    Conv2d {
        n,
        c,
        h,
        w: h,
        m,
        kh: kk,
        kw: kk,
        sh: stride,
        sw: stride,
        dh: 1,
        dw: 1,
        pt: pad,
        pl: pad,
        oh,
        ow: oh,
        groups,
    }
}

/// Seconds per call of `f`, over about 4 GFLOP of calls after one warm-up.
fn time(flops: f64, mut f: impl FnMut()) -> f64 {
    let iters = ((4e9 / flops) as usize).max(3);
    f();
    let t = Instant::now();
    (0..iters).for_each(|_| f());
    t.elapsed().as_secs_f64() / iters as f64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let batch = args
        .iter()
        .position(|a| a == "--batch")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(1usize);
    // `--only TEXT`: just the convolutions whose name contains TEXT (and no GEMMs).
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1).cloned());
    let cold = args.iter().any(|a| a == "--cold");
    // `--gemms`: just the GEMMs (and no convolutions).
    let gemms_only = args.iter().any(|a| a == "--gemms");
    for threads in [1usize, 2] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("thread pool");
        pool.install(|| {
            for &(m, n, k, name) in GEMMS.iter().filter(|_| only.is_none()) {
                let (a, b, mut c) = (vec![0.5f32; m * k], vec![0.25f32; k * n], vec![0f32; m * n]);
                let flops = 2.0 * (m * n * k) as f64;
                let s = time(flops, || {
                    let (am, bm) = (Mat::row_major(&a, k), Mat::row_major(&b, n));
                    sgemm(threads, m, n, k, am, bm, &mut c, n, false)
                });
                println!(
                    "{threads}t gemm {name:28} {m:5}x{n:5}x{k:5} {:7.1} GFLOP/s",
                    flops / s / 1e9
                );
            }
            for &(m, n, k, name) in GEMMS.iter().filter(|_| only.is_none() && nhwc_conv::available()) {
                // A MatMul by constant weights as the models run it: a 1x1 NHWC convolution.
                let a: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
                let b: Vec<f32> = (0..k * n).map(|i| ((i * 104729) % 997) as f32 / 997.0 - 0.5).collect();
                let copies = if cold { (256 << 20) / (k * n * 4) + 1 } else { 1 };
                let fs: Vec<_> = (0..copies).map(|_| NhwcFilter::of_matrix(&b, k, n)).collect();
                let mut c = vec![0f32; m * n];
                let flops = 2.0 * (m * n * k) as f64;
                let mut i = 0;
                let epi = Epilogue::default();
                let s = time(flops, || {
                    i = (i + 1) % copies;
                    nhwc_conv::matmul_packed(threads, &a, m, &fs[i], epi, &mut c)
                });
                println!(
                    "{threads}t packed {name:26} {m:5}x{n:5}x{k:5} {:7.1} GFLOP/s",
                    flops / s / 1e9
                );
            }
            for &(m, n, k, name) in GEMMS.iter().filter(|_| only.is_none()) {
                // The products of an int8 convolution: packed weights by packed activations.
                let a: Vec<i8> = (0..m * k).map(|i| (i * 7919 % 255) as i8).collect();
                let b: Vec<u8> = (0..k * n).map(|i| (i * 104_729 % 251) as u8).collect();
                let pa = PackedA::weights(m, k, &a, &[0]);
                let pb = PackedB::new(k, n, &b, (n, 1), &[128]);
                let mut c = vec![0i32; m * n];
                let ops = 2.0 * (m * n * k) as f64;
                let s = time(ops, || qgemm(threads, &pa, &pb, &mut c));
                println!(
                    "{threads}t qgemm {name:27} {m:5}x{n:5}x{k:5} {:7.1} GOP/s",
                    ops / s / 1e9
                );
            }
            for &(m, n, k, name) in GEMMS.iter().filter(|_| only.is_none()) {
                // The products of a dynamically quantized MatMul: uint8 rows by 7-bit weights
                // (`reduce_range`), the pairs AVX2's `vpmaddubsw` sums without saturating.
                let a: Vec<u8> = (0..m * k).map(|i| (i * 7919 % 251) as u8).collect();
                let b = seven_bit(k * n);
                let mut pa = PackedA::default();
                pa.pack(m, k, &a, k, 3);
                let copies = if cold { (256 << 20) / (k * n) + 1 } else { 1 };
                let pbs: Vec<_> = (0..copies).map(|_| PackedB::new(k, n, &b, (n, 1), &[0])).collect();
                let mut c = vec![0i32; m * n];
                let ops = 2.0 * (m * n * k) as f64;
                let mut i = 0;
                let s = time(ops, || {
                    i = (i + 1) % copies;
                    qgemm(threads, &pa, &pbs[i], &mut c)
                });
                println!(
                    "{threads}t qgemm7 {name:26} {m:5}x{n:5}x{k:5} {:7.1} GOP/s",
                    ops / s / 1e9
                );
            }
            let chosen = CONVS.iter().filter(|c| {
                !gemms_only && only.as_ref().is_none_or(|o| c.5.contains(o.as_str()))
            });
            for &(c, h, m, kk, stride, name) in chosen {
                let n = batch;
                let p = geometry(n, c, h, m, kk, stride, 1);
                let oh = p.oh;
                let x: Vec<f32> = (0..n * c * h * h).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
                let w: Vec<f32> = (0..m * c * kk * kk).map(|i| ((i * 104729) % 997) as f32 / 997.0 - 0.5).collect();
                let bias = vec![0.1f32; m];
                let mut out = vec![0f32; n * m * oh * oh];
                let mut scratch = Vec::new();
                let epi = Epilogue {
                    bias: Some(&bias),
                    residual: None,
                    act: Some(Activation::Relu),
                };
                let flops = 2.0 * (n * m * oh * oh * c * kk * kk) as f64;
                let s = time(flops, || {
                    conv2d(&p, &x, &w, epi, &mut out, &mut scratch, threads)
                });
                println!(
                    "{threads}t conv batch {n} {name:22} {:7.1} GFLOP/s {:8.3} ms",
                    flops / s / 1e9,
                    s * 1e3
                );
                if applies(&p) {
                    let f = PackedFilter::new(&w, m, c, kk, kk);
                    let mut o2 = vec![0f32; out.len()];
                    let s = time(flops, || {
                        direct_conv(&p, &x, &f, epi, &mut o2, &mut scratch, threads)
                    });
                    let err = out.iter().zip(&o2).map(|(a, b)| (a - b).abs() / (1.0 + a.abs())).fold(0f32, f32::max);
                    println!(
                        "{threads}t direct batch {n} {name:20} {:7.1} GFLOP/s {:8.3} ms  err {err:e}",
                        flops / s / 1e9,
                        s * 1e3
                    );
                }
                if let Some(f) = qconv::pack_filter(m, c, (kk, kk), 1, &seven_bit(m * c * kk * kk)) {
                    // The same convolution quantized: uint8 activations, 7-bit weights (as
                    // compare.py's resnet50_int8), requantized to uint8 with a ReLU.
                    let xq: Vec<u8> = (0..x.len()).map(|i| (i * 7919 % 251) as u8).collect();
                    let (mult, offset) = (vec![1e-3f32; m], vec![0.5f32; m]);
                    let rq = Requantize { mult: &mult, offset: &offset, zero: 3.0, lo: 3.0, hi: 255.0 };
                    let mut oq = vec![0u8; out.len()];
                    let s = time(flops, || qconv_nhwc(threads, &p, &xq, 5, &f, &rq, &mut oq));
                    println!(
                        "{threads}t qconv batch {n} {name:21} {:7.1} GMAC/s {:8.3} ms",
                        flops / 2.0 / s / 1e9,
                        s * 1e3
                    );
                    // Full-range weights, whose pairs AVX2's `vpmaddubsw` could saturate on:
                    // the exact wide products there.
                    let full: Vec<i8> = (0..m * c * kk * kk).map(|i| (i * 104_729 % 255) as i8).collect();
                    if let Some(f) = qconv::pack_filter(m, c, (kk, kk), 1, &full) {
                        let s = time(flops, || qconv_nhwc(threads, &p, &xq, 5, &f, &rq, &mut oq));
                        println!(
                            "{threads}t qconv8 batch {n} {name:20} {:7.1} GMAC/s {:8.3} ms",
                            flops / 2.0 / s / 1e9,
                            s * 1e3
                        );
                    }
                }
                if nhwc_conv::available() {
                    // The same convolution on NHWC activations (the values in another order).
                    let copies = if cold { (256 << 20) / (w.len() * 4) + 1 } else { 1 };
                    let fs: Vec<_> = (0..copies).map(|_| NhwcFilter::new(&w, m, c, kk, kk)).collect();
                    // Outputs written once before, so that the time holds no page faults.
                    let outs = if cold { (256 << 20) / (out.len() * 4) + 1 } else { 1 };
                    let mut o3: Vec<Vec<f32>> = (0..outs).map(|_| vec![1f32; out.len()]).collect();
                    let (mut i, mut j) = (0, 0);
                    let s = time(flops, || {
                        (i, j) = ((i + 1) % copies, (j + 1) % outs);
                        conv_nhwc(threads, &p, &x, &fs[i], epi, &mut o3[j])
                    });
                    println!(
                        "{threads}t nhwc batch {n} {name:22} {:7.1} GFLOP/s {:8.3} ms",
                        flops / s / 1e9,
                        s * 1e3
                    );
                }
            }
            let chosen = few_pixel_convs().into_iter().filter(|c| {
                !gemms_only && only.as_ref().is_none_or(|o| c.1.contains(o.as_str()))
            });
            for (p, name) in chosen {
                few_pixels(&p, name, threads);
            }
            let chosen = DEPTHWISE.iter().filter(|c| {
                !gemms_only && only.as_ref().is_none_or(|o| c.3.contains(o.as_str()))
            });
            for &(c, h, stride, name) in chosen {
                let p = geometry(batch, c, h, c, 3, stride, c);
                let x: Vec<f32> = (0..batch * c * h * h).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
                let w: Vec<f32> = (0..c * 9).map(|i| ((i * 104729) % 997) as f32 / 997.0 - 0.5).collect();
                let bias = vec![0.1f32; c];
                let mut out = vec![0f32; batch * c * p.oh * p.ow];
                let epi = Epilogue {
                    bias: Some(&bias),
                    residual: None,
                    act: Some(Activation::Clip(0.0, 6.0)),
                };
                let flops = 2.0 * (out.len() * 9) as f64;
                let s = time(flops, || conv2d(&p, &x, &w, epi, &mut out, &mut Vec::new(), threads));
                println!(
                    "{threads}t depthwise batch {batch} {name:17} {:7.1} GFLOP/s {:8.3} ms",
                    flops / s / 1e9,
                    s * 1e3
                );
                if nhwc_conv::available() {
                    // The same convolution on NHWC activations.
                    let f = NhwcFilter::new(&w, c, 1, 3, 3);
                    let s = time(flops, || depthwise_nhwc(threads, &p, &x, &f, epi, &mut out));
                    println!(
                        "{threads}t nhwc dw batch {batch} {name:17} {:7.1} GFLOP/s {:8.3} ms",
                        flops / s / 1e9,
                        s * 1e3
                    );
                }
            }
        });
    }
}
