//! One tenant's scaling decision for this round: its profile, approach and knobs (DNNScaler),
//! its replica count and the footprint of one replica. Pure; what it recalls of past rounds is
//! `TenantRecall`, rebuilt from the tenant's status after an operator restart.

use crate::reason::EventReason;
use cotenant_crds::convert::{self, bounds_and_slo};
use cotenant_crds::report::TenantReport;
use cotenant_crds::{ModelTenant, Profile as SpecProfile};
use cotenant_policy::{
    Approach, Controller, Epoch, Knobs, LatencyModel, Learned, Measured, ReplicaConfig,
    RoundConfig, STEP_INTERVAL_S, ScalerConfig, ScalerState, TenantObservation, TenantRound,
    choose_approach, demand,
};
use kube::ResourceExt;

/// Largest batch and instance count the profiler measures.
const PROFILE_K: u32 = 4;

/// What the operator remembers of a tenant between rounds.
pub struct TenantRecall {
    /// The policy's round for the tenant, once it has a profile.
    pub round: Option<TenantRound>,
    /// The replica count to start the round from: the status's, after an operator restart.
    replicas: u32,
    /// Weight bytes an agent reported, known before any profile.
    pub weight_bytes: Option<u64>,
    /// The knobs decided last, the replicas serving and the replica count decided, and when
    /// one of them last changed (operator seconds; `None` until then under this operator). A
    /// replica that moves is added before the old one goes, so the serving count moves too.
    configured: Option<(Knobs, u32, u32)>,
    configured_at_s: Option<f64>,
}

impl TenantRecall {
    pub fn new(tenant: &ModelTenant) -> TenantRecall {
        let replicas = tenant
            .status
            .as_ref()
            .and_then(|s| s.replicas)
            .unwrap_or(tenant.spec.scaling.min_replicas);
        TenantRecall {
            round: None,
            replicas: replicas.max(1),
            weight_bytes: None,
            configured: None,
            configured_at_s: None,
        }
    }

    fn scaler(&self) -> Option<&ScalerState> {
        match &self.round.as_ref()?.controller {
            Controller::Scaler(s) => Some(s),
            Controller::Static(_) | Controller::Aimd { .. } => None,
        }
    }
}

/// A user-visible decision, recorded as a Kubernetes Event on its tenant or pool.
#[derive(Clone, Debug, PartialEq)]
pub struct EventToRecord {
    pub reason: EventReason,
    pub message: String,
}

/// Load and latency summed over the tenant's ready replicas.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Aggregate {
    pub replicas: u32,
    pub arrival_rate: f64,
    pub throughput: f64,
    /// Worst replica's latency at the SLO percentile (NaN without traffic).
    pub latency_ms: f64,
    /// Worst replica's compute time at the SLO percentile, where the agents report it.
    pub compute_ms: Option<f64>,
    pub queue_depth: u64,
    pub completions: u64,
    /// Completion-weighted SLO attainment.
    pub attainment: Option<f64>,
    /// Requests admission control refused.
    pub shed: u64,
    /// Seconds since the replica that took up its knobs last did so (infinite where no
    /// replica says).
    pub knobs_age_s: f64,
}

pub fn aggregate(reports: &[&TenantReport]) -> Aggregate {
    let mut a = Aggregate {
        latency_ms: f64::NAN,
        knobs_age_s: f64::INFINITY,
        ..Aggregate::default()
    };
    let mut attained = 0.0;
    for r in reports.iter().filter_map(|r| r.serving()) {
        // Counters come from agents: they saturate rather than overflow.
        a.replicas += 1;
        a.queue_depth = a.queue_depth.saturating_add(r.queue_depth);
        if let Some(l) = r.latency_at_percentile_millis.filter(|l| l.is_finite()) {
            a.latency_ms = if a.latency_ms.is_nan() {
                l
            } else {
                a.latency_ms.max(l)
            };
        }
        if let Some(c) = r.compute_at_percentile_millis.filter(|c| c.is_finite()) {
            a.compute_ms = Some(a.compute_ms.map_or(c, |w| w.max(c)));
        }
        if r.since_knobs_changed_seconds >= 0.0 {
            a.knobs_age_s = a.knobs_age_s.min(r.since_knobs_changed_seconds);
        }
        let w = &r.window;
        a.arrival_rate += w.arrival_rate_per_second;
        a.throughput += w.throughput_per_second;
        a.completions = a.completions.saturating_add(w.completions);
        a.shed = a.shed.saturating_add(w.shed);
        if let Some(s) = w.slo_attainment {
            attained += s * w.completions as f64;
        }
    }
    if a.completions > 0 {
        a.attainment = Some(attained / a.completions as f64);
    }
    a
}

