//! 8-bit matrix product with zero points: `c[i][j] = Σ_p (a[i][p] - za) · (b[p][j] - zb[j])`
//! in `i32`, wrapping like the ONNX reference's int32 arithmetic, for `a` and `b` each int8 or
//! uint8.
//!
//! The product runs on AMX tiles (`qamx`) where the CPU has them, Linux grants them and the
//! reduction is a multiple of 64, else on AVX-512 VNNI (`vpdpbusd`: four u8 × s8 products
//! summed into each i32 lane) where the CPU has it, else on AVX2 (`qavx2`), else on a portable
//! loop over the same layout. `vpdpbusd` wants
//! `a` unsigned and `b` signed, so int8 `a` is stored plus 128 and uint8 `b` minus 128, with the
//! zero points moved the same way: `(a + 128) - (za + 128) = a - za`. The zero points then come
//! out of the sum as terms of row and column sums:
//! `Σ (a - za)(b - zb) = Σ ab - zb·Σa - za·Σb + k·za·zb`, all in wrapping `i32`, so the result
//! is exactly the reference's (modulo 2³², as it is there).
//!
//! `b` (the weights) is packed once, [`PackedB`]: columns in panels of 16, each panel the
//! reduction in groups of 4 (one 64-byte vector per group), padded with zeros. `a` is packed per
//! call, [`PackedA`]: rows padded to a multiple of 4 with zeros, with their sums.

use rayon::prelude::*;

/// Columns per panel: one vector of 16 i32 sums.
pub(crate) const LANES: usize = 16;
/// Panels per register tile (the last tile of a row takes the panels that are left).
pub(crate) const NP: usize = 4;
/// Rows per register tile: `MR × NP` = 24 accumulators of the 32 vector registers.
pub(crate) const MR: usize = 6;

/// An 8-bit element type: int8 or uint8.
pub trait Int8: Copy + Send + Sync + 'static {
    /// The value plus 128 when the type is signed: an unsigned operand of `vpdpbusd`.
    fn unsigned(self) -> u8;
    /// The value less 128 when the type is unsigned: a signed operand of `vpdpbusd`.
    fn signed(self) -> i8;
    /// What [`Int8::unsigned`] adds (0 or 128).
    const TO_UNSIGNED: i32;
    /// What [`Int8::signed`] adds (0 or -128).
    const TO_SIGNED: i32;
}

impl Int8 for u8 {
    fn unsigned(self) -> u8 {
        self
    }
    fn signed(self) -> i8 {
        (self ^ 0x80) as i8
    }
    const TO_UNSIGNED: i32 = 0;
    const TO_SIGNED: i32 = -128;
}

impl Int8 for i8 {
    fn unsigned(self) -> u8 {
        (self as u8) ^ 0x80
    }
    fn signed(self) -> i8 {
        self
    }
    const TO_UNSIGNED: i32 = 128;
    const TO_SIGNED: i32 = 0;
}

/// Whether this CPU runs the VNNI kernel (else the portable one runs).
pub fn vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::avx512f()
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `k × n` weights in the kernel's layout, with their zero points and column sums.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PackedB {
    pub(crate) k: usize,
    pub(crate) n: usize,
    /// `k` rounded up to a multiple of 4.
    pub(crate) kp: usize,
    /// Panels of 16 columns.
    pub(crate) panels: usize,
    /// `[panel][kp / 4][16 columns][4]`, signed (uint8 values less 128), zero padded.
    pub(crate) data: Vec<i8>,
    /// Per column (padded to `panels × 16`): the zero point, shifted as the values are.
    pub(crate) zero: Vec<i32>,
    /// Per column (padded): the sum of the shifted values over the reduction.
    pub(crate) sums: Vec<i32>,
    /// Whether no two values of a column at adjacent reduction steps `2q, 2q + 1` exceed 128
    /// in magnitude together, so that 16-bit sums of their products by unsigned bytes cannot
    /// overflow (AVX2's fast product, `qavx2::Narrow`). Weights only; run-time packs say no.
    pub(crate) narrow: bool,
}

impl PackedB {
    /// Packs `b` (`k × n`, element `(p, j)` at `b[p * row + j * col]`) with zero points `zb`
    /// (one, or one per column).
    ///
    /// # Panics
    /// If `b` is too short for the strides or `zb` has another count.
    pub fn new<T: Int8>(
        k: usize,
        n: usize,
        b: &[T],
        (row, col): (usize, usize),
        zb: &[T],
    ) -> PackedB {
        assert!(
            zb.len() == 1 || zb.len() == n,
            "{} zero points for {n} columns",
            zb.len()
        );
        if k > 0 && n > 0 {
            assert!(
                b.len() > (k - 1) * row + (n - 1) * col,
                "PackedB operand too small"
            );
        }
        let kp = k.div_ceil(4) * 4;
        let panels = n.div_ceil(LANES);
        let width = panels * LANES;
        let mut data = vec![0i8; panels * kp * LANES];
        let mut sums = vec![0i32; width];
        for j in 0..n {
            let (panel, lane) = (j / LANES, j % LANES);
            let base = panel * kp * LANES + lane * 4;
            for p in 0..k {
                let v = b[p * row + j * col].signed();
                data[base + p / 4 * LANES * 4 + p % 4] = v;
                sums[j] = sums[j].wrapping_add(v as i32);
            }
        }
        let zero = (0..width)
            .map(|j| match j {
                j if j >= n => 0,
                _ => zb[if zb.len() == 1 { 0 } else { j }].signed() as i32,
            })
            .collect();
        let narrow = data
            .chunks_exact(2)
            .all(|p| p[0].unsigned_abs() as u16 + p[1].unsigned_abs() as u16 <= 128);
        PackedB {
            k,
            n,
            kp,
            panels,
            data,
            zero,
            sums,
            narrow,
        }
    }

