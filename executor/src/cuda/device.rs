//! [`CudaDevice`]: the device API on an NVIDIA GPU through cudarc's driver, NVRTC and cuBLAS
//! bindings, loaded at run time. Raw driver calls throughout: the runtime orders its work itself
//! (streams, events), so cudarc's per-slice event tracking is not used. Every handle the runtime
//! holds is an id resolved here; a [`DevPtr`] is the buffer's base address plus its offset.

use super::module::Loaded;
use super::probe::{self, DeviceInfo, Unavailable};
use crate::gpu::api::*;
use cudarc::cublas::result as blas;
use cudarc::cublas::sys as blas_sys;
use cudarc::driver::result as drv;
use cudarc::driver::sys;
use cudarc::driver::{CudaContext, DriverError};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard};

fn driver(call: &'static str) -> impl Fn(DriverError) -> DeviceError {
    move |e| DeviceError::Driver {
        call,
        detail: e.to_string(),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A stream and the cuBLAS handle bound to it (a handle is not safe to share across threads;
/// the lock serialises the threads that share a stream).
struct Stream {
    raw: usize,
    blas: Arc<Mutex<usize>>,
}

struct Pinned {
    ptr: usize,
    len: u64,
}

struct Handles {
    buffers: HashMap<BufferId, (sys::CUdeviceptr, u64)>,
    pinned: HashMap<PinnedId, Pinned>,
    streams: HashMap<StreamId, Stream>,
    events: HashMap<EventId, usize>,
    next: u32,
}

pub struct CudaDevice {
    info: DeviceInfo,
    props: DeviceProps,
    ctx: Arc<CudaContext>,
    kernels: Loaded,
    tf32: bool,
    handles: Mutex<Handles>,
}

// SAFETY: the raw driver handles kept as integers are only used through driver calls, which are
// thread-safe once the context is bound to the calling thread (every method binds it first).
unsafe impl Send for CudaDevice {}
unsafe impl Sync for CudaDevice {}

impl CudaDevice {
    /// Opens device `ordinal`, compiles (or loads cached) kernels and checks cuBLAS. Never
    /// panics: every failure is an `Unavailable` with the reason.
    pub fn new(ordinal: usize, tf32: bool) -> Result<CudaDevice, Unavailable> {
        let info = probe::probe_device(ordinal)?;
        probe::nvrtc_present()?;
        probe::cublas_present()?;
        probe::guarded("starting CUDA", || {
            let ctx = CudaContext::new(ordinal).map_err(|e| e.to_string())?;
            // The runtime orders its work with its own events.
            // SAFETY: no cudarc slices are used on this context.
            unsafe { ctx.disable_event_tracking() };
            let kernels = Loaded::load(&ctx, &info.arch())?;
            tracing::debug!(
                "cuda: {} kernel sources for {} ({} compiled, {} from the PTX cache)",
                cotenant_kernels::cuda::SOURCES.len(),
                info.arch(),
                kernels.compiled,
                kernels.cached
            );
            let handle = blas::create_handle().map_err(|e| format!("cuBLAS: {e:?}"))?;
            // SAFETY: a handle just created.
            unsafe { blas::destroy_handle(handle) }.map_err(|e| format!("cuBLAS: {e:?}"))?;
            Ok(CudaDevice {
                props: DeviceProps {
                    name: info.name.clone(),
                    multiprocessors: info.multiprocessors,
                    total_bytes: info.total_bytes as u64,
                },
                info: info.clone(),
                ctx,
                kernels,
                tf32,
                handles: Mutex::new(Handles {
                    buffers: HashMap::new(),
                    pinned: HashMap::new(),
                    streams: HashMap::new(),
                    events: HashMap::new(),
                    next: 0,
                }),
            })
        })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn bind(&self) -> DeviceResult<()> {
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))
    }

    fn id(h: &mut Handles) -> u32 {
        h.next += 1;
        h.next
    }

    fn ptr(&self, p: DevPtr) -> DeviceResult<sys::CUdeviceptr> {
        let h = lock(&self.handles);
        let (base, len) = h
            .buffers
            .get(&p.buffer)
            .copied()
            .ok_or_else(|| DeviceError::Invalid(format!("buffer {}", p.buffer.0)))?;
        if p.offset > len {
            return Err(DeviceError::Invalid(format!(
                "offset {} past buffer {} of {len} bytes",
                p.offset, p.buffer.0
            )));
        }
        Ok(base + p.offset)
    }

    /// `bytes` at `p`, checked to lie inside its buffer.
    fn range(&self, p: DevPtr, bytes: u64) -> DeviceResult<sys::CUdeviceptr> {
        let h = lock(&self.handles);
        let (base, len) = h
            .buffers
            .get(&p.buffer)
            .copied()
            .ok_or_else(|| DeviceError::Invalid(format!("buffer {}", p.buffer.0)))?;
        if p.offset.checked_add(bytes).is_none_or(|end| end > len) {
            return Err(DeviceError::Invalid(format!(
                "{bytes} bytes at offset {} run past buffer {} of {len} bytes",
                p.offset, p.buffer.0
            )));
        }
        Ok(base + p.offset)
    }

    fn stream(&self, s: StreamId) -> DeviceResult<(sys::CUstream, Arc<Mutex<usize>>)> {
        lock(&self.handles)
            .streams
            .get(&s)
            .map(|st| (st.raw as sys::CUstream, st.blas.clone()))
            .ok_or_else(|| DeviceError::Invalid(format!("stream {}", s.0)))
    }

    fn event(&self, e: EventId) -> DeviceResult<sys::CUevent> {
        lock(&self.handles)
            .events
            .get(&e)
            .map(|&r| r as sys::CUevent)
            .ok_or_else(|| DeviceError::Invalid(format!("event {}", e.0)))
    }

    /// A host slice of pinned memory, checked.
    fn pinned(&self, p: PinnedId, offset: u64, len: u64) -> DeviceResult<*mut u8> {
        let h = lock(&self.handles);
        let pin = h
            .pinned
            .get(&p)
            .ok_or_else(|| DeviceError::Invalid(format!("pinned buffer {}", p.0)))?;
        if offset.checked_add(len).is_none_or(|end| end > pin.len) {
            return Err(DeviceError::Invalid(
                "past the end of a pinned buffer".into(),
            ));
        }
        Ok((pin.ptr as *mut u8).wrapping_add(offset as usize))
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        if self.bind().is_err() {
            return;
        }
        let _ = self.ctx.synchronize();
        let h = std::mem::replace(
            &mut *lock(&self.handles),
            Handles {
                buffers: HashMap::new(),
                pinned: HashMap::new(),
                streams: HashMap::new(),
                events: HashMap::new(),
                next: 0,
            },
        );
        // SAFETY: every handle was created by this device and the context is idle.
        unsafe {
            for (_, e) in h.events {
                let _ = drv::event::destroy(e as sys::CUevent);
            }
            for (_, s) in h.streams {
                let _ = blas::destroy_handle(*lock(&s.blas) as blas_sys::cublasHandle_t);
                let _ = drv::stream::destroy(s.raw as sys::CUstream);
            }
            for (_, (p, _)) in h.buffers {
                let _ = drv::free_sync(p);
            }
            for (_, p) in h.pinned {
                let _ = drv::free_host(p.ptr as *mut c_void);
            }
        }
    }
}

/// One kernel argument's bytes, kept alive while the launch reads them.
enum ArgValue {
    Ptr(u64),
    I32(i32),
    I64(i64),
    F32(f32),
    Dims([i64; 6]),
}

impl ArgValue {
    fn as_param(&mut self) -> *mut c_void {
        match self {
            ArgValue::Ptr(v) => v as *mut u64 as *mut c_void,
            ArgValue::I32(v) => v as *mut i32 as *mut c_void,
            ArgValue::I64(v) => v as *mut i64 as *mut c_void,
            ArgValue::F32(v) => v as *mut f32 as *mut c_void,
            ArgValue::Dims(v) => v.as_mut_ptr() as *mut c_void,
        }
    }
}

impl DeviceApi for CudaDevice {
    fn props(&self) -> &DeviceProps {
        &self.props
    }

    fn alloc(&self, bytes: u64) -> DeviceResult<BufferId> {
        self.bind()?;
        // SAFETY: a plain allocation; the contents are unspecified, as the API says.
        let p = unsafe { drv::malloc_sync(bytes.max(1) as usize) }.map_err(|e| {
            if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                DeviceError::OutOfMemory { bytes }
            } else {
                driver("cuMemAlloc")(e)
            }
        })?;
        let mut h = lock(&self.handles);
        let id = BufferId(Self::id(&mut h));
        h.buffers.insert(id, (p, bytes));
        Ok(id)
    }

    fn free(&self, buffer: BufferId) {
        let entry = lock(&self.handles).buffers.remove(&buffer);
        if let Some((p, _)) = entry
            && self.bind().is_ok()
        {
            // Work issued earlier may still use it.
            let _ = self.ctx.synchronize();
            // SAFETY: allocated by this device, no longer referenced by any handle.
            let _ = unsafe { drv::free_sync(p) };
        }
    }

    fn alloc_pinned(&self, bytes: u64) -> DeviceResult<PinnedId> {
        self.bind()?;
        // SAFETY: page-locked host memory of `bytes`, zeroed below before any use.
        let p = unsafe { drv::malloc_host(bytes.max(1) as usize, 0) }
            .map_err(driver("cuMemHostAlloc"))?;
        // SAFETY: `p` points to at least `bytes` writable bytes.
        unsafe { std::ptr::write_bytes(p as *mut u8, 0, bytes.max(1) as usize) };
        let mut h = lock(&self.handles);
        let id = PinnedId(Self::id(&mut h));
        h.pinned.insert(
            id,
            Pinned {
                ptr: p as usize,
                len: bytes,
            },
        );
        Ok(id)
    }

    fn free_pinned(&self, pinned: PinnedId) {
        let entry = lock(&self.handles).pinned.remove(&pinned);
        if let Some(p) = entry
            && self.bind().is_ok()
        {
            let _ = self.ctx.synchronize();
            // SAFETY: allocated by this device with cuMemHostAlloc.
            let _ = unsafe { drv::free_host(p.ptr as *mut c_void) };
        }
    }

    fn write_pinned(&self, pinned: PinnedId, offset: u64, data: &[u8]) -> DeviceResult<()> {
        let dst = self.pinned(pinned, offset, data.len() as u64)?;
        // SAFETY: the range was checked to lie inside the pinned buffer.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
        Ok(())
    }

    fn read_pinned(&self, pinned: PinnedId, offset: u64, out: &mut [u8]) -> DeviceResult<()> {
        let src = self.pinned(pinned, offset, out.len() as u64)?;
        // SAFETY: the range was checked to lie inside the pinned buffer.
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    fn upload_now(&self, dst: DevPtr, data: &[u8]) -> DeviceResult<()> {
        self.bind()?;
        let d = self.range(dst, data.len() as u64)?;
        // SAFETY: the destination range lies inside its buffer; the copy is synchronous.
        unsafe { drv::memcpy_htod_sync(d, data) }.map_err(driver("cuMemcpyHtoD"))
    }

    fn new_stream(&self) -> DeviceResult<StreamId> {
        self.bind()?;
        let s = drv::stream::create(drv::stream::StreamKind::NonBlocking)
            .map_err(driver("cuStreamCreate"))?;
        let handle = blas::create_handle().map_err(|e| DeviceError::Driver {
            call: "cublasCreate",
            detail: format!("{e:?}"),
        })?;
        // SAFETY: a fresh handle and stream of this context.
        unsafe {
            blas::set_stream(handle, s as blas_sys::cudaStream_t).map_err(|e| {
                DeviceError::Driver {
                    call: "cublasSetStream",
                    detail: format!("{e:?}"),
                }
            })?;
            let mode = if self.tf32 {
                blas_sys::cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH
            } else {
                blas_sys::cublasMath_t::CUBLAS_DEFAULT_MATH
            };
            let rc = blas_sys::cublasSetMathMode(handle, mode);
            if rc != blas_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                return Err(DeviceError::Driver {
                    call: "cublasSetMathMode",
                    detail: format!("{rc:?}"),
                });
            }
        }
        let mut h = lock(&self.handles);
        let id = StreamId(Self::id(&mut h));
        h.streams.insert(
            id,
            Stream {
                raw: s as usize,
                blas: Arc::new(Mutex::new(handle as usize)),
            },
        );
        Ok(id)
    }

    fn free_stream(&self, stream: StreamId) {
        let entry = lock(&self.handles).streams.remove(&stream);
        if let Some(s) = entry
            && self.bind().is_ok()
        {
            // SAFETY: created by this device; the driver finishes its work before destroying it.
            unsafe {
                let _ = drv::stream::synchronize(s.raw as sys::CUstream);
                let _ = blas::destroy_handle(*lock(&s.blas) as blas_sys::cublasHandle_t);
                let _ = drv::stream::destroy(s.raw as sys::CUstream);
            }
        }
    }

    fn new_event(&self, timing: bool) -> DeviceResult<EventId> {
        self.bind()?;
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        let e = drv::event::create(flags).map_err(driver("cuEventCreate"))?;
        let mut h = lock(&self.handles);
        let id = EventId(Self::id(&mut h));
        h.events.insert(id, e as usize);
        Ok(id)
    }

    fn free_event(&self, event: EventId) {
        let entry = lock(&self.handles).events.remove(&event);
        if let Some(e) = entry
            && self.bind().is_ok()
        {
            // SAFETY: created by this device.
            let _ = unsafe { drv::event::destroy(e as sys::CUevent) };
        }
    }

    fn copy_htod(
        &self,
        stream: StreamId,
        src: PinnedId,
        src_offset: u64,
        dst: DevPtr,
        bytes: u64,
    ) -> DeviceResult<()> {
        self.bind()?;
        let (s, _) = self.stream(stream)?;
        let from = self.pinned(src, src_offset, bytes)?;
        let to = self.range(dst, bytes)?;
        // SAFETY: both ranges checked; the pinned buffer outlives the copy (the runtime frees it
        // only after its last batch's host wait).
        unsafe {
            let host = std::slice::from_raw_parts(from as *const u8, bytes as usize);
            drv::memcpy_htod_async(to, host, s)
        }
        .map_err(driver("cuMemcpyHtoDAsync"))
    }

    fn copy_dtoh(
        &self,
        stream: StreamId,
        src: DevPtr,
        dst: PinnedId,
        dst_offset: u64,
        bytes: u64,
    ) -> DeviceResult<()> {
        self.bind()?;
        let (s, _) = self.stream(stream)?;
        let from = self.range(src, bytes)?;
        let to = self.pinned(dst, dst_offset, bytes)?;
        // SAFETY: as for copy_htod.
        unsafe {
            let host = std::slice::from_raw_parts_mut(to, bytes as usize);
            drv::memcpy_dtoh_async(host, from, s)
        }
        .map_err(driver("cuMemcpyDtoHAsync"))
    }

    fn launch(&self, stream: StreamId, launch: &Launch) -> DeviceResult<()> {
        self.bind()?;
        let (s, _) = self.stream(stream)?;
        let f = self
            .kernels
            .get(launch.kernel)
            .map_err(DeviceError::Invalid)?
            .cu_function();
        let mut values: Vec<ArgValue> = launch
            .args
            .iter()
            .map(|a| {
                Ok(match a {
                    Arg::Ptr(p) => ArgValue::Ptr(self.ptr(*p)?),
                    Arg::Null => ArgValue::Ptr(0),
                    Arg::I32(v) => ArgValue::I32(*v),
                    Arg::I64(v) => ArgValue::I64(*v),
                    Arg::F32(v) => ArgValue::F32(*v),
                    Arg::Dims(d) => ArgValue::Dims(d.0),
                })
            })
            .collect::<DeviceResult<_>>()?;
        let mut params: Vec<*mut c_void> = values.iter_mut().map(ArgValue::as_param).collect();
        // SAFETY: the arguments follow the kernel's header comment (checked on the simulated
        // device, which reads them exactly as the kernel does); the driver copies the parameter
        // values during the call.
        unsafe {
            drv::launch_kernel(
                f,
                launch.grid,
                launch.block,
                launch.shared_mem,
                s,
                &mut params,
            )
        }
        .map_err(|e| DeviceError::Driver {
            call: launch.kernel.name(),
            detail: e.to_string(),
        })
    }

    fn gemm(&self, stream: StreamId, g: &Gemm) -> DeviceResult<()> {
        self.bind()?;
        let (_, handle) = self.stream(stream)?;
        let (a, b, c) = (self.ptr(g.a)?, self.ptr(g.b)?, self.ptr(g.c)?);
        let op = |t: bool| {
            if t {
                blas_sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                blas_sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let int = |v: usize, what: &str| {
            i32::try_from(v)
                .map_err(|_| DeviceError::Invalid(format!("SGEMM {what} {v} exceeds int")))
        };
        let (m, n, k) = (int(g.m, "m")?, int(g.n, "n")?, int(g.k, "k")?);
        let (lda, ldb, ldc) = (int(g.lda, "lda")?, int(g.ldb, "ldb")?, int(g.ldc, "ldc")?);
        let batch = int(g.batch, "batch")?;
        let h = lock(&handle);
        // SAFETY: the handle is bound to this stream; the operands lie in device buffers the
        // lowering sized for this product.
        let rc = unsafe {
            blas::sgemm_strided_batched(
                *h as blas_sys::cublasHandle_t,
                op(g.trans_a),
                op(g.trans_b),
                m,
                n,
                k,
                &g.alpha,
                a as *const f32,
                lda,
                g.stride_a,
                b as *const f32,
                ldb,
                g.stride_b,
                &g.beta,
                c as *mut f32,
                ldc,
                g.stride_c,
                batch,
            )
        };
        rc.map_err(|e| DeviceError::Driver {
            call: "cublasSgemmStridedBatched",
            detail: format!("{e:?}"),
        })
    }

    fn record(&self, stream: StreamId, event: EventId) -> DeviceResult<()> {
        self.bind()?;
        let (s, _) = self.stream(stream)?;
        let e = self.event(event)?;
        // SAFETY: both handles belong to this context.
        unsafe { drv::event::record(e, s) }.map_err(driver("cuEventRecord"))
    }

    fn wait(&self, stream: StreamId, event: EventId) -> DeviceResult<()> {
        self.bind()?;
        let (s, _) = self.stream(stream)?;
        let e = self.event(event)?;
        // SAFETY: both handles belong to this context.
        unsafe { drv::stream::wait_event(s, e, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT) }
            .map_err(driver("cuStreamWaitEvent"))
    }

    fn sync_event(&self, event: EventId) -> DeviceResult<()> {
        self.bind()?;
        let e = self.event(event)?;
        // SAFETY: an event of this context.
        unsafe { drv::event::synchronize(e) }.map_err(|e| DeviceError::Failed(e.to_string()))
    }

    fn elapsed_ms(&self, start: EventId, end: EventId) -> DeviceResult<f32> {
        self.bind()?;
        let (a, b) = (self.event(start)?, self.event(end)?);
        // SAFETY: events of this context, both recorded and complete (the caller synced).
        unsafe { drv::event::elapsed(a, b) }.map_err(driver("cuEventElapsedTime"))
    }

    fn kernel_attributes(&self, kernel: Kernel) -> KernelAttributes {
        let attr = |a| -> Option<usize> {
            let f = self.kernels.get(kernel).ok()?.cu_function();
            self.bind().ok()?;
            // SAFETY: a loaded function of this context.
            let v = unsafe { drv::function::get_function_attribute(f, a) }.ok()?;
            usize::try_from(v).ok()
        };
        KernelAttributes {
            registers_per_thread: attr(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS)
                .unwrap_or(32),
            shared_mem_per_block: attr(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
            )
            .unwrap_or(0),
        }
    }
}
