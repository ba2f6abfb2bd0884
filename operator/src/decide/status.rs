//! A tenant's status from this round's decision: phase, knobs, replicas, observations, endpoint
//! and the Ready / ModelLoaded / SLOMet conditions, each with a reason a user can act on.
//!
//! A status is written only when it differs, so nothing in it may move with every round's
//! noise: the observations are a summary ([`summary`]) kept until a value moves past a
//! threshold or the SLO flips, and the messages quote that summary. Its `measuredAt` says how
//! old it is; a steady tenant's status is never rewritten. What measurements alone move (the
//! summary, and SLOMet with the phase that follows it) moves at most once per [`DWELL_S`], so
//! a latency hovering at the SLO does not rewrite the status every round. A summary taken while
//! the knobs or the replica count were new measured a configuration in transition: in the
//! configuration's second [`DWELL_S`] it is replaced at half the thresholds, so that a value
//! that settled close to a threshold is not pushed over it by later noise. The live numbers are
//! the agents' Prometheus metrics.

use super::tenant::{Aggregate, TenantDecision};
use crate::reason::Reason;
use cotenant_crds::conditions::set_condition;
use cotenant_crds::convert::{chosen, scaler_memory, spec_knobs};
use cotenant_crds::report::served_name;
use cotenant_crds::{ModelTenant, ModelTenantStatus, Observed, ReplicaPlacement, TenantPhase};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

/// A summary value is rewritten when it moves by more than this share of itself…
const RELATIVE_CHANGE: f64 = 0.2;
/// …and by more than this many requests per second (rates) or milliseconds (latency).
const ABSOLUTE_CHANGE: f64 = 1.0;
/// Attainment is rewritten when it crosses this, or moves by more than [`ATTAINMENT_CHANGE`].
const ATTAINMENT_TARGET: f64 = 0.99;
const ATTAINMENT_CHANGE: f64 = 0.05;
/// Seconds a summary, and the SLOMet condition's state, are kept at least.
pub const DWELL_S: f64 = 30.0;

/// Where the tenant's replicas ended up.
pub struct Placement {
    pub placements: Vec<ReplicaPlacement>,
    /// The largest agent's memory, when one replica needs more than that.
    pub too_big: Option<u64>,
    /// Replicas that fit on no agent now.
    pub unplaced: u32,
    pub pool_at_max: bool,
}

pub fn tenant_status(
    tenant: &ModelTenant,
    d: &TenantDecision,
    placement: Placement,
    now: Timestamp,
) -> ModelTenantStatus {
    let generation = tenant.metadata.generation;
    let namespace = tenant.namespace().unwrap_or_default();
    let name = tenant.name_any();
    let mut s = tenant.status.clone().unwrap_or_default();
    let ready_replicas = placement.placements.iter().filter(|p| p.ready).count() as u32;
    s.replicas = Some(d.replicas);
    s.ready_replicas = Some(ready_replicas);
    s.placements = placement.placements;
    s.profile = d.profile.clone();
    s.knobs = Some(spec_knobs(d.knobs));
    s.approach = d.approach.map(chosen);
    s.scaler = d.learned.map(scaler_memory);
    s.endpoint = Some(format!(
        "http://{name}.{namespace}.svc:8000/v2/models/{}",
        served_name(&namespace, &name)
    ));
    s.observed_generation = generation;
    let a = &d.aggregate;
    let slo_ms = tenant.spec.slo.latency_millis;
    let measured_met = !(a.latency_ms.is_finite() && a.latency_ms > slo_ms);
    let was = s.conditions.iter().find(|c| c.type_ == "SLOMet");
    let was_met = was.map(|c| c.status == "True");
    // A flip waits until the last one is DWELL_S old.
    let flip_allowed = was.is_none_or(|c| dwelt(c.last_transition_time.0, now));
    let slo_met = match was_met {
        Some(m) if !flip_allowed => m,
        _ => measured_met,
    };
    if a.replicas > 0 {
        let flipped = was_met.is_some_and(|m| m != slo_met);
        s.observed = Some(summary(
            s.observed.as_ref(),
            a,
            now,
            flipped,
            d.configured_for_s,
        ));
    }
    // The latency the messages quote: the summary's, so they move only when it does.
    let quoted_ms = s
        .observed
        .as_ref()
        .map_or(a.latency_ms, |o| o.latency_millis);
    let (loaded, load_reason, load_message) = match (&d.failure, placement.too_big) {
        (Some(e), _) => {
            // Name the model, unless the agent already did.
            let uri = &tenant.spec.model.uri;
            let message = if e.contains(uri.trim_start_matches("file://")) {
                e.clone()
            } else {
                format!("{uri}: {e}")
            };
            (false, Reason::LoadFailed, message)
        }
        (None, Some(largest)) => (
            false,
            Reason::ModelTooLarge,
            format!(
                "one replica needs {} MiB but the largest agent of pool {:?} has {} MiB",
                d.memory_bytes >> 20,
                tenant.spec.pool,
                largest >> 20
            ),
        ),
        (None, None) if ready_replicas > 0 => (
            true,
            Reason::Loaded,
            format!("{ready_replicas} replica(s) loaded"),
        ),
        (None, None) => (
            false,
            Reason::Loading,
            "waiting for an agent to load the model".into(),
        ),
    };
    set_condition(
        &mut s.conditions,
        "ModelLoaded",
        loaded,
        load_reason.as_str(),
        &load_message,
        generation,
    );
    let (met_reason, met_message) = if !a.latency_ms.is_finite() {
        (
            Reason::NoTraffic,
            "no completed requests in the window".to_string(),
        )
    } else if slo_met {
        (
            Reason::WithinSLO,
            format!(
                "p{} {quoted_ms:.1} ms within {slo_ms} ms{}",
                tenant.spec.slo.percentile,
                shed_note(a)
            ),
        )
    } else {
        (
            Reason::SLOViolated,
            format!(
                "p{} {quoted_ms:.1} ms over {slo_ms} ms{}",
                tenant.spec.slo.percentile,
                shed_note(a)
            ),
        )
    };
    set_condition(
        &mut s.conditions,
        "SLOMet",
        slo_met,
        met_reason.as_str(),
        &met_message,
        generation,
    );

    let (phase, ready, reason, message) = if !loaded && load_reason != Reason::Loading {
        (TenantPhase::Failed, false, load_reason, load_message)
    } else if ready_replicas == 0 && placement.unplaced > 0 {
        let why = if placement.pool_at_max {
            "the pool is at maxAgents"
        } else {
            "the pool is adding agents"
        };
        (
            TenantPhase::Pending,
            false,
            Reason::AwaitingAgents,
            format!("no agent has room for a replica; {why}"),
        )
    } else if ready_replicas == 0 {
        (
            TenantPhase::Pending,
            false,
            Reason::Loading,
            "waiting for an agent to load the model".to_string(),
        )
    } else if d.wants_profile.is_some() {
        (
            TenantPhase::Profiling,
            true,
            Reason::Profiling,
            "serving on one replica while DNNScaler measures the model".to_string(),
        )
    } else if slo_met && ready_replicas >= d.replicas {
        (
            TenantPhase::Serving,
            true,
            Reason::Serving,
            format!("{ready_replicas} replica(s) serving"),
        )
    } else {
        (
            TenantPhase::Degraded,
            true,
            if slo_met {
                Reason::ScalingUp
            } else {
                Reason::SLOViolated
            },
            format!(
                "{ready_replicas} of {} replica(s) ready; {met_message}",
                d.replicas
            ),
        )
    };
    s.phase = Some(phase);
    set_condition(
        &mut s.conditions,
        "Ready",
        ready,
        reason.as_str(),
        &message,
        generation,
    );
    s
}