    pub fn k(&self) -> usize {
        self.k
    }

    pub fn n(&self) -> usize {
        self.n
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len() + 4 * (self.zero.len() + self.sums.len())
    }
}

impl PackedB {
    /// Repacks `k` rows of `n` values (`rows`, `k × n` row-major: activations by channel, or
    /// an im2col matrix) with the single zero point `zb`, reusing this pack's buffers.
    ///
    /// # Panics
    /// If `rows` is not `k × n`.
    pub fn pack_rows<T: Int8>(&mut self, k: usize, n: usize, rows: &[T], zb: T) {
        assert_eq!(rows.len(), k * n, "pack_rows operand size");
        self.begin(k, n, zb);
        for g in 0..k.div_ceil(4) {
            let count = (k - 4 * g).min(4);
            // Slots past `count` repeat the last row; only the first `count` are stored.
            let group: [&[T]; 4] =
                std::array::from_fn(|q| &rows[(4 * g + q.min(count - 1)) * n..][..n]);
            self.store_group(g, &group[..count]);
        }
    }

    /// Repacks `k` rows of `n` values that `fill(p, row)` writes (every element of row `p`),
    /// with the single zero point `zb`, reusing this pack's buffers. The rows are made four at
    /// a time in a small buffer: an im2col matrix packed this way never exists whole.
    pub fn pack_filled<T: Int8>(
        &mut self,
        k: usize,
        n: usize,
        zb: T,
        mut fill: impl FnMut(usize, &mut [T]),
    ) {
        self.begin(k, n, zb);
        let mut rows = vec![zb; 4 * n];
        for g in 0..k.div_ceil(4) {
            let ps = 4 * g..(4 * g + 4).min(k);
            for (p, row) in ps.clone().zip(rows.chunks_exact_mut(n.max(1))) {
                fill(p, row);
            }
            let group: [&[T]; 4] = std::array::from_fn(|q| &rows[q * n..(q + 1) * n]);
            self.store_group(g, &group[..ps.len()]);
        }
    }

    /// Sets this pack's shape to `k × n` with zero point `zb` and zeroes its padding.
    fn begin<T: Int8>(&mut self, k: usize, n: usize, zb: T) {
        let kp = k.div_ceil(4) * 4;
        let panels = n.div_ceil(LANES);
        let width = panels * LANES;
        // Only the padding needs zeros (below); everything else is written.
        self.data.resize(panels * kp * LANES, 0);
        self.sums.clear();
        self.sums.resize(width, 0);
        self.zero.clear();
        self.zero.resize(width, zb.signed() as i32);
        for j in n..width {
            let at = j / LANES * kp * LANES + j % LANES * 4;
            for g in 0..kp / 4 {
                self.data[at + g * 4 * LANES..][..4].fill(0);
            }
        }
        for p in k..kp {
            for j in 0..width {
                self.data[(j / LANES * kp + p / 4 * 4) * LANES + j % LANES * 4 + p % 4] = 0;
            }
        }
        (self.k, self.n, self.kp, self.panels) = (k, n, kp, panels);
        self.narrow = false;
    }

    /// Stores the rows `4g..` (`rows`, one to four of `n` values) into reduction group `g`
    /// of a pack [`begin`](Self::begin) set up, and adds them to the column sums.
    fn store_group<T: Int8>(&mut self, g: usize, rows: &[&[T]]) {
        let (n, kp) = (self.n, self.kp);
        for row in rows {
            crate::wide::wide(
                #[inline(always)]
                || {
                    for (s, &v) in self.sums.iter_mut().zip(*row) {
                        *s += v.signed() as i32;
                    }
                },
            );
        }
        let full = n / LANES;
        let group = &mut self.data[..];
        #[cfg(target_arch = "x86_64")]
        if let &[a, b, c, d] = rows {
            for panel in 0..full {
                let at = (panel * kp + 4 * g) * LANES;
                let flip = T::TO_SIGNED != 0;
                interleave4([a, b, c, d], panel * LANES, flip, &mut group[at..at + 64]);
            }
        }
        // What the vector path leaves: partial groups, the last partial panel (and
        // everything off x86-64).
        let vector = if cfg!(target_arch = "x86_64") && rows.len() == 4 {
            full * LANES
        } else {
            0
        };
        for (q, row) in rows.iter().enumerate() {
            for (j, &v) in row.iter().enumerate().skip(vector) {
                let at = (j / LANES * kp + 4 * g) * LANES + j % LANES * 4 + q;
                group[at] = v.signed();
            }
        }
    }
}

/// Sixteen columns from `at` of four rows, made signed (`flip`: uint8 less 128), interleaved
/// into one 64-byte group of the packed layout: column `j`'s four values at `4j..4j + 4`.
#[cfg(target_arch = "x86_64")]
fn interleave4<T: Int8>(rows: [&[T]; 4], at: usize, flip: bool, dst: &mut [i8]) {
    use std::arch::x86_64::*;
    assert!(dst.len() >= 64 && rows.iter().all(|r| r.len() >= at + 16));
    // SAFETY: 16 bytes from `at` of each row and 64 of dst are in bounds (asserted); SSE2 is
    // part of x86-64; T is one byte.
    unsafe {
        let flip = _mm_set1_epi8(if flip { -128 } else { 0 });
        let load = |r: &[T]| _mm_xor_si128(_mm_loadu_si128(r.as_ptr().add(at).cast()), flip);
        let (a, b, c, d) = (load(rows[0]), load(rows[1]), load(rows[2]), load(rows[3]));
        let (ab_lo, ab_hi) = (_mm_unpacklo_epi8(a, b), _mm_unpackhi_epi8(a, b));
        let (cd_lo, cd_hi) = (_mm_unpacklo_epi8(c, d), _mm_unpackhi_epi8(c, d));
        let o = dst.as_mut_ptr();
        _mm_storeu_si128(o.cast(), _mm_unpacklo_epi16(ab_lo, cd_lo));
        _mm_storeu_si128(o.add(16).cast(), _mm_unpackhi_epi16(ab_lo, cd_lo));
        _mm_storeu_si128(o.add(32).cast(), _mm_unpacklo_epi16(ab_hi, cd_hi));
        _mm_storeu_si128(o.add(48).cast(), _mm_unpackhi_epi16(ab_hi, cd_hi));
    }
}

