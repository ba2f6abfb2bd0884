//! A [`DeviceApi`] that records every call it passes on: which copies, launches, SGEMMs, event
//! records and waits, and host waits a run made, and the addresses they touched. Tests check the
//! runtime's structure with it on the simulated device; the device check counts transfers and
//! host waits per batch with it on a real GPU.

use super::api::*;
use std::sync::{Arc, Mutex};

/// One call, as recorded.
#[derive(Clone, Debug, PartialEq)]
pub enum Call {
    CopyHtoD {
        stream: StreamId,
        dst: DevPtr,
        bytes: u64,
    },
    CopyDtoH {
        stream: StreamId,
        src: DevPtr,
        bytes: u64,
    },
    Launch {
        stream: StreamId,
        launch: Launch,
    },
    Gemm {
        stream: StreamId,
        gemm: Gemm,
    },
    Record {
        stream: StreamId,
        event: EventId,
    },
    Wait {
        stream: StreamId,
        event: EventId,
    },
    /// The host waited.
    Sync {
        event: EventId,
    },
    /// A blocking upload (weights, parameters), outside any batch's stream work.
    Upload {
        dst: DevPtr,
        bytes: u64,
    },
    Alloc {
        buffer: BufferId,
        bytes: u64,
    },
}

impl Call {
    /// The stream it was issued on, for stream work.
    pub fn stream(&self) -> Option<StreamId> {
        match self {
            Call::CopyHtoD { stream, .. }
            | Call::CopyDtoH { stream, .. }
            | Call::Launch { stream, .. }
            | Call::Gemm { stream, .. }
            | Call::Record { stream, .. }
            | Call::Wait { stream, .. } => Some(*stream),
            _ => None,
        }
    }
}

pub struct Recorder {
    inner: Arc<dyn DeviceApi>,
    calls: Mutex<Vec<Call>>,
}

impl Recorder {
    pub fn new(inner: Arc<dyn DeviceApi>) -> Recorder {
        Recorder {
            inner,
            calls: Mutex::new(Vec::new()),
        }
    }

    /// The calls recorded since the last `take`.
    pub fn take(&self) -> Vec<Call> {
        std::mem::take(&mut *self.calls.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn log(&self, c: Call) {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).push(c);
    }
}

impl DeviceApi for Recorder {
    fn props(&self) -> &DeviceProps {
        self.inner.props()
    }
    fn alloc(&self, bytes: u64) -> DeviceResult<BufferId> {
        let buffer = self.inner.alloc(bytes)?;
        self.log(Call::Alloc { buffer, bytes });
        Ok(buffer)
    }
    fn free(&self, buffer: BufferId) {
        self.inner.free(buffer)
    }
    fn alloc_pinned(&self, bytes: u64) -> DeviceResult<PinnedId> {
        self.inner.alloc_pinned(bytes)
    }
    fn free_pinned(&self, pinned: PinnedId) {
        self.inner.free_pinned(pinned)
    }
    fn write_pinned(&self, pinned: PinnedId, offset: u64, data: &[u8]) -> DeviceResult<()> {
        self.inner.write_pinned(pinned, offset, data)
    }
    fn read_pinned(&self, pinned: PinnedId, offset: u64, out: &mut [u8]) -> DeviceResult<()> {
        self.inner.read_pinned(pinned, offset, out)
    }
    fn upload_now(&self, dst: DevPtr, data: &[u8]) -> DeviceResult<()> {
        self.log(Call::Upload {
            dst,
            bytes: data.len() as u64,
        });
        self.inner.upload_now(dst, data)
    }
    fn new_stream(&self) -> DeviceResult<StreamId> {
        self.inner.new_stream()
    }
    fn free_stream(&self, stream: StreamId) {
        self.inner.free_stream(stream)
    }
    fn new_event(&self, timing: bool) -> DeviceResult<EventId> {
        self.inner.new_event(timing)
    }
    fn free_event(&self, event: EventId) {
        self.inner.free_event(event)
    }
    fn copy_htod(
        &self,
        stream: StreamId,
        src: PinnedId,
        src_offset: u64,
        dst: DevPtr,
        bytes: u64,
    ) -> DeviceResult<()> {
        self.log(Call::CopyHtoD { stream, dst, bytes });
        self.inner.copy_htod(stream, src, src_offset, dst, bytes)
    }
    fn copy_dtoh(
        &self,
        stream: StreamId,
        src: DevPtr,
        dst: PinnedId,
        dst_offset: u64,
        bytes: u64,
    ) -> DeviceResult<()> {
        self.log(Call::CopyDtoH { stream, src, bytes });
        self.inner.copy_dtoh(stream, src, dst, dst_offset, bytes)
    }
    fn launch(&self, stream: StreamId, launch: &Launch) -> DeviceResult<()> {
        self.log(Call::Launch {
            stream,
            launch: launch.clone(),
        });
        self.inner.launch(stream, launch)
    }
    fn gemm(&self, stream: StreamId, gemm: &Gemm) -> DeviceResult<()> {
        self.log(Call::Gemm {
            stream,
            gemm: *gemm,
        });
        self.inner.gemm(stream, gemm)
    }
    fn record(&self, stream: StreamId, event: EventId) -> DeviceResult<()> {
        self.log(Call::Record { stream, event });
        self.inner.record(stream, event)
    }
    fn wait(&self, stream: StreamId, event: EventId) -> DeviceResult<()> {
        self.log(Call::Wait { stream, event });
        self.inner.wait(stream, event)
    }
    fn sync_event(&self, event: EventId) -> DeviceResult<()> {
        self.log(Call::Sync { event });
        self.inner.sync_event(event)
    }
    fn elapsed_ms(&self, start: EventId, end: EventId) -> DeviceResult<f32> {
        self.inner.elapsed_ms(start, end)
    }
    fn kernel_attributes(&self, kernel: Kernel) -> KernelAttributes {
        self.inner.kernel_attributes(kernel)
    }
}
