//! A simulated GPU: the [`DeviceApi`] with CUDA's asynchronous semantics, run on the CPU. Each
//! stream is a thread that runs its queue in issue order; copies read and write pinned memory when
//! they run, not when they are issued; an event wait holds a stream until the record it names has
//! run on the other; errors are sticky per stream and surface at the next `sync_event`. Kernels
//! are the CPU renderings of `kernels.rs`, cuBLAS is `gemm.rs`. So the runtime's structure — what
//! it copies, launches, records, waits for and synchronizes on — runs and is checked on any
//! machine, and the numbers it computes can be compared with the CPU backend's.

mod gemm;
mod kernels;
mod memory;

use super::api::*;
use memory::Memory;
use std::collections::HashMap;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

/// Registers per thread and static shared memory per block of each kernel, as `ptxas -arch=sm_90
/// -v` reports them (`kernels/cuda/compile_check.py` prints the same table). The simulated device
/// reports these where a real one reads the compiled function's attributes.
const SM90_ATTRIBUTES: &[(Kernel, usize, usize)] = &[
    (Kernel::Conv2dDirect, 48, 0),
    (Kernel::DepthwiseConv2d, 40, 0),
    (Kernel::Im2col, 40, 0),
    (Kernel::Fill, 24, 0),
    (Kernel::GatherI32, 32, 0),
    (Kernel::GatherI64, 30, 0),
    (Kernel::Pad, 36, 0),
    (Kernel::StridedCopy, 32, 0),
    (Kernel::Transpose2d, 20, 4224),
    (Kernel::EwBinaryBcast, 30, 0),
    (Kernel::EwBinary, 22, 0),
    (Kernel::EwScalar, 25, 0),
    (Kernel::EwUnary, 24, 0),
    (Kernel::EpilogueBiasAct, 30, 0),
    (Kernel::EpilogueBiasResidualAct, 30, 0),
    (Kernel::EpilogueScaleShiftAct, 28, 0),
    (Kernel::LayerNorm, 26, 132),
    (Kernel::RmsNorm, 24, 132),
    (Kernel::AvgPool2d, 38, 0),
    (Kernel::GlobalAvgPool, 22, 132),
    (Kernel::GlobalMaxPool, 21, 132),
    (Kernel::MaxPool2d, 32, 0),
    (Kernel::ReduceAxis, 32, 0),
    (Kernel::ReduceLastAxis, 23, 132),
    (Kernel::LogSoftmax, 21, 132),
    (Kernel::Softmax, 23, 132),
];

/// One queued piece of work.
enum Cmd {
    Launch(Launch),
    Gemm(Gemm),
    CopyHtoD {
        src: PinnedId,
        src_offset: u64,
        dst: DevPtr,
        bytes: u64,
    },
    CopyDtoH {
        src: DevPtr,
        dst: PinnedId,
        dst_offset: u64,
        bytes: u64,
    },
    /// Marks `event`'s record number `seq` complete.
    Record {
        event: EventId,
        seq: u64,
    },
    /// Holds the stream until stream `stream` has run its command number `upto`.
    Wait {
        stream: StreamId,
        upto: u64,
    },
    /// Holds the stream until the host opens the gate (tests that need an ordering the host
    /// controls).
    #[cfg(test)]
    Hold(Arc<(Mutex<bool>, Condvar)>),
}

/// A stream's position: commands issued and run, and its sticky error.
#[derive(Default)]
struct StreamProgress {
    issued: u64,
    done: u64,
    error: Option<String>,
}

/// An event's most recent record issued: on which stream, as which command, and the record count.
#[derive(Default)]
struct EventState {
    latest: Option<(StreamId, u64, u64)>,
    records: u64,
    /// When each record number ran (timing events only keep the last few).
    ran_at: HashMap<u64, Instant>,
    timing: bool,
}

