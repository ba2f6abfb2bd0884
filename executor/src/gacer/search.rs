//! GACER's low-cost search: starting from the unregulated plan, repeatedly try the moves the
//! cost model's timeline suggests — a pointer that keeps two contending operators apart, a
//! finer split of a large operator, dropping a pointer or a split — and keep the best one that
//! lowers the score, until none does (greedy with local improvement).

use super::cost::{CostModel, Prediction};
use super::plan::{GacerPlan, StepRef, SyncPointer};
use super::profile::{DeviceShape, ModelProfile};
use std::time::Duration;

/// Knobs of the search.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchOptions {
    /// Piece counts an operator may be resized to (besides 1).
    pub split_factors: Vec<usize>,
    /// Most improving moves applied.
    pub max_moves: usize,
    /// Contending pairs and large operators considered per move.
    pub candidates: usize,
}

impl Default for SearchOptions {
    fn default() -> SearchOptions {
        SearchOptions {
            split_factors: vec![2, 4],
            max_moves: 24,
            candidates: 12,
        }
    }
}

/// One tenant of the mix, as the planner sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct MixTenant {
    pub profile: std::sync::Arc<ModelProfile>,
    /// Longest its batch may take within a round (its share of the latency SLO), if bounded.
    pub latency_bound: Option<Duration>,
}

/// Searches split factors and pointers for the mix; the result always validates.
pub fn search(mix: &[MixTenant], device: &DeviceShape, opts: &SearchOptions) -> GacerPlan {
    let profiles: Vec<ModelProfile> = mix.iter().map(|t| (*t.profile).clone()).collect();
    let model = CostModel {
        profiles: &profiles,
        device,
        latency_bounds: mix
            .iter()
            .map(|t| t.latency_bound.map(|d| d.as_secs_f64()))
            .collect(),
    };
    let counts: Vec<usize> = profiles.iter().map(|p| p.steps.len()).collect();
    let mut plan = GacerPlan::unregulated(&counts);
    let Some(mut pred) = model.predict(&plan) else {
        return plan;
    };
    let mut score = model.score(&pred);
    for _ in 0..opts.max_moves {
        let mut best: Option<(f64, GacerPlan, Prediction)> = None;
        for cand in moves(&plan, &pred, &profiles, device, opts) {
            if cand.validate(&counts).is_err() {
                continue;
            }
            let Some(p) = model.predict(&cand) else {
                continue;
            };
            let s = model.score(&p);
            if s < best.as_ref().map_or(score, |b| b.0) {
                best = Some((s, cand, p));
            }
        }
        match best {
            Some((s, cand, p)) if s < score * (1.0 - 1e-6) => {
                score = s;
                plan = cand;
                pred = p;
            }
            _ => break,
        }
    }
    plan.predicted_makespan = pred.makespan;
    plan.predicted_finish = pred.finish;
    plan
}

/// Candidate plans one move away from `plan`.
fn moves(
    plan: &GacerPlan,
    pred: &Prediction,
    profiles: &[ModelProfile],
    device: &DeviceShape,
    opts: &SearchOptions,
) -> Vec<GacerPlan> {
    let mut out = Vec::new();
    // Temporal: keep the most contended pairs of steps apart, in either order.
    for (a, b) in contended_pairs(plan, pred, profiles, device, opts.candidates) {
        for (waiter, after) in [(a, b), (b, a)] {
            let p = SyncPointer { waiter, after };
            if !plan.pointers.contains(&p) {
                let mut c = plan.clone();
                c.pointers.push(p);
                out.push(c);
            }
        }
    }
    // Spatial: resize the largest operators that still fill the device one step finer.
    let mut big: Vec<(f64, StepRef)> = Vec::new();
    for (t, prof) in profiles.iter().enumerate() {
        for (s, sp) in prof.steps.iter().enumerate() {
            let k = plan.splits[t][s];
            let occ = sp.footprint.piece(k).occupancy(device);
            if occ > 0.5 {
                big.push((
                    sp.piece_time(k, device).as_secs_f64() * k as f64 * occ,
                    StepRef { tenant: t, step: s },
                ));
            }
        }
    }
    big.sort_by(|x, y| y.0.total_cmp(&x.0));
    for (_, r) in big.into_iter().take(opts.candidates) {
        let k = plan.splits[r.tenant][r.step];
        let sp = &profiles[r.tenant].steps[r.step];
        if let Some(&f) = opts
            .split_factors
            .iter()
            .filter(|&&f| f > k && sp.can_split(f))
            .min()
        {
            let mut c = plan.clone();
            c.splits[r.tenant][r.step] = f;
            out.push(c);
        }
    }
    // Local improvement: undo earlier moves that no longer pay.
    for i in 0..plan.pointers.len() {
        let mut c = plan.clone();
        c.pointers.remove(i);
        out.push(c);
    }
    for (t, s) in plan.splits.iter().enumerate() {
        for (step, &k) in s.iter().enumerate() {
            if k > 1 {
                let mut c = plan.clone();
                c.splits[t][step] = 1;
                out.push(c);
            }
        }
    }
    out
}

