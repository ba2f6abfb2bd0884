//! The device API the GPU runtime is written against: device memory, pinned host staging,
//! streams, events, asynchronous copies, kernel launches and the one library call (a strided
//! batched SGEMM). Two implementations: `crate::cuda::CudaDevice` (cudarc) and
//! [`super::sim::SimDevice`] (the same work on the CPU with the same asynchronous semantics).
//!
//! Every handle is a small id the device resolves; a [`DevPtr`] is a buffer plus a byte offset,
//! so a launch may address any sub-range of a buffer. Work issued on a stream runs in issue order,
//! asynchronously to the host; [`DeviceApi::wait`] orders it after another stream's event, and
//! [`DeviceApi::sync_event`] is the only way the host waits for the device.

pub use cotenant_kernels::cuda::{Dims6, Kernel};
use thiserror::Error;

/// A device memory allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufferId(pub u32);

/// A pinned (page-locked) host allocation that asynchronous copies read from and write to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PinnedId(pub u32);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u32);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(pub u32);

/// An address in device memory: `offset` bytes into `buffer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevPtr {
    pub buffer: BufferId,
    pub offset: u64,
}

impl DevPtr {
    pub fn new(buffer: BufferId, offset: u64) -> DevPtr {
        DevPtr { buffer, offset }
    }

    /// The address `bytes` further on.
    pub fn byte_add(self, bytes: u64) -> DevPtr {
        DevPtr {
            offset: self.offset + bytes,
            ..self
        }
    }

    /// The address of element `index` of an array of `elem`-byte elements starting here.
    pub fn at(self, index: usize, elem: usize) -> DevPtr {
        self.byte_add((index * elem) as u64)
    }
}

/// One kernel argument, in the kernel's parameter order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    Ptr(DevPtr),
    /// A NULL pointer (an optional input left out).
    Null,
    I32(i32),
    I64(i64),
    F32(f32),
    Dims(Dims6),
}

impl Arg {
    pub fn opt(p: Option<DevPtr>) -> Arg {
        p.map_or(Arg::Null, Arg::Ptr)
    }
}

/// A kernel launch: which kernel, its grid, and its arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    pub kernel: Kernel,
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block (every kernel of `kernels/cuda` uses static shared memory
    /// only, so today always 0).
    pub shared_mem: u32,
    pub args: Vec<Arg>,
}

impl Launch {
    /// Blocks in the grid.
    pub fn blocks(&self) -> u64 {
        self.grid.0 as u64 * self.grid.1 as u64 * self.grid.2 as u64
    }

    /// Threads per block.
    pub fn threads_per_block(&self) -> u32 {
        self.block.0 * self.block.1 * self.block.2
    }

    /// The device addresses it reads or writes.
    pub fn pointers(&self) -> impl Iterator<Item = DevPtr> + '_ {
        self.args.iter().filter_map(|a| match a {
            Arg::Ptr(p) => Some(*p),
            _ => None,
        })
    }
}

/// `C[i] = alpha · op(A[i]) · op(B[i]) + beta · C[i]` for `i < batch`, column-major as cuBLAS
/// defines it (`cublasSgemmStridedBatched`): op(A) is m × k, op(B) k × n, C m × n; `lda`, `ldb`,
/// `ldc` are leading dimensions in elements and the strides are elements between batch members.
/// Row-major products are written through the usual operand swap (`super::blas`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gemm {
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub alpha: f32,
    pub a: DevPtr,
    pub lda: usize,
    pub stride_a: i64,
    pub b: DevPtr,
    pub ldb: usize,
    pub stride_b: i64,
    pub beta: f32,
    pub c: DevPtr,
    pub ldc: usize,
    pub stride_c: i64,
    pub batch: usize,
}

/// What the compiled code of one kernel needs per thread and block, for launch footprints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelAttributes {
    pub registers_per_thread: usize,
    /// Static shared memory per block, in bytes.
    pub shared_mem_per_block: usize,
}

/// The parallel resources of a device (for footprints and GACER's cost model).
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceProps {
    /// For example "NVIDIA H200", or "simulated".
    pub name: String,
    pub multiprocessors: usize,
    pub total_bytes: u64,
}

