//! The 8-bit products of [`qgemm`](crate::qgemm) and [`qconv`](crate::qconv) on AVX2, for CPUs
//! without AVX-512 VNNI, on the same packed layout: the right operand in panels of 16 columns,
//! each group of 4 reduction steps one 64-byte block `[16 columns][4]` of signed bytes, the
//! left operand's 4 unsigned bytes broadcast against it.
//!
//! AVX2 has no `vpdpbusd`, and `vpmaddubsw` saturates its 16-bit pair sums, so the bytes are
//! widened to 16 bits instead: the left operand's 4 bytes zero-extended and repeated across the
//! vector, 16 bytes of the block (4 columns by 4 steps) sign-extended, and `vpmaddwd` sums the
//! pairs exactly into 32 bits (two partial sums per column, added at the end).

use std::arch::x86_64::*;

/// Rows per register tile: `R` rows by one panel keep `4R` accumulators, `R` broadcast rows, a
/// block of weights and a product in the 16 vector registers (with 3 rows, one accumulator
/// went to the stack: a third of the time).
pub(crate) const ROWS: usize = 2;

/// One panel's accumulators for one row: vector `h` holds columns `4h..4h + 4`, two partial
/// sums each.
pub(crate) type Sums = [__m256i; 4];

/// Whether this CPU runs the AVX2 kernels.
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
}

/// `acc[r] += Σ_g rows[r][4g..4g + 4] · b[g]` for `groups` groups of 4, where `b` points at the
/// first group's 64-byte block of one panel. Taking and returning the accumulators by value
/// keeps them in registers.
///
/// # Safety
/// The CPU has AVX2; each `rows[r]` holds `4·groups` bytes and `b` holds `groups` blocks.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) unsafe fn products<const R: usize>(
    mut acc: [Sums; R],
    rows: [*const u8; R],
    b: *const i8,
    groups: usize,
) -> [Sums; R] {
    for g in 0..groups {
        let av: [__m256i; R] = std::array::from_fn(|r| {
            // SAFETY: 4g + 4 <= 4·groups bytes of row r (this function's contract).
            let x = unsafe { rows[r].add(4 * g).cast::<i32>().read_unaligned() };
            _mm256_broadcastq_epi64(_mm_cvtepu8_epi16(_mm_cvtsi32_si128(x)))
        });
        for h in 0..4 {
            // SAFETY: block g of b (this function's contract), bytes 16h..16h + 16 of its 64.
            let wv =
                _mm256_cvtepi8_epi16(unsafe { _mm_loadu_si128(b.add(g * 64 + h * 16).cast()) });
            for (acc, &av) in acc.iter_mut().zip(&av) {
                acc[h] = _mm256_add_epi32(acc[h], _mm256_madd_epi16(av, wv));
            }
        }
    }
    acc
}

/// The 16 column sums of one row's accumulators, in column order.
///
/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) unsafe fn column_sums(acc: &Sums) -> [i32; 16] {
    // hadd gives columns [0 1 4 5 | 2 3 6 7]; the permute puts the pairs in order.
    let lo = _mm256_permute4x64_epi64::<0xD8>(_mm256_hadd_epi32(acc[0], acc[1]));
    let hi = _mm256_permute4x64_epi64::<0xD8>(_mm256_hadd_epi32(acc[2], acc[3]));
    let mut out = [0i32; 16];
    // SAFETY: out holds 16 i32, two vectors of 8.
    unsafe {
        _mm256_storeu_si256(out.as_mut_ptr().cast(), lo);
        _mm256_storeu_si256(out.as_mut_ptr().add(8).cast(), hi);
    }
    out
}

/// Accumulators at zero.
///
/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) unsafe fn zeros<const R: usize>() -> [Sums; R] {
    [[_mm256_setzero_si256(); 4]; R]
}
