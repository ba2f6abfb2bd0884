//! A tenant's status from this round's decision: phase, knobs, replicas, observations, endpoint
//! and the Ready / ModelLoaded / SLOMet conditions, each with a reason a user can act on.

use super::tenant::{Aggregate, TenantDecision};
use cotenant_crds::conditions::set_condition;
use cotenant_crds::policy_view::{chosen, scaler_memory, spec_knobs};
use cotenant_crds::report::served_name;
use cotenant_crds::{ModelTenant, ModelTenantStatus, Observed, ReplicaPlacement, TenantPhase};
use kube::ResourceExt;

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
    if a.replicas > 0 {
        s.observed = Some(Observed {
            arrival_rate_per_second: round(a.arrival_rate),
            throughput_per_second: round(a.throughput),
            latency_millis: if a.latency_ms.is_finite() {
                round(a.latency_ms)
            } else {
                0.0
            },
            slo_attainment: a.attainment.map_or(1.0, round),
        });
    }

    let slo_ms = tenant.spec.slo.latency_millis;
    let slo_met = !(a.latency_ms.is_finite() && a.latency_ms > slo_ms);
    let (loaded, load_reason, load_message) = match (&d.failure, placement.too_big) {
        (Some(e), _) => {
            // Name the model, unless the agent already did.
            let uri = &tenant.spec.model.uri;
            let message = if e.contains(uri.trim_start_matches("file://")) {
                e.clone()
            } else {
                format!("{uri}: {e}")
            };
            (false, "LoadFailed", message)
        }
        (None, Some(largest)) => (
            false,
            "ModelTooLarge",
            format!(
                "one replica needs {} MiB but the largest agent of pool {:?} has {} MiB",
                d.memory_bytes >> 20,
                tenant.spec.pool,
                largest >> 20
            ),
        ),
        (None, None) if ready_replicas > 0 => (
            true,
            "Loaded",
            format!("{ready_replicas} replica(s) loaded"),
        ),
        (None, None) => (
            false,
            "Loading",
            "waiting for an agent to load the model".into(),
        ),
    };
    set_condition(
        &mut s.conditions,
        "ModelLoaded",
        loaded,
        load_reason,
        &load_message,
        generation,
    );
    let (met_reason, met_message) = if !a.latency_ms.is_finite() {
        (
            "NoTraffic",
            "no completed requests in the window".to_string(),
        )
    } else if slo_met {
        (
            "WithinSLO",
            format!(
                "p{} {:.1} ms within {slo_ms} ms{}",
                tenant.spec.slo.percentile,
                a.latency_ms,
                shed_note(a)
            ),
        )
    } else {
        (
            "SLOViolated",
            format!(
                "p{} {:.1} ms over {slo_ms} ms{}",
                tenant.spec.slo.percentile,
                a.latency_ms,
                shed_note(a)
            ),
        )
    };
    set_condition(
        &mut s.conditions,
        "SLOMet",
        slo_met,
        met_reason,
        &met_message,
        generation,
    );

    let (phase, ready, reason, message) = if !loaded && load_reason != "Loading" {
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
            "AwaitingAgents",
            format!("no agent has room for a replica; {why}"),
        )
    } else if ready_replicas == 0 {
        (
            TenantPhase::Pending,
            false,
            "Loading",
            "waiting for an agent to load the model".to_string(),
        )
    } else if d.wants_profile.is_some() {
        (
            TenantPhase::Profiling,
            true,
            "Profiling",
            "serving on one replica while DNNScaler measures the model".to_string(),
        )
    } else if slo_met && ready_replicas >= d.replicas {
        (
            TenantPhase::Serving,
            true,
            "Serving",
            format!("{ready_replicas} replica(s) serving"),
        )
    } else {
        (
            TenantPhase::Degraded,
            true,
            if slo_met { "ScalingUp" } else { "SLOViolated" },
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
        reason,
        &message,
        generation,
    );
    s
}

/// What admission control refused over the window, when that is at least 1% of the requests.
/// The SLO is held for the requests accepted, so a tenant can meet it while refusing most of its
/// load; the condition says so instead of looking healthy.
fn shed_note(a: &Aggregate) -> String {
    let share = a.shed as f64 / a.shed.saturating_add(a.completions).max(1) as f64;
    if share < 0.01 {
        return String::new();
    }
    format!(
        "; {:.0}% of requests refused by admission control",
        share * 100.0
    )
}

/// Two decimals: statuses should not churn on noise below that.
fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}
