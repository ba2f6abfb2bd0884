//! A tenant's device-memory budget. One tenant's weights are resident once and shared by all its
//! instances on the device; each instance adds its own arena (activations, scratch, parameters)
//! and pinned staging is host memory. So a tenant of N instances holds
//! `weights + N × arena` device bytes, and that is what its budget caps: an instance that would
//! pass it fails to start (that tenant alone), never another tenant's.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use thiserror::Error;

#[derive(Clone, Debug, Error, PartialEq)]
#[error(
    "tenant {tenant:?}: device memory over budget: {requested} more bytes requested, {in_use} of {budget} in use"
)]
pub struct OverBudget {
    pub tenant: String,
    pub requested: u64,
    pub budget: u64,
    pub in_use: u64,
}

/// Device bytes one tenant may hold.
#[derive(Debug)]
pub struct Budget {
    tenant: String,
    limit: u64,
    used: AtomicU64,
}

impl Budget {
    pub fn new(tenant: impl Into<String>, limit: u64) -> Arc<Budget> {
        Arc::new(Budget {
            tenant: tenant.into(),
            limit,
            used: AtomicU64::new(0),
        })
    }

    pub fn tenant(&self) -> &str {
        &self.tenant
    }
    pub fn limit(&self) -> u64 {
        self.limit
    }
    pub fn in_use(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// Takes `bytes` of the budget until the reservation is dropped.
    pub fn reserve(self: &Arc<Self>, bytes: u64) -> Result<Reservation, OverBudget> {
        let mut cur = self.used.load(Ordering::Acquire);
        loop {
            let next = cur.saturating_add(bytes);
            if next > self.limit {
                return Err(OverBudget {
                    tenant: self.tenant.clone(),
                    requested: bytes,
                    budget: self.limit,
                    in_use: cur,
                });
            }
            match self
                .used
                .compare_exchange(cur, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    return Ok(Reservation {
                        budget: self.clone(),
                        bytes,
                    });
                }
                Err(now) => cur = now,
            }
        }
    }
}

/// Bytes held against a budget; given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Reservation {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_capped_and_given_back() {
        let b = Budget::new("t", 100);
        let r1 = b.reserve(60).unwrap();
        let e = b.reserve(50).unwrap_err();
        assert_eq!((e.requested, e.in_use, e.budget), (50, 60, 100));
        assert!(e.to_string().contains("\"t\""), "{e}");
        drop(r1);
        let _r2 = b.reserve(100).unwrap();
        assert_eq!(b.in_use(), 100);
    }
}