struct Shared {
    memory: Mutex<Memory>,
    pinned: Mutex<Vec<Option<Vec<u8>>>>,
    progress: Mutex<HashMap<StreamId, StreamProgress>>,
    events: Mutex<Vec<Option<EventState>>>,
    changed: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Stream {
    queue: Sender<(u64, Cmd)>,
    worker: Option<JoinHandle<()>>,
}

pub struct SimDevice {
    props: DeviceProps,
    shared: Arc<Shared>,
    streams: Mutex<HashMap<StreamId, Stream>>,
    next_stream: Mutex<u32>,
}

impl SimDevice {
    /// A simulated device with `multiprocessors` SMs and `total_bytes` of memory (allocations
    /// beyond it fail as a real device's would).
    pub fn new(multiprocessors: usize, total_bytes: u64) -> SimDevice {
        SimDevice {
            props: DeviceProps {
                name: "simulated".into(),
                multiprocessors,
                total_bytes,
            },
            shared: Arc::new(Shared {
                memory: Mutex::new(Memory::default()),
                pinned: Mutex::new(Vec::new()),
                progress: Mutex::new(HashMap::new()),
                events: Mutex::new(Vec::new()),
                changed: Condvar::new(),
            }),
            streams: Mutex::new(HashMap::new()),
            next_stream: Mutex::new(0),
        }
    }

    /// An H200-shaped simulated device (132 SMs, 141 GB).
    pub fn h200() -> SimDevice {
        SimDevice::new(132, 141 << 30)
    }

    /// Device bytes allocated now.
    pub fn allocated_bytes(&self) -> u64 {
        lock(&self.shared.memory).live_bytes
    }

    /// Holds `stream` at this point of its queue until the returned gate is opened
    /// (`*gate.0.lock() = true; gate.1.notify_all()`).
    #[cfg(test)]
    pub(crate) fn hold(&self, stream: StreamId) -> Arc<(Mutex<bool>, Condvar)> {
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        self.enqueue(stream, Cmd::Hold(gate.clone()))
            .expect("a stream");
        gate
    }

