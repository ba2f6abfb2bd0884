//! Leader election on a `coordination.k8s.io/v1` Lease, with the timing rules of client-go:
//!
//! - The leader renews from its own task every [`RETRY`], apart from the work of a round, so a
//!   long round cannot starve the renewal.
//! - A leader acts only until [`RENEW_DEADLINE`] after the *start* of its last successful
//!   renewal, by its own monotonic clock ([`Fence`]). A leader that cannot renew stops acting
//!   then, whether its attempts failed, hung or were never made.
//! - A candidate judges expiry by its own clock ([`Observer`]): the lease is free once its record
//!   (the resourceVersion) has not changed for the lease duration since this candidate saw it
//!   change. The holder's `renewTime` is never compared with the candidate's wall clock, so skewed
//!   clocks cannot shorten a term.
//! - Fencing: every API write of a round goes through [`Fence::write_deadline`]. It starts only
//!   while the term is valid and is abandoned [`WRITE_GRACE`] after the term ends at the latest.
//!   A successor takes over no sooner than [`LEASE_DURATION`] after the deposed leader's last
//!   successful renewal, which is later than `RENEW_DEADLINE + WRITE_GRACE`, so the deposed
//!   leader's writes have ended before the successor's first round (up to the two clocks' rate
//!   difference, the assumption client-go makes too).
//!
//! Writes to the Lease carry its resourceVersion, so two candidates can never both win.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ObjectMeta, PostParams};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How long a candidate waits on an unchanged lease before taking it over.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How long after the start of its last successful renewal the leader may act.
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// How often the leader renews and a candidate retries.
pub const RETRY: Duration = Duration::from_secs(2);
/// How long a write may run past the end of the term before it is abandoned.
pub const WRITE_GRACE: Duration = Duration::from_secs(4);
/// Longest one acquire or renew attempt may take (a hung API server must not stall the elector).
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(4);
/// Bounds on a lease duration read from the Lease, which any writer of it can set.
const DURATION_BOUNDS_S: (i32, i32) = (1, 300);

const _: () = assert!(LEASE_DURATION.as_secs() > RENEW_DEADLINE.as_secs() + WRITE_GRACE.as_secs());

/// Why a write was not made or not finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FenceError {
    #[error("not the leader: the lease was not renewed within the renew deadline")]
    NotLeading,
    #[error("abandoned: the write outlived this replica's term as leader")]
    Abandoned,
}

/// Until when this replica may act as the leader, and which term it is in.
#[derive(Debug, Default)]
pub struct Fence {
    state: Mutex<Term>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Term {
    /// End of the current term; `None` when not leading.
    until: Option<Instant>,
    /// Counts the terms won, so a loss and a win between two looks are still seen.
    number: u64,
}

impl Fence {
    fn term(&self) -> std::sync::MutexGuard<'_, Term> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A renewal that started at `started` succeeded: the term runs until `RENEW_DEADLINE` later.
    pub fn renewed(&self, started: Instant) {
        let mut term = self.term();
        let was_acting = term.until.is_some_and(|until| started < until);
        if !was_acting {
            term.number += 1;
        }
        let until = started + RENEW_DEADLINE;
        term.until = Some(
            term.until
                .filter(|t| was_acting && *t > until)
                .unwrap_or(until),
        );
    }

    /// Someone else holds the lease, or this replica gave it up: stop at once.
    pub fn revoke(&self) {
        self.term().until = None;
    }

    /// The term number while acting at `now`.
    pub fn term_at(&self, now: Instant) -> Option<u64> {
        let term = *self.term();
        term.until.filter(|until| now < *until).map(|_| term.number)
    }

    /// The term number while acting now.
    pub fn current_term(&self) -> Option<u64> {
        self.term_at(Instant::now())
    }

    /// When a write starting at `now` must have finished: `Err` when it may not start at all.
    pub fn write_deadline(&self, now: Instant) -> Result<Instant, FenceError> {
        match self.term().until {
            Some(until) if now < until => Ok(until + WRITE_GRACE),
            _ => Err(FenceError::NotLeading),
        }
    }
}

/// What a candidate saw of the lease, and when by its own clock.
#[derive(Debug, Default)]
pub struct Observer {
    seen: Option<(String, Instant)>,
}

impl Observer {
    /// Records the lease's resourceVersion at `now`; only a change restarts the clock.
    pub fn observe(&mut self, version: &str, now: Instant) {
        if self.seen.as_ref().is_none_or(|(v, _)| v != version) {
            self.seen = Some((version.to_string(), now));
        }
    }

    /// Whether the record has stayed unchanged for `duration` of this observer's clock.
    pub fn expired(&self, now: Instant, duration: Duration) -> bool {
        self.seen
            .as_ref()
            .is_some_and(|(_, at)| now.saturating_duration_since(*at) >= duration)
    }
}

/// What a replica does with the lease it just read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// It holds the lease: renew it.
    Renew,
    /// Nobody holds it, or the holder let it lapse: take it.
    TakeOver,
    /// Someone else holds it.
    Wait,
}

