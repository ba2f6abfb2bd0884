//! A global allocator that starts every buffer of 1 KiB or more on a cache line (64 bytes).
//!
//! glibc gives 16-byte alignment, and a block it maps on its own starts 16 bytes past a page.
//! The kernels load 64 bytes at a time (an AVX-512 vector, a row of an AMX tile), so in such a
//! buffer every load straddles two lines. On the Sapphire Rapids Xeon an AMX tile load that
//! straddles takes about three times as long, and the int8 products ran at a third of their
//! speed. The packed weights, the activations and the pooled buffers are all plain `Vec`s: the
//! binaries that run models install this allocator
//! (`#[global_allocator] static ALLOC: LineAligned = LineAligned;`) rather than each kernel
//! aligning its own buffers.

use std::alloc::{GlobalAlloc, Layout, System};

/// The alignment given to large buffers.
pub const LINE: usize = 64;
/// The size from which a buffer is aligned to [`LINE`]. Smaller ones keep the system's alignment,
/// so that the many small allocations cost nothing more.
pub const ALIGNED_FROM: usize = 1024;

/// [`System`], with buffers of [`ALIGNED_FROM`] bytes or more aligned to [`LINE`].
pub struct LineAligned;

/// Whether a buffer of `layout` is placed on a line by this allocator.
fn on_a_line(layout: Layout) -> bool {
    layout.size() >= ALIGNED_FROM && layout.align() < LINE
}

/// What is asked of the system for a buffer of `size` bytes on a line: room to move it up to
/// the next line, which always leaves room for the system block's address just before it.
/// `None` for a size within a line of `isize::MAX` (the allocation fails, as in the system).
fn system_layout(size: usize) -> Option<Layout> {
    Layout::from_size_align(size.checked_add(LINE)?, align_of::<usize>()).ok()
}

/// [`system_layout`] of a block that was allocated, and so has one.
fn allocated_layout(size: usize) -> Layout {
    system_layout(size).expect("an allocated block's layout")
}

/// How far into a system block at `base` its line-aligned buffer starts: a word to a line, since
/// the system aligns to at least a word.
fn offset_in(base: *mut u8) -> usize {
    LINE - base as usize % LINE
}

/// The line-aligned address within the system block at `base` (null stays null), with `base`
/// recorded in the word before it.
///
/// # Safety
/// `base` is null or a block of `system_layout(size)` for some size.
unsafe fn place(base: *mut u8) -> *mut u8 {
    if base.is_null() {
        return base;
    }
    // SAFETY: the offset is at most a line, the block's extra line; the word before is in it.
    unsafe {
        let placed = base.add(offset_in(base));
        placed.cast::<usize>().sub(1).write_unaligned(base as usize);
        placed
    }
}

/// The system block a placed buffer lies in.
///
/// # Safety
/// `placed` came from [`place`].
unsafe fn base_of(placed: *mut u8) -> *mut u8 {
    // SAFETY: `place` wrote the base in the word before.
    unsafe { placed.cast::<usize>().sub(1).read_unaligned() as *mut u8 }
}

/// A block for `layout` from `system` (the system's `alloc` or `alloc_zeroed`): on a line where
/// [`on_a_line`] says, within a block one line larger.
///
/// # Safety
/// `layout` has a non-zero size.
unsafe fn allocated(layout: Layout, system: unsafe fn(&System, Layout) -> *mut u8) -> *mut u8 {
    // SAFETY: the contract; `place` takes the system's block.
    unsafe {
        match (on_a_line(layout), system_layout(layout.size())) {
            (true, Some(block)) => place(system(&System, block)),
            (true, None) => std::ptr::null_mut(),
            (false, _) => system(&System, layout),
        }
    }
}

