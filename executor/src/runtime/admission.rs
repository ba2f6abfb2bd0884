//! Admission control's prediction: how long a new request would take from now until its batch
//! finishes, from a high percentile of recent batch times, the batches already running and the
//! rows queued ahead of it.

use std::collections::VecDeque;
use std::time::Duration;

/// Recent batch compute times; admission uses a high percentile, not the mean, because under
/// contention batch times spread and the mean admits work that then finishes late.
#[derive(Debug, Default)]
pub struct BatchTimes {
    recent: VecDeque<Duration>,
}

impl BatchTimes {
    /// Batches remembered.
    const WINDOW: usize = 32;
    /// The percentile admission plans with.
    const PERCENTILE: f64 = 0.9;

    pub fn record(&mut self, compute: Duration) {
        if self.recent.len() == Self::WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back(compute);
    }

    /// The 90th percentile of the recent batch times; `None` before the first batch.
    pub fn estimate(&self) -> Option<Duration> {
        let mut sorted: Vec<Duration> = self.recent.iter().copied().collect();
        sorted.sort_unstable();
        let last = sorted.len().checked_sub(1)?;
        let at = ((last as f64) * Self::PERCENTILE).ceil() as usize;
        sorted.get(at.min(last)).copied()
    }
}

/// When a request of `own_rows` would finish if admitted now. Batches of up to `max_batch` rows
/// take `per_batch` each; `instances` run in parallel, those in `running` (elapsed times of the
/// batches now running) free up once their batch is done. The queued rows go first, in batches,
/// each to the instance free soonest; the request finishes with the last of them.
pub fn predicted_latency(
    per_batch: Duration,
    running: &[Duration],
    queued_rows: usize,
    own_rows: usize,
    max_batch: usize,
    instances: usize,
) -> Duration {
    let instances = instances.max(1);
    let mut free_in: Vec<Duration> = running
        .iter()
        .map(|elapsed| per_batch.saturating_sub(*elapsed))
        .collect();
    free_in.resize(free_in.len().max(instances), Duration::ZERO);
    free_in.sort_unstable();
    free_in.truncate(instances);
    let batches = (queued_rows + own_rows.max(1)).div_ceil(max_batch.max(1));
    let last = batches - 1;
    let rounds = u32::try_from(last / instances + 1).unwrap_or(u32::MAX);
    free_in[last % instances] + per_batch.saturating_mul(rounds)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn an_idle_replica_predicts_one_batch() {
        assert_eq!(predicted_latency(10 * MS, &[], 0, 1, 8, 2), 10 * MS);
    }

    #[test]
    fn queued_rows_fill_rounds_across_instances() {
        // 15 queued + 1 own = 2 batches of 8, on two idle instances: one round.
        assert_eq!(predicted_latency(10 * MS, &[], 15, 1, 8, 2), 10 * MS);
        // 17 rows = 3 batches: the third waits for a second round.
        assert_eq!(predicted_latency(10 * MS, &[], 16, 1, 8, 2), 20 * MS);
        assert_eq!(predicted_latency(10 * MS, &[], 100, 1, 1, 1), 101 * 10 * MS);
    }

    #[test]
    fn batches_in_flight_delay_the_queue() {
        // One instance busy for 4 ms more: the request waits for it.
        assert_eq!(predicted_latency(10 * MS, &[6 * MS], 0, 1, 1, 1), 14 * MS);
        // Two instances, one busy: the idle one takes it at once.
        assert_eq!(predicted_latency(10 * MS, &[6 * MS], 0, 1, 1, 2), 10 * MS);
        // Both busy: the one free first.
        let running = [2 * MS, 7 * MS];
        assert_eq!(predicted_latency(10 * MS, &running, 0, 1, 1, 2), 13 * MS);
        // Overrunning batches count as about to finish, not as negative time.
        assert_eq!(predicted_latency(10 * MS, &[30 * MS], 0, 1, 1, 1), 10 * MS);
    }

    #[test]
    fn degenerate_knobs_do_not_divide_by_zero() {
        assert_eq!(predicted_latency(10 * MS, &[], 5, 0, 0, 0), 60 * MS);
    }

    #[test]
    fn the_estimate_is_a_high_percentile_of_recent_batches() {
        let mut times = BatchTimes::default();
        assert_eq!(times.estimate(), None);
        for _ in 0..9 {
            times.record(10 * MS);
        }
        times.record(50 * MS);
        assert_eq!(times.estimate(), Some(50 * MS));
        for _ in 0..BatchTimes::WINDOW {
            times.record(20 * MS);
        }
        assert_eq!(times.estimate(), Some(20 * MS), "old batches are forgotten");
    }
}
