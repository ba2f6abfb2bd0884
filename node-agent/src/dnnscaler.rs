//! DNNScaler on the agent (standalone mode, where no operator decides; `--knob-policy` swaps in
//! static knobs or Clipper-style AIMD to compare against): profile each tenant at
//! (batch 1, 1 instance), (batch k, 1 instance) and (batch 1, k instances), let the policy choose
//! the approach, then move the knobs under feedback from the tenant's own measurements. The
//! decisions are `cotenant-policy`'s, the same code the operator runs.

use cotenant_executor::RunError;
use cotenant_executor::runtime::{Stats, Tenant, batchable, measure_within};
use cotenant_policy as policy;
use policy::sim::{Controller, Strategy};
use policy::{Bounds, Decision, Knobs, LatencyModel, Profile, ProfilePoint, ScalerConfig, Slo};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a whole profile may take: no run starts after it (a model slow at a large batch
/// costs one run past it, never an unbounded profile).
pub const PROFILE_DEADLINE: Duration = Duration::from_secs(120);

/// Measures the three profile points (k = 4, within the bounds), each for `per_point`, within
/// [`PROFILE_DEADLINE`]. Blocking: call it off the async workers.
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

/// Measures (batch 1, 1 instance), (batch `k_batch`, 1 instance) and (batch 1, `k_instances`
/// instances), each for `per_point`, starting no run after `deadline`; repeated settings are
/// measured once. A model whose requests never share a batch is measured at batch 1 only (its
/// batch knob cannot move). Blocking: call it off the async workers.
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
    for knobs in [
        Knobs::new(1, 1),
        Knobs::new(k_batch.max(1), 1),
        Knobs::new(1, k_instances.max(1)),
    ] {
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

/// One tenant under a knob controller's feedback.
pub struct Controlled {
    pub name: String,
    pub tenant: Arc<Tenant>,
    pub slo: Slo,
    pub bounds: Bounds,
    pub model: LatencyModel,
    pub controller: Controller,
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
            model: LatencyModel::from_profile(profile),
            controller,
        }
    }

    /// One feedback step from the tenant's window; returns the decision it applied.
    pub fn step(&mut self) -> Decision {
        let observation = observe(self.tenant.stats(), &self.slo, self.tenant.queue_depth());
        let before = self.controller.knobs();
        let wants_replicas =
            self.controller
                .observe(&observation, &self.slo, &self.bounds, &self.model);
        let after = self.controller.knobs();
        if after != before {
            apply(&self.tenant, after, &self.slo);
            Decision::SetKnobs(after)
        } else if wants_replicas {
            Decision::NeedReplicas
        } else {
            Decision::Hold
        }
    }
}

/// What the scaler reads of a tenant's window: its load, and its latency and compute time at the
/// SLO's percentile.
pub fn observe(stats: &Stats, slo: &Slo, queue_depth: usize) -> policy::TenantObservation {
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
}
