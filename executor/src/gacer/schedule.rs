//! The three interchangeable multi-tenant schedules and the streams each one makes: what every
//! stream runs in one round (every tenant one batch), in which order, in how many pieces, and
//! after which other streams' steps.

use super::cache::PlanSlot;
use super::plan::{GacerPlan, StepRef};
use std::sync::Arc;

/// How the tenants of a mix share the device.
#[derive(Clone)]
pub enum Schedule {
    /// One stream: one operator at a time across all tenants, taking turns step by step.
    Sequential,
    /// A stream per tenant issuing freely (what PyTorch and Triton do).
    MultiStream,
    /// A stream per tenant regulated by a GACER plan: resized operators and pointers.
    Gacer(Arc<PlanSlot>),
}

impl Schedule {
    /// A GACER schedule following one fixed plan.
    pub fn gacer(plan: GacerPlan) -> Schedule {
        Schedule::Gacer(Arc::new(PlanSlot::new(Arc::new(plan))))
    }

    pub fn name(&self) -> &'static str {
        match self {
            Schedule::Sequential => "sequential",
            Schedule::MultiStream => "multi-stream",
            Schedule::Gacer(_) => "gacer",
        }
    }

    /// The tenants each stream serves.
    pub fn streams(&self, tenants: usize) -> Vec<Vec<usize>> {
        match self {
            Schedule::Sequential => vec![(0..tenants).collect()],
            Schedule::MultiStream | Schedule::Gacer(_) => (0..tenants).map(|t| vec![t]).collect(),
        }
    }
}

/// One step a stream runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Task {
    pub step: StepRef,
    /// Pieces the operator runs as.
    pub pieces: usize,
    /// Steps of other streams that must have finished first (this round).
    pub waits: Vec<StepRef>,
    /// Whether some other stream waits for this step.
    pub signals: bool,
}

/// The tasks of one stream for one round: the stream's tenants' steps in issue order.
pub fn stream_tasks(
    tenants: &[usize],
    step_counts: &[usize],
    plan: Option<&GacerPlan>,
) -> Vec<Task> {
    let most = tenants
        .iter()
        .map(|&t| step_counts.get(t).copied().unwrap_or(0))
        .max()
        .unwrap_or(0);
    let mut tasks = Vec::new();
    // Several tenants on one stream take turns step by step; one tenant just runs in order.
    for s in 0..most {
        for &t in tenants {
            if s >= step_counts.get(t).copied().unwrap_or(0) {
                continue;
            }
            let step = StepRef { tenant: t, step: s };
            let (pieces, waits, signals) = match plan {
                Some(p) => (
                    p.splits
                        .get(t)
                        .and_then(|v| v.get(s))
                        .copied()
                        .unwrap_or(1)
                        .max(1),
                    p.waits_of(step).collect(),
                    p.pointers.iter().any(|x| x.after == step),
                ),
                None => (1, vec![], false),
            };
            tasks.push(Task {
                step,
                pieces,
                waits,
                signals,
            });
        }
    }
    tasks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gacer::plan::SyncPointer;

    #[test]
    fn sequential_takes_turns_across_tenants() {
        let tasks = stream_tasks(&[0, 1], &[2, 3], None);
        let order: Vec<(usize, usize)> =
            tasks.iter().map(|t| (t.step.tenant, t.step.step)).collect();
        assert_eq!(order, vec![(0, 0), (1, 0), (0, 1), (1, 1), (1, 2)]);
    }

    #[test]
    fn gacer_tasks_carry_pieces_and_waits() {
        let mut p = GacerPlan::unregulated(&[2, 2]);
        p.splits[1][1] = 4;
        let (a, b) = (
            StepRef { tenant: 1, step: 1 },
            StepRef { tenant: 0, step: 0 },
        );
        p.pointers.push(SyncPointer {
            waiter: a,
            after: b,
        });
        let t1 = stream_tasks(&[1], &[2, 2], Some(&p));
        assert_eq!(t1[1].pieces, 4);
        assert_eq!(t1[1].waits, vec![b]);
        assert!(stream_tasks(&[0], &[2, 2], Some(&p))[0].signals);
    }
}