/// `m × k` values in the kernel's layout: rows padded to a multiple of 4, unsigned, with their
/// sums and zero points (one, or one per row). Reused across calls (`pack` keeps the buffers).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PackedA {
    m: usize,
    k: usize,
    kp: usize,
    data: Vec<u8>,
    sums: Vec<i32>,
    /// The zero points (one, or one per row), shifted as the values are.
    zero: Vec<i32>,
}

impl PackedA {
    /// Packs `a` (`m × k`, element `(i, p)` at `a[i * row + p]`) with zero point `za`.
    ///
    /// # Panics
    /// If `a` is too short.
    pub fn pack<T: Int8>(&mut self, m: usize, k: usize, a: &[T], row: usize, za: T) {
        self.pack_rows(m, k, a, row, &[za]);
    }

    /// Packs constant `a` (`m × k` row-major, e.g. convolution weights by output channel) with
    /// zero points `za` (one, or one per row).
    ///
    /// # Panics
    /// If `a` is not `m × k` or `za` has another count.
    pub fn weights<T: Int8>(m: usize, k: usize, a: &[T], za: &[T]) -> PackedA {
        assert_eq!(a.len(), m * k, "PackedA weights size");
        let mut p = PackedA::default();
        p.pack_rows(m, k, a, k, za);
        p
    }

    fn pack_rows<T: Int8>(&mut self, m: usize, k: usize, a: &[T], row: usize, za: &[T]) {
        if m > 0 && k > 0 {
            assert!(a.len() >= (m - 1) * row + k, "PackedA operand too small");
        }
        assert!(
            za.len() == 1 || za.len() == m,
            "{} zero points for {m} rows",
            za.len()
        );
        let kp = k.div_ceil(4) * 4;
        self.data.clear();
        self.data.resize(m * kp, 0);
        self.sums.clear();
        self.sums.resize(m, 0);
        for i in 0..m {
            let (src, dst) = (&a[i * row..i * row + k], &mut self.data[i * kp..i * kp + k]);
            let mut sum = 0i32;
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = s.unsigned();
                sum = sum.wrapping_add(*d as i32);
            }
            self.sums[i] = sum;
        }
        (self.m, self.k, self.kp) = (m, k, kp);
        self.zero = za.iter().map(|z| z.unsigned() as i32).collect();
    }

    pub fn m(&self) -> usize {
        self.m
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len() + 4 * (self.sums.len() + self.zero.len())
    }

    fn zero_of(&self, i: usize) -> i32 {
        self.zero[if self.zero.len() == 1 { 0 } else { i }]
    }

    /// The packed rows: `m` rows of `kp` bytes.
    pub(crate) fn data_ptr(&self) -> *const u8 {
        self.data.as_ptr()
    }
}

/// `c[i·n + j]` (`m × n`, row-major) `= Σ_p (a[i][p] - za[i]) · (b[p][j] - zb[j])`, split
/// across `threads`.
///
/// # Panics
/// If `a` and `b` disagree on `k` or `c` is not `m × n`.
pub fn qgemm(threads: usize, a: &PackedA, b: &PackedB, c: &mut [i32]) {
    qgemm_map(threads, a, b, c, |_, _, v, o| o.copy_from_slice(v));
}

