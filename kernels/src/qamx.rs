//! Intel's AMX tiles (Sapphire Rapids and later) for the 8-bit products of [`crate::qgemm`] and
//! [`crate::qconv`], where the CPU has them and Linux lets the process use them.
//!
//! A tile register holds 16 rows of 64 bytes. `tdpbusd` multiplies a tile of 16 rows by 64
//! unsigned bytes (`a`) by a tile of 16 groups of 4 reductions by 16 columns of signed bytes
//! (`b`) into a tile of 16 × 16 `i32` sums: 16 384 products an instruction, eight times what
//! VNNI's `vpdpbusd` does a cycle. [`PackedB`]'s `[panel][k / 4][16][4]` layout is that B-tile
//! layout already. The register tile is 32 rows by 32 columns (two A tiles, two B tiles, four
//! accumulators: the eight tile registers), in [`products`]; where its A rows come from is the
//! caller's ([`Rows`]). Here, for `qgemm`, they are [`PackedA`]'s rows (stride `kp`), and the
//! zero points are corrected as the VNNI kernel does; the rows and panels left over, and
//! reductions that are not a multiple of 64, run on the VNNI kernel.
//!
//! Rust has no stable AMX intrinsics: the instructions are written as inline assembly.

use crate::qgemm::{Ahead, LANES, NP, PackedA, PackedB, Share, SharedOut};
use std::arch::asm;
use std::sync::OnceLock;

/// Rows of an A tile, and reductions (bytes) of one.
pub(crate) const TILE_ROWS: usize = 16;
pub(crate) const TILE_K: usize = 64;
/// Panels a task of [`tiles`] takes: each A tile is read from L2 once for their 256 columns.
pub(crate) const BLOCK_PANELS: usize = 16;

/// Whether this process can run the AMX kernel: the CPU has AMX-TILE and AMX-INT8 (and the
/// VNNI kernel for what is left over), and Linux granted the tile data state.
pub(crate) fn available() -> bool {
    static GRANTED: OnceLock<bool> = OnceLock::new();
    *GRANTED.get_or_init(|| {
        crate::isa::allows(crate::isa::Isa::Amx)
            && crate::qgemm::vnni()
            && has_amx_int8()
            && request_tile_data()
    })
}

fn has_amx_int8() -> bool {
    // Leaf 7 exists on every CPU with AVX-512 (checked first by the caller).
    let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
    leaf7.edx & (1 << 24) != 0 && leaf7.edx & (1 << 25) != 0
}

/// Asks Linux for the AMX tile data state (`arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)`),
/// once for the whole process; without it the first tile instruction is a fatal signal.
#[cfg(target_os = "linux")]
fn request_tile_data() -> bool {
    const ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: the system call only changes which extended states the process may use.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

#[cfg(not(target_os = "linux"))]
fn request_tile_data() -> bool {
    false
}

/// Rows from which a last, partial register tile runs on AMX rather than on the VNNI kernel.
/// A tile load of B feeds as many rows as the tile has where a VNNI load feeds six, and from
/// 8 rows the VNNI kernel is bound by its multiply-adds: `gemm_rate --gemms`, 12 × 1024 × 512
/// with the weights in cache 403 → 957 GOP/s, 8 rows 304 → 791. With the weights read from
/// memory (`--cold`) the two are even at 8 rows and the VNNI kernel ahead by a tenth below,
/// where AMX is ahead in cache (6 rows 357 → 622).
const PARTIAL_ROWS: usize = 8;

/// Whether the AMX kernel takes a product of these operands: its reduction is whole A tiles,
/// and there are rows for at least a partial register tile.
pub(crate) fn applies(a: &PackedA, b: &PackedB) -> bool {
    b.kp > 0 && b.kp.is_multiple_of(TILE_K) && a.m() >= PARTIAL_ROWS && available()
}

/// The tile configuration: palette 1, the eight tiles 16 rows of 64 bytes.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    bytes_per_row: [u16; 16],
    rows: [u8; 16],
}

const CONFIG: TileConfig = TileConfig {
    palette: 1,
    start_row: 0,
    reserved: [0; 14],
    bytes_per_row: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
    rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
};

/// Loads [`CONFIG`] into the tile registers: palette 1, eight tiles of 16 rows of 64 bytes.
///
/// # Safety
/// [`available`] holds; the caller calls [`release`] before it returns.
pub(crate) unsafe fn configure() {
    // SAFETY: the configuration is valid for palette 1 (16 rows of 64 bytes).
    unsafe { asm!("ldtilecfg [{}]", in(reg) &CONFIG, options(nostack, readonly)) };
}

