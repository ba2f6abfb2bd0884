//! Compute kernels. CPU kernels are plain Rust over slices; CUDA sources live in `cuda/*.cu`, and
//! [`cuda`] exports them with the typed names and codes of their entry points (no CUDA needed to
//! build). Kernels know nothing of graphs, tenants or scheduling.
//!
//! Every CPU kernel takes a `threads` budget: the caller (one tenant's instance) decides how many
//! cores it may use, and the kernel parallelises with rayon inside whatever pool the caller installed.

pub mod activation;
pub mod conv;
pub mod cuda;
pub mod dense;
mod depthwise;
mod depthwise_rows;
pub mod direct_conv;
pub mod few_pixels;
pub mod fused;
pub mod gemm;
pub mod igemm;
pub mod inverted_residual;
pub mod isa;
#[cfg(target_arch = "x86_64")]
mod lanes16;
pub mod line_alloc;
pub mod nhwc_block;
pub mod nhwc_conv;
pub mod nhwc_depthwise;
pub mod norm;
pub mod pool;
#[cfg(target_arch = "x86_64")]
mod qamx;
mod qavx2;
pub mod qconv;
pub mod qdepthwise;
pub mod qgemm;
#[cfg(target_arch = "x86_64")]
pub mod quantize;
mod split;
pub mod wide;
mod winograd;

/// Seeded pseudo-random bytes for the kernels' tests.
#[cfg(test)]
pub(crate) fn test_bytes(len: usize, seed: u32) -> Vec<u8> {
    let mut s = seed;
    (0..len)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 20) as u8
        })
        .collect()
}

/// The geometry of a square test convolution: `(n, c, h, w, m, k, stride, dilation, pad
/// top-left, pad bottom-right)`.
#[cfg(test)]
pub(crate) fn test_conv(
    (n, c, h, w, m, k, s, d, pad, extra): (
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
    ),
) -> conv::Conv2d {
    let out = |len: usize| (len + pad + extra - d * (k - 1) - 1) / s + 1;
    conv::Conv2d {
        n,
        c,
        h,
        w,
        m,
        kh: k,
        kw: k,
        sh: s,
        sw: s,
        dh: d,
        dw: d,
        pt: pad,
        pl: pad,
        oh: out(h),
        ow: out(w),
        groups: 1,
    }
}

/// For a test of an AVX-512 path: whether to skip it on this CPU, which it prints. With
/// `COTENANT_REQUIRE_AVX512` set, a CPU without `what` fails the test instead, so a machine
/// that should run these paths cannot pass them silently.
#[cfg(test)]
pub(crate) fn skip_without(available: bool, what: &str) -> bool {
    if available {
        return false;
    }
    assert!(
        std::env::var_os("COTENANT_REQUIRE_AVX512").is_none(),
        "COTENANT_REQUIRE_AVX512 is set, but this CPU lacks {what}"
    );
    eprintln!("skipped: this CPU lacks {what} (COTENANT_REQUIRE_AVX512=1 makes this a failure)");
    true
}

/// Whether this CPU has AVX-512F (cached by the standard library) and the cap ([`isa`]) allows
/// it, for the kernels written for it.
pub(crate) fn avx512f() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f") && isa::allows(isa::Isa::Avx512)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU runs the AMX kernel of the 8-bit products.
pub(crate) fn qamx_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        qamx::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU runs the AVX2 kernels of the 8-bit products (where VNNI is missing).
pub(crate) fn qavx2_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        qavx2::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The first `len` floats of a scratch `buffer`, grown to hold them (contents unspecified).
pub(crate) fn grown(buffer: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buffer.len() < len {
        buffer.resize(len, 0.0);
    }
    &mut buffer[..len]
}

/// The AVX-512 lane mask of the first `remaining` of 16 lanes (all of them from 16 on): the
/// last, partial vector of a row.
pub(crate) fn mask16(remaining: usize) -> u16 {
    match remaining {
        r if r >= 16 => !0,
        r => (1u16 << r) - 1,
    }
}

/// Work below this many scalar operations is not worth splitting across threads.
pub(crate) const PAR_MIN_WORK: usize = 1 << 15;