// SAFETY: a buffer on a line lies within a system block of its size and a line more, which is
// freed or resized with the layout it was allocated with (a function of the caller's layout,
// which the caller passes back unchanged); other buffers are the system's own.
unsafe impl GlobalAlloc for LineAligned {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract (a non-zero size).
        unsafe { allocated(layout, <System as GlobalAlloc>::alloc) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // The system's zeroed blocks: a large one is fresh pages, not written until used.
        // SAFETY: as `alloc`.
        unsafe { allocated(layout, <System as GlobalAlloc>::alloc_zeroed) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe {
            match on_a_line(layout) {
                true => System.dealloc(base_of(ptr), allocated_layout(layout.size())),
                false => System.dealloc(ptr, layout),
            }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees that new_size, rounded up to layout's alignment, does
        // not overflow isize.
        let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        let kept = layout.size().min(new_size);
        // SAFETY: `ptr` came from `alloc` with `layout`; the system resizes its own block, and
        // a block on a line moves its contents to the new block's line, all within it.
        unsafe {
            match (on_a_line(layout), on_a_line(new)) {
                (false, false) => System.realloc(ptr, layout, new_size),
                (true, true) => {
                    let Some(grown) = system_layout(new_size) else {
                        return std::ptr::null_mut();
                    };
                    let base = base_of(ptr);
                    let offset = ptr as usize - base as usize;
                    let old = allocated_layout(layout.size());
                    let resized = System.realloc(base, old, grown.size());
                    if resized.is_null() {
                        return resized;
                    }
                    // The contents first: the new base's word may lie within them.
                    std::ptr::copy(resized.add(offset), resized.add(offset_in(resized)), kept);
                    place(resized)
                }
                // Onto a line or off it: a new block, and a copy.
                _ => {
                    let moved = self.alloc(new);
                    if !moved.is_null() {
                        std::ptr::copy_nonoverlapping(ptr, moved, kept);
                        self.dealloc(ptr, layout);
                    }
                    moved
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(size: usize) -> Layout {
        Layout::from_size_align(size, 4).unwrap()
    }

    #[test]
    fn large_buffers_start_on_a_line_and_small_ones_keep_the_system_alignment() {
        for size in [ALIGNED_FROM, 4096, 1 << 20, 12 << 20] {
            // SAFETY: non-zero sizes; freed with the same layout.
            unsafe {
                let p = LineAligned.alloc(layout(size));
                assert_eq!(p as usize % LINE, 0, "{size} bytes");
                p.write_bytes(7, size);
                LineAligned.dealloc(p, layout(size));
                let z = LineAligned.alloc_zeroed(layout(size));
                assert_eq!(z as usize % LINE, 0, "{size} bytes zeroed");
                assert!(std::slice::from_raw_parts(z, size).iter().all(|&b| b == 0));
                LineAligned.dealloc(z, layout(size));
            }
        }
        assert!(!on_a_line(layout(ALIGNED_FROM - 1)));
        // A size within a line of isize::MAX fails (null), as the system's would.
        let huge = Layout::from_size_align(isize::MAX as usize - 8, 4).unwrap();
        // SAFETY: a non-zero size.
        assert!(unsafe { LineAligned.alloc(huge) }.is_null());
        assert!(unsafe { LineAligned.alloc_zeroed(huge) }.is_null());
        // A caller's larger alignment is the system's to keep.
        let page = Layout::from_size_align(8192, 4096).unwrap();
        assert!(!on_a_line(page));
        // SAFETY: as above.
        unsafe {
            let p = LineAligned.alloc(page);
            assert_eq!(p as usize % 4096, 0);
            LineAligned.dealloc(p, page);
        }
    }

    /// Reallocates one block through `sizes` (the first is its allocation), filling what each
    /// size adds with a pattern and checking that every resize keeps the pattern and, at
    /// ALIGNED_FROM or more, a line; `between` runs before each resize.
    fn resize_through(sizes: &[usize], mut between: impl FnMut()) {
        let byte = |i: usize| (i * 7 % 253) as u8;
        // SAFETY: the block is reallocated and freed with the layout it last had, and only its
        // own bytes are read and written.
        unsafe {
            let mut size = sizes[0];
            let mut p = LineAligned.alloc(layout(size));
            for i in 0..size {
                *p.add(i) = byte(i);
            }
            for &new_size in &sizes[1..] {
                between();
                let q = LineAligned.realloc(p, layout(size), new_size);
                assert!(!q.is_null());
                if new_size >= ALIGNED_FROM {
                    assert_eq!(q as usize % LINE, 0, "{size} -> {new_size}");
                }
                let kept = size.min(new_size);
                let moved = (0..kept).find(|&i| *q.add(i) != byte(i));
                assert_eq!(moved, None, "{size} -> {new_size}");
                for i in kept..new_size {
                    *q.add(i) = byte(i);
                }
                (p, size) = (q, new_size);
            }
            LineAligned.dealloc(p, layout(size));
        }
    }

    #[test]
    fn realloc_keeps_the_contents_across_the_threshold_both_ways() {
        resize_through(
            &[100, 900, 5000, 3_000_000, 3_000_100, 2000, 1023, 50],
            || {},
        );
    }

    #[test]
    fn realloc_that_moves_the_block_keeps_the_contents() {
        // Blocks in the heap, resized among others, move to bases at other offsets from a line.
        let mut seed = 12345u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            seed
        };
        let sizes: Vec<usize> = (0..300)
            .map(|_| ALIGNED_FROM + (next() >> 8) as usize % 60_000)
            .collect();
        let mut spacers = Vec::new();
        resize_through(&sizes, || {
            spacers.push(vec![0u8; 16 + (next() >> 24) as usize * 8])
        });
    }
}