/// [`configure`] for a register tile of `rows` rows (1..32): the A tiles and their sums take
/// `min(rows, 16)` and `rows - 16` rows; under 17 rows the second A tile repeats the first's
/// rows (its products are computed and not read), so that no load reads past the last row.
///
/// # Safety
/// As [`configure`].
unsafe fn configure_rows(rows: usize) {
    let first = rows.clamp(1, TILE_ROWS) as u8;
    let second = match rows > TILE_ROWS {
        true => (rows - TILE_ROWS).min(TILE_ROWS) as u8,
        false => first,
    };
    let config = TileConfig {
        rows: [
            first, first, second, second, first, second, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0,
        ],
        ..CONFIG
    };
    // SAFETY: rows of 1..=16 and 64 bytes are valid for palette 1.
    unsafe { asm!("ldtilecfg [{}]", in(reg) &config, options(nostack, readonly)) };
}

/// Releases the tile state [`configure`] set up.
///
/// # Safety
/// The tiles were configured.
pub(crate) unsafe fn release() {
    // SAFETY: the contract.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// Where the 16 rows of an A tile lie: row `r` of reduction group `g` (64 bytes) at
/// `base + offset(g) + r·stride`, where `offset(g)` is `g·64` or `offsets[g]`.
#[derive(Clone, Copy)]
pub(crate) struct Rows<'a> {
    pub base: *const u8,
    pub stride: usize,
    pub offsets: Option<&'a [usize]>,
}

impl Rows<'_> {
    /// The rows `i..i + 16` of a packed A whose rows are `kp` bytes.
    fn packed(a: &PackedA, kp: usize, i: usize) -> Rows<'static> {
        Rows {
            base: a.data_ptr().wrapping_add(i * kp),
            stride: kp,
            offsets: None,
        }
    }

    #[inline(always)]
    fn group(&self, g: usize) -> *const u8 {
        let offset = self.offsets.map_or(g * TILE_K, |o| o[g]);
        self.base.wrapping_add(offset)
    }
}

/// Rows `rows` by the columns of `panels`: 32 × 32 register tiles on AMX (the last one
/// partial, from [`PARTIAL_ROWS`] rows), the rest on the VNNI kernel (`NP` panels a call).
///
/// # Safety
/// [`applies`] holds for `a` and `b`; `a`, `b` are consistent packs; `out` holds `a.m × b.n`
/// elements and no one else writes these tiles.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn tiles<O, F: Fn(usize, usize, &[i32], &mut [O])>(
    a: &PackedA,
    b: &PackedB,
    rows: std::ops::Range<usize>,
    panels: std::ops::Range<usize>,
    out: SharedOut<O>,
    f: &F,
) {
    // Whole 32-row register tiles, then a partial one of the rows left if there are enough.
    let whole = rows.start + (rows.len() / (2 * TILE_ROWS)) * 2 * TILE_ROWS;
    let row_end = match rows.end - whole >= PARTIAL_ROWS {
        true => rows.end,
        false => whole,
    };
    let panel_end = panels.start + (panels.len() / 2) * 2;
    if row_end > rows.start && panel_end > panels.start {
        // SAFETY: `applies` implies `available`; the tile state is released below, before
        // this function returns (`f`, called in between, uses no tiles).
        unsafe { configure() };
        let mut sums = [0i32; 4 * TILE_ROWS * LANES];
        // The weights of the next block of panels, a share by each product (as the VNNI
        // kernel's tiles take theirs).
        let blocks = (row_end - rows.start).div_ceil(2 * TILE_ROWS);
        let shares = blocks * (panel_end - panels.start) / 2;
        let mut ahead = Ahead::after(b, panels.clone(), panels.len(), shares);
        for i in (rows.start..row_end).step_by(2 * TILE_ROWS) {
            let height = (row_end - i).min(2 * TILE_ROWS);
            if height < 2 * TILE_ROWS {
                // SAFETY: as `configure` above; only the last block is partial.
                unsafe { configure_rows(height) };
            }
            // Rows of the two A tiles; under 17 rows the second repeats the first.
            let tile_rows = [height.min(TILE_ROWS), height.saturating_sub(TILE_ROWS)];
            let second = if height > TILE_ROWS { i + TILE_ROWS } else { i };
            let halves = [Rows::packed(a, b.kp, i), Rows::packed(a, b.kp, second)];
            for p in (panels.start..panel_end).step_by(2) {
                let pair = [panel(b, p), panel(b, p + 1)];
                // SAFETY: the configured rows from i and `second` lie within a
                // (row_end <= a.m), panels p, p + 1 within b, and the reduction is kp / 64
                // whole tiles of both.
                let share = ahead.share(b.kp / TILE_K);
                unsafe { products(halves, pair, b.kp / TILE_K, &mut sums, share) };
                for (q, quarter) in sums.chunks_exact(TILE_ROWS * LANES).enumerate() {
                    let (i0, j0) = (i + (q / 2) * TILE_ROWS, (p + q % 2) * LANES);
                    if j0 >= b.n {
                        continue;
                    }
                    let valid = tile_rows[q / 2];
                    for (r, row) in quarter.chunks_exact(LANES).take(valid).enumerate() {
                        // SAFETY: row i0 + r < m and columns from j0 < n: within the
                        // output, written by this task alone.
                        unsafe {
                            let acc = std::arch::x86_64::_mm512_loadu_si512(row.as_ptr().cast());
                            crate::qgemm::emit(a, b, (i0 + r, j0), acc, out, f)
                        };
                    }
                }
            }
        }
        // SAFETY: releases the tile state configured above.
        unsafe { release() };
    }
    // What the 32 × 32 tiles leave: the rows below them, and an odd last panel beside them.
    for p0 in panels.clone().step_by(NP) {
        let block = p0..(p0 + NP).min(panels.end);
        // SAFETY: as this function's contract, for the VNNI kernel (which `applies` implies),
        // at most NP panels a call.
        unsafe {
            if row_end < rows.end {
                crate::qgemm::vnni_tiles(a, b, row_end..rows.end, block.clone(), out, f);
            }
            let odd = panel_end.max(block.start)..block.end;
            if !odd.is_empty() && row_end > rows.start {
                crate::qgemm::vnni_tiles(a, b, rows.start..row_end, odd, out, f);
            }
        }
    }
}