    fn enqueue(&self, stream: StreamId, cmd: Cmd) -> DeviceResult<u64> {
        let streams = lock(&self.streams);
        let s = streams
            .get(&stream)
            .ok_or_else(|| DeviceError::Invalid(format!("stream {}", stream.0)))?;
        let seq = {
            let mut progress = lock(&self.shared.progress);
            let p = progress.entry(stream).or_default();
            p.issued += 1;
            p.issued
        };
        s.queue
            .send((seq, cmd))
            .map_err(|_| DeviceError::Failed(format!("stream {} has stopped", stream.0)))?;
        Ok(seq)
    }
}

impl Drop for SimDevice {
    fn drop(&mut self) {
        let streams: Vec<Stream> = lock(&self.streams).drain().map(|(_, s)| s).collect();
        for mut s in streams {
            drop(s.queue);
            if let Some(w) = s.worker.take() {
                let _ = w.join();
            }
        }
    }
}

/// Runs one stream's queue until its sender is gone.
fn worker(shared: Arc<Shared>, id: StreamId, queue: Receiver<(u64, Cmd)>) {
    for (seq, cmd) in queue {
        let failed = lock(&shared.progress)
            .get(&id)
            .is_some_and(|p| p.error.is_some());
        // After an error the stream only counts its work (records still complete, so a host
        // waiting on them wakes and sees the error).
        let outcome = if failed {
            Ok(())
        } else {
            run(&shared, id, cmd)
        };
        let mut progress = lock(&shared.progress);
        let p = progress.entry(id).or_default();
        p.done = seq;
        if let Err(e) = outcome {
            p.error.get_or_insert(e);
        }
        drop(progress);
        shared.changed.notify_all();
    }
}

fn run(shared: &Shared, stream: StreamId, cmd: Cmd) -> Result<(), String> {
    match cmd {
        Cmd::Launch(l) => kernels::run(&l, &mut lock(&shared.memory)),
        Cmd::Gemm(g) => gemm::run(&g, &mut lock(&shared.memory)).map_err(|e| format!("sgemm: {e}")),
        Cmd::CopyHtoD {
            src,
            src_offset,
            dst,
            bytes,
        } => {
            let data = {
                let pinned = lock(&shared.pinned);
                let p = pinned
                    .get(src.0 as usize)
                    .and_then(Option::as_ref)
                    .ok_or("copy from a freed pinned buffer")?;
                let end = src_offset.checked_add(bytes).ok_or("overflow")?;
                p.get(src_offset as usize..end as usize)
                    .ok_or("copy past the end of a pinned buffer")?
                    .to_vec()
            };
            lock(&shared.memory).write::<u8>(dst, &data)
        }
        Cmd::CopyDtoH {
            src,
            dst,
            dst_offset,
            bytes,
        } => {
            let data = lock(&shared.memory).read::<u8>(src, bytes as usize)?;
            let mut pinned = lock(&shared.pinned);
            let p = pinned
                .get_mut(dst.0 as usize)
                .and_then(Option::as_mut)
                .ok_or("copy into a freed pinned buffer")?;
            let end = dst_offset.checked_add(bytes).ok_or("overflow")?;
            p.get_mut(dst_offset as usize..end as usize)
                .ok_or("copy past the end of a pinned buffer")?
                .copy_from_slice(&data);
            Ok(())
        }
        Cmd::Record { event, seq } => {
            let mut events = lock(&shared.events);
            if let Some(Some(e)) = events.get_mut(event.0 as usize)
                && e.timing
            {
                e.ran_at.insert(seq, Instant::now());
                e.ran_at.retain(|&k, _| k + 8 > seq);
            }
            Ok(())
        }
        #[cfg(test)]
        Cmd::Hold(gate) => {
            let mut open = lock(&gate.0);
            while !*open {
                open = gate.1.wait(open).unwrap_or_else(|e| e.into_inner());
            }
            Ok(())
        }
        Cmd::Wait {
            stream: other,
            upto,
        } => {
            let mut progress = lock(&shared.progress);
            loop {
                let p = progress.entry(other).or_default();
                if let Some(e) = &p.error {
                    return Err(format!("waited on stream {}, which failed: {e}", other.0));
                }
                if p.done >= upto {
                    return Ok(());
                }
                if other == stream {
                    return Err("a stream waits on its own later work".into());
                }
                progress = shared
                    .changed
                    .wait(progress)
                    .unwrap_or_else(|e| e.into_inner());
            }
        }
    }
}

impl DeviceApi for SimDevice {
    fn props(&self) -> &DeviceProps {
        &self.props
    }

    fn alloc(&self, bytes: u64) -> DeviceResult<BufferId> {
        let mut m = lock(&self.shared.memory);
        if m.live_bytes.saturating_add(bytes) > self.props.total_bytes {
            return Err(DeviceError::OutOfMemory { bytes });
        }
        m.alloc(bytes)
            .map_err(|_| DeviceError::OutOfMemory { bytes })
    }

    fn free(&self, buffer: BufferId) {
        // Work issued earlier may still use it: wait for every stream to drain first.
        let mut progress = lock(&self.shared.progress);
        while progress
            .values()
            .any(|p| p.done < p.issued && p.error.is_none())
        {
            progress = self
                .shared
                .changed
                .wait(progress)
                .unwrap_or_else(|e| e.into_inner());
        }
        drop(progress);
        lock(&self.shared.memory).free(buffer);
    }

    fn alloc_pinned(&self, bytes: u64) -> DeviceResult<PinnedId> {
        let len = usize::try_from(bytes).map_err(|_| DeviceError::OutOfMemory { bytes })?;
        let mut v = Vec::new();
        v.try_reserve_exact(len)
            .map_err(|_| DeviceError::OutOfMemory { bytes })?;
        v.resize(len, 0u8);
        let mut pinned = lock(&self.shared.pinned);
        pinned.push(Some(v));
        Ok(PinnedId((pinned.len() - 1) as u32))
    }