/// [`qgemm`] with each row's results passed through `f` on their way out: `f(i, j0, sums,
/// out)` gets the sums of row `i` for columns `j0..j0 + sums.len()` (at most 16) and the
/// elements of `out` (`m × n`, row-major) they become.
///
/// # Panics
/// If `a` and `b` disagree on `k` or `out` is not `m × n`.
pub fn qgemm_map<O: Send, F: Fn(usize, usize, &[i32], &mut [O]) + Sync>(
    threads: usize,
    a: &PackedA,
    b: &PackedB,
    out: &mut [O],
    f: F,
) {
    let (m, n) = (a.m, b.n);
    assert_eq!(a.k, b.k, "qgemm reduction lengths");
    assert_eq!(out.len(), m * n, "qgemm output size");
    if m == 0 || n == 0 {
        return;
    }
    let out = SharedOut(out.as_mut_ptr());
    let (vnni, avx2) = (vnni(), crate::qavx2_available());
    #[cfg(target_arch = "x86_64")]
    let amx = crate::qamx::applies(a, b);
    #[cfg(not(target_arch = "x86_64"))]
    let amx = false;
    // A task takes blocks of panels in turn, each over all of its rows. A block is NP panels,
    // the VNNI register tile's; on AMX it is `qamx::BLOCK_PANELS`, so that each tile of rows is
    // read from L2 once for more columns.
    #[cfg(target_arch = "x86_64")]
    let (np, unit, mr) = match amx {
        true => (crate::qamx::BLOCK_PANELS, 2, 2 * crate::qamx::TILE_ROWS),
        false => (NP, NP, MR),
    };
    #[cfg(not(target_arch = "x86_64"))]
    let (np, unit, mr) = (NP, NP, MR);
    // Tasks over whole register tiles: rows in AMX's 32 (a task's rows split at 66 of 128 left
    // 32 of them to the VNNI kernel, a third of each of bert_int8's batch-1 products on two
    // threads), columns in the tile's panels (`split::grid`).
    let threads = match m * n * b.k >= crate::PAR_MIN_WORK {
        true => threads,
        false => 1,
    };
    let (row_units, col_units) = (m.div_ceil(mr), b.panels.div_ceil(unit));
    let (row_tasks, col_tasks) =
        crate::split::grid(threads, row_units, col_units, m * b.k, n * b.k);
    let rows_per = row_units.div_ceil(row_tasks) * mr;
    let panels_per = col_units.div_ceil(col_tasks) * unit;
    let run = |t: usize| {
        let (ct, rt) = (t / row_tasks, t % row_tasks);
        let rows = (rt * rows_per).min(m)..((rt + 1) * rows_per).min(m);
        let mine = (ct * panels_per).min(b.panels)..((ct + 1) * panels_per).min(b.panels);
        for p0 in mine.clone().step_by(np) {
            let (rows, panels) = (rows.clone(), p0..(p0 + np).min(mine.end));
            if amx {
                // SAFETY: `qamx::applies` holds; as below.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    crate::qamx::tiles(a, b, rows, panels, out, &f)
                }
            } else if vnni {
                // SAFETY: the CPU has AVX-512F/BW/VNNI (`vnni`); `a` and `b` hold their padded
                // sizes by construction and `out` is `m × n` (asserted above); tasks write
                // disjoint (rows, panels) tiles.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    vnni_tiles(a, b, rows, panels, out, &f)
                }
            } else if avx2 {
                // SAFETY: the CPU has AVX2; as above.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    avx2_tiles(a, b, rows, panels, out, &f)
                }
            } else {
                portable_tiles(a, b, rows, panels, out, &f)
            }
        }
    };
    let tasks = row_tasks * col_tasks;
    if tasks > 1 {
        (0..tasks).into_par_iter().for_each(run);
    } else {
        run(0);
    }
}

/// The output shared by tasks that write disjoint tiles of it.
pub(crate) struct SharedOut<O>(pub(crate) *mut O);
impl<O> Clone for SharedOut<O> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<O> Copy for SharedOut<O> {}
// SAFETY: tasks write disjoint elements (see `qgemm_map`), and the pointer outlives them.
unsafe impl<O: Send> Send for SharedOut<O> {}
// SAFETY: as above.
unsafe impl<O: Send> Sync for SharedOut<O> {}

impl<O> SharedOut<O> {
    /// Row `i`'s `width` elements from column `j0`.
    ///
    /// # Safety
    /// They lie within the `m × n` output and no one else touches them meanwhile.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn row(&self, i: usize, n: usize, j0: usize, width: usize) -> &mut [O] {
        // SAFETY: as the contract.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(i * n + j0), width) }
    }
}

/// The correction of row `i`'s sums for the zero points:
/// `sum + zb[j]·(k·za[i] - Σa[i]) - za[i]·Σb[j]`.
fn corrected(a: &PackedA, b: &PackedB, i: usize, j: usize, sum: i32) -> i32 {
    let za = a.zero_of(i);
    let t = (b.k as i32).wrapping_mul(za).wrapping_sub(a.sums[i]);
    sum.wrapping_add(b.zero[j].wrapping_mul(t))
        .wrapping_sub(za.wrapping_mul(b.sums[j]))
}

/// The portable kernel: rows `rows` by the columns of `panels`.
fn portable_tiles<O, F: Fn(usize, usize, &[i32], &mut [O])>(
    a: &PackedA,
    b: &PackedB,
    rows: std::ops::Range<usize>,
    panels: std::ops::Range<usize>,
    out: SharedOut<O>,
    f: &F,
) {
    let (kp, n) = (a.kp, b.n);
    let mut acc = [0i32; LANES];
    for panel in panels {
        let j0 = panel * LANES;
        if j0 >= n {
            break;
        }
        let width = (n - j0).min(LANES);
        let bp = &b.data[panel * kp * LANES..(panel + 1) * kp * LANES];
        for i in rows.clone() {
            let ar = &a.data[i * kp..(i + 1) * kp];
            acc.fill(0);
            for (av, bg) in ar.chunks_exact(4).zip(bp.chunks_exact(4 * LANES)) {
                for (l, o) in acc.iter_mut().enumerate() {
                    let bl = &bg[l * 4..l * 4 + 4];
                    let s = (0..4).fold(0i32, |s, q| s + av[q] as i32 * bl[q] as i32);
                    *o = o.wrapping_add(s);
                }
            }
            for (l, v) in acc[..width].iter_mut().enumerate() {
                *v = corrected(a, b, i, j0 + l, *v);
            }
            // SAFETY: i < m and j0 + width <= n: within the output (`m × n`, asserted in
            // `qgemm_map`); this task alone writes this tile.
            f(i, j0, &acc[..width], unsafe { out.row(i, n, j0, width) });
        }
    }
}

/// The AVX2 kernel: rows `rows` by the columns of `panels`, a panel at a time, each by tiles
/// of rows, with the fast products where the weights allow them.
///
/// # Safety
/// The CPU has AVX2; `a`, `b` are consistent packs; `out` holds `a.m × b.n` elements and no
/// one else writes this tile.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn avx2_tiles<O, F: Fn(usize, usize, &[i32], &mut [O])>(
    a: &PackedA,
    b: &PackedB,
    rows: std::ops::Range<usize>,
    panels: std::ops::Range<usize>,
    out: SharedOut<O>,
    f: &F,
) {
    use crate::qavx2::{Narrow, Wide};
    // SAFETY: as this function's contract; Narrow only where b's pairs pass its bound.
    unsafe {
        if b.narrow {
            avx2_products::<Narrow, O, F>(a, b, rows, panels, out, f)
        } else {
            avx2_products::<Wide, O, F>(a, b, rows, panels, out, f)
        }
    }
}

