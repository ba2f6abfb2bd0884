//! Keeps a GACER co-schedule's plan matched to the replicas it serves. Each [`Planner::tick`]
//! looks at the seats; when the mix changed (a replica loaded or unloaded, an instance added, a
//! batch size moved) it profiles every seat's model at the rows of its last batch (profiles are
//! kept per model and batch), asks the plan cache for the mix's plan — searched on a background
//! thread the first time, so a tick never blocks on the search — and publishes it once ready. A
//! published plan takes over between batches.

use super::cosched::{CoSchedule, SeatModel};
use crate::device::Device;
use crate::error::RunError;
use crate::gacer::{MixTenant, ModelProfile, PlanCache, SearchOptions};
use std::collections::HashMap;
use std::sync::Arc;

/// A seat as the planner tells mixes apart: label, rows of its batch, latency bound.
type MixKey = (String, usize, Option<std::time::Duration>);

/// Timed passes per profile (the median is kept).
const PROFILE_REPS: usize = 3;

pub struct Planner {
    co: Arc<CoSchedule>,
    cache: PlanCache,
    /// Where the seats compute (profiles are taken there).
    device: Device,
    /// Threads a profiling run may use (one stream's budget).
    threads: usize,
    profiles: HashMap<(String, usize), Arc<ModelProfile>>,
    /// The mix of the plan published last.
    published: Option<Vec<Option<MixKey>>>,
}

impl Planner {
    /// Plans for `co` on `device` (`cores` CPU cores in all), profiling with `threads` threads,
    /// one stream's budget.
    pub fn new(co: Arc<CoSchedule>, device: &Device, cores: usize, threads: usize) -> Planner {
        Planner {
            co,
            cache: PlanCache::new(device.shape(cores, threads), SearchOptions::default()),
            device: device.clone(),
            threads: threads.max(1),
            profiles: HashMap::new(),
            published: None,
        }
    }

    /// One look at the seats; true when it published a plan for a new mix. Not a GACER
    /// schedule, or fewer than two seats: nothing to plan.
    pub fn tick(&mut self) -> Result<bool, RunError> {
        let Some(slot) = self.co.plan_slot().cloned() else {
            return Ok(false);
        };
        let seats = self.co.seat_models();
        let mix: Vec<Option<MixKey>> = seats
            .iter()
            .map(|s| {
                s.as_ref()
                    .map(|s| (s.label.clone(), s.rows, s.latency_bound))
            })
            .collect();
        if seats.iter().flatten().count() < 2 || self.published.as_ref() == Some(&mix) {
            return Ok(false);
        }
        let mut tenants = Vec::with_capacity(seats.len());
        for seat in &seats {
            let profile = match seat {
                Some(SeatModel {
                    label, model, rows, ..
                }) => {
                    let key = (label.clone(), *rows);
                    match self.profiles.get(&key) {
                        Some(p) => p.clone(),
                        None => {
                            let mut engine = self
                                .device
                                .place(label, model)
                                .and_then(|p| p.engine(self.threads, None))
                                .map_err(|e| RunError::Device(format!("{label}: {e}")))?;
                            let inputs = model.plan.example_inputs(*rows);
                            let p = engine.profile(
                                label,
                                &inputs,
                                PROFILE_REPS,
                                &SearchOptions::default().split_factors,
                            )?;
                            self.profiles.entry(key).or_insert(Arc::new(p)).clone()
                        }
                    }
                }
                // A free seat in the middle: a tenant of no steps keeps the indices.
                None => Arc::new(ModelProfile {
                    model: String::new(),
                    batch: 0,
                    steps: vec![],
                }),
            };
            tenants.push(MixTenant {
                profile,
                latency_bound: seat.as_ref().and_then(|s| s.latency_bound),
            });
        }
        match self.cache.plan_for(&tenants) {
            Some(plan) => {
                slot.publish(plan);
                self.published = Some(mix);
                Ok(true)
            }
            None => Ok(false),
        }
    }
}
