//! DNNScaler on the agent (standalone mode, where no operator decides; `--knob-policy` swaps in
//! static knobs or Clipper-style AIMD to compare against): profile each tenant at
//! (batch 1, 1 instance), (batch k, 1 instance) and (batch 1, k instances), let the policy choose
//! the approach, then move the knobs under feedback from the tenant's own measurements. The
//! decisions are `cotenant-policy`'s, the same code the operator runs.

use cotenant_executor::RunError;
use cotenant_executor::runtime::{Stats, Tenant, batchable, measure_within};
use cotenant_policy as policy;
use policy::{
    Bounds, Controller, Decision, Knobs, LatencyModel, Measured, Profile, ProfilePoint,
    ReplicaConfig, RoundConfig, STEP_INTERVAL_S, ScalerConfig, Slo, Strategy, TenantRound,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a whole profile may take: no run starts after it (a model slow at a large batch
/// costs one run past it, never an unbounded profile).
pub const PROFILE_DEADLINE: Duration = Duration::from_secs(120);

/// Instances at the joint point: DNNScaler's Joint approach keeps this many instances and moves
/// the batch size. Two, the fewest that show whether instances add to batching, at the least
/// memory (the instances share the weights, but each holds a batch's activations).
pub const JOINT_INSTANCES: u32 = 2;

/// Measures the profile points (k = 4, within the bounds; see [`profile_points`]), each for
/// `per_point`, within [`PROFILE_DEADLINE`]. Blocking: call it off the async workers.
pub fn profile(
    name: &str,
    tenant: &Tenant,
    bounds: &Bounds,
    threads: usize,
    per_point: Duration,
) -> Result<Profile, RunError> {
    let k = 4;
    profile_points(
        name,
        tenant,
        bounds.max_batch.min(k),
        bounds.max_instances.min(k),
        threads,
        per_point,
        Instant::now() + PROFILE_DEADLINE,
    )
}

/// Measures (batch 1, 1 instance), (batch `k_batch`, 1 instance), (batch 1, `k_instances`
/// instances) and, where both knobs can move, the joint point (batch `k_batch`,
/// [`JOINT_INSTANCES`] instances), each for `per_point`, starting no run after `deadline`;
/// repeated settings are measured once. A model whose requests never share a batch is measured
/// at batch 1 only (its batch knob cannot move). Blocking: call it off the async workers.
pub fn profile_points(
    name: &str,
    tenant: &Tenant,
    k_batch: u32,
    k_instances: u32,
    threads: usize,
    per_point: Duration,
    deadline: Instant,
) -> Result<Profile, RunError> {
    let model = tenant.model();
    let k_batch = if batchable(&model.plan) { k_batch } else { 1 };
    let mut settings: Vec<Knobs> = Vec::new();
    let joint = (k_batch > 1 && k_instances > 1)
        .then(|| Knobs::new(k_batch, k_instances.min(JOINT_INSTANCES)));
    let single_knob = [
        Knobs::new(1, 1),
        Knobs::new(k_batch.max(1), 1),
        Knobs::new(1, k_instances.max(1)),
    ];
    for knobs in single_knob.into_iter().chain(joint) {
        if !settings.contains(&knobs) {
            settings.push(knobs);
        }
    }
    let mut points = Vec::new();
    for knobs in settings {
        let batch = knobs.batch as usize;
        let inputs = model.plan.example_inputs(batch);
        let m = measure_within(
            tenant.device(),
            model,
            &inputs,
            batch,
            knobs.instances as usize,
            threads,
            per_point,
            1,
            deadline,
        )?;
        points.push(ProfilePoint {
            batch: knobs.batch,
            instances: knobs.instances,
            throughput: m.throughput,
            p99_ms: m.percentile_ms(99.0),
            peak_activation_bytes: model.plan.peak_activation_bytes(batch).unwrap_or(0) as u64,
            gpu_util: None,
        });
    }
    Ok(Profile {
        model: name.to_string(),
        weight_bytes: model.plan.weight_bytes() as u64,
        points,
    })
}

/// Which policy moves a standalone tenant's knobs: DNNScaler, or a peer to compare it with.
pub fn parse_knob_policy(text: &str) -> Result<Strategy, String> {
    let bad = || {
        format!("unknown knob policy {text:?}: use dnnscaler, aimd or static:<batch>x<instances>")
    };
    match text {
        "dnnscaler" => Ok(Strategy::DnnScaler(ScalerConfig::default())),
        // Clipper's additive increase, multiplicative decrease by 10%.
        "aimd" => Ok(Strategy::Aimd { decrease: 0.9 }),
        _ => {
            let (b, m) = text
                .strip_prefix("static:")
                .and_then(|k| k.split_once('x'))
                .ok_or_else(bad)?;
            let b: u32 = b.parse().map_err(|_| bad())?;
            let m: u32 = m.parse().map_err(|_| bad())?;
            if b == 0 || m == 0 {
                return Err(bad());
            }
            Ok(Strategy::Static(Knobs::new(b, m)))
        }
    }
}

/// One tenant under a knob controller's feedback: the policy's round, with one replica.
pub struct Controlled {
    pub name: String,
    pub tenant: Arc<Tenant>,
    pub slo: Slo,
    pub bounds: Bounds,
    pub round: TenantRound,
    started: Instant,
}

/// The round as standalone mode runs it: knob steps as often as the operator takes them.
/// Standalone mode has one replica, so the replica count the round sets goes unused.
fn round_config() -> RoundConfig {
    RoundConfig {
        step_interval_s: STEP_INTERVAL_S,
        replicas: ReplicaConfig::default(),
    }
}

impl Controlled {
    /// Starts `strategy` from `profile` (DNNScaler chooses its approach here), applies its first
    /// knobs, and takes control.
    pub fn start(
        name: &str,
        tenant: Arc<Tenant>,
        profile: &Profile,
        slo: Slo,
        bounds: Bounds,
        strategy: Strategy,
    ) -> Controlled {
        let controller = Controller::new(strategy, profile, &slo, &bounds);
        apply(&tenant, controller.knobs(), &slo);
        Controlled {
            name: name.to_string(),
            tenant,
            slo,
            bounds,
            round: TenantRound::new(controller, LatencyModel::from_profile(profile), 1),
            started: Instant::now(),
        }
    }

    /// One round on the tenant's window; returns the decision it applied.
    pub fn step(&mut self) -> Decision {
        let window = observe(
            self.tenant.stats(),
            &self.slo,
            self.tenant.queue_depth(),
            self.round.controller.knobs(),
        );
        let measured = Measured {
            per_replica: Some(window),
            arrival_rate: window.arrival_rate,
        };
        let now_s = self.started.elapsed().as_secs_f64();
        let o = self
            .round
            .round(&measured, &self.slo, &self.bounds, &round_config(), now_s);
        if o.knobs != o.knobs_before {
            apply(&self.tenant, o.knobs, &self.slo);
            Decision::SetKnobs(o.knobs)
        } else if o.wants_more {
            Decision::NeedReplicas
        } else {
            Decision::Hold
        }
    }
}

/// What the scaler reads of a tenant's window: its load, its latency and compute time at the
/// SLO's percentile, and how long `knobs` (the knobs last applied to it) have run: the window
/// begins where they took effect.
pub fn observe(
    stats: &Stats,
    slo: &Slo,
    queue_depth: usize,
    knobs: Knobs,
) -> policy::TenantObservation {
    let w = stats.window();
    let millis = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1e3);
    policy::TenantObservation {
        arrival_rate: w.arrival_rate_per_sec,
        throughput: w.throughput_per_sec,
        latency_at_percentile_ms: millis(stats.latency_percentile(slo.percentile))
            .unwrap_or(f64::NAN),
        queue_depth: u32::try_from(queue_depth).unwrap_or(u32::MAX),
        completed: w.completions,
        compute_at_percentile_ms: millis(stats.compute_percentile(slo.percentile)),
        epoch: Some(policy::Epoch {
            knobs,
            seconds: w.epoch_secs,
        }),
    }
}

fn apply(tenant: &Tenant, knobs: Knobs, slo: &Slo) {
    let delay = Duration::from_secs_f64(slo.latency_ms / 1e3 / 10.0);
    tenant.set_knobs(knobs.batch as usize, knobs.instances as usize, delay);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load;
    use cotenant_executor::Device;
    use std::time::Duration;

    fn tenant(model: &[u8]) -> Tenant {
        let config = load::config(
            "profiled",
            Duration::from_secs(5),
            99.0,
            1,
            1,
            1,
            &Device::Cpu,
        );
        let sizing = load::Sizing {
            memory_limit: 1 << 30,
            largest_batch: 4,
        };
        let loaded = load::start(model, config, sizing, None).expect("loads");
        Arc::try_unwrap(loaded.tenant).unwrap_or_else(|_| panic!("one owner"))
    }

    /// A profile past its deadline stops before measuring and says so.
    #[test]
    fn a_profile_stops_at_its_deadline() {
        let t = tenant(&load::tests::squeezenet());
        let e = profile_points("p", &t, 4, 2, 1, Duration::from_secs(60), Instant::now())
            .expect_err("past its deadline");
        assert!(matches!(e, RunError::Deadline(_)), "{e}");
    }

    /// A model whose requests never share a batch is profiled at batch 1 only: its batch knob
    /// cannot move, so DNNScaler must not be shown what batching would gain.
    #[test]
    fn a_model_that_mixes_rows_is_profiled_without_batching() {
        let t = tenant(&load::tests::batch_normalising_model());
        assert!(t.batch_refusal().is_some());
        let deadline = Instant::now() + Duration::from_secs(120);
        let p = profile_points("p", &t, 4, 2, 1, Duration::from_millis(20), deadline)
            .expect("profiled");
        let knobs: Vec<(u32, u32)> = p.points.iter().map(|q| (q.batch, q.instances)).collect();
        assert_eq!(knobs, vec![(1, 1), (1, 2)]);
    }

    /// A replayed tenant under DNNScaler, stepped as the standalone agent steps it: 50 requests
    /// a second, each taking 5 ms in the queue and `compute_ms(batch)` in its batch, through the
    /// window a serving replica keeps. Returns every knob change with the second it happened.
    fn replay(start: Knobs, compute_ms: impl Fn(u32) -> f64, seconds: u32) -> Vec<(u32, Knobs)> {
        let slo = Slo::p99(100.0);
        let bounds = Bounds {
            max_batch: 32,
            max_instances: 1,
            ..Bounds::default()
        };
        // The profile predicts the replayed tenant: 10 ms at batch 1, 150 ms at batch 16.
        let point = |batch, throughput, p99_ms| ProfilePoint {
            batch,
            instances: 1,
            throughput,
            p99_ms,
            peak_activation_bytes: 0,
            gpu_util: None,
        };
        let model = LatencyModel::from_profile(&Profile {
            model: "m".into(),
            weight_bytes: 0,
            points: vec![point(1, 100.0, 10.0), point(16, 110.0, 150.0)],
        });
        let scaler =
            policy::ScalerState::new(policy::Approach::Batching, start, ScalerConfig::default());
        let mut round = TenantRound::new(Controller::Scaler(scaler), model, 1);
        let stats = Stats::replay(Duration::from_millis(100));
        let mut changes = Vec::new();
        let every = (crate::standalone::SCALE_EVERY.as_millis() / 100) as u32;
        for tenth in 1..=seconds * 10 {
            let batch = round.controller.knobs().batch;
            for _ in 0..5 {
                stats.arrival();
                stats.completion(
                    Duration::from_millis(5),
                    Duration::from_secs_f64(compute_ms(batch) / 1e3),
                );
            }
            stats.advance(Duration::from_millis(100));
            if tenth % every == 0 {
                let window = observe(&stats, &slo, 0, round.controller.knobs());
                let measured = Measured {
                    per_replica: Some(window),
                    arrival_rate: window.arrival_rate,
                };
                let o = round.round(
                    &measured,
                    &slo,
                    &bounds,
                    &round_config(),
                    tenth as f64 / 10.0,
                );
                if o.knobs != o.knobs_before {
                    // As `Tenant::set_knobs` does when the knobs change.
                    stats.start_epoch();
                    changes.push((tenth / 10, o.knobs));
                }
            }
        }
        changes
    }

    /// The rule's window is the one a serving replica keeps.
    #[test]
    fn the_evidence_window_is_the_replicas_window() {
        let window = cotenant_executor::runtime::stats::WINDOW_SECS as f64;
        assert_eq!(ScalerConfig::default().evidence.window_s, window);
    }

    /// Batch 16 takes 150 ms, over the 100 ms SLO; batch 8 takes 60 ms, well within it. The
    /// scaler shrinks 16 to 8 once, and the batch-16 measurements still in the window must not
    /// shrink 8 any further.
    #[test]
    fn measurements_of_the_old_knobs_cause_no_shrink() {
        let compute_ms = |batch: u32| if batch >= 16 { 150.0 } else { 60.0 };
        let changes = replay(Knobs::new(16, 1), compute_ms, 60);
        assert_eq!(changes, vec![(2, Knobs::new(8, 1))]);
    }
}