/// [`avx2_tiles`] by the products `K`.
///
/// # Safety
/// As [`avx2_tiles`]; `b` passes `K`'s bound.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn avx2_products<K: crate::qavx2::Products, O, F: Fn(usize, usize, &[i32], &mut [O])>(
    a: &PackedA,
    b: &PackedB,
    rows: std::ops::Range<usize>,
    panels: std::ops::Range<usize>,
    out: SharedOut<O>,
    f: &F,
) {
    // Rows in blocks that stay in L2 while every panel of the task runs over them: the whole
    // left operand, read again for each panel, would come from memory once past L2.
    let block = (A_BLOCK_BYTES / a.kp.max(1)).max(1).div_ceil(K::ROWS) * K::ROWS;
    for r0 in rows.clone().step_by(block) {
        let r1 = (r0 + block).min(rows.end);
        for panel in panels.clone() {
            if panel * LANES >= b.n {
                break;
            }
            let mut i = r0;
            while i < r1 {
                let mr = (r1 - i).min(K::ROWS);
                // SAFETY: as this function's contract; rows i..i + mr are within a.
                unsafe {
                    match mr {
                        4 => avx2_tile::<K, 4, O, F>(a, b, i, panel, out, f),
                        3 => avx2_tile::<K, 3, O, F>(a, b, i, panel, out, f),
                        2 => avx2_tile::<K, 2, O, F>(a, b, i, panel, out, f),
                        _ => avx2_tile::<K, 1, O, F>(a, b, i, panel, out, f),
                    }
                }
                i += mr;
            }
        }
    }
}

/// Bytes of the left operand that the AVX2 kernel runs every panel of a task over before it
/// takes the next rows: a quarter of a 512 KiB L2, next to the task's panels.
const A_BLOCK_BYTES: usize = 128 << 10;

/// `R` rows from `i0` by panel `panel`, on AVX2.
///
/// # Safety
/// As [`avx2_products`], with rows `i0..i0 + R` within `a` and `panel` within `b`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn avx2_tile<
    K: crate::qavx2::Products,
    const R: usize,
    O,
    F: Fn(usize, usize, &[i32], &mut [O]),
>(
    a: &PackedA,
    b: &PackedB,
    i0: usize,
    panel: usize,
    out: SharedOut<O>,
    f: &F,
) {
    use std::arch::x86_64::*;
    let (kp, n, j0) = (a.kp, b.n, panel * LANES);
    let width = (n - j0).min(LANES);
    // SAFETY: rows i0..i0 + R and the panel lie within a.data and b.data (this function's
    // contract), kp bytes of each row and kp / 4 blocks of the panel; the CPU has AVX2.
    let acc = unsafe {
        let rows = std::array::from_fn(|r| a.data.as_ptr().add((i0 + r) * kp));
        let bp = b.data.as_ptr().add(panel * kp * LANES);
        K::products::<R>(K::zeros(), rows, bp, kp / 4)
    };
    // The panel's zero points and column sums (both padded to whole panels).
    // SAFETY: j0 + 16 <= panels · 16, their length; the CPU has AVX2.
    let (zb, sb): ([__m256i; 2], [__m256i; 2]) = unsafe {
        let at = |v: &[i32], h: usize| _mm256_loadu_si256(v.as_ptr().add(j0 + 8 * h).cast());
        (
            [at(&b.zero, 0), at(&b.zero, 1)],
            [at(&b.sums, 0), at(&b.sums, 1)],
        )
    };
    for (r, acc) in acc.iter().enumerate() {
        let i = i0 + r;
        // [`corrected`], 8 columns a vector.
        let za = a.zero_of(i);
        let t = _mm256_set1_epi32((b.k as i32).wrapping_mul(za).wrapping_sub(a.sums[i]));
        let za = _mm256_set1_epi32(za);
        let mut vals = [0i32; LANES];
        // SAFETY: the CPU has AVX2; vals holds two vectors of 8.
        unsafe {
            for (h, sums) in K::columns(acc).into_iter().enumerate() {
                let v = _mm256_add_epi32(sums, _mm256_mullo_epi32(zb[h], t));
                let v = _mm256_sub_epi32(v, _mm256_mullo_epi32(za, sb[h]));
                _mm256_storeu_si256(vals.as_mut_ptr().add(8 * h).cast(), v);
            }
        }
        // SAFETY: i < m and j0 + width <= n: within the output; this task alone writes it.
        f(i, j0, &vals[..width], unsafe { out.row(i, n, j0, width) });
    }
}

