//! Where plans live between searches: a cache keyed by the tenant mix (model ids and knobs),
//! filled by searches running in the background, and the slot a running co-schedule reads its
//! plan from, so a new plan takes over between batches.

use super::plan::GacerPlan;
use super::profile::DeviceShape;
use super::search::{MixTenant, SearchOptions, search};
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// One tenant's part of a mix key: which model, at which batch, under which bound.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TenantKey {
    pub model: String,
    pub batch: usize,
    pub latency_bound_us: Option<u128>,
}

/// A tenant mix, in stream order (a plan's tenant indices follow it).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MixKey(pub Vec<TenantKey>);

impl MixKey {
    pub fn of(mix: &[MixTenant]) -> MixKey {
        MixKey(
            mix.iter()
                .map(|t| TenantKey {
                    model: t.profile.model.clone(),
                    batch: t.profile.batch,
                    latency_bound_us: t.latency_bound.map(|d| d.as_micros()),
                })
                .collect(),
        )
    }
}

enum Entry {
    Searching,
    Ready(Arc<GacerPlan>),
}

struct Shared {
    entries: Mutex<HashMap<MixKey, Entry>>,
    ready: Condvar,
}

/// Plans per mix; a mix seen for the first time is searched on a background thread while the
/// caller keeps running what it has.
#[derive(Clone)]
pub struct PlanCache {
    shared: Arc<Shared>,
    device: DeviceShape,
    options: SearchOptions,
}

impl PlanCache {
    pub fn new(device: DeviceShape, options: SearchOptions) -> PlanCache {
        PlanCache {
            shared: Arc::new(Shared {
                entries: Mutex::new(HashMap::new()),
                ready: Condvar::new(),
            }),
            device,
            options,
        }
    }

    /// The plan for this mix if one is ready; otherwise `None`, and a background search for it
    /// is running (started now unless one already was).
    pub fn plan_for(&self, mix: &[MixTenant]) -> Option<Arc<GacerPlan>> {
        let key = MixKey::of(mix);
        let mut entries = self
            .shared
            .entries
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match entries.get(&key) {
            Some(Entry::Ready(p)) => return Some(p.clone()),
            Some(Entry::Searching) => return None,
            None => {}
        }
        entries.insert(key.clone(), Entry::Searching);
        drop(entries);
        let (shared, device, options) = (
            self.shared.clone(),
            self.device.clone(),
            self.options.clone(),
        );
        let (mix, searched) = (mix.to_vec(), key.clone());
        let spawned = std::thread::Builder::new()
            .name("cotenant-gacer-search".into())
            .spawn(move || {
                let plan = Arc::new(search(&mix, &device, &options));
                let mut entries = shared.entries.lock().unwrap_or_else(|e| e.into_inner());
                entries.insert(searched, Entry::Ready(plan));
                shared.ready.notify_all();
            });
        if spawned.is_err() {
            // No thread to search on: forget the entry so a later call tries again.
            let mut entries = self
                .shared
                .entries
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            entries.remove(&key);
        }
        None
    }

    /// Like `plan_for`, but waits up to `timeout` for the background search to finish.
    pub fn wait_for(&self, mix: &[MixTenant], timeout: Duration) -> Option<Arc<GacerPlan>> {
        if let Some(p) = self.plan_for(mix) {
            return Some(p);
        }
        let key = MixKey::of(mix);
        let deadline = Instant::now() + timeout;
        let mut entries = self
            .shared
            .entries
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(Entry::Ready(p)) = entries.get(&key) {
                return Some(p.clone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            entries = self
                .shared
                .ready
                .wait_timeout(entries, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// The plan a running co-schedule follows. A plan published while it runs takes effect from the
/// next round (batch) no stream has started yet, for every stream at once, so the pointers of
/// one round always come from one plan.
pub struct PlanSlot {
    state: Mutex<SlotState>,
}

struct SlotState {
    /// Plans with the first round they govern, oldest first.
    versions: Vec<(u64, Arc<GacerPlan>)>,
    /// The highest round any stream has started.
    started: Option<u64>,
}

impl PlanSlot {
    pub fn new(plan: Arc<GacerPlan>) -> PlanSlot {
        PlanSlot {
            state: Mutex::new(SlotState {
                versions: vec![(0, plan)],
                started: None,
            }),
        }
    }

    /// Makes `plan` govern every round from the next one no stream has started; returns that
    /// round.
    pub fn publish(&self, plan: Arc<GacerPlan>) -> u64 {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let from = s.started.map_or(0, |r| r + 1);
        s.versions.retain(|(f, _)| *f < from);
        s.versions.push((from, plan));
        from
    }

    /// The highest round any stream has started, if any.
    pub fn started(&self) -> Option<u64> {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).started
    }

    /// The plan for `round`, recording that a stream has started it.
    pub fn for_round(&self, round: u64) -> Arc<GacerPlan> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.started = Some(s.started.map_or(round, |r| r.max(round)));
        s.versions
            .iter()
            .rev()
            .find(|(f, _)| *f <= round)
            .or(s.versions.first())
            .map(|(_, p)| p.clone())
            .unwrap_or_else(|| Arc::new(GacerPlan::unregulated(&[])))
    }

    /// The plan the latest round follows.
    pub fn current(&self) -> Arc<GacerPlan> {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.versions
            .last()
            .map(|(_, p)| p.clone())
            .unwrap_or_else(|| Arc::new(GacerPlan::unregulated(&[])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gacer::profile::ModelProfile;

    fn plan(steps: usize) -> Arc<GacerPlan> {
        Arc::new(GacerPlan::unregulated(&[steps]))
    }

    #[test]
    fn a_published_plan_governs_only_rounds_no_stream_has_started() {
        let slot = PlanSlot::new(plan(1));
        assert_eq!(slot.for_round(0).splits[0].len(), 1);
        assert_eq!(slot.publish(plan(2)), 1);
        // A stream still starting round 0 keeps the plan the others ran round 0 with.
        assert_eq!(slot.for_round(0).splits[0].len(), 1);
        assert_eq!(slot.for_round(1).splits[0].len(), 2);
        assert_eq!(slot.current().splits[0].len(), 2);
    }

    #[test]
    fn a_new_mix_is_searched_in_the_background_then_cached() {
        let cache = PlanCache::new(DeviceShape::h200(), SearchOptions::default());
        let mix = vec![MixTenant {
            profile: Arc::new(ModelProfile {
                model: "m".into(),
                batch: 1,
                steps: vec![],
            }),
            latency_bound: None,
        }];
        let plan = cache
            .wait_for(&mix, Duration::from_secs(30))
            .expect("the background search finishes");
        assert!(Arc::ptr_eq(&plan, &cache.plan_for(&mix).expect("cached")));
        let mut other = mix.clone();
        other[0].latency_bound = Some(Duration::from_millis(5));
        assert_ne!(MixKey::of(&mix), MixKey::of(&other));
    }
}