/// Pairs of steps of different tenants that overlapped in the timeline with occupancies summing
/// above 1, heaviest (overlap × excess) first.
fn contended_pairs(
    plan: &GacerPlan,
    pred: &Prediction,
    profiles: &[ModelProfile],
    device: &DeviceShape,
    limit: usize,
) -> Vec<(StepRef, StepRef)> {
    // Every step's span and occupancy: from its first piece's start to its last piece's finish.
    let mut steps: Vec<(f64, f64, f64, StepRef)> = Vec::new();
    for (t, prof) in profiles.iter().enumerate() {
        let spans = &pred.timeline.spans[t];
        for (s, sp) in prof.steps.iter().enumerate() {
            let (first, end) = (pred.first_task[t][s], pred.first_task[t][s + 1]);
            if first >= end || end > spans.len() {
                continue;
            }
            let occ = sp.footprint.piece(plan.splits[t][s]).occupancy(device);
            steps.push((
                spans[first].0,
                spans[end - 1].1,
                occ,
                StepRef { tenant: t, step: s },
            ));
        }
    }
    steps.sort_by(|x, y| x.0.total_cmp(&y.0));
    let mut pairs: Vec<(f64, StepRef, StepRef)> = Vec::new();
    let mut active: Vec<usize> = Vec::new();
    for i in 0..steps.len() {
        let (start, _, occ, r) = steps[i];
        active.retain(|&j| steps[j].1 > start);
        for &j in &active {
            let (s2, f2, o2, r2) = steps[j];
            let overlap = steps[i].1.min(f2) - start.max(s2);
            let excess = occ + o2 - 1.0;
            if r2.tenant != r.tenant && overlap > 0.0 && excess > 0.0 {
                pairs.push((overlap * excess, r2, r));
            }
        }
        active.push(i);
    }
    pairs.sort_by(|x, y| y.0.total_cmp(&x.0));
    pairs
        .into_iter()
        .take(limit)
        .map(|(_, a, b)| (a, b))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gacer::profile::{LaunchFootprint, StepProfile};
    use std::sync::Arc;

    fn device() -> DeviceShape {
        DeviceShape {
            name: "ten units".into(),
            units: 10,
            max_threads_per_unit: 256,
            max_blocks_per_unit: 1,
            shared_mem_per_unit: usize::MAX,
            registers_per_unit: usize::MAX,
            units_per_stream: 10,
            launch_overhead: Duration::ZERO,
        }
    }

    fn tenant(steps: &[(f64, usize, Option<usize>)], bound: Option<f64>) -> MixTenant {
        MixTenant {
            profile: Arc::new(ModelProfile {
                model: "synthetic".into(),
                batch: 4,
                steps: steps
                    .iter()
                    .map(|&(secs, blocks, split_rows)| StepProfile {
                        op: "Conv".into(),
                        time: Duration::from_secs_f64(secs),
                        footprint: LaunchFootprint {
                            blocks,
                            threads_per_block: 256,
                            shared_mem_per_block: 0,
                            registers_per_thread: 32,
                        },
                        split_rows,
                        piece_times: vec![],
                    })
                    .collect(),
            }),
            latency_bound: bound.map(Duration::from_secs_f64),
        }
    }

    #[test]
    fn resizing_a_tail_wave_lets_the_other_tenant_in() {
        // 12 blocks on 10 units: a full device for the whole time, though 2 units idle in the
        // second wave. Halves of 6 blocks each leave room for the other tenant's 4.
        let mix = [
            tenant(&[(1.0, 12, Some(4))], None),
            tenant(&[(1.0, 4, None)], None),
        ];
        let plan = search(&mix, &device(), &SearchOptions::default());
        assert_eq!(plan.splits[0][0], 2);
        assert!((plan.predicted_makespan - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_pointer_keeps_a_bounded_tenant_within_its_latency() {
        let mix = [
            tenant(&[(1.0, 10, None)], Some(1.1)),
            tenant(&[(1.0, 10, None)], None),
        ];
        let plan = search(&mix, &device(), &SearchOptions::default());
        let first = StepRef { tenant: 0, step: 0 };
        let second = StepRef { tenant: 1, step: 0 };
        assert_eq!(
            plan.pointers,
            vec![SyncPointer {
                waiter: second,
                after: first
            }]
        );
        assert!(plan.predicted_finish[0] <= 1.1);
    }
}