/// Which knobs the replicas' windows measured, and for how long: `wanted` when every serving
/// replica runs it, for as long as the one that took it up last has; `None` while some replica
/// still runs other knobs (the new ones have not reached its agent yet). Where the model's
/// batch cannot move (`batch_moves` false: its profile has no point above batch 1), a replica
/// at batch 1 runs any batch the scaler asks for.
pub fn epoch(reports: &[&TenantReport], wanted: Knobs, batch_moves: bool) -> Option<Epoch> {
    let mut seconds = f64::INFINITY;
    for s in reports.iter().filter_map(|r| r.serving()) {
        let runs = convert::knobs(&s.knobs);
        let same = runs == wanted
            || (!batch_moves && runs.batch == 1 && runs.instances == wanted.instances);
        if !same || s.since_knobs_changed_seconds.is_nan() {
            return None;
        }
        seconds = seconds.min(s.since_knobs_changed_seconds.max(0.0));
    }
    seconds.is_finite().then_some(Epoch {
        knobs: wanted,
        seconds,
    })
}

/// The outcome of one round for one tenant.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantDecision {
    /// The approach DNNScaler applies, once chosen.
    pub approach: Option<Approach>,
    pub knobs: Knobs,
    /// What DNNScaler has learned so far, to keep in the status.
    pub learned: Option<Learned>,
    pub replicas: u32,
    /// Device memory one replica needs at `knobs`; 0 while unknown.
    pub memory_bytes: u64,
    /// Device share one replica keeps busy at the observed load.
    pub load: f64,
    /// The profile to record in the status (new or as it was).
    pub profile: Option<SpecProfile>,
    /// Ask an agent to profile (up to these knobs) because no profile exists yet.
    pub wants_profile: Option<Knobs>,
    /// Why the model cannot run, as its agent reported.
    pub failure: Option<String>,
    pub aggregate: Aggregate,
    /// Seconds the replicas have served at the current knobs and replica count (of those
    /// serving and of those decided): what the aggregate measures is this configuration's once
    /// that is long enough.
    pub configured_for_s: f64,
    pub events: Vec<EventToRecord>,
}

