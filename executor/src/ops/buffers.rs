//! Recycled activation buffers: buffers of activations that died earlier (f32, and uint8 for
//! quantized models), handed out again for new outputs so steady-state runs neither fault in
//! fresh pages nor zero memory.
//!
//! Only buffers that get reused are worth their memory. A buffer that lay in the pool through a
//! whole run without being taken is freed when the next run ends ([`BufferPool::end_run`]); a
//! pool no op took from in the last run keeps nothing; and the pool never holds more than
//! [`MAX_BUFFERS`], beyond which the smallest goes (the large ones are the expensive ones to get
//! back).

/// Most buffers the pool keeps.
pub const MAX_BUFFERS: usize = 24;

/// The largest capacity handed out for `n` elements: a quarter more. A buffer given to a much
/// smaller output comes back that short, and a later output of its full size would have to
/// zero the rest first: in resnet50 at batch 1, with a bound of four times, 3.2 MB outputs
/// zeroed 2.4 MB of their buffers four or five times a run, and the 1x1 64 → 256 layers at
/// 56x56 took 0.99–1.24 ms a call against 0.82–0.94 with this bound. Outputs of every size a
/// model has then keep buffers of their own, hence the count above.
fn near(n: usize) -> usize {
    let n = n.max(1024);
    n + n / 4
}

pub struct BufferPool<T> {
    entries: Vec<Entry<T>>,
    /// Whether an op asked for a buffer in this run, and in the last one.
    taken: bool,
    taken_before: bool,
}

impl<T> Default for BufferPool<T> {
    fn default() -> Self {
        BufferPool {
            entries: Vec::new(),
            taken: false,
            taken_before: false,
        }
    }
}

struct Entry<T> {
    buf: Vec<T>,
    /// Whether a run ended while the buffer lay here.
    idle: bool,
}

impl<T: Copy + Default> BufferPool<T> {
    /// A buffer of length `n` with unspecified (but initialised) contents: a pooled one when one
    /// is big enough and at most [`near`] `n` in capacity, else a fresh zeroed one.
    pub fn take(&mut self, n: usize) -> Vec<T> {
        self.taken = true;
        // Of the buffers that fit, the one with the least to fill in (elements past its
        // initialised length), then the smallest.
        let best = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.buf.capacity() >= n && e.buf.capacity() <= near(n))
            .min_by_key(|(_, e)| (n.saturating_sub(e.buf.len()), e.buf.capacity()))
            .map(|(i, _)| i);
        match best {
            Some(i) => {
                let mut v = self.entries.swap_remove(i).buf;
                v.resize(n, T::default());
                v
            }
            None => vec![T::default(); n],
        }
    }

    /// Takes back a buffer nothing reads any more.
    pub fn put(&mut self, buf: Vec<T>) {
        if !(self.taken || self.taken_before) {
            return;
        }
        self.entries.push(Entry { buf, idle: false });
        if self.entries.len() > MAX_BUFFERS {
            let smallest = (0..self.entries.len()).min_by_key(|&i| self.entries[i].buf.capacity());
            if let Some(i) = smallest {
                self.entries.swap_remove(i);
            }
        }
    }

    /// Marks the end of a run: frees the buffers that lay here through the whole of it.
    pub fn end_run(&mut self) {
        self.taken_before = std::mem::take(&mut self.taken);
        self.entries.retain(|e| !e.idle);
        for e in &mut self.entries {
            e.idle = true;
        }
    }

    /// Bytes the pool holds.
    pub fn bytes(&self) -> usize {
        self.entries
            .iter()
            .map(|e| e.buf.capacity() * std::mem::size_of::<T>())
            .sum()
    }
}

/// The pools of every element type that is recycled.
#[derive(Default)]
pub struct Pools {
    pub f32: BufferPool<f32>,
    pub u8: BufferPool<u8>,
}

impl Pools {
    /// Takes back an activation's buffer, when it is of a recycled type.
    pub fn put(&mut self, data: crate::tensor::Data) {
        match data {
            crate::tensor::Data::F32(v) => self.f32.put(v),
            crate::tensor::Data::U8(v) => self.u8.put(v),
            _ => {}
        }
    }

    /// As [`BufferPool::end_run`], for every pool.
    pub fn end_run(&mut self) {
        self.f32.end_run();
        self.u8.end_run();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_nothing_takes_from_keeps_nothing() {
        let mut pool = BufferPool::<u8>::default();
        for _ in 0..3 {
            pool.put(vec![0; 1 << 16]);
            assert_eq!(pool.bytes(), 0);
            pool.end_run();
        }
        let _ = pool.take(10);
        pool.put(vec![0; 1 << 16]);
        assert_eq!(pool.bytes(), 1 << 16, "kept once an op takes buffers");
    }

    #[test]
    fn a_buffer_no_run_takes_is_freed_after_the_next_run() {
        let mut pool = BufferPool::<f32>::default();
        let _ = pool.take(1);
        pool.put(vec![0.0; 1 << 16]);
        pool.end_run();
        assert_eq!(
            pool.bytes(),
            4 << 16,
            "kept through the run it was freed in"
        );
        pool.end_run();
        assert_eq!(pool.bytes(), 0, "a whole run went by without taking it");
    }

    #[test]
    fn a_buffer_taken_and_returned_each_run_stays() {
        let mut pool = BufferPool::<f32>::default();
        let _ = pool.take(1);
        pool.put(vec![1.0; 4096]);
        for _ in 0..5 {
            pool.end_run();
            let v = pool.take(4000);
            assert_eq!(v.len(), 4000);
            assert_eq!(v.capacity(), 4096, "the pooled buffer, not a fresh one");
            pool.put(v);
        }
        assert_eq!(pool.bytes(), 4 * 4096);
    }

    #[test]
    fn only_buffers_that_fit_without_waste_are_handed_out() {
        let mut pool = BufferPool::<f32>::default();
        let _ = pool.take(1);
        pool.put(vec![0.0; 100_000]);
        assert_eq!(
            pool.take(1000).capacity(),
            1000,
            "100x too large: a fresh one"
        );
        assert_eq!(
            pool.take(50_000).capacity(),
            50_000,
            "twice as large: a fresh one"
        );
        assert_eq!(
            pool.take(200_000).capacity(),
            200_000,
            "too small: a fresh one"
        );
        assert_eq!(pool.take(85_000).capacity(), 100_000);
        assert_eq!(pool.bytes(), 0);
    }

    #[test]
    fn the_pool_keeps_the_largest_buffers_up_to_its_count() {
        let mut pool = BufferPool::<f32>::default();
        let _ = pool.take(1);
        for i in 0..MAX_BUFFERS + 3 {
            pool.put(vec![0.0; 1000 * (i + 1)]);
        }
        assert_eq!(pool.entries.len(), MAX_BUFFERS);
        let smallest = pool.entries.iter().map(|e| e.buf.capacity()).min();
        assert_eq!(smallest, Some(4000));
    }
}