/// Decides the move for `identity` on a lease whose spec is `spec`, as `observer` has seen it.
pub fn next_move(spec: &LeaseSpec, identity: &str, observer: &Observer, now: Instant) -> Move {
    match spec.holder_identity.as_deref() {
        Some(holder) if holder == identity => Move::Renew,
        None | Some("") => Move::TakeOver,
        Some(_) if observer.expired(now, lease_duration(spec)) => Move::TakeOver,
        Some(_) => Move::Wait,
    }
}

/// The lease's own duration, within sane bounds.
fn lease_duration(spec: &LeaseSpec) -> Duration {
    let seconds = spec
        .lease_duration_seconds
        .map_or(LEASE_DURATION.as_secs() as i32, |s| {
            s.clamp(DURATION_BOUNDS_S.0, DURATION_BOUNDS_S.1)
        });
    Duration::from_secs(seconds as u64)
}

/// This replica's side of the election on the Lease `cotenant-operator`.
pub struct Leadership {
    api: Api<Lease>,
    name: String,
    pub identity: String,
    observer: Mutex<Observer>,
}

impl Leadership {
    pub fn new(client: kube::Client, namespace: &str, identity: String) -> Leadership {
        Leadership {
            api: Api::namespaced(client, namespace),
            name: "cotenant-operator".into(),
            identity,
            observer: Mutex::new(Observer::default()),
        }
    }

    fn observer(&self) -> std::sync::MutexGuard<'_, Observer> {
        self.observer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One attempt: true when this replica holds the lease afterwards, false when another does.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return self.create().await;
        };
        let now = Instant::now();
        let version = lease.resource_version().unwrap_or_default();
        let spec = lease.spec.get_or_insert_with(Default::default);
        let decision = {
            let mut observer = self.observer();
            observer.observe(&version, now);
            next_move(spec, &self.identity, &observer, now)
        };
        let stamp = MicroTime(Timestamp::now());
        match decision {
            Move::Wait => return Ok(false),
            Move::Renew => {}
            Move::TakeOver => {
                spec.holder_identity = Some(self.identity.clone());
                spec.acquire_time = Some(stamp.clone());
                spec.lease_transitions =
                    Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
            }
        }
        spec.lease_duration_seconds = Some(LEASE_DURATION.as_secs() as i32);
        spec.renew_time = Some(stamp);
        // The resourceVersion read above makes this a compare-and-swap.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn create(&self) -> Result<bool, kube::Error> {
        let now = MicroTime(Timestamp::now());
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.identity.clone()),
                lease_duration_seconds: Some(LEASE_DURATION.as_secs() as i32),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the lease up so a successor need not wait for it to expire. Call after the last
    /// write: the fence is revoked first.
    pub async fn release(&self, fence: &Fence) {
        fence.revoke();
        let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await else {
            return;
        };
        let Some(spec) = lease.spec.as_mut() else {
            return;
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        spec.lease_duration_seconds = Some(DURATION_BOUNDS_S.0);
        if let Err(e) = self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            tracing::warn!(error = %e, "could not release the leader lease");
        }
    }
}

