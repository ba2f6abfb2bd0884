//! The bytes of a model file while it is imported, in memory the import can hand back part by
//! part: once an initializer is decoded into its tensor, the pages that held its raw data are
//! returned to the system. A model's weights are most of its file, so a model no longer needs
//! twice their size to load (BERT-base: 414 MiB of weights, 830 MiB at peak when the whole file
//! stayed until the end).
//!
//! The file is copied into a private anonymous mapping, not mapped itself: a file truncated or
//! rewritten while it is read cannot fault the process. A released page reads as zeros
//! afterwards; the import never reads an initializer's raw data again once it is decoded.

use prost::bytes::Bytes;
use std::io::Read;
use std::sync::Arc;

/// A model file's bytes in their own mapping (where the platform has one).
pub(crate) struct ModelBuffer {
    map: Mapping,
}

impl ModelBuffer {
    /// Reads the whole file.
    pub fn read(mut file: std::fs::File) -> std::io::Result<Arc<ModelBuffer>> {
        let len = usize::try_from(file.metadata()?.len())
            .map_err(|_| std::io::Error::other("the model file is larger than memory"))?;
        let mut map = Mapping::new(len)?;
        file.read_exact(map.as_mut())?;
        // A file that grew since its size was read: refuse rather than import a prefix.
        if file.read(&mut [0u8])? != 0 {
            return Err(std::io::Error::other(
                "the model file changed while it was read",
            ));
        }
        Ok(Arc::new(ModelBuffer { map }))
    }

    /// The bytes as a `Bytes`, so that decoded raw data fields point into this buffer.
    pub fn bytes(self: &Arc<ModelBuffer>) -> Bytes {
        Bytes::from_owner(Shared(self.clone()))
    }

    /// Returns the whole pages within `part` to the system, if `part` lies in this buffer;
    /// they read as zeros afterwards.
    pub fn release(&self, part: &[u8]) {
        let all = self.map.as_ref().as_ptr_range();
        let range = part.as_ptr_range();
        if part.is_empty() || range.start < all.start || range.end > all.end {
            return;
        }
        self.map.release(range.start as usize, range.end as usize);
    }
}

struct Shared(Arc<ModelBuffer>);

impl AsRef<[u8]> for Shared {
    fn as_ref(&self) -> &[u8] {
        self.0.map.as_ref()
    }
}

#[cfg(unix)]
use unix::Mapping;

#[cfg(not(unix))]
use portable::Mapping;

#[cfg(unix)]
mod unix {
    /// A private anonymous mapping of `len` bytes (none for an empty file).
    pub struct Mapping {
        ptr: *mut u8,
        len: usize,
    }

    // SAFETY: the mapping is owned memory like a `Vec<u8>`; after construction it is only read,
    // and `release` only drops whole pages (which then read as zeros), never writes.
    unsafe impl Send for Mapping {}
    // SAFETY: as above.
    unsafe impl Sync for Mapping {}

    impl Mapping {
        pub fn new(len: usize) -> std::io::Result<Mapping> {
            if len == 0 {
                return Ok(Mapping {
                    ptr: std::ptr::NonNull::dangling().as_ptr(),
                    len,
                });
            }
            // SAFETY: a fresh anonymous mapping; no existing memory is touched.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if ptr == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error());
            }
            Ok(Mapping {
                ptr: ptr.cast(),
                len,
            })
        }

        pub fn as_mut(&mut self) -> &mut [u8] {
            // SAFETY: `len` bytes mapped readable and writable, owned by `self`.
            unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
        }

        /// Drops the whole pages in `[start, end)` (addresses within this mapping).
        pub fn release(&self, start: usize, end: usize) {
            let page = page_size();
            let (lo, hi) = (start.next_multiple_of(page), end / page * page);
            if hi <= lo {
                return;
            }
            // SAFETY: `[lo, hi)` is whole pages inside this private anonymous mapping (the
            // caller checked `[start, end)` lies in it); MADV_DONTNEED makes them read as zeros
            // and never invalidates the mapping. A failure only keeps the pages.
            unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_DONTNEED) };
        }
    }

    impl AsRef<[u8]> for Mapping {
        fn as_ref(&self) -> &[u8] {
            // SAFETY: as in `as_mut`.
            unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
        }
    }

    impl Drop for Mapping {
        fn drop(&mut self) {
            if self.len > 0 {
                // SAFETY: the mapping made in `new`, unmapped once; nothing borrows it now.
                unsafe { libc::munmap(self.ptr.cast(), self.len) };
            }
        }
    }

    fn page_size() -> usize {
        // SAFETY: sysconf has no preconditions.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
    }
}

#[cfg(not(unix))]
mod portable {
    /// Heap memory where there is no anonymous mapping: nothing is released early.
    pub struct Mapping(Vec<u8>);

    impl Mapping {
        pub fn new(len: usize) -> std::io::Result<Mapping> {
            Ok(Mapping(vec![0; len]))
        }
        pub fn as_mut(&mut self) -> &mut [u8] {
            &mut self.0
        }
        pub fn release(&self, _: usize, _: usize) {}
    }

    impl AsRef<[u8]> for Mapping {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_with(bytes: &[u8]) -> std::fs::File {
        let path = std::env::temp_dir().join(format!(
            "cotenant-buffer-{}-{}",
            std::process::id(),
            bytes.len()
        ));
        std::fs::File::create(&path)
            .and_then(|mut f| f.write_all(bytes))
            .expect("writes the test file");
        let f = std::fs::File::open(&path).expect("opens the test file");
        std::fs::remove_file(&path).expect("removes the test file");
        f
    }

    #[cfg(unix)]
    #[test]
    fn holds_the_file_and_releases_only_whole_pages_of_what_it_is_given() {
        let data: Vec<u8> = (0..5 * 4096 + 123).map(|i| (i % 251) as u8 + 1).collect();
        let buf = ModelBuffer::read(file_with(&data)).expect("reads");
        let bytes = buf.bytes();
        assert_eq!(&bytes[..], &data[..]);
        // From the middle of page 0 to the middle of page 3: pages 1 and 2 go, the rest stays.
        buf.release(&bytes[2000..3 * 4096 + 10]);
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let (lo, hi) = (
            2000usize.next_multiple_of(page),
            (3 * 4096 + 10) / page * page,
        );
        for (i, (&got, &was)) in bytes.iter().zip(&data).enumerate() {
            let released = (lo..hi).contains(&i);
            assert_eq!(got, if released { 0 } else { was }, "byte {i}");
        }
        // Memory of another buffer is never touched.
        let other = data.clone();
        buf.release(&other);
        assert_eq!(other, data);
    }

    #[test]
    fn an_empty_file_is_an_empty_buffer() {
        let buf = ModelBuffer::read(file_with(&[])).expect("reads");
        assert!(buf.bytes().is_empty());
        buf.release(&[]);
    }
}
