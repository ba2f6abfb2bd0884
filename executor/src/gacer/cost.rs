//! GACER's cost model: a small concurrency simulator over profiled footprints. Operators on
//! different streams overlap at full speed while their occupancies sum to at most 1; beyond
//! that they share the device and each slows down in proportion. Scores candidate plans without
//! running them.

use super::plan::{GacerPlan, StepRef};
use super::profile::{DeviceShape, ModelProfile};

/// One launch on a simulated stream.
#[derive(Clone, Debug, PartialEq)]
pub struct SimTask {
    /// Seconds it takes alone.
    pub time: f64,
    /// Share of the device it occupies, in (0, 1].
    pub occupancy: f64,
    /// Tasks `(stream, index)` that must have finished before it starts.
    pub after: Vec<(usize, usize)>,
}

/// When each task of each stream started and finished, in seconds from the round's start.
#[derive(Clone, Debug, PartialEq)]
pub struct Timeline {
    pub spans: Vec<Vec<(f64, f64)>>,
}

impl Timeline {
    /// When the last task of any stream finished.
    pub fn makespan(&self) -> f64 {
        self.spans
            .iter()
            .filter_map(|s| s.last().map(|x| x.1))
            .fold(0.0, f64::max)
    }
}

/// Runs the streams in the concurrency model; `None` when waits deadlock.
pub fn simulate(streams: &[Vec<SimTask>]) -> Option<Timeline> {
    let n = streams.len();
    let mut spans: Vec<Vec<(f64, f64)>> = streams
        .iter()
        .map(|s| Vec::with_capacity(s.len()))
        .collect();
    // Tasks finished per stream; a task `(s, i)` is done once `done[s] > i`.
    let mut done = vec![0usize; n];
    // Running tasks: (stream, seconds of solo work left, occupancy, start).
    let mut running: Vec<(usize, f64, f64, f64)> = Vec::with_capacity(n);
    let mut busy = vec![false; n];
    let mut now = 0.0f64;
    loop {
        for s in 0..n {
            if busy[s] || done[s] >= streams[s].len() {
                continue;
            }
            let t = &streams[s][done[s]];
            if t.after
                .iter()
                .all(|&(ws, wi)| done.get(ws).is_some_and(|&d| d > wi))
            {
                busy[s] = true;
                running.push((s, t.time.max(0.0), t.occupancy.clamp(1e-6, 1.0), now));
            }
        }
        if running.is_empty() {
            let all = (0..n).all(|s| done[s] >= streams[s].len());
            return all.then_some(Timeline { spans });
        }
        let total: f64 = running.iter().map(|r| r.2).sum();
        let rate = if total <= 1.0 { 1.0 } else { 1.0 / total };
        let dt = running.iter().map(|r| r.1).fold(f64::INFINITY, f64::min) / rate;
        now += dt;
        running.retain_mut(|r| {
            r.1 -= dt * rate;
            if r.1 > 1e-12 {
                return true;
            }
            spans[r.0].push((r.3, now));
            done[r.0] += 1;
            busy[r.0] = false;
            false
        });
    }
}

/// Scores plans for one mix on one device.
pub struct CostModel<'a> {
    pub profiles: &'a [ModelProfile],
    pub device: &'a DeviceShape,
    /// Per tenant, the longest its batch may take within a round (seconds), if bounded.
    pub latency_bounds: Vec<Option<f64>>,
}

/// What the model predicts for a plan.
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    pub timeline: Timeline,
    /// For each tenant, the index of its first task for each step (then one per piece).
    pub first_task: Vec<Vec<usize>>,
    pub makespan: f64,
    pub finish: Vec<f64>,
}

