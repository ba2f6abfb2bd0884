//! The simulated device's memory: buffers of 8-byte-aligned words, addressed by [`DevPtr`]s, with
//! every access bounds- and alignment-checked (a launcher that sizes a view wrongly fails here
//! with the kernel's name instead of corrupting a neighbour, as it could on a real device). Fresh
//! buffers are filled with 0xFF bytes — NaN as f32 — so reading memory nothing wrote shows up in
//! the results.

use crate::gpu::api::{BufferId, DevPtr};

pub type R<T> = Result<T, String>;

/// A plain-old-data element type that a buffer can be viewed as.
pub trait Elem: Copy + 'static {
    const NAME: &'static str;
}
impl Elem for f32 {
    const NAME: &'static str = "f32";
}
impl Elem for i64 {
    const NAME: &'static str = "i64";
}
impl Elem for i32 {
    const NAME: &'static str = "i32";
}
impl Elem for u8 {
    const NAME: &'static str = "u8";
}

#[derive(Default)]
pub struct Memory {
    /// Each buffer's words and its length in bytes.
    buffers: Vec<Option<(Box<[u64]>, u64)>>,
    pub live_bytes: u64,
}

impl Memory {
    pub fn alloc(&mut self, bytes: u64) -> R<BufferId> {
        let words = usize::try_from(bytes.max(1).div_ceil(8))
            .map_err(|_| format!("{bytes} bytes do not fit this host"))?;
        let mut v = Vec::new();
        v.try_reserve_exact(words)
            .map_err(|_| format!("out of memory allocating {bytes} bytes"))?;
        v.resize(words, u64::MAX);
        // Ids are never reused, so a pointer into a freed buffer fails instead of reaching a new one.
        let id = self.buffers.len();
        self.buffers.push(Some((v.into_boxed_slice(), bytes)));
        self.live_bytes += bytes;
        Ok(BufferId(id as u32))
    }

    pub fn free(&mut self, b: BufferId) {
        if let Some(slot) = self.buffers.get_mut(b.0 as usize)
            && let Some((_, bytes)) = slot.take()
        {
            self.live_bytes -= bytes;
        }
    }

    /// The byte range `[offset, offset + bytes)` of `p`'s buffer as (words, first byte), checked.
    fn span(&self, p: DevPtr, bytes: u64, align: u64) -> R<(&[u64], usize)> {
        let (words, len) = self
            .buffers
            .get(p.buffer.0 as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| format!("buffer {} does not exist", p.buffer.0))?;
        let end = p.offset.checked_add(bytes).ok_or("address overflow")?;
        if end > *len {
            return Err(format!(
                "{bytes} bytes at offset {} of buffer {} run past its end ({len} bytes)",
                p.offset, p.buffer.0
            ));
        }
        if !p.offset.is_multiple_of(align) {
            return Err(format!(
                "offset {} of buffer {} is not aligned to {align} bytes",
                p.offset, p.buffer.0
            ));
        }
        Ok((words, p.offset as usize))
    }

    /// `n` elements of type `T` at `p`.
    pub fn slice<T: Elem>(&self, p: DevPtr, n: usize) -> R<&[T]> {
        let size = std::mem::size_of::<T>();
        let bytes = (n as u64).checked_mul(size as u64).ok_or("size overflow")?;
        let (words, start) = self
            .span(p, bytes, size as u64)
            .map_err(|e| format!("reading {n} {}: {e}", T::NAME))?;
        // SAFETY: the span lies inside the buffer's words (checked above), `start` is a multiple of
        // T's size and the words are 8-byte aligned, so every T is aligned; T is plain old data
        // (f32, i64, i32, u8), valid for any bit pattern.
        Ok(unsafe {
            std::slice::from_raw_parts((words.as_ptr() as *const u8).add(start) as *const T, n)
        })
    }

    /// `n` elements of type `T` at `p`, writable.
    pub fn slice_mut<T: Elem>(&mut self, p: DevPtr, n: usize) -> R<&mut [T]> {
        let size = std::mem::size_of::<T>();
        let bytes = (n as u64).checked_mul(size as u64).ok_or("size overflow")?;
        let (_, start) = self
            .span(p, bytes, size as u64)
            .map_err(|e| format!("writing {n} {}: {e}", T::NAME))?;
        let words = match self.buffers.get_mut(p.buffer.0 as usize) {
            Some(Some((w, _))) => w,
            _ => return Err(format!("buffer {} does not exist", p.buffer.0)),
        };
        // SAFETY: as in `slice`, and the `&mut self` borrow makes the view exclusive.
        Ok(unsafe {
            std::slice::from_raw_parts_mut((words.as_mut_ptr() as *mut u8).add(start) as *mut T, n)
        })
    }

    /// A copy of `n` elements at `p` (for inputs that may alias the output).
    pub fn read<T: Elem>(&self, p: DevPtr, n: usize) -> R<Vec<T>> {
        Ok(self.slice::<T>(p, n)?.to_vec())
    }

    pub fn write<T: Elem>(&mut self, p: DevPtr, data: &[T]) -> R<()> {
        self.slice_mut::<T>(p, data.len())?.copy_from_slice(data);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accesses_are_checked_and_fresh_memory_reads_nan() {
        let mut m = Memory::default();
        let b = m.alloc(16).unwrap();
        let p = DevPtr::new(b, 0);
        assert!(m.slice::<f32>(p, 4).unwrap().iter().all(|x| x.is_nan()));
        m.write(p.byte_add(4), &[1.0f32, 2.0]).unwrap();
        assert_eq!(m.slice::<f32>(p.byte_add(4), 2).unwrap(), &[1.0, 2.0]);
        let e = m.slice::<f32>(p.byte_add(8), 3).unwrap_err();
        assert!(e.contains("past its end"), "{e}");
        let e = m.slice::<i64>(p.byte_add(4), 1).unwrap_err();
        assert!(e.contains("aligned"), "{e}");
        m.free(b);
        assert!(m.slice::<f32>(p, 1).is_err());
        assert_eq!(m.live_bytes, 0);
    }
}