/// What admission control refused over the window, when that is at least 1% of the requests,
/// in steps of 10% (so the message does not move with every round). The SLO is held for the
/// requests accepted, so a tenant can meet it while refusing most of its load; the condition
/// says so instead of looking healthy.
fn shed_note(a: &Aggregate) -> String {
    let share = a.shed as f64 / a.shed.saturating_add(a.completions).max(1) as f64;
    if share < 0.01 {
        return String::new();
    }
    let about = if share < 0.1 {
        "under 10%".to_string()
    } else {
        format!("about {:.0}%", (share * 10.0).round() * 10.0)
    };
    format!("; {about} of requests refused by admission control")
}

/// The observations to keep in the status: `previous` while every value stays within the
/// thresholds of it and the SLO did not flip; otherwise this round's values, measured `now`.
/// `configured_for_s` is how long the tenant's knobs and replica count have been what they are:
/// a `previous` measured before they had served [`DWELL_S`] is compared at half the thresholds
/// while they serve their second [`DWELL_S`].
pub fn summary(
    previous: Option<&Observed>,
    a: &Aggregate,
    now: Timestamp,
    slo_flipped: bool,
    configured_for_s: f64,
) -> Observed {
    let latency = if a.latency_ms.is_finite() {
        round(a.latency_ms)
    } else {
        0.0
    };
    let current = Observed {
        measured_at: Some(now.to_string()),
        arrival_rate_per_second: round(a.arrival_rate),
        throughput_per_second: round(a.throughput),
        latency_millis: latency,
        slo_attainment: a.attainment.map_or(1.0, round),
    };
    let Some(p) = previous else {
        return current;
    };
    let young = p
        .measured_at
        .as_deref()
        .and_then(|t| t.parse::<Timestamp>().ok())
        .is_some_and(|t| !dwelt(t, now));
    if young && !slo_flipped {
        return p.clone();
    }
    // The configuration in its second DWELL_S: a summary kept for DWELL_S (not young) was
    // measured before the configuration had served its first.
    let in_transition = (DWELL_S..2.0 * DWELL_S).contains(&configured_for_s);
    let share = if in_transition { 0.5 } else { 1.0 };
    let moved = |old: f64, new: f64| {
        (new - old).abs() > share * (RELATIVE_CHANGE * old.abs()).max(ABSOLUTE_CHANGE)
    };
    let attainment_moved = (p.slo_attainment >= ATTAINMENT_TARGET)
        != (current.slo_attainment >= ATTAINMENT_TARGET)
        || (p.slo_attainment - current.slo_attainment).abs() > ATTAINMENT_CHANGE;
    let stale = slo_flipped
        || moved(p.arrival_rate_per_second, current.arrival_rate_per_second)
        || moved(p.throughput_per_second, current.throughput_per_second)
        || moved(p.latency_millis, current.latency_millis)
        || attainment_moved;
    if stale { current } else { p.clone() }
}

/// Whether what was set at `since` has been kept for [`DWELL_S`] by `now`. A `since` in the
/// future (another replica's clock, after a failover) has.
fn dwelt(since: Timestamp, now: Timestamp) -> bool {
    let kept_s = now.duration_since(since).as_secs_f64();
    !(0.0..DWELL_S).contains(&kept_s)
}

/// Two decimals.
fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}