    fn free_pinned(&self, p: PinnedId) {
        if let Some(slot) = lock(&self.shared.pinned).get_mut(p.0 as usize) {
            *slot = None;
        }
    }

    fn write_pinned(&self, p: PinnedId, offset: u64, data: &[u8]) -> DeviceResult<()> {
        let mut pinned = lock(&self.shared.pinned);
        let buf = pinned
            .get_mut(p.0 as usize)
            .and_then(Option::as_mut)
            .ok_or_else(|| DeviceError::Invalid(format!("pinned buffer {}", p.0)))?;
        buf.get_mut(offset as usize..offset as usize + data.len())
            .ok_or_else(|| DeviceError::Invalid("write past the end of a pinned buffer".into()))?
            .copy_from_slice(data);
        Ok(())
    }

    fn read_pinned(&self, p: PinnedId, offset: u64, out: &mut [u8]) -> DeviceResult<()> {
        let pinned = lock(&self.shared.pinned);
        let buf = pinned
            .get(p.0 as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| DeviceError::Invalid(format!("pinned buffer {}", p.0)))?;
        out.copy_from_slice(
            buf.get(offset as usize..offset as usize + out.len())
                .ok_or_else(|| {
                    DeviceError::Invalid("read past the end of a pinned buffer".into())
                })?,
        );
        Ok(())
    }

    fn upload_now(&self, dst: DevPtr, data: &[u8]) -> DeviceResult<()> {
        lock(&self.shared.memory)
            .write::<u8>(dst, data)
            .map_err(DeviceError::Failed)
    }

    fn new_stream(&self) -> DeviceResult<StreamId> {
        let id = {
            let mut n = lock(&self.next_stream);
            *n += 1;
            StreamId(*n)
        };
        lock(&self.shared.progress).insert(id, StreamProgress::default());
        let (tx, rx) = channel();
        let shared = self.shared.clone();
        let handle = std::thread::Builder::new()
            .name(format!("sim-stream-{}", id.0))
            .spawn(move || worker(shared, id, rx))
            .map_err(|e| DeviceError::Failed(format!("starting a stream thread: {e}")))?;
        lock(&self.streams).insert(
            id,
            Stream {
                queue: tx,
                worker: Some(handle),
            },
        );
        Ok(id)
    }

    fn free_stream(&self, stream: StreamId) {
        let s = lock(&self.streams).remove(&stream);
        if let Some(mut s) = s {
            drop(s.queue);
            if let Some(w) = s.worker.take() {
                let _ = w.join();
            }
        }
    }

    fn new_event(&self, timing: bool) -> DeviceResult<EventId> {
        let mut events = lock(&self.shared.events);
        events.push(Some(EventState {
            timing,
            ..Default::default()
        }));
        Ok(EventId((events.len() - 1) as u32))
    }