/// Runs the election until the task is aborted: renews or tries to acquire every [`RETRY`],
/// keeps `fence` current, and sends the term number (or `None`) whenever it may have changed.
pub fn spawn(
    leadership: Arc<Leadership>,
    fence: Arc<Fence>,
) -> (tokio::task::JoinHandle<()>, watch::Receiver<Option<u64>>) {
    let (tx, rx) = watch::channel(None);
    let task = tokio::spawn(async move {
        loop {
            let started = Instant::now();
            match tokio::time::timeout(ATTEMPT_TIMEOUT, leadership.try_acquire_or_renew()).await {
                Ok(Ok(true)) => fence.renewed(started),
                Ok(Ok(false)) => fence.revoke(),
                // The term runs out on its own unless a later attempt succeeds in time.
                Ok(Err(e)) => tracing::warn!(error = %e, "leader election failed; retrying"),
                Err(_) => tracing::warn!(
                    timeout = ?ATTEMPT_TIMEOUT,
                    "leader election got no answer; retrying"
                ),
            }
            tx.send_if_modified(|term| {
                let now = fence.current_term();
                std::mem::replace(term, now) != now
            });
            // Wake at the end of the term too, so its lapse is announced when it happens.
            let next = started + RETRY;
            let wake = match fence.write_deadline(Instant::now()) {
                Ok(grace_end) => next.min(grace_end - WRITE_GRACE),
                Err(_) => next,
            };
            tokio::time::sleep_until(wake.into()).await;
        }
    });
    (task, rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, duration_s: Option<i32>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            lease_duration_seconds: duration_s,
            // A holder's clock far ahead of ours: it must not matter.
            renew_time: Some(MicroTime(
                Timestamp::from_second(4_000_000_000).expect("timestamp"),
            )),
            ..Default::default()
        }
    }

    fn s(seconds: u64) -> Duration {
        Duration::from_secs(seconds)
    }

    #[test]
    fn expiry_is_judged_by_the_observers_clock_not_the_holders_timestamps() {
        let t0 = Instant::now();
        let spec = lease(Some("a"), Some(15));
        let mut seen = Observer::default();
        seen.observe("100", t0);
        assert_eq!(next_move(&spec, "b", &seen, t0 + s(14)), Move::Wait);
        assert_eq!(next_move(&spec, "b", &seen, t0 + s(15)), Move::TakeOver);

        // A record that keeps changing never expires, however old its first sighting.
        let mut renewed = Observer::default();
        for i in 0..20u64 {
            renewed.observe(&format!("{}", 100 + i), t0 + s(2 * i));
        }
        assert_eq!(next_move(&spec, "b", &renewed, t0 + s(50)), Move::Wait);
        assert_eq!(next_move(&spec, "b", &renewed, t0 + s(53)), Move::TakeOver);
    }

    #[test]
    fn a_candidate_that_just_started_waits_a_full_lease_duration() {
        // Even when the holder's renewTime is ancient: the candidate has only just seen it.
        let t0 = Instant::now();
        let mut spec = lease(Some("a"), Some(15));
        spec.renew_time = Some(MicroTime(Timestamp::UNIX_EPOCH));
        let mut seen = Observer::default();
        seen.observe("7", t0 + s(100));
        assert_eq!(next_move(&spec, "b", &seen, t0 + s(101)), Move::Wait);
        assert_eq!(next_move(&spec, "b", &seen, t0 + s(115)), Move::TakeOver);
        // Never seen at all: not expired.
        assert_eq!(
            next_move(&spec, "b", &Observer::default(), t0 + s(1000)),
            Move::Wait
        );
    }

    #[test]
    fn free_and_own_leases() {
        let t0 = Instant::now();
        let seen = Observer::default();
        assert_eq!(
            next_move(&lease(None, None), "b", &seen, t0),
            Move::TakeOver
        );
        assert_eq!(
            next_move(&lease(Some(""), None), "b", &seen, t0),
            Move::TakeOver
        );
        assert_eq!(
            next_move(&lease(Some("b"), None), "b", &seen, t0),
            Move::Renew
        );
    }

    #[test]
    fn a_lease_duration_written_by_anyone_is_bounded() {
        let t0 = Instant::now();
        let mut seen = Observer::default();
        seen.observe("1", t0);
        let forever = lease(Some("a"), Some(i32::MAX));
        assert_eq!(next_move(&forever, "b", &seen, t0 + s(299)), Move::Wait);
        assert_eq!(next_move(&forever, "b", &seen, t0 + s(300)), Move::TakeOver);
        let negative = lease(Some("a"), Some(-5));
        assert_eq!(next_move(&negative, "b", &seen, t0 + s(1)), Move::TakeOver);
    }

    #[test]
    fn a_leader_that_cannot_renew_stops_at_its_deadline() {
        let t0 = Instant::now();
        let fence = Fence::default();
        assert_eq!(fence.term_at(t0), None);
        assert_eq!(fence.write_deadline(t0), Err(FenceError::NotLeading));
        fence.renewed(t0);
        let term = fence.term_at(t0 + s(9)).expect("leading");
        // No further renewal succeeds: nothing more is written from the deadline on.
        assert_eq!(fence.term_at(t0 + RENEW_DEADLINE), None);
        assert_eq!(
            fence.write_deadline(t0 + RENEW_DEADLINE),
            Err(FenceError::NotLeading)
        );
        // A write started just before the deadline must end within the grace.
        assert_eq!(
            fence.write_deadline(t0 + s(9)),
            Ok(t0 + RENEW_DEADLINE + WRITE_GRACE)
        );
        // Renewals keep the same term going.
        fence.renewed(t0 + s(2));
        assert_eq!(fence.term_at(t0 + s(11)), Some(term));
        // Losing the lease ends the term at once; winning again starts a new one.
        fence.revoke();
        assert_eq!(fence.term_at(t0 + s(3)), None);
        fence.renewed(t0 + s(4));
        assert_eq!(fence.term_at(t0 + s(5)), Some(term + 1));
    }

    #[test]
    fn a_renewal_that_lapsed_before_it_succeeded_starts_a_new_term() {
        let t0 = Instant::now();
        let fence = Fence::default();
        fence.renewed(t0);
        let first = fence.term_at(t0).expect("leading");
        fence.renewed(t0 + s(12));
        assert_eq!(fence.term_at(t0 + s(13)), Some(first + 1));
    }

    #[test]
    fn a_deposed_leaders_last_write_ends_before_a_successor_can_act() {
        // The successor sees the last renewal land no earlier than it started.
        let renewal_started = Instant::now();
        let fence = Fence::default();
        fence.renewed(renewal_started);
        let mut successor = Observer::default();
        successor.observe("last", renewal_started);
        let spec = lease(Some("old"), Some(LEASE_DURATION.as_secs() as i32));
        let last_write_start = renewal_started + RENEW_DEADLINE - Duration::from_millis(1);
        let last_write_end = fence
            .write_deadline(last_write_start)
            .expect("still leading");
        let takeover = (0..600)
            .map(|ms| renewal_started + Duration::from_millis(ms * 50))
            .find(|t| next_move(&spec, "new", &successor, *t) == Move::TakeOver)
            .expect("the successor takes over eventually");
        assert!(last_write_end < takeover);
    }
}