/// The VNNI kernel: rows `rows` by the columns of `panels` (at most `NP` of them).
///
/// # Safety
/// The CPU has AVX-512F, BW and VNNI; `a`, `b` are consistent packs; `out` holds `a.m × b.n`
/// elements and no one else writes this tile.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn vnni_tiles<O, F: Fn(usize, usize, &[i32], &mut [O])>(
    a: &PackedA,
    b: &PackedB,
    rows: std::ops::Range<usize>,
    panels: std::ops::Range<usize>,
    out: SharedOut<O>,
    f: &F,
) {
    let (p0, np) = (panels.start, panels.len());
    debug_assert!((1..=NP).contains(&np));
    // Every (rows, panels) tile shape the edges need, each compiled with its own registers.
    macro_rules! tiles {
        ($i:expr, $ahead:expr, $mr:expr, $($r:literal)*) => {
            match ($mr, np) {
                $(
                    ($r, 4) => tile::<$r, 4, O, F>(a, b, ($i, p0), $ahead, out, f),
                    ($r, 3) => tile::<$r, 3, O, F>(a, b, ($i, p0), $ahead, out, f),
                    ($r, 2) => tile::<$r, 2, O, F>(a, b, ($i, p0), $ahead, out, f),
                    ($r, _) => tile::<$r, 1, O, F>(a, b, ($i, p0), $ahead, out, f),
                )*
                _ => unreachable!("tiles have 1 to {MR} rows"),
            }
        };
    }
    // The weights of the panels after these, brought into L2 while these tiles compute, a
    // share by each tile: at batch 1 every weight matrix is read once a run, from memory, and
    // the first tile of each block of panels would wait for all of its weights (on a Xeon,
    // `gemm_rate --gemms --cold`, BERT's batch-1 FFN product, median of six runs interleaved
    // with a build without it: 303 → 349 GOP/s; 515 with its weights in a cache).
    let mut ahead = Ahead::after(b, p0..p0 + np, NP, rows.len().div_ceil(MR));
    let mut i = rows.start;
    while i < rows.end {
        let mr = (rows.end - i).min(MR);
        let share = ahead.share(b.kp / 4);
        // SAFETY: as this function's contract; rows i..i + mr are within a.
        unsafe { tiles!(i, share, mr, 6 5 4 3 2 1) }
        i += mr;
    }
}

/// The cache lines of the weights a kernel will read next, brought into L2 while it computes
/// (at batch 1 every weight matrix is read once a run, from memory), handed out in even shares.
#[cfg(target_arch = "x86_64")]
pub(crate) struct Ahead {
    base: *const u8,
    lines: std::ops::Range<usize>,
    per_share: usize,
}

#[cfg(target_arch = "x86_64")]
impl Ahead {
    /// The `count` panels of `b` after `panels`, in `shares` shares.
    pub(crate) fn after(
        b: &PackedB,
        panels: std::ops::Range<usize>,
        count: usize,
        shares: usize,
    ) -> Ahead {
        let next = panels.end.min(b.panels)..(panels.end + count).min(b.panels);
        let panel_lines = b.kp * LANES / 64;
        let lines = next.start * panel_lines..next.end * panel_lines;
        Ahead {
            base: b.data.as_ptr().cast(),
            per_share: lines.len().div_ceil(shares.max(1)),
            lines,
        }
    }

    /// The next share, spread over `steps` steps of the product that takes it.
    pub(crate) fn share(&mut self, steps: usize) -> Share {
        let count = self.per_share.min(self.lines.len());
        let share = Share {
            first: self.base.wrapping_add(self.lines.start * 64),
            count,
            per_step: count.div_ceil(steps.max(1)),
        };
        self.lines.start += count;
        share
    }
}

/// `count` cache lines from `first` to bring into L2, `per_step` at each step of a product.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(crate) struct Share {
    first: *const u8,
    count: usize,
    per_step: usize,
}

#[cfg(target_arch = "x86_64")]
impl Share {
    /// No lines.
    pub(crate) const NONE: Share = Share {
        first: std::ptr::null(),
        count: 0,
        per_step: 0,
    };

    /// Asks for the lines of step `step`.
    #[inline(always)]
    pub(crate) fn prefetch(&self, step: usize) {
        use std::arch::x86_64::{_MM_HINT_T1, _mm_prefetch};
        let end = ((step + 1) * self.per_step).min(self.count);
        for line in (step * self.per_step).min(end)..end {
            // SAFETY: every x86-64 CPU has SSE, and a prefetch faults on nothing.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(self.first.wrapping_add(line * 64).cast()) };
        }
    }
}

/// `R` rows from `i0` by the `P` panels from `p0`, asking for share `ahead` of the lines to
/// come into L2 on the way, spread over the reduction groups.
///
/// # Safety
/// As [`vnni_tiles`], with rows `i0..i0 + R` within `a` and panels `p0..p0 + P` within `b`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn tile<const R: usize, const P: usize, O, F: Fn(usize, usize, &[i32], &mut [O])>(
    a: &PackedA,
    b: &PackedB,
    (i0, p0): (usize, usize),
    ahead: Share,
    out: SharedOut<O>,
    f: &F,
) {
    use std::arch::x86_64::*;
    let (kp, n) = (a.kp, b.n);
    debug_assert!(i0 + R <= a.m && p0 + P <= b.panels);
    let mut acc = [[_mm512_setzero_si512(); P]; R];
    // SAFETY: panel p0 and row i0 start within b.data and a.data (this function's contract).
    let (bp, ap) = unsafe {
        (
            b.data.as_ptr().add(p0 * kp * LANES),
            a.data.as_ptr().add(i0 * kp),
        )
    };
    for g in 0..kp / 4 {
        ahead.prefetch(g);
        // (A loop, not a closure: closures do not inherit the target features.)
        let mut bv = [_mm512_setzero_si512(); P];
        for (q, v) in bv.iter_mut().enumerate() {
            // SAFETY: group g < kp / 4 of panels p0..p0 + P lies within b.data
            // ([panel][kp / 4][64 bytes]).
            *v = unsafe { _mm512_loadu_si512(bp.add((q * kp + g * 4) * LANES).cast()) };
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            // SAFETY: row i0 + r < m, bytes 4g..4g + 4 < kp of it.
            let av =
                _mm512_set1_epi32(unsafe { ap.add(r * kp + g * 4).cast::<i32>().read_unaligned() });
            for (acc, &bv) in acc.iter_mut().zip(&bv) {
                *acc = _mm512_dpbusd_epi32(*acc, av, bv);
            }
        }
    }
    for q in 0..P {
        let j0 = (p0 + q) * LANES;
        if j0 >= n {
            break;
        }
        for (r, acc) in acc.iter().enumerate() {
            // SAFETY: row i0 + r < m, columns from j0 < n: within the output (this
            // function's contract), written by this task alone.
            unsafe { emit(a, b, (i0 + r, j0), acc[q], out, f) };
        }
    }
}

