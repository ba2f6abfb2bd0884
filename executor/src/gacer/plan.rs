//! A GACER plan for one tenant mix: how many pieces each step of each tenant runs as (spatial
//! regulation) and the synchronization pointers between tenants' streams (temporal
//! regulation). Backend-independent: it names steps by index, never a device.

use std::collections::VecDeque;
use thiserror::Error;

/// One step of one tenant of the mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StepRef {
    pub tenant: usize,
    pub step: usize,
}

/// An event wait between streams: `waiter` may not start before `after` has finished (in the
/// same round, i.e. the same batch of each tenant).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SyncPointer {
    pub waiter: StepRef,
    pub after: StepRef,
}

/// Why a plan cannot run on a mix.
#[derive(Clone, Debug, Error, PartialEq)]
pub enum PlanError {
    #[error("the plan covers {plan} tenants, the mix has {mix}")]
    TenantCount { plan: usize, mix: usize },
    #[error("tenant {tenant}: the plan splits {plan} steps, the model has {model}")]
    StepCount {
        tenant: usize,
        plan: usize,
        model: usize,
    },
    #[error("tenant {tenant} step {step}: split into 0 pieces")]
    ZeroPieces { tenant: usize, step: usize },
    #[error("pointer {0:?} names a step outside the mix")]
    OutOfRange(SyncPointer),
    #[error("pointer {0:?} waits within one stream")]
    SameStream(SyncPointer),
    #[error("the pointers form a cycle with the streams' order: the plan would deadlock")]
    Cycle,
}

/// Split factors and pointers for one mix, with what the cost model predicted for it.
#[derive(Clone, Debug, PartialEq)]
pub struct GacerPlan {
    /// `splits[tenant][step]`: pieces the step runs as (1 = whole).
    pub splits: Vec<Vec<usize>>,
    pub pointers: Vec<SyncPointer>,
    /// Predicted time of one round (every tenant one batch), in seconds.
    pub predicted_makespan: f64,
    /// Predicted finish of each tenant's batch within the round, in seconds.
    pub predicted_finish: Vec<f64>,
}

impl GacerPlan {
    /// No pieces, no pointers: every stream issues freely (what multi-stream does).
    pub fn unregulated(step_counts: &[usize]) -> GacerPlan {
        GacerPlan {
            splits: step_counts.iter().map(|&n| vec![1; n]).collect(),
            pointers: vec![],
            predicted_makespan: f64::NAN,
            predicted_finish: vec![f64::NAN; step_counts.len()],
        }
    }

    /// Steps of each tenant.
    pub fn step_counts(&self) -> Vec<usize> {
        self.splits.iter().map(|s| s.len()).collect()
    }

    /// Pointers whose waiter is this step.
    pub fn waits_of(&self, s: StepRef) -> impl Iterator<Item = StepRef> + '_ {
        self.pointers
            .iter()
            .filter(move |p| p.waiter == s)
            .map(|p| p.after)
    }

    /// Checks the plan against a mix with these step counts: sizes agree, every pointer names
    /// steps of two different tenants, and the pointers with each stream's order are acyclic.
    pub fn validate(&self, step_counts: &[usize]) -> Result<(), PlanError> {
        if self.splits.len() != step_counts.len() {
            return Err(PlanError::TenantCount {
                plan: self.splits.len(),
                mix: step_counts.len(),
            });
        }
        for (tenant, (s, &n)) in self.splits.iter().zip(step_counts).enumerate() {
            if s.len() != n {
                return Err(PlanError::StepCount {
                    tenant,
                    plan: s.len(),
                    model: n,
                });
            }
            if let Some(step) = s.iter().position(|&k| k == 0) {
                return Err(PlanError::ZeroPieces { tenant, step });
            }
        }
        let inside = |r: &StepRef| step_counts.get(r.tenant).is_some_and(|&n| r.step < n);
        for p in &self.pointers {
            if !inside(&p.waiter) || !inside(&p.after) {
                return Err(PlanError::OutOfRange(*p));
            }
            if p.waiter.tenant == p.after.tenant {
                return Err(PlanError::SameStream(*p));
            }
        }
        if acyclic(step_counts, &self.pointers) {
            Ok(())
        } else {
            Err(PlanError::Cycle)
        }
    }
}

/// Kahn's algorithm over all steps: edges from each step to the next of its stream and from
/// each pointer's `after` to its `waiter`.
pub(crate) fn acyclic(step_counts: &[usize], pointers: &[SyncPointer]) -> bool {
    let offset: Vec<usize> = step_counts
        .iter()
        .scan(0, |acc, &n| {
            let o = *acc;
            *acc += n;
            Some(o)
        })
        .collect();
    let total: usize = step_counts.iter().sum();
    let id = |r: &StepRef| offset[r.tenant] + r.step;
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); total];
    let mut indeg = vec![0usize; total];
    for (t, &n) in step_counts.iter().enumerate() {
        for s in 1..n {
            succ[offset[t] + s - 1].push(offset[t] + s);
            indeg[offset[t] + s] += 1;
        }
    }
    for p in pointers {
        succ[id(&p.after)].push(id(&p.waiter));
        indeg[id(&p.waiter)] += 1;
    }
    let mut ready: VecDeque<usize> = (0..total).filter(|&v| indeg[v] == 0).collect();
    let mut seen = 0;
    while let Some(v) = ready.pop_front() {
        seen += 1;
        for &w in &succ[v] {
            indeg[w] -= 1;
            if indeg[w] == 0 {
                ready.push_back(w);
            }
        }
    }
    seen == total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ptr(wt: usize, ws: usize, at: usize, as_: usize) -> SyncPointer {
        SyncPointer {
            waiter: StepRef {
                tenant: wt,
                step: ws,
            },
            after: StepRef {
                tenant: at,
                step: as_,
            },
        }
    }

    #[test]
    fn crossing_pointers_deadlock() {
        let mut p = GacerPlan::unregulated(&[3, 3]);
        p.pointers = vec![ptr(0, 1, 1, 2), ptr(1, 1, 0, 2)];
        assert_eq!(p.validate(&[3, 3]), Err(PlanError::Cycle));
        p.pointers = vec![ptr(0, 1, 1, 0), ptr(1, 2, 0, 1)];
        assert_eq!(p.validate(&[3, 3]), Ok(()));
    }

    #[test]
    fn pointers_must_stay_in_the_mix() {
        let mut p = GacerPlan::unregulated(&[2, 2]);
        p.pointers = vec![ptr(0, 1, 1, 5)];
        assert!(matches!(p.validate(&[2, 2]), Err(PlanError::OutOfRange(_))));
        p.pointers = vec![ptr(0, 1, 0, 0)];
        assert!(matches!(p.validate(&[2, 2]), Err(PlanError::SameStream(_))));
    }
}