impl CostModel<'_> {
    /// The streams a plan makes: one per tenant, a task per piece, pointers as waits on the
    /// last piece of the step waited for.
    pub fn streams(&self, plan: &GacerPlan) -> (Vec<Vec<SimTask>>, Vec<Vec<usize>>) {
        let mut first_task = Vec::with_capacity(self.profiles.len());
        for (t, p) in self.profiles.iter().enumerate() {
            let mut idx = Vec::with_capacity(p.steps.len());
            let mut at = 0;
            for s in 0..p.steps.len() {
                idx.push(at);
                at += pieces(plan, t, s);
            }
            idx.push(at);
            first_task.push(idx);
        }
        let streams = self
            .profiles
            .iter()
            .enumerate()
            .map(|(t, p)| {
                let mut tasks = Vec::new();
                for (s, sp) in p.steps.iter().enumerate() {
                    let k = pieces(plan, t, s);
                    let time = sp.piece_time(k, self.device).as_secs_f64();
                    let occupancy = sp.footprint.piece(k).occupancy(self.device);
                    let after: Vec<(usize, usize)> = plan
                        .waits_of(StepRef { tenant: t, step: s })
                        .filter(|a| a.tenant < first_task.len())
                        .map(|a| (a.tenant, first_task[a.tenant][a.step + 1] - 1))
                        .collect();
                    for piece in 0..k {
                        tasks.push(SimTask {
                            time,
                            occupancy,
                            after: if piece == 0 { after.clone() } else { vec![] },
                        });
                    }
                }
                tasks
            })
            .collect();
        (streams, first_task)
    }

    /// Simulates one round of the plan; `None` if its pointers deadlock.
    pub fn predict(&self, plan: &GacerPlan) -> Option<Prediction> {
        let (streams, first_task) = self.streams(plan);
        let timeline = simulate(&streams)?;
        let finish: Vec<f64> = timeline
            .spans
            .iter()
            .map(|s| s.last().map_or(0.0, |x| x.1))
            .collect();
        Some(Prediction {
            makespan: timeline.makespan(),
            timeline,
            first_task,
            finish,
        })
    }

    /// Lower is better: the round's makespan, plus a steep penalty for every second a tenant
    /// overruns its bound, plus a small pull towards early finishes (mean latency).
    pub fn score(&self, p: &Prediction) -> f64 {
        let overrun: f64 = p
            .finish
            .iter()
            .zip(&self.latency_bounds)
            .map(|(f, b)| b.map_or(0.0, |b| (f - b).max(0.0)))
            .sum();
        let mean = p.finish.iter().sum::<f64>() / p.finish.len().max(1) as f64;
        p.makespan + 100.0 * overrun + 1e-3 * mean
    }
}

fn pieces(plan: &GacerPlan, tenant: usize, step: usize) -> usize {
    plan.splits
        .get(tenant)
        .and_then(|s| s.get(step))
        .copied()
        .unwrap_or(1)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(time: f64, occupancy: f64) -> SimTask {
        SimTask {
            time,
            occupancy,
            after: vec![],
        }
    }

    #[test]
    fn two_half_occupancy_ops_overlap_fully() {
        let t = simulate(&[vec![task(1.0, 0.5)], vec![task(1.0, 0.5)]]).unwrap();
        assert!((t.makespan() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn two_full_occupancy_ops_serialize() {
        let t = simulate(&[vec![task(1.0, 1.0)], vec![task(1.0, 1.0)]]).unwrap();
        assert!((t.makespan() - 2.0).abs() < 1e-9);
        // Sharing: both finish together at 2, neither at 1.
        assert!((t.spans[0][0].1 - 2.0).abs() < 1e-9);
    }

    #[test]
    fn oversubscription_slows_in_proportion() {
        // 0.75 + 0.75 = 1.5: both run at 1/1.5 speed until the short one ends.
        let t = simulate(&[vec![task(1.0, 0.75)], vec![task(2.0, 0.75)]]).unwrap();
        assert!((t.spans[0][0].1 - 1.5).abs() < 1e-9);
        // The long one did 1.0 of work by then and finishes its last 1.0 alone.
        assert!((t.spans[1][0].1 - 2.5).abs() < 1e-9);
    }

    #[test]
    fn a_wait_delays_the_start() {
        let mut b = task(1.0, 0.1);
        b.after = vec![(0, 0)];
        let t = simulate(&[vec![task(2.0, 0.1)], vec![b]]).unwrap();
        assert!((t.spans[1][0].0 - 2.0).abs() < 1e-9);
        assert!((t.makespan() - 3.0).abs() < 1e-9);
    }

    #[test]
    fn crossing_waits_are_a_deadlock() {
        let mut a = task(1.0, 0.1);
        a.after = vec![(1, 0)];
        let mut b = task(1.0, 0.1);
        b.after = vec![(0, 0)];
        assert_eq!(simulate(&[vec![a], vec![b]]), None);
    }
}
