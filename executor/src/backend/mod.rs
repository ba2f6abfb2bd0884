//! The [`Backend`] trait a plan's steps execute on, one op at a time with host tensors, and the
//! CPU backend that implements it. The plan never branches on the device: it hands each step's
//! op and inputs to the backend.
//!
//! | file | job |
//! |---|---|
//! | `cpu.rs` | [`CpuBackend`]: a private thread pool, im2col scratch, recycled buffers, batch lanes |
//! | `spin.rs` | when the pool's threads spin between operators instead of sleeping |

mod cpu;
mod spin;

pub use cpu::CpuBackend;

use crate::error::OpError;
use crate::ops::Op;
use crate::tensor::Tensor;

/// Executes ops of a plan on host tensors.
pub trait Backend: Send + Sync {
    /// Short name for logs and reports ("cpu(4 threads, avx2)").
    fn name(&self) -> String;
    /// Runs `f` inside the backend's execution context (the thread pool on the CPU); every
    /// `execute` of one plan run happens inside one `scope`.
    fn scope(&self, f: &mut (dyn FnMut() + Send));
    /// Runs one op.
    fn execute(&self, op: &Op, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError>;
    /// Takes back an activation the plan no longer needs, so its memory can serve a later
    /// output (the memory plan's buffer reuse). Dropping it is always correct.
    fn recycle(&self, t: Tensor) {
        drop(t);
    }
    /// Backends that may each run a part of a batch at the same time, inside this backend's
    /// `scope`, where the plan's batch separates (see `Plan::run`); none by default.
    fn batch_lanes(&self) -> Vec<&dyn Backend> {
        Vec::new()
    }
}