/// Row `i`'s raw sums `acc` for the (up to) 16 columns from `j0`, corrected for the zero points
/// ([`corrected`], 16 at a time) and passed through `f` into the output.
///
/// # Safety
/// The CPU has AVX-512F; `i < a.m`, `j0 < b.n`, and no one else writes these elements of `out`
/// (`a.m × b.n`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn emit<O, F: Fn(usize, usize, &[i32], &mut [O])>(
    a: &PackedA,
    b: &PackedB,
    (i, j0): (usize, usize),
    acc: std::arch::x86_64::__m512i,
    out: SharedOut<O>,
    f: &F,
) {
    use std::arch::x86_64::*;
    let n = b.n;
    let width = (n - j0).min(LANES);
    // SAFETY: b.zero and b.sums hold panels × 16 entries.
    let (zb, sb) = unsafe {
        (
            _mm512_loadu_si512(b.zero.as_ptr().add(j0).cast()),
            _mm512_loadu_si512(b.sums.as_ptr().add(j0).cast()),
        )
    };
    let za = a.zero_of(i);
    let t = (b.k as i32).wrapping_mul(za).wrapping_sub(a.sums[i]);
    let v = _mm512_sub_epi32(
        _mm512_add_epi32(acc, _mm512_mullo_epi32(zb, _mm512_set1_epi32(t))),
        _mm512_mullo_epi32(_mm512_set1_epi32(za), sb),
    );
    let mut vals = [0i32; LANES];
    // SAFETY: vals holds 16 i32.
    unsafe { _mm512_storeu_si512(vals.as_mut_ptr().cast(), v) };
    // SAFETY: row i < m, columns j0..j0 + width <= n (this function's contract).
    f(i, j0, &vals[..width], unsafe { out.row(i, n, j0, width) });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::igemm::igemm_reference;

    use crate::test_bytes as bytes;

    /// The reference igemm on centred operands.
    fn reference<A: Int8 + Into<i32>, B: Int8 + Into<i32>>(
        (m, n, k): (usize, usize, usize),
        a: &[A],
        za: A,
        b: &[B],
        zb: &[B],
    ) -> Vec<i32> {
        let ac: Vec<i16> = a.iter().map(|&v| (v.into() - za.into()) as i16).collect();
        let bc: Vec<i16> = (0..k * n)
            .map(|i| (b[i].into() - zb[if zb.len() == 1 { 0 } else { i % n }].into()) as i16)
            .collect();
        igemm_reference(m, n, k, &ac, &bc)
    }

    fn check<A: Int8 + Into<i32>, B: Int8 + Into<i32>>(
        (m, n, k): (usize, usize, usize),
        a: &[A],
        za: A,
        b: &[B],
        zb: &[B],
    ) {
        let want = reference((m, n, k), a, za, b, zb);
        let packed = PackedB::new(k, n, b, (n, 1), zb);
        let mut pa = PackedA::default();
        pa.pack(m, k, a, k, za);
        for threads in [1, 2, 3] {
            let mut c = vec![7i32; m * n];
            qgemm(threads, &pa, &packed, &mut c);
            assert_eq!(c, want, "{m}x{n}x{k} on {threads} threads");
        }
        // The portable and AVX2 kernels too, on this CPU.
        if m > 0 && n > 0 {
            let copy = |_, _, v: &[i32], o: &mut [i32]| o.copy_from_slice(v);
            let mut c = vec![7i32; m * n];
            let panels = 0..packed.panels;
            portable_tiles(
                &pa,
                &packed,
                0..m,
                panels.clone(),
                SharedOut(c.as_mut_ptr()),
                &copy,
            );
            assert_eq!(c, want, "portable {m}x{n}x{k}");
            #[cfg(target_arch = "x86_64")]
            if crate::qavx2_available() {
                let mut c = vec![7i32; m * n];
                let out = SharedOut(c.as_mut_ptr());
                // SAFETY: the CPU has AVX2; the packs are consistent and c is m × n.
                unsafe { avx2_tiles(&pa, &packed, 0..m, panels, out, &copy) };
                assert_eq!(c, want, "AVX2 {m}x{n}x{k}");
            }
        }
        // b repacked from rows with one zero point, and a as weights with one per row.
        if zb.len() != 1 {
            return;
        }
        // Over a pack of a larger matrix, whose leftovers must not leak into the padding.
        let mut rows = PackedB::default();
        let stale: Vec<i8> = bytes((k + 3) * (n + 17), 9)
            .iter()
            .map(|&v| v as i8)
            .collect();
        rows.pack_rows(k + 3, n + 17, &stale, -1);
        rows.pack_rows(k, n, b, zb[0]);
        let mut filled = PackedB::default();
        filled.pack_filled(k, n, zb[0], |p, row| {
            row.copy_from_slice(&b[p * n..(p + 1) * n])
        });
        assert_eq!(filled, rows, "rows made four at a time pack the same");
        // Every other row's zero point is a's first value.
        let other = a.first().copied().unwrap_or(za);
        let zas: Vec<A> = (0..m)
            .map(|i| if i % 2 == 0 { za } else { other })
            .collect();
        let w = PackedA::weights(m, k, a, &zas);
        let mut want = vec![0; m * n];
        for i in 0..m {
            let row = reference((1, n, k), &a[i * k..(i + 1) * k], zas[i], b, zb);
            want[i * n..(i + 1) * n].copy_from_slice(&row);
        }
        for threads in [1, 2] {
            let mut c = vec![7i32; m * n];
            qgemm(threads, &w, &rows, &mut c);
            assert_eq!(c, want, "rows-packed {m}x{n}x{k} on {threads} threads");
        }
    }

    const SHAPES: &[(usize, usize, usize)] = &[
        (1, 1, 1),
        (3, 5, 7),
        (7, 17, 1),
        (13, 33, 9),
        (6, 64, 4),
        (13, 49, 36),
        (7, 196, 20),
        (9, 40, 8),
        (8, 20, 5),
        (25, 70, 131),
        (1, 1000, 259),
        (50, 3, 30),
        // Rows in several of the AVX2 kernel's L2 blocks (16 rows each at this reduction).
        (37, 20, 8192),
        // Reductions of whole AMX tiles (64): 32 × 32 register tiles with rows below them, an
        // odd panel beside them, a narrow last panel, and a single panel.
        (32, 32, 64),
        (70, 53, 128),
        (45, 40, 192),
        (64, 16, 64),
        // More panels than a task of AMX tiles takes (16), the last odd, with rows below.
        (45, 300, 128),
        // Partial AMX register tiles: one A tile of 12 rows, 16 + 4 rows, at the threshold,
        // and just under it (the VNNI kernel's).
        (12, 40, 128),
        (20, 33, 64),
        (8, 16, 64),
        (7, 16, 64),
        (57, 35, 192),
        // On two threads, column tasks of more than one block of 16 panels.
        (64, 1100, 64),
        (0, 4, 4),
        (4, 0, 4),
        (4, 4, 0),
    ];

    #[test]
    fn matches_the_reference_for_every_signedness_and_zero_point() {
        if !vnni() {
            eprintln!("no AVX-512 VNNI: only the portable kernel runs");
        }
        #[cfg(target_arch = "x86_64")]
        if !crate::qamx::available() {
            eprintln!("no AMX: the VNNI kernel runs the 64-step reductions too");
        }
        for &(m, n, k) in SHAPES {
            let (a, b) = (bytes(m * k, 1), bytes(k * n, 2));
            let ai: Vec<i8> = a.iter().map(|&v| v as i8).collect();
            let bi: Vec<i8> = b.iter().map(|&v| v as i8).collect();
            for (za, zb) in [(0u8, 0u8), (255, 255), (128, 0), (3, 200)] {
                check((m, n, k), &a, za, &bi, &[zb as i8]);
                check((m, n, k), &a, za, &b, &[zb]);
                check((m, n, k), &ai, za as i8, &bi, &[zb as i8]);
                check((m, n, k), &ai, za as i8, &b, &[zb]);
            }
            for (za, zb) in [(-128i8, 127i8), (127, -128)] {
                check((m, n, k), &ai, za, &bi, &[zb]);
            }
            // One zero point per column, at the extremes.
            let zbs: Vec<i8> = (0..n).map(|j| [-128, 127, 0][j % 3]).collect();
            check((m, n, k), &a, 255, &bi, &zbs);
            let zbu: Vec<u8> = (0..n).map(|j| [0, 255, 128][j % 3]).collect();
            check((m, n, k), &ai, -128, &b, &zbu);
        }
    }

    #[test]
    fn seven_bit_weights_take_the_narrow_products() {
        for &(m, n, k) in SHAPES {
            let a = bytes(m * k, 1);
            let b: Vec<i8> = bytes(k * n, 2).iter().map(|&v| (v as i8) >> 1).collect();
            assert!(PackedB::new(k, n, &b, (n, 1), &[0]).narrow, "{m}x{n}x{k}");
            for (za, zb) in [(0u8, 0i8), (255, -64), (3, 63)] {
                check((m, n, k), &a, za, &b, &[zb]);
            }
            // uint8 weights are packed less 128: these are the same.
            let bu: Vec<u8> = b.iter().map(|&v| (v as i16 + 128) as u8).collect();
            assert!(PackedB::new(k, n, &bu, (n, 1), &[128]).narrow);
            check((m, n, k), &a, 7, &bu, &[128]);
        }
        // At the bound and one past it.
        let pair = |x: i8, y: i8| PackedB::new(2, 1, &[x, y], (1, 1), &[0i8]).narrow;
        assert!(pair(-128, 0) && pair(64, -64) && pair(100, 28));
        assert!(!pair(127, 2) && !pair(-128, -1) && !pair(65, 64));
        let mut rows = PackedB::new(4, 1, &[0i8; 4], (1, 1), &[0i8]);
        rows.pack_rows(4, 1, &[0i8; 4], 0);
        assert!(
            !rows.narrow,
            "activations packed at run time are never taken as narrow"
        );
    }

    #[test]
    fn wraps_like_int32_on_overflow() {
        // Full-range weights, and 7-bit ones (the narrow products on AVX2).
        for (w, k) in [(-128i8, 70_001), (-64, 140_001)] {
            let (a, b) = (vec![255u8; k], vec![w; k]);
            let packed = PackedB::new(k, 1, &b, (1, 1), &[127]);
            let mut pa = PackedA::default();
            pa.pack(1, k, &a, k, 0);
            let mut c = vec![0];
            qgemm(1, &pa, &packed, &mut c);
            assert_eq!(c[0], (255i64 * (w as i64 - 127) * k as i64) as i32);
        }
    }

    #[test]
    fn a_transposed_b_packs_like_a_copy() {
        let (n, k) = (19, 11);
        let b: Vec<i8> = bytes(k * n, 4).iter().map(|&v| v as i8).collect();
        // b stored as n × k (column-major in the k × n sense).
        let bt: Vec<i8> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
        let (x, y) = (
            PackedB::new(k, n, &b, (n, 1), &[5]),
            PackedB::new(k, n, &bt, (1, k), &[5]),
        );
        assert_eq!(x, y);
    }
}