    fn free_event(&self, event: EventId) {
        if let Some(slot) = lock(&self.shared.events).get_mut(event.0 as usize) {
            *slot = None;
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
        self.enqueue(
            stream,
            Cmd::CopyHtoD {
                src,
                src_offset,
                dst,
                bytes,
            },
        )
        .map(drop)
    }

    fn copy_dtoh(
        &self,
        stream: StreamId,
        src: DevPtr,
        dst: PinnedId,
        dst_offset: u64,
        bytes: u64,
    ) -> DeviceResult<()> {
        self.enqueue(
            stream,
            Cmd::CopyDtoH {
                src,
                dst,
                dst_offset,
                bytes,
            },
        )
        .map(drop)
    }

    fn launch(&self, stream: StreamId, launch: &Launch) -> DeviceResult<()> {
        self.enqueue(stream, Cmd::Launch(launch.clone())).map(drop)
    }

    fn gemm(&self, stream: StreamId, gemm: &Gemm) -> DeviceResult<()> {
        self.enqueue(stream, Cmd::Gemm(*gemm)).map(drop)
    }

    fn record(&self, stream: StreamId, event: EventId) -> DeviceResult<()> {
        // The record's place in the stream is fixed now, at issue, as CUDA fixes it.
        let streams = lock(&self.streams);
        let s = streams
            .get(&stream)
            .ok_or_else(|| DeviceError::Invalid(format!("stream {}", stream.0)))?;
        let mut events = lock(&self.shared.events);
        let e = events
            .get_mut(event.0 as usize)
            .and_then(Option::as_mut)
            .ok_or_else(|| DeviceError::Invalid(format!("event {}", event.0)))?;
        let seq = {
            let mut progress = lock(&self.shared.progress);
            let p = progress.entry(stream).or_default();
            p.issued += 1;
            p.issued
        };
        e.records += 1;
        e.latest = Some((stream, seq, e.records));
        drop(events);
        s.queue
            .send((seq, Cmd::Record { event, seq }))
            .map_err(|_| DeviceError::Failed(format!("stream {} has stopped", stream.0)))
    }

    fn wait(&self, stream: StreamId, event: EventId) -> DeviceResult<()> {
        let latest = lock(&self.shared.events)
            .get(event.0 as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| DeviceError::Invalid(format!("event {}", event.0)))?
            .latest;
        match latest {
            // Never recorded: the wait does not hold (CUDA's semantics).
            None => Ok(()),
            Some((other, upto, _)) => self
                .enqueue(
                    stream,
                    Cmd::Wait {
                        stream: other,
                        upto,
                    },
                )
                .map(drop),
        }
    }

    fn sync_event(&self, event: EventId) -> DeviceResult<()> {
        let latest = lock(&self.shared.events)
            .get(event.0 as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| DeviceError::Invalid(format!("event {}", event.0)))?
            .latest;
        let Some((stream, upto, _)) = latest else {
            return Ok(());
        };
        let mut progress = lock(&self.shared.progress);
        loop {
            let p = progress.entry(stream).or_default();
            if let Some(e) = &p.error {
                return Err(DeviceError::Failed(e.clone()));
            }
            if p.done >= upto {
                return Ok(());
            }
            progress = self
                .shared
                .changed
                .wait(progress)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    fn elapsed_ms(&self, start: EventId, end: EventId) -> DeviceResult<f32> {
        let events = lock(&self.shared.events);
        let at = |e: EventId| -> DeviceResult<Instant> {
            let s = events
                .get(e.0 as usize)
                .and_then(Option::as_ref)
                .ok_or_else(|| DeviceError::Invalid(format!("event {}", e.0)))?;
            let (_, seq, _) = s.latest.filter(|_| s.timing).ok_or_else(|| {
                DeviceError::Invalid(format!("event {} has no timed record", e.0))
            })?;
            s.ran_at
                .get(&seq)
                .copied()
                .ok_or_else(|| DeviceError::Invalid(format!("event {} has not completed", e.0)))
        };
        let (a, b) = (at(start)?, at(end)?);
        // Signed, as cuEventElapsedTime's: events on different streams may have run either way.
        Ok(match b.checked_duration_since(a) {
            Some(d) => d.as_secs_f32() * 1e3,
            None => -(a.duration_since(b).as_secs_f32() * 1e3),
        })
    }

    fn kernel_attributes(&self, kernel: Kernel) -> KernelAttributes {
        let (regs, smem) = SM90_ATTRIBUTES
            .iter()
            .find(|(k, ..)| *k == kernel)
            .map_or((32, 0), |&(_, r, s)| (r, s));
        KernelAttributes {
            registers_per_thread: regs,
            shared_mem_per_block: smem,
        }
    }
}

#[cfg(test)]
mod tests;
