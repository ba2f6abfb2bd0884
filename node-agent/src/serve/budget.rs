//! Bytes of requests in flight, per tenant and for the whole agent. A request reserves what it
//! holds before it allocates it: its body as it arrives (with room for its tensors), then
//! exactly its decoded tensors, which it keeps until the tenant has run them. Over a tenant's cap
//! the request gets 429 (that tenant is busy), over the agent's cap 503 (the agent is), both with
//! `Retry-After`, and what it held is released.
//!
//! Bodies grow their reservations as they arrive, so concurrent large bodies compete for the
//! same cap. If every refused one gave up, several could be refused at once with none served.
//! So the oldest open request on a cap (the tenant's, or the agent's) waits for room there until
//! its body deadline instead; younger ones that are refused give up and release what they hold.
//! The oldest always gets through, and nothing waits on a younger request that waits in turn.
//!
//! The bound this gives, whatever clients send: the memory requests hold is at most the agent's
//! cap (`--max-inflight-bytes`, 512 MiB by default), and one tenant's requests at most the
//! tenant's cap (`--max-inflight-bytes-per-tenant`, 256 MiB). Beyond that, a batch being run
//! takes the executor's own working memory: it copies the batch's inputs and plans activations
//! for them (three copies of the inputs in all for the reduction model of the agent test). The
//! agent test `peak_memory_under_four_maximum_bodies_stays_within_the_documented_bound` sends
//! four concurrent 62 MiB JSON bodies to one tenant and checks that one is served and the peak
//! RSS growth stays within the tenant's cap plus three copies of one request's inputs plus
//! 64 MiB of runtime slack.

use super::error::ApiError;
use axum::http::StatusCode;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Default cap on bytes in flight for the whole agent.
pub const DEFAULT_AGENT_BYTES: u64 = 512 << 20;
/// Default cap on bytes in flight for one tenant.
pub const DEFAULT_TENANT_BYTES: u64 = 256 << 20;

/// The caps and what is reserved against them.
pub struct Budget {
    agent_cap: u64,
    tenant_cap: u64,
    agent: Account,
    tenants: Mutex<HashMap<String, Arc<Account>>>,
    /// Each reservation's place in line: lower is older.
    next_ticket: AtomicU64,
    /// Woken whenever bytes are released or a reservation closes.
    released: Notify,
}

/// Bytes reserved against one cap, and the reservations open on it.
#[derive(Default)]
struct Account {
    bytes: AtomicU64,
    open: Mutex<BTreeSet<u64>>,
}

impl Account {
    /// Adds `n` unless that passes `cap`.
    fn try_add(&self, n: u64, cap: u64) -> bool {
        self.bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                now.checked_add(n).filter(|next| *next <= cap)
            })
            .is_ok()
    }

    fn tickets(&self) -> std::sync::MutexGuard<'_, BTreeSet<u64>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is_oldest(&self, ticket: u64) -> bool {
        self.tickets().first() == Some(&ticket)
    }
}

impl Budget {
    pub fn new(agent_cap: u64, tenant_cap: u64) -> Arc<Budget> {
        Arc::new(Budget {
            agent_cap,
            tenant_cap: tenant_cap.min(agent_cap),
            agent: Account::default(),
            tenants: Mutex::new(HashMap::new()),
            next_ticket: AtomicU64::new(0),
            released: Notify::new(),
        })
    }

    /// An empty reservation for `tenant` (its served name), to grow as the request allocates.
    pub fn open(self: &Arc<Budget>, tenant: &str) -> Reservation {
        let account = self
            .tenants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(tenant.to_string())
            .or_default()
            .clone();
        self.reservation(account)
    }

    /// An empty reservation counted against the agent's cap alone (and the tenant cap as the
    /// most one request may hold), for bytes that arrive before the request names its tenant.
    pub fn open_unattributed(self: &Arc<Budget>) -> Reservation {
        self.reservation(Arc::default())
    }

    fn reservation(self: &Arc<Budget>, tenant: Arc<Account>) -> Reservation {
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        tenant.tickets().insert(ticket);
        self.agent.tickets().insert(ticket);
        Reservation {
            budget: self.clone(),
            tenant,
            ticket,
            bytes: 0,
        }
    }

    /// Bytes reserved now by the whole agent.
    pub fn in_flight(&self) -> u64 {
        self.agent.bytes.load(Ordering::Acquire)
    }
}

/// The cap that refused a growth.
enum Refusal {
    Tenant,
    Agent,
}

/// Bytes one request holds; released when dropped.
pub struct Reservation {
    budget: Arc<Budget>,
    tenant: Arc<Account>,
    ticket: u64,
    bytes: u64,
}

impl Reservation {
    /// Reserves `n` more bytes, or says which cap refuses them.
    pub fn grow(&mut self, n: u64) -> Result<(), ApiError> {
        self.try_grow(n).map_err(|refusal| self.refused(refusal))
    }

