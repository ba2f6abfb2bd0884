//! The 8-bit products of [`qgemm`](crate::qgemm) and [`qconv`](crate::qconv) on AVX2, for CPUs
//! without AVX-512 VNNI, on the same packed layout: the right operand in panels of 16 columns,
//! each group of 4 reduction steps one 64-byte block `[16 columns][4]` of signed bytes, the
//! left operand's 4 unsigned bytes broadcast against it.
//!
//! AVX2 has no `vpdpbusd`. Its `vpmaddubsw` multiplies unsigned by signed bytes but saturates
//! the 16-bit sum of each pair of products, so it is exact only where no pair of weights can
//! reach past the 16-bit range: `255·(|w₀| + |w₁|) ≤ 32767`, that is `|w₀| + |w₁| ≤ 128`, as
//! with 7-bit weights (onnxruntime's `reduce_range`). Such packs ([`PackedB::narrow`]) run
//! [`Narrow`]; any other runs [`Wide`], which widens the bytes to 16 bits and sums pairs with
//! `vpmaddwd`, exact for every weight at about two thirds of the rate.
//!
//! [`PackedB::narrow`]: crate::qgemm::PackedB

use std::arch::x86_64::*;

/// Whether this CPU runs the AVX2 kernels (and the cap, [`crate::isa`], allows them).
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && crate::isa::allows(crate::isa::Isa::Avx2)
}

/// One way of summing byte products into 32-bit column sums.
pub(crate) trait Products {
    /// Rows per register tile: as many as keep the accumulators, the broadcast rows, the
    /// weights and a product in the 16 vector registers.
    const ROWS: usize;
    /// One panel's accumulators for one row.
    type Sums: Copy;

    /// Accumulators at zero.
    ///
    /// # Safety
    /// The CPU has AVX2.
    unsafe fn zeros<const R: usize>() -> [Self::Sums; R];

    /// `acc[r] += Σ_g rows[r][4g..4g + 4] · b[g]` for `groups` groups of 4, where `b` points
    /// at the first group's 64-byte block of one panel. Taking and returning the accumulators
    /// by value keeps them in registers.
    ///
    /// # Safety
    /// The CPU has AVX2; each `rows[r]` holds `4·groups` bytes and `b` holds `groups` blocks
    /// (which, for [`Narrow`], pass its pair bound).
    unsafe fn products<const R: usize>(
        acc: [Self::Sums; R],
        rows: [*const u8; R],
        b: *const i8,
        groups: usize,
    ) -> [Self::Sums; R];

    /// The 16 column sums of one row's accumulators: columns 0..8, then 8..16.
    ///
    /// # Safety
    /// The CPU has AVX2.
    unsafe fn columns(acc: &Self::Sums) -> [__m256i; 2];
}

/// Row `r`'s 4 bytes of group `g`, as one 32-bit value.
///
/// # Safety
/// `row` holds `4g + 4` bytes.
#[inline(always)]
unsafe fn group_of(row: *const u8, g: usize) -> i32 {
    // SAFETY: as the contract.
    unsafe { row.add(4 * g).cast::<i32>().read_unaligned() }
}

/// Exact for every weight: the left operand's 4 bytes zero-extended and repeated across the
/// vector, 16 bytes of the block (4 columns by 4 steps) sign-extended, and `vpmaddwd` summing
/// the pairs into 32 bits. Vector `h` of a row's sums holds columns `4h..4h + 4`, two partial
/// sums each (added at the end).
pub(crate) struct Wide;

impl Products for Wide {
    /// With 3 rows one accumulator went to the stack: a third of the time.
    const ROWS: usize = 2;
    type Sums = [__m256i; 4];

    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn zeros<const R: usize>() -> [Self::Sums; R] {
        [[_mm256_setzero_si256(); 4]; R]
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn products<const R: usize>(
        mut acc: [Self::Sums; R],
        rows: [*const u8; R],
        b: *const i8,
        groups: usize,
    ) -> [Self::Sums; R] {
        // Byte i % 4 of each 32-bit lane into 16-bit lane i, zero-extended (-1: a zero byte).
        let spread = _mm256_setr_epi8(
            0, -1, 1, -1, 2, -1, 3, -1, 0, -1, 1, -1, 2, -1, 3, -1, 0, -1, 1, -1, 2, -1, 3, -1, 0,
            -1, 1, -1, 2, -1, 3, -1,
        );
        for g in 0..groups {
            // The 4 bytes broadcast (a load), then spread: one shuffle where a zero extension
            // and a broadcast of it took two.
            let av: [__m256i; R] = std::array::from_fn(|r| {
                // SAFETY: 4g + 4 <= 4·groups bytes of row r (this function's contract).
                let x = unsafe { group_of(rows[r], g) };
                _mm256_shuffle_epi8(_mm256_set1_epi32(x), spread)
            });
            for h in 0..4 {
                // SAFETY: block g of b (this function's contract), bytes 16h..16h + 16 of 64.
                let wv =
                    _mm256_cvtepi8_epi16(unsafe { _mm_loadu_si128(b.add(g * 64 + h * 16).cast()) });
                for (acc, &av) in acc.iter_mut().zip(&av) {
                    acc[h] = _mm256_add_epi32(acc[h], _mm256_madd_epi16(av, wv));
                }
            }
        }
        acc
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn columns(acc: &Self::Sums) -> [__m256i; 2] {
        // hadd gives columns [0 1 4 5 | 2 3 6 7]; the permute puts the pairs in order.
        [
            _mm256_permute4x64_epi64::<0xD8>(_mm256_hadd_epi32(acc[0], acc[1])),
            _mm256_permute4x64_epi64::<0xD8>(_mm256_hadd_epi32(acc[2], acc[3])),
        ]
    }
}

/// For packs whose weight pairs pass the bound: the left operand's 4 bytes repeated across the
/// vector, `vpmaddubsw` against half a block (8 columns by 4 steps) giving each column's two
/// pair sums, `vpmaddwd` by ones adding them into 32 bits. Vector `h` of a row's sums holds
/// columns `8h..8h + 8`, in order.
pub(crate) struct Narrow;

impl Products for Narrow {
    /// 8 accumulators, 4 broadcast rows, 2 half blocks, the ones and a product.
    const ROWS: usize = 4;
    type Sums = [__m256i; 2];

    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn zeros<const R: usize>() -> [Self::Sums; R] {
        [[_mm256_setzero_si256(); 2]; R]
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn products<const R: usize>(
        mut acc: [Self::Sums; R],
        rows: [*const u8; R],
        b: *const i8,
        groups: usize,
    ) -> [Self::Sums; R] {
        let ones = _mm256_set1_epi16(1);
        for g in 0..groups {
            // SAFETY: block g of b (this function's contract), its two 32-byte halves.
            let wv: [__m256i; 2] = std::array::from_fn(|h| unsafe {
                _mm256_loadu_si256(b.add(g * 64 + h * 32).cast())
            });
            for (acc, row) in acc.iter_mut().zip(rows) {
                // SAFETY: 4g + 4 <= 4·groups bytes of the row (this function's contract).
                let av = _mm256_set1_epi32(unsafe { group_of(row, g) });
                for h in 0..2 {
                    let pairs = _mm256_maddubs_epi16(av, wv[h]);
                    acc[h] = _mm256_add_epi32(acc[h], _mm256_madd_epi16(pairs, ones));
                }
            }
        }
        acc
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn columns(acc: &Self::Sums) -> [__m256i; 2] {
        *acc
    }
}
