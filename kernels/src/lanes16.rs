//! 16 lanes of f32 as one AVX-512 vector or two AVX2 ones, for kernels written once over both
//! instruction sets: each kernel's generic body is inlined into one function per instruction
//! set (`#[target_feature]`), which is where these methods' instructions become available.

/// 16 lanes of f32 in registers, and the operations the kernels need on them. Every method is
/// inlined into a function compiled for the instruction set.
///
/// # Safety
/// The methods need the implementation's instruction set.
pub(crate) trait Lanes16: Copy {
    /// How many values of 16 lanes the vector registers hold.
    const REGISTERS: usize;
    /// Which of the 16 lanes exist.
    type Mask: Copy;
    /// The first `remaining` lanes (all of them from 16 on).
    unsafe fn mask(remaining: usize) -> Self::Mask;
    unsafe fn zero() -> Self;
    unsafe fn splat(v: f32) -> Self;
    /// 16 values from `p`.
    unsafe fn load(p: *const f32) -> Self;
    /// The channels of `m` from `p`, zero elsewhere; nothing else is read.
    unsafe fn load_masked(m: Self::Mask, p: *const f32) -> Self;
    /// The channels of `m` to `p`; nothing else is written.
    unsafe fn store_masked(self, m: Self::Mask, p: *mut f32);
    /// `self + a·b`, rounded once.
    unsafe fn fmadd(self, a: Self, b: Self) -> Self;
    unsafe fn add(self, b: Self) -> Self;
    unsafe fn sub(self, b: Self) -> Self;
    /// The 16 values to `p`.
    unsafe fn store(self, p: *mut f32);
    /// `min(max(self, lo), hi)`, NaN giving `lo`.
    unsafe fn clamp(self, lo: Self, hi: Self) -> Self;
    /// The sum of the 16 lanes, in one fixed order.
    unsafe fn reduce_add(self) -> f32;

    /// What a kernel short of registers computes at a time: the 16 lanes in one register, or
    /// on AVX2 each half (8 lanes, one register) on its own, `PARTS` of them.
    type Part: Copy;
    const PARTS: usize;
    unsafe fn part_zero() -> Self::Part;
    /// One part's lanes from `p`.
    unsafe fn part_load(p: *const f32) -> Self::Part;
    /// Part `h`'s lanes of `m` from `p` (its lanes start at `p`), zero elsewhere; nothing else
    /// is read.
    unsafe fn part_load_masked(m: Self::Mask, h: usize, p: *const f32) -> Self::Part;
    /// `acc + a·b`, rounded once.
    unsafe fn part_fmadd(acc: Self::Part, a: Self::Part, b: Self::Part) -> Self::Part;
    /// The 16 lanes of `parts[..PARTS]`.
    unsafe fn join(parts: [Self::Part; 2]) -> Self;
}

use std::arch::x86_64::*;

/// One AVX-512 vector.
#[derive(Clone, Copy)]
pub(crate) struct Avx512(__m512);

impl Lanes16 for Avx512 {
    const REGISTERS: usize = 32;
    type Mask = u16;
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn mask(remaining: usize) -> u16 {
        crate::mask16(remaining)
    }
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn zero() -> Self {
        Avx512(_mm512_setzero_ps())
    }
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn splat(v: f32) -> Self {
        Avx512(_mm512_set1_ps(v))
    }
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: the caller's.
        Avx512(unsafe { _mm512_loadu_ps(p) })
    }
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn load_masked(m: u16, p: *const f32) -> Self {
        // SAFETY: the caller's.
        Avx512(unsafe { _mm512_maskz_loadu_ps(m, p) })
    }
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn store_masked(self, m: u16, p: *mut f32) {
        // SAFETY: the caller's.
        unsafe { _mm512_mask_storeu_ps(p, m, self.0) }
    }
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn fmadd(self, a: Self, b: Self) -> Self {
        Avx512(_mm512_fmadd_ps(a.0, b.0, self.0))
    }
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn add(self, b: Self) -> Self {
        Avx512(_mm512_add_ps(self.0, b.0))
    }
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn sub(self, b: Self) -> Self {
        Avx512(_mm512_sub_ps(self.0, b.0))
    }
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: the caller's.
        unsafe { _mm512_storeu_ps(p, self.0) }
    }
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn clamp(self, lo: Self, hi: Self) -> Self {
        // max/min return their second operand for NaN: the lower bound.
        Avx512(_mm512_min_ps(_mm512_max_ps(self.0, lo.0), hi.0))
    }
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn reduce_add(self) -> f32 {
        _mm512_reduce_add_ps(self.0)
    }
    type Part = __m512;
    const PARTS: usize = 1;
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn part_zero() -> __m512 {
        _mm512_setzero_ps()
    }
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn part_load(p: *const f32) -> __m512 {
        // SAFETY: the caller's.
        unsafe { _mm512_loadu_ps(p) }
    }
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn part_load_masked(m: u16, _: usize, p: *const f32) -> __m512 {
        // SAFETY: the caller's.
        unsafe { _mm512_maskz_loadu_ps(m, p) }
    }
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn part_fmadd(acc: __m512, a: __m512, b: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, acc)
    }
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn join(parts: [__m512; 2]) -> Self {
        Avx512(parts[0])
    }
}

