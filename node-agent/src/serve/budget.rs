//! Bytes of requests in flight, per tenant and for the whole agent. A request reserves what it
//! holds before it allocates it: its body as it arrives (with room for its tensors), then
//! exactly its decoded tensors, which it keeps until the tenant has run them. Over a tenant's cap the request gets 429 (that tenant
//! is busy), over the agent's cap 503 (the agent is), both with `Retry-After`, and what it held
//! is released.
//!
//! The bound this gives, whatever clients send: the memory requests hold is at most the agent's
//! cap (`--max-inflight-bytes`, 512 MiB by default), and one tenant's requests at most the
//! tenant's cap (`--max-inflight-bytes-per-tenant`, 256 MiB). Beyond that, a batch being run
//! takes the executor's own working memory: it copies the batch's inputs and plans activations
//! for them (three copies of the inputs in all for the reduction model of the agent test). The
//! agent test `peak_memory_under_four_maximum_bodies_stays_within_the_documented_bound` sends
//! four concurrent 62 MiB JSON bodies to one tenant and checks the peak RSS growth stays within
//! the tenant's cap plus three copies of one request's inputs plus 64 MiB of runtime slack.

use super::error::ApiError;
use axum::http::StatusCode;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Default cap on bytes in flight for the whole agent.
pub const DEFAULT_AGENT_BYTES: u64 = 512 << 20;
/// Default cap on bytes in flight for one tenant.
pub const DEFAULT_TENANT_BYTES: u64 = 256 << 20;

/// The caps and what is reserved against them.
pub struct Budget {
    agent_cap: u64,
    tenant_cap: u64,
    agent: AtomicU64,
    tenants: Mutex<HashMap<String, Arc<AtomicU64>>>,
}

impl Budget {
    pub fn new(agent_cap: u64, tenant_cap: u64) -> Arc<Budget> {
        Arc::new(Budget {
            agent_cap,
            tenant_cap: tenant_cap.min(agent_cap),
            agent: AtomicU64::new(0),
            tenants: Mutex::new(HashMap::new()),
        })
    }

    /// An empty reservation for `tenant` (its served name), to grow as the request allocates.
    pub fn open(self: &Arc<Budget>, tenant: &str) -> Reservation {
        let counter = self
            .tenants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(tenant.to_string())
            .or_default()
            .clone();
        Reservation {
            budget: self.clone(),
            tenant: counter,
            bytes: 0,
        }
    }

    /// An empty reservation counted against the agent's cap alone (and the tenant cap as the
    /// most one request may hold), for bytes that arrive before the request names its tenant.
    pub fn open_unattributed(self: &Arc<Budget>) -> Reservation {
        Reservation {
            budget: self.clone(),
            tenant: Arc::default(),
            bytes: 0,
        }
    }

    /// Bytes reserved now by the whole agent.
    pub fn in_flight(&self) -> u64 {
        self.agent.load(Ordering::Acquire)
    }
}

/// Adds `n` to `counter` unless that passes `cap`.
fn try_add(counter: &AtomicU64, n: u64, cap: u64) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
            now.checked_add(n).filter(|next| *next <= cap)
        })
        .is_ok()
}

/// Bytes one request holds; released when dropped.
pub struct Reservation {
    budget: Arc<Budget>,
    tenant: Arc<AtomicU64>,
    bytes: u64,
}

impl Reservation {
    /// Reserves `n` more bytes, or says which cap refuses them.
    pub fn grow(&mut self, n: u64) -> Result<(), ApiError> {
        if !try_add(&self.tenant, n, self.budget.tenant_cap) {
            return Err(busy(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "this model's requests in flight would pass its cap of {} bytes; retry shortly",
                    self.budget.tenant_cap
                ),
            ));
        }
        if !try_add(&self.budget.agent, n, self.budget.agent_cap) {
            self.tenant.fetch_sub(n, Ordering::AcqRel);
            return Err(busy(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "this agent's requests in flight would pass its cap of {} bytes; retry shortly",
                    self.budget.agent_cap
                ),
            ));
        }
        self.bytes += n;
        Ok(())
    }

    /// Grows or shrinks the reservation to `total` bytes.
    pub fn resize(&mut self, total: u64) -> Result<(), ApiError> {
        if total > self.bytes {
            self.grow(total - self.bytes)
        } else {
            self.shrink(self.bytes - total);
            Ok(())
        }
    }

    /// Gives back `n` of the reserved bytes (what was freed).
    pub fn shrink(&mut self, n: u64) {
        let n = n.min(self.bytes);
        self.tenant.fetch_sub(n, Ordering::AcqRel);
        self.budget.agent.fetch_sub(n, Ordering::AcqRel);
        self.bytes -= n;
    }

    #[cfg(test)]
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.shrink(self.bytes);
    }
}

/// A refusal that asks the client to come back.
fn busy(status: StatusCode, message: String) -> ApiError {
    ApiError::new(status, message).retry_after(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_over_its_cap_gets_429_and_the_agent_over_its_cap_503() {
        let budget = Budget::new(100, 60);
        let mut a = budget.open("a");
        a.grow(50).expect("within both caps");
        let e = a.grow(20).expect_err("over the tenant cap");
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        let mut b = budget.open("b");
        b.grow(40).expect("within both caps");
        let e = b.grow(20).expect_err("over the agent cap");
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        // The refused growth left nothing behind.
        assert_eq!(budget.in_flight(), 90);
        drop(a);
        assert_eq!(budget.in_flight(), 40);
        b.grow(20).expect("room again");
    }

    #[test]
    fn shrinking_gives_back_no_more_than_was_held() {
        let budget = Budget::new(100, 100);
        let mut r = budget.open("a");
        r.grow(10).expect("grow");
        r.shrink(50);
        assert_eq!((r.bytes(), budget.in_flight()), (0, 0));
    }
}