/// Decides `tenant`'s knobs and replicas from its replicas' reports.
pub fn decide(
    tenant: &ModelTenant,
    reports: &[&TenantReport],
    recall: &mut TenantRecall,
    tuning: &super::Tuning,
    largest_agent: u64,
    now_s: f64,
    now_rfc3339: &str,
) -> TenantDecision {
    let (bounds, slo) = bounds_and_slo(&tenant.spec);
    let status = tenant.status.clone().unwrap_or_default();
    let model_name = tenant.name_any();
    let mut events = Vec::new();
    let aggregate = aggregate(reports);
    let failure = reports.iter().find_map(|r| r.error()).map(str::to_string);
    if let Some(w) = reports
        .iter()
        .find_map(|r| r.serving().map(|s| s.weight_bytes))
    {
        recall.weight_bytes = Some(w);
    }

    // The profile: recorded in the status for this model, or just measured by an agent. A new
    // model is measured again and DNNScaler starts over.
    let uri = &tenant.spec.model.uri;
    let mut profile = status
        .profile
        .clone()
        .filter(|p| p.model_uri.as_ref().is_none_or(|m| m == uri));
    if profile.is_none()
        && status.profile.is_some()
        && let Some(round) = recall.round.take()
    {
        recall.replicas = round.replicas.replicas;
        events.push(EventToRecord {
            reason: EventReason::ModelChanged,
            message: format!("{uri}: profiling again"),
        });
    }
    let mut measured = profile
        .as_ref()
        .and_then(|p| convert::profile_from_status(&model_name, p));
    // Approach and knobs in the status belong to that profile (after an operator restart).
    let recorded_choice = measured.is_some();
    if measured.is_none()
        && let Some(p) = reports.iter().find_map(|r| r.profile.as_ref())
    {
        let recorded = convert::profile_to_status(p, uri, now_rfc3339.to_string());
        measured = convert::profile_from_status(&model_name, &recorded);
        if measured.is_some() {
            profile = Some(recorded);
        }
    }
    // Approach and knobs: as the status recorded them for this profile (after an operator
    // restart), or chosen now.
    if let (Some(p), None) = (&measured, &recall.round) {
        let restored = status
            .approach
            .filter(|_| recorded_choice)
            .zip(status.knobs.as_ref())
            .map(|(a, k)| (convert::approach(a), bounds.clamp(convert::knobs(k))));
        let (approach, knobs) = match restored {
            Some(r) => r,
            None => {
                let choice = choose_approach(p, &slo, &bounds);
                // One Event for the profile and the choice made from it.
                let measured_points = p
                    .points
                    .iter()
                    .map(|q| {
                        format!(
                            "batch {} x {} instances: {:.1}/s, {:.1} ms",
                            q.batch, q.instances, q.throughput, q.p99_ms
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("; ");
                events.push(EventToRecord {
                    reason: EventReason::ApproachChosen,
                    message: format!(
                        "{:?} at batch {} x {} instances (throughput gain: batching {:.2}, instances {:.2}{}); profile: {measured_points}",
                        choice.approach,
                        choice.knobs.batch,
                        choice.knobs.instances,
                        choice.gain_batching,
                        choice.gain_multi_tenancy,
                        choice
                            .gain_joint
                            .map(|g| format!(", joint {g:.2}"))
                            .unwrap_or_default()
                    ),
                });
                (choice.approach, choice.knobs)
            }
        };
        let mut scaler = ScalerState::new(approach, knobs, ScalerConfig::default());
        if let Some(m) = status.scaler.as_ref().filter(|_| recorded_choice) {
            scaler.restore(convert::learned(m));
        }
        recall.round = Some(TenantRound::new(
            Controller::Scaler(scaler),
            LatencyModel::from_profile(p),
            recall.replicas,
        ));
    }
    let batch_moves = measured
        .as_ref()
        .is_some_and(|p| p.points.iter().any(|q| q.batch > 1));

    // The policy's round: a knob step on fresh evidence, the replicas, the demand. While there
    // is no profile (it is being measured), or the model is broken, one replica.
    let (knobs, replicas, memory_bytes, load) = match recall.round.as_mut() {
        Some(round) if failure.is_none() => {
            let n = aggregate.replicas.max(1) as f64;
            let per_replica = (aggregate.replicas > 0).then(|| TenantObservation {
                arrival_rate: aggregate.arrival_rate / n,
                throughput: aggregate.throughput / n,
                latency_at_percentile_ms: aggregate.latency_ms,
                queue_depth: u32::try_from(aggregate.queue_depth).unwrap_or(u32::MAX),
                completed: aggregate.completions,
                compute_at_percentile_ms: aggregate.compute_ms,
                epoch: epoch(reports, round.controller.knobs(), batch_moves),
            });
            // Knobs whose replica no agent could hold are out of bounds.
            let bounds = round.model.within_memory(
                bounds,
                round.controller.knobs().instances,
                largest_agent,
            );
            let o = round.round(
                &Measured {
                    per_replica,
                    arrival_rate: aggregate.arrival_rate,
                },
                &slo,
                &bounds,
                &RoundConfig {
                    step_interval_s: STEP_INTERVAL_S,
                    replicas: ReplicaConfig {
                        scale_down_after_s: tuning.replica_scale_down_s,
                        ..ReplicaConfig::default()
                    },
                },
                now_s,
            );
            if o.knobs != o.knobs_before {
                events.push(EventToRecord {
                    reason: EventReason::KnobsChanged,
                    message: format!(
                        "batch {} x {} instances -> batch {} x {} instances (observed {:.1} ms at p{} against {} ms)",
                        o.knobs_before.batch,
                        o.knobs_before.instances,
                        o.knobs.batch,
                        o.knobs.instances,
                        aggregate.latency_ms,
                        slo.percentile,
                        slo.latency_ms
                    ),
                });
            }
            if o.replicas != o.replicas_before {
                events.push(EventToRecord {
                    reason: EventReason::ReplicasChanged,
                    message: format!(
                        "{} -> {} replicas (arrival {:.1}/s{})",
                        o.replicas_before,
                        o.replicas,
                        aggregate.arrival_rate,
                        if o.wants_more {
                            ", no knob meets the SLO"
                        } else {
                            ""
                        }
                    ),
                });
            }
            (o.knobs, o.replicas, o.demand.memory_bytes, o.demand.load)
        }
        Some(round) => {
            let knobs = bounds.clamp(round.controller.knobs());
            let d = demand(&round.model, knobs, aggregate.arrival_rate, 1);
            (knobs, 1, d.memory_bytes, d.load)
        }
        None => (Knobs::ONE, 1, recall.weight_bytes.unwrap_or(0), 0.0),
    };
    let configuration = (knobs, aggregate.replicas, replicas);
    let was = recall.configured.replace(configuration);
    if was.is_some_and(|w| w != configuration) {
        recall.configured_at_s = Some(now_s);
    }
    let configured_for_s = recall
        .configured_at_s
        .map_or(f64::INFINITY, |at| now_s - at)
        .min(aggregate.knobs_age_s);
    let wants_profile = (measured.is_none() && failure.is_none())
        .then(|| bounds.clamp(Knobs::new(PROFILE_K, PROFILE_K)));
    TenantDecision {
        approach: recall.scaler().map(|s| s.approach),
        knobs,
        learned: recall.scaler().and_then(ScalerState::learned),
        replicas,
        memory_bytes,
        load,
        profile,
        wants_profile,
        failure,
        aggregate,
        configured_for_s,
        events,
    }
}
