//! Launch shapes and a builder for kernel arguments in the order of each kernel's header comment
//! (`int` → i32, `long long` → i64, `float` → f32, pointers → [`DevPtr`], NULL for an optional
//! input left out). A size that does not fit the kernel's `int` makes the launch decline, so the
//! step runs another way instead of wrapping around.

use super::api::{Arg, DevPtr, Dims6, Kernel, Launch};

/// Threads per block of the 1-D grid-stride kernels and the row (block-reduction) kernels.
pub const BLOCK: u32 = 256;
/// Most blocks along x the launchers use (grid-stride loops cover the rest).
pub const MAX_GRID: u64 = 65_535;

/// A grid and block.
pub type Shape = ((u32, u32, u32), (u32, u32, u32));

/// A 1-D grid-stride launch over `n` elements: min(ceil(n / 256), 65535) blocks of 256.
pub fn grid_1d(n: u64) -> Shape {
    let blocks = n.div_ceil(BLOCK as u64).clamp(1, MAX_GRID) as u32;
    ((blocks, 1, 1), (BLOCK, 1, 1))
}

/// One block (of 256 threads, a multiple of 32) per row, blocks striding over rows.
pub fn grid_rows(rows: u64) -> Shape {
    ((rows.clamp(1, MAX_GRID) as u32, 1, 1), (BLOCK, 1, 1))
}

/// transpose2d_tiled_f32: blocks of (32, 8) tiling the matrix, batch in z.
pub fn grid_transpose(batch: u64, rows: u64, cols: u64) -> Option<Shape> {
    let (gx, gy) = (cols.div_ceil(32), rows.div_ceil(32));
    if gx > u32::MAX as u64 || gy > MAX_GRID {
        return None;
    }
    Some((
        (
            gx.max(1) as u32,
            gy.max(1) as u32,
            batch.clamp(1, MAX_GRID) as u32,
        ),
        (32, 8, 1),
    ))
}

/// Arguments pushed in order; `finish` gives the launch, or `None` when a value did not fit.
pub struct Builder {
    launch: Launch,
    fits: bool,
}

impl Builder {
    pub fn new(kernel: Kernel, shape: Shape) -> Builder {
        Builder {
            launch: Launch {
                kernel,
                grid: shape.0,
                block: shape.1,
                shared_mem: 0,
                args: Vec::with_capacity(24),
            },
            fits: true,
        }
    }
    fn push(mut self, a: Arg) -> Builder {
        self.launch.args.push(a);
        self
    }
    pub fn ptr(self, p: DevPtr) -> Builder {
        self.push(Arg::Ptr(p))
    }
    pub fn opt(self, p: Option<DevPtr>) -> Builder {
        self.push(Arg::opt(p))
    }
    /// An `int` argument.
    pub fn int(mut self, v: usize) -> Builder {
        match i32::try_from(v) {
            Ok(v) => self.push(Arg::I32(v)),
            Err(_) => {
                self.fits = false;
                self
            }
        }
    }
    /// An `int` code (op, activation, mode).
    pub fn code(self, v: i32) -> Builder {
        self.push(Arg::I32(v))
    }
    /// A `long long` count.
    pub fn long(mut self, v: usize) -> Builder {
        match i64::try_from(v) {
            Ok(v) => self.push(Arg::I64(v)),
            Err(_) => {
                self.fits = false;
                self
            }
        }
    }
    /// A signed `long long` (offsets).
    pub fn signed(self, v: i64) -> Builder {
        self.push(Arg::I64(v))
    }
    pub fn float(self, v: f32) -> Builder {
        self.push(Arg::F32(v))
    }
    pub fn dims(mut self, d: Option<Dims6>) -> Builder {
        match d {
            Some(d) => self.push(Arg::Dims(d)),
            None => {
                self.fits = false;
                self
            }
        }
    }
    /// The arguments epilogue.cu's kernels share after their pointers: `n` elements of
    /// `channels` channels repeating every `inner`, and the activation (act, alpha, beta).
    pub fn epilogue(
        self,
        n: usize,
        channels: usize,
        inner: usize,
        act: (i32, f32, f32),
    ) -> Builder {
        self.long(n)
            .int(channels)
            .long(inner)
            .code(act.0)
            .float(act.1)
            .float(act.2)
    }

    pub fn finish(self) -> Option<Launch> {
        self.fits.then_some(self.launch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_cover_the_work() {
        assert_eq!(grid_1d(0), ((1, 1, 1), (256, 1, 1)));
        assert_eq!(grid_1d(257).0, (2, 1, 1));
        assert_eq!(grid_1d(1 << 40).0, (65_535, 1, 1));
        assert_eq!(grid_rows(3).0, (3, 1, 1));
        assert_eq!(grid_transpose(2, 33, 64), Some(((2, 2, 2), (32, 8, 1))));
    }

    #[test]
    fn values_that_do_not_fit_decline() {
        let b = Builder::new(Kernel::Fill, grid_1d(1));
        assert!(b.int(usize::MAX).finish().is_none());
        let b = Builder::new(Kernel::Fill, grid_1d(1));
        assert!(b.dims(Dims6::new(&[1; 7])).finish().is_none());
    }
}