/// Where panel `p` of `b` starts: `kp / 4` groups of 16 columns of 4 bytes.
pub(crate) fn panel(b: &PackedB, p: usize) -> *const i8 {
    b.data.as_ptr().wrapping_add(p * b.kp * LANES)
}

/// The sums of two A tiles of 16 rows (`a`) by two B panels of 16 columns (`b`, each
/// `[groups · 16][16][4]` bytes) over `groups` reductions of 64, into `sums` as four 16 × 16
/// quarters: `a[0]` by `b[0]`, `a[0]` by `b[1]`, `a[1]` by `b[0]`, `a[1]` by `b[1]`. On the
/// way it asks for share `ahead` of the lines to come into L2, spread over the groups.
///
/// # Safety
/// The tiles are configured ([`configure`]); every group `g < groups` of each of `a`'s rows
/// holds 64 readable bytes, and each of `b` holds `groups · 1024` readable bytes.
#[inline]
pub(crate) unsafe fn products(
    a: [Rows<'_>; 2],
    b: [*const i8; 2],
    groups: usize,
    sums: &mut [i32; 4 * TILE_ROWS * LANES],
    ahead: Share,
) {
    // SAFETY: the tiles are configured (contract); every load reads 16 rows of 64 bytes that
    // the contract says are readable.
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack, nomem)
        );
        for g in 0..groups {
            ahead.prefetch(g);
            asm!(
                "tileloadd tmm4, [{a0} + {lda0}*1]",
                "tileloadd tmm5, [{a1} + {lda1}*1]",
                "tileloadd tmm6, [{b0} + {ldb}*1]",
                "tileloadd tmm7, [{b1} + {ldb}*1]",
                "tdpbusd tmm0, tmm4, tmm6",
                "tdpbusd tmm1, tmm4, tmm7",
                "tdpbusd tmm2, tmm5, tmm6",
                "tdpbusd tmm3, tmm5, tmm7",
                a0 = in(reg) a[0].group(g),
                a1 = in(reg) a[1].group(g),
                b0 = in(reg) b[0].add(g * TILE_K * LANES),
                b1 = in(reg) b[1].add(g * TILE_K * LANES),
                lda0 = in(reg) a[0].stride,
                lda1 = in(reg) a[1].stride,
                ldb = in(reg) TILE_K,
                options(nostack, readonly)
            );
        }
        let c = sums.as_mut_ptr();
        let ldc = LANES * 4;
        asm!(
            "tilestored [{c0} + {ldc}*1], tmm0",
            "tilestored [{c1} + {ldc}*1], tmm1",
            "tilestored [{c2} + {ldc}*1], tmm2",
            "tilestored [{c3} + {ldc}*1], tmm3",
            c0 = in(reg) c,
            c1 = in(reg) c.add(256),
            c2 = in(reg) c.add(512),
            c3 = in(reg) c.add(768),
            ldc = in(reg) ldc,
            options(nostack)
        );
    }
}