    /// Reserves `n` more bytes; refused, the oldest request on the refusing cap waits for room
    /// until `deadline`, any other gives up at once (see the module's comment).
    pub async fn grow_or_wait(&mut self, n: u64, deadline: Instant) -> Result<(), ApiError> {
        let budget = self.budget.clone();
        loop {
            // Registered before trying, so a release between the try and the wait still wakes.
            let released = budget.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            let refusal = match self.try_grow(n) {
                Ok(()) => return Ok(()),
                Err(refusal) => refusal,
            };
            if !self.may_wait(&refusal, n)
                || tokio::time::timeout_at(deadline, released).await.is_err()
            {
                return Err(self.refused(refusal));
            }
        }
    }

    fn try_grow(&mut self, n: u64) -> Result<(), Refusal> {
        let budget = &self.budget;
        if !self.tenant.try_add(n, budget.tenant_cap) {
            return Err(Refusal::Tenant);
        }
        if !budget.agent.try_add(n, budget.agent_cap) {
            self.tenant.bytes.fetch_sub(n, Ordering::AcqRel);
            return Err(Refusal::Agent);
        }
        self.bytes += n;
        Ok(())
    }

    /// Whether this request may wait for the room `refusal` denied: it must fit the cap on its
    /// own, and be the oldest open there.
    fn may_wait(&self, refusal: &Refusal, n: u64) -> bool {
        let (account, cap) = match refusal {
            Refusal::Tenant => (&*self.tenant, self.budget.tenant_cap),
            Refusal::Agent => (&self.budget.agent, self.budget.agent_cap),
        };
        self.bytes.saturating_add(n) <= cap && account.is_oldest(self.ticket)
    }

    fn refused(&self, refusal: Refusal) -> ApiError {
        match refusal {
            Refusal::Tenant => busy(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "this model's requests in flight would pass its cap of {} bytes; retry shortly",
                    self.budget.tenant_cap
                ),
            ),
            Refusal::Agent => busy(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "this agent's requests in flight would pass its cap of {} bytes; retry shortly",
                    self.budget.agent_cap
                ),
            ),
        }
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
        if n == 0 {
            return;
        }
        self.tenant.bytes.fetch_sub(n, Ordering::AcqRel);
        self.budget.agent.bytes.fetch_sub(n, Ordering::AcqRel);
        self.bytes -= n;
        self.budget.released.notify_waiters();
    }

    #[cfg(test)]
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.shrink(self.bytes);
        self.tenant.tickets().remove(&self.ticket);
        self.budget.agent.tickets().remove(&self.ticket);
        // Someone may be the oldest now.
        self.budget.released.notify_waiters();
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

    fn soon(ms: u64) -> Instant {
        Instant::now() + std::time::Duration::from_millis(ms)
    }

    #[tokio::test]
    async fn of_two_bodies_competing_for_a_cap_the_older_waits_and_the_younger_gives_up() {
        let budget = Budget::new(100, 60);
        let mut older = budget.open("a");
        let mut younger = budget.open("a");
        older.grow(30).expect("room");
        younger.grow(30).expect("room");
        // Both now need more than is left. The younger is refused at once...
        let e = younger
            .grow_or_wait(20, soon(10_000))
            .await
            .expect_err("the younger gives up");
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        // ...while the older waits for room, and gets it when the younger releases.
        let waiting =
            tokio::spawn(async move { older.grow_or_wait(20, soon(10_000)).await.map(|()| older) });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "the older should be waiting");
        drop(younger);
        let older = waiting
            .await
            .expect("task")
            .expect("room after the release");
        assert_eq!(older.bytes(), 50);
    }

    #[tokio::test]
    async fn a_request_waits_no_longer_than_its_deadline_nor_for_room_it_could_never_have() {
        let budget = Budget::new(100, 60);
        let mut older = budget.open("a");
        let mut held = budget.open("a");
        held.grow(50).expect("room");
        let e = older
            .grow_or_wait(20, soon(50))
            .await
            .expect_err("still no room at the deadline");
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        // More than the cap itself is refused without waiting.
        let e = older
            .grow_or_wait(61, soon(60_000))
            .await
            .expect_err("past the cap alone");
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        // At the agent's cap the oldest request on the agent waits, here for tenant c's bytes.
        drop(held);
        let mut b = budget.open("b");
        b.grow(50).expect("room");
        let mut c = budget.open("c");
        c.grow(40).expect("room");
        let waiting =
            tokio::spawn(async move { older.grow_or_wait(20, soon(10_000)).await.map(|()| older) });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(c);
        let older = waiting.await.expect("task").expect("room at the agent");
        assert_eq!((older.bytes(), budget.in_flight()), (20, 70));
    }
}