/// Two AVX2 vectors: channels 0..8 and 8..16.
#[derive(Clone, Copy)]
pub(crate) struct Avx2([__m256; 2]);

/// An AVX2 panel's channels: all 16 (plain loads and stores), or those of the lane masks.
#[derive(Clone, Copy)]
pub(crate) struct Avx2Mask {
    all: bool,
    halves: [__m256i; 2],
}

impl Lanes16 for Avx2 {
    const REGISTERS: usize = 8;
    type Mask = Avx2Mask;
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn mask(remaining: usize) -> Avx2Mask {
        let count = _mm256_set1_epi32(remaining.min(16) as i32);
        Avx2Mask {
            all: remaining >= 16,
            halves: [
                _mm256_cmpgt_epi32(count, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
                _mm256_cmpgt_epi32(count, _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15)),
            ],
        }
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn zero() -> Self {
        Avx2([_mm256_setzero_ps(); 2])
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn splat(v: f32) -> Self {
        Avx2([_mm256_set1_ps(v); 2])
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: the caller's.
        unsafe { Avx2([_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))]) }
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn load_masked(m: Avx2Mask, p: *const f32) -> Self {
        // SAFETY: the caller's (a masked-off lane is not read).
        unsafe {
            if m.all {
                Self::load(p)
            } else {
                Avx2([
                    _mm256_maskload_ps(p, m.halves[0]),
                    _mm256_maskload_ps(p.wrapping_add(8), m.halves[1]),
                ])
            }
        }
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn store_masked(self, m: Avx2Mask, p: *mut f32) {
        // SAFETY: the caller's (a masked-off lane is not written).
        unsafe {
            if m.all {
                _mm256_storeu_ps(p, self.0[0]);
                _mm256_storeu_ps(p.add(8), self.0[1]);
            } else {
                _mm256_maskstore_ps(p, m.halves[0], self.0[0]);
                _mm256_maskstore_ps(p.wrapping_add(8), m.halves[1], self.0[1]);
            }
        }
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn fmadd(self, a: Self, b: Self) -> Self {
        Avx2(std::array::from_fn(|h| {
            _mm256_fmadd_ps(a.0[h], b.0[h], self.0[h])
        }))
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn add(self, b: Self) -> Self {
        Avx2(std::array::from_fn(|h| _mm256_add_ps(self.0[h], b.0[h])))
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn sub(self, b: Self) -> Self {
        Avx2(std::array::from_fn(|h| _mm256_sub_ps(self.0[h], b.0[h])))
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: the caller's.
        unsafe {
            _mm256_storeu_ps(p, self.0[0]);
            _mm256_storeu_ps(p.add(8), self.0[1]);
        }
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn clamp(self, lo: Self, hi: Self) -> Self {
        // max/min return their second operand for NaN: the lower bound.
        Avx2(std::array::from_fn(|h| {
            _mm256_min_ps(_mm256_max_ps(self.0[h], lo.0[h]), hi.0[h])
        }))
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn reduce_add(self) -> f32 {
        // Lanes l and l + 8, then halves of what remains, down to one.
        let eight = _mm256_add_ps(self.0[0], self.0[1]);
        let four = _mm_add_ps(
            _mm256_castps256_ps128(eight),
            _mm256_extractf128_ps::<1>(eight),
        );
        let two = _mm_add_ps(four, _mm_movehl_ps(four, four));
        _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)))
    }
    type Part = __m256;
    const PARTS: usize = 2;
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn part_zero() -> __m256 {
        _mm256_setzero_ps()
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn part_load(p: *const f32) -> __m256 {
        // SAFETY: the caller's.
        unsafe { _mm256_loadu_ps(p) }
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn part_load_masked(m: Avx2Mask, h: usize, p: *const f32) -> __m256 {
        // SAFETY: the caller's (a masked-off lane is not read).
        unsafe {
            if m.all {
                _mm256_loadu_ps(p)
            } else {
                _mm256_maskload_ps(p, m.halves[h])
            }
        }
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn part_fmadd(acc: __m256, a: __m256, b: __m256) -> __m256 {
        _mm256_fmadd_ps(a, b, acc)
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn join(parts: [__m256; 2]) -> Self {
        Avx2(parts)
    }
}
