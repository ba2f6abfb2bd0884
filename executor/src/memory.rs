//! A plan's host-memory budget for activations, and how each run keeps to it. The budget is
//! shared by every run of the plan at once (instances, batch lanes): a run first holds its
//! inputs; before each step runs it reserves what the step will allocate (`ops::size`), then
//! holds the step's outputs and gives back what the step freed; at its end it gives back the
//! rest. A step that would pass the limit fails its run with an error naming the node, before
//! anything is allocated: a hostile shape costs one failed request, never the process.
//!
//! What a tenant needs is also estimated before it serves: weights plus the peak of live
//! activations at the largest batch it may run, from value sizes measured at batch 1 and 2 and
//! taken as affine in the batch ([`extrapolate`]), so that a large batch is never run just to
//! learn its size.

use crate::error::{OpError, RunError};
use crate::plan::Plan;
use crate::tensor::checked_numel;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes of activations a plan's runs may hold at once.
#[derive(Debug)]
pub struct MemoryBudget {
    limit: usize,
    live: AtomicUsize,
}

impl MemoryBudget {
    pub fn new(limit: usize) -> MemoryBudget {
        MemoryBudget {
            limit,
            live: AtomicUsize::new(0),
        }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes the runs now in flight hold.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// Reserves `bytes`, or nothing when that would pass the limit.
    fn reserve(&self, bytes: usize) -> bool {
        let mut now = self.live.load(Ordering::Acquire);
        loop {
            let Some(next) = now.checked_add(bytes).filter(|&n| n <= self.limit) else {
                return false;
            };
            match self
                .live
                .compare_exchange_weak(now, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(seen) => now = seen,
            }
        }
    }

    fn release(&self, bytes: usize) {
        self.live.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// What one run (or one step run on its own) holds against its plan's budget; dropping it
/// gives everything back. Without a budget it only counts.
pub(crate) struct Ledger<'a> {
    budget: Option<&'a MemoryBudget>,
    held: usize,
}

impl<'a> Ledger<'a> {
    pub(crate) fn new(budget: Option<&'a MemoryBudget>) -> Ledger<'a> {
        Ledger { budget, held: 0 }
    }

    /// Holds `bytes` more for step `node` (`op`). Over the limit on this run's own account, the
    /// request cannot fit at all; otherwise the plan's other runs hold the rest for now and the
    /// device error says so (a retry may fit).
    pub(crate) fn take(&mut self, bytes: usize, node: &str, op: &str) -> Result<(), RunError> {
        if let Some(budget) = self.budget
            && !budget.reserve(bytes)
        {
            let needed = self.held.saturating_add(bytes);
            if needed > budget.limit {
                return Err(RunError::MemoryBudget {
                    node: node.to_string(),
                    op: op.to_string(),
                    needed,
                    limit: budget.limit,
                });
            }
            return Err(RunError::Node {
                node: node.to_string(),
                op: op.to_string(),
                source: OpError::Device(format!(
                    "{bytes} more bytes of activations would pass the memory budget of {} bytes, {} of which other runs hold now",
                    budget.limit,
                    budget.live().saturating_sub(self.held)
                )),
            });
        }
        self.held = self.held.saturating_add(bytes);
        Ok(())
    }

    /// Gives back `bytes` this run held.
    pub(crate) fn give(&mut self, bytes: usize) {
        let bytes = bytes.min(self.held);
        self.held -= bytes;
        if let Some(budget) = self.budget {
            budget.release(bytes);
        }
    }
}

impl Drop for Ledger<'_> {
    fn drop(&mut self) {
        self.give(self.held);
    }
}

/// Bytes of `Plan::example_inputs(batch)`, from the declared shapes and without allocating
/// them: what a trial run at `batch` starts by holding. `None` when a declared shape is past
/// the executor's limit.
pub fn example_input_bytes(plan: &Plan, batch: usize) -> Option<usize> {
    plan.inputs.iter().try_fold(0usize, |total, input| {
        let shape = input.example_shape(batch);
        let bytes = checked_numel(&shape)
            .ok()?
            .checked_mul(input.dtype.size())?;
        total.checked_add(bytes)
    })
}

/// Value sizes at `batch`, from those measured at batch 1 and 2: each taken as affine in the
/// batch (`one + (batch - 1) * (two - one)`). Exact for every value whose shape scales with
/// the batch alone; a model whose sizes grow faster is still held to its budget at run time.
pub fn extrapolate(one: &[usize], two: &[usize], batch: usize) -> Vec<usize> {
    let steps = batch.saturating_sub(1);
    one.iter()
        .zip(two)
        .map(|(&a, &b)| a.saturating_add(b.saturating_sub(a).saturating_mul(steps)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_is_shared_and_given_back() {
        let budget = MemoryBudget::new(100);
        let mut a = Ledger::new(Some(&budget));
        let mut b = Ledger::new(Some(&budget));
        a.take(60, "n", "Op").unwrap();
        // Over the limit only because of the other run: a device error (retry later).
        let busy = b.take(50, "m", "Op").unwrap_err();
        assert!(
            matches!(&busy, RunError::Node { source: OpError::Device(why), .. } if why.contains("60 of which")),
            "{busy}"
        );
        // Over the limit on its own: the budget error with the numbers.
        let alone = a.take(41, "n", "Op").unwrap_err();
        assert!(
            matches!(
                alone,
                RunError::MemoryBudget {
                    needed: 101,
                    limit: 100,
                    ..
                }
            ),
            "{alone}"
        );
        b.take(40, "m", "Op").unwrap();
        assert_eq!(budget.live(), 100);
        a.give(10);
        drop(b);
        assert_eq!(budget.live(), 50);
        drop(a);
        assert_eq!(budget.live(), 0);
    }

    #[test]
    fn example_inputs_are_priced_without_allocating() {
        use crate::zoo::{self, ZooOptions};
        use prost::Message;
        let proto = zoo::build("squeezenet", &ZooOptions::default()).expect("zoo");
        let model = crate::Model::from_bytes(&proto.encode_to_vec()).expect("imports");
        for batch in [1, 3] {
            let made: usize = model
                .plan
                .example_inputs(batch)
                .iter()
                .map(|(_, t)| t.bytes())
                .sum();
            assert_eq!(example_input_bytes(&model.plan, batch), Some(made));
        }
        assert_eq!(example_input_bytes(&model.plan, usize::MAX), None);
    }

    #[test]
    fn sizes_extrapolate_affinely() {
        assert_eq!(extrapolate(&[10, 4, 0], &[18, 4, 0], 5), vec![42, 4, 0]);
        assert_eq!(extrapolate(&[10], &[18], 1), vec![10]);
        assert_eq!(extrapolate(&[1], &[usize::MAX], 3), vec![usize::MAX]);
    }
}
