//! The CPU backend: a private rayon pool sized to the instance's thread budget, so several
//! tenants share the cores without oversubscribing them, plus per-instance scratch and recycled
//! activation buffers.

use super::Backend;
use crate::error::OpError;
use crate::ops::buffers::Pools;
use crate::ops::{Cx, Op};
use crate::tensor::Tensor;
use std::sync::Mutex;
use std::sync::atomic::AtomicUsize;

/// The CPU backend: a private rayon pool sized to the caller's thread budget, so several tenants
/// can share the cores without oversubscribing them.
pub struct CpuBackend {
    threads: usize,
    pool: Option<rayon::ThreadPool>,
    /// im2col scratch reused across convolutions of a run.
    scratch: Mutex<Vec<f32>>,
    /// Freed activation buffers, reused for new outputs.
    buffers: Mutex<Pools>,
    /// One one-thread backend per thread of the pool (none without a pool), each with its own
    /// scratch and buffers.
    lanes: Vec<CpuBackend>,
    /// Scopes running on the pool now: only one that runs alone gets spinners (`spin.rs`).
    scopes: AtomicUsize,
}

impl CpuBackend {
    /// A backend using at most `threads` threads (at least 1).
    pub fn new(threads: usize) -> CpuBackend {
        let threads = threads.max(1);
        // One thread needs no pool: the caller's thread does the work.
        let pool = if threads > 1 {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|i| format!("cotenant-cpu-{i}"))
                .build()
                .ok()
        } else {
            None
        };
        let threads = if pool.is_some() { threads } else { 1 };
        let lanes = match pool {
            Some(_) => (0..threads).map(|_| CpuBackend::new(1)).collect(),
            None => Vec::new(),
        };
        CpuBackend {
            threads,
            pool,
            scratch: Mutex::new(Vec::new()),
            buffers: Mutex::default(),
            lanes,
            scopes: AtomicUsize::new(0),
        }
    }

    pub fn threads(&self) -> usize {
        self.threads
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> String {
        format!(
            "cpu({} threads, {})",
            self.threads,
            cotenant_kernels::isa::in_use().name()
        )
    }

    fn scope(&self, f: &mut (dyn FnMut() + Send)) {
        super::spin::run_scope(self.pool.as_ref(), self.threads, &self.scopes, f);
        // Buffers no op took during a whole run are only memory held.
        self.buffers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .end_run();
    }

    fn execute(&self, op: &Op, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> {
        let cx = Cx::new(self.threads);
        // A poisoned lock only means another run panicked mid-op; the scratch is still usable.
        let mut guard = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let mut buffers = self.buffers.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::swap(&mut *cx.scratch.borrow_mut(), &mut *guard);
        std::mem::swap(&mut *cx.pool.borrow_mut(), &mut *buffers);
        let res = op.eval(&cx, inputs);
        std::mem::swap(&mut *cx.scratch.borrow_mut(), &mut *guard);
        std::mem::swap(&mut *cx.pool.borrow_mut(), &mut *buffers);
        res
    }

    fn batch_lanes(&self) -> Vec<&dyn Backend> {
        self.lanes.iter().map(|l| l as &dyn Backend).collect()
    }

    fn recycle(&self, t: Tensor) {
        self.buffers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .put(t.data);
    }
}