#[derive(Clone, Debug, Error, PartialEq)]
pub enum DeviceError {
    /// The device has no room for an allocation.
    #[error("device out of memory allocating {bytes} bytes")]
    OutOfMemory { bytes: u64 },
    /// A handle that does not exist (freed, or from another device).
    #[error("invalid {0}")]
    Invalid(String),
    /// Work on a stream failed; later work on it fails too (as CUDA errors are sticky).
    #[error("{0}")]
    Failed(String),
    /// The driver refused a call.
    #[error("{call}: {detail}")]
    Driver { call: &'static str, detail: String },
}

pub type DeviceResult<T> = Result<T, DeviceError>;

/// One device, as the runtime uses it. Calls that take a stream only enqueue work and return;
/// their failures may surface at a later `sync_event` on that stream.
pub trait DeviceApi: Send + Sync {
    fn props(&self) -> &DeviceProps;

    /// Device memory of `bytes` (at least 1), contents unspecified.
    fn alloc(&self, bytes: u64) -> DeviceResult<BufferId>;
    /// Frees a buffer once every stream's work issued so far has finished with it.
    fn free(&self, buffer: BufferId);
    /// Pinned host memory of `bytes`, zeroed.
    fn alloc_pinned(&self, bytes: u64) -> DeviceResult<PinnedId>;
    fn free_pinned(&self, pinned: PinnedId);
    /// Host writes into pinned memory. The caller must not write where a copy issued earlier has
    /// yet to read (it waits on an event first).
    fn write_pinned(&self, pinned: PinnedId, offset: u64, data: &[u8]) -> DeviceResult<()>;
    /// Host reads from pinned memory, after an event that follows the copy that filled it.
    fn read_pinned(&self, pinned: PinnedId, offset: u64, out: &mut [u8]) -> DeviceResult<()>;
    /// Copies `data` into device memory and waits for it: for weights at load, never per batch.
    fn upload_now(&self, dst: DevPtr, data: &[u8]) -> DeviceResult<()>;

    fn new_stream(&self) -> DeviceResult<StreamId>;
    fn free_stream(&self, stream: StreamId);
    /// An event; `timing` ones can measure elapsed time between two records.
    fn new_event(&self, timing: bool) -> DeviceResult<EventId>;
    fn free_event(&self, event: EventId);

    /// Enqueues a host-to-device copy of `bytes` from pinned memory.
    fn copy_htod(
        &self,
        stream: StreamId,
        src: PinnedId,
        src_offset: u64,
        dst: DevPtr,
        bytes: u64,
    ) -> DeviceResult<()>;
    /// Enqueues a device-to-host copy of `bytes` into pinned memory.
    fn copy_dtoh(
        &self,
        stream: StreamId,
        src: DevPtr,
        dst: PinnedId,
        dst_offset: u64,
        bytes: u64,
    ) -> DeviceResult<()>;
    /// Enqueues a kernel launch.
    fn launch(&self, stream: StreamId, launch: &Launch) -> DeviceResult<()>;
    /// Enqueues a strided batched SGEMM.
    fn gemm(&self, stream: StreamId, gemm: &Gemm) -> DeviceResult<()>;
    /// Enqueues a record of `event`: it completes when all work issued on `stream` before it has.
    fn record(&self, stream: StreamId, event: EventId) -> DeviceResult<()>;
    /// Enqueues a wait: later work on `stream` starts only after the most recent record of
    /// `event` issued before this call has completed (an event never recorded does not hold).
    fn wait(&self, stream: StreamId, event: EventId) -> DeviceResult<()>;
    /// Blocks the host until the most recent record of `event` has completed, or fails with the
    /// error of the stream it was recorded on.
    fn sync_event(&self, event: EventId) -> DeviceResult<()>;
    /// Milliseconds between the completions of two timing events' latest records (negative when
    /// `end` completed first, as on different streams it may).
    fn elapsed_ms(&self, start: EventId, end: EventId) -> DeviceResult<f32>;

    /// What `kernel`'s compiled code needs per thread and block.
    fn kernel_attributes(&self, kernel: Kernel) -> KernelAttributes;
}
