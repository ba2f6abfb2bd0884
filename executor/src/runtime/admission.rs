//! Admission control's prediction: how long a new request would take from now until its batch
//! finishes, from a high percentile of recent batch times, the batches already running and the
//! rows queued ahead of it; and how far requests actually overran their predictions, so that what
//! is admitted meets the SLO at its percentile and not merely on average.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Recent batch compute times; admission uses a high percentile, not the mean, because under
/// contention batch times spread and the mean admits work that then finishes late.
#[derive(Debug, Default)]
pub struct BatchTimes {
    recent: VecDeque<Duration>,
    /// Batches recorded since the knobs last changed.
    since_knobs: usize,
}

impl BatchTimes {
    /// Batches remembered.
    const WINDOW: usize = 32;
    /// The percentile admission plans with.
    const PERCENTILE: f64 = 0.9;
    /// Batches at new knobs that fill the window's top tenth, so that the estimate shows a
    /// slowdown from a larger batch or more instances.
    const SETTLED: usize = 4;

    pub fn record(&mut self, compute: Duration) {
        if self.recent.len() == Self::WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back(compute);
        self.since_knobs = self.since_knobs.saturating_add(1);
    }

    /// The knobs changed: the batches remembered ran at the old ones.
    pub fn knobs_changed(&mut self) {
        self.since_knobs = 0;
    }

    /// Whether enough batches ran at the current knobs for the estimate to hold for them. Until
    /// then the overrun learns nothing: a prediction from batches of another size is no
    /// evidence about the next one.
    pub fn settled(&self) -> bool {
        self.since_knobs >= Self::SETTLED
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

/// How much longer requests took than admission predicted for them: the ratio of each completed
/// request's latency to its prediction, over the last `span`, at a percentile that allows half the
/// misses the SLO allows (99.5 for a p99 SLO). Admission scales its predictions by it.
///
/// Under overload the queue fills until the prediction reaches the SLO, so without it the requests
/// admitted last would finish around the SLO, half of them late. The ratio also absorbs what the
/// prediction leaves out: batching delay, other tenants on the same cores, batch times beyond
/// their 90th percentile. Overruns come in runs (a slow stretch of the host delays the whole queue
/// at once) and are learnt only an SLO later, as their requests finish; so the span is ten SLOs
/// (5–30 s), long enough to remember the last slow stretch when the next comes, and the
/// percentile keeps a margin.
#[derive(Debug)]
pub struct Overrun {
    /// When each ratio was recorded, and the ratio.
    recent: VecDeque<(Instant, f32)>,
    /// How long a ratio is remembered.
    span: Duration,
    /// The percentile (0–100) of ratios the factor is taken at.
    percentile: f64,
    factor: f64,
    /// Ratios recorded since the factor was last computed.
    stale: usize,
}

impl Overrun {
    /// The span, in SLOs, and its bounds.
    const SPAN_SLOS: u32 = 10;
    const MIN_SPAN: Duration = Duration::from_secs(5);
    const MAX_SPAN: Duration = Duration::from_secs(30);
    /// Ratios remembered at most: at high rates the span shortens.
    const CAPACITY: usize = 4096;
    /// The factor is recomputed every this many ratios, and at once for a ratio above it.
    const EVERY: usize = 16;
    /// Never below 1: predictions that ran long are corrected, pessimistic ones are kept, because
    /// the requests measured while the queue was short say little about a queue building up.
    const MIN: f64 = 1.0;
    /// A run of stalls must not shut the tenant out: the requests an idle instance takes anyway
    /// bring the factor back down.
    const MAX: f64 = 8.0;

    /// Tracks the ratios for an SLO of `latency` met by `percentile` (0–100) of requests.
    pub fn new(latency: Duration, percentile: f64) -> Overrun {
        let mut overrun = Overrun {
            recent: VecDeque::new(),
            span: Self::MAX_SPAN,
            percentile: 99.5,
            factor: Self::MIN,
            stale: 0,
        };
        overrun.set_slo(latency, percentile);
        overrun
    }

    /// A new SLO; a percentile that is not a number keeps the one before.
    pub fn set_slo(&mut self, latency: Duration, percentile: f64) {
        self.span = latency
            .saturating_mul(Self::SPAN_SLOS)
            .clamp(Self::MIN_SPAN, Self::MAX_SPAN);
        if percentile.is_finite() {
            let p = percentile.clamp(0.0, 100.0);
            self.percentile = p + (100.0 - p) / 2.0;
        }
        self.update();
    }

    /// A request admitted with `predicted` took `actual`, finishing `now`.
    pub fn record(&mut self, now: Instant, predicted: Duration, actual: Duration) {
        if predicted.is_zero() {
            return;
        }
        let span = self.span;
        while self.recent.front().is_some_and(|(at, _)| {
            self.recent.len() >= Self::CAPACITY || now.saturating_duration_since(*at) > span
        }) {
            self.recent.pop_front();
        }
        let ratio = actual.as_secs_f64() / predicted.as_secs_f64();
        self.recent.push_back((now, ratio as f32));
        self.stale += 1;
        if self.stale >= Self::EVERY || ratio > self.factor || self.recent.len() <= 4 * Self::EVERY
        {
            self.update();
        }
    }

    fn update(&mut self) {
        self.stale = 0;
        let mut ratios: Vec<f32> = self.recent.iter().map(|(_, r)| *r).collect();
        let Some(last) = ratios.len().checked_sub(1) else {
            self.factor = Self::MIN;
            return;
        };
        let at = (((last as f64) * self.percentile / 100.0).ceil() as usize).min(last);
        let ratio = f64::from(*ratios.select_nth_unstable_by(at, f32::total_cmp).1);
        self.factor = if ratio.is_finite() {
            ratio.clamp(Self::MIN, Self::MAX)
        } else {
            Self::MAX
        };
    }

    /// What admission multiplies its predictions by, in [1, 8].
    pub fn factor(&self) -> f64 {
        self.factor
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

    /// The factor is a ratio stored as f32.
    fn assert_factor(overrun: &Overrun, want: f64) {
        let got = overrun.factor();
        assert!((got - want).abs() < 1e-6, "factor {got}, want {want}");
    }

    #[test]
    fn the_overrun_allows_half_the_misses_the_slo_allows() {
        let now = Instant::now();
        let slo = 1000 * MS;
        let mut overrun = Overrun::new(slo, 99.0);
        assert_eq!(overrun.factor(), 1.0, "no completions yet");
        for _ in 0..97 {
            overrun.record(now, 100 * MS, 100 * MS);
        }
        for ms in [110, 120, 150] {
            overrun.record(now, 100 * MS, ms * MS);
        }
        // 100 ratios. A p99 SLO allows one miss in 100: admission plans for half of one.
        assert_factor(&overrun, 1.5);
        // A p96 SLO allows four, admission two: the second largest ratio.
        overrun.set_slo(slo, 96.0);
        assert_factor(&overrun, 1.2);
        overrun.set_slo(slo, 94.0);
        assert_factor(&overrun, 1.1);
        overrun.set_slo(slo, f64::NAN);
        assert_factor(&overrun, 1.1); // not a number: the percentile stays
        overrun.set_slo(slo, 80.0);
        assert_eq!(overrun.factor(), 1.0);
        overrun.set_slo(slo, 99.0);
        for _ in 0..Overrun::CAPACITY {
            overrun.record(now, 100 * MS, 50 * MS);
        }
        assert_eq!(
            overrun.factor(),
            1.0,
            "early finishes do not loosen admission"
        );
    }

    #[test]
    fn the_overrun_is_bounded_and_forgets_after_ten_slos() {
        let now = Instant::now();
        let mut overrun = Overrun::new(2000 * MS, 99.0);
        overrun.record(now, Duration::ZERO, 100 * MS);
        assert_eq!(overrun.factor(), 1.0, "no prediction, no ratio");
        overrun.record(now, Duration::from_nanos(1), Duration::from_secs(3600));
        assert_eq!(overrun.factor(), Overrun::MAX);
        // Ten SLOs are 20 s: still remembered after 19 s, forgotten after 21 s.
        overrun.record(now + Duration::from_secs(19), 100 * MS, 110 * MS);
        assert_eq!(overrun.factor(), Overrun::MAX);
        overrun.record(now + Duration::from_secs(21), 100 * MS, 110 * MS);
        assert_factor(&overrun, 1.1);
        // A tight SLO still keeps five seconds; a loose one at most thirty.
        overrun.set_slo(MS, 99.0);
        assert_eq!(overrun.span, Overrun::MIN_SPAN);
        overrun.set_slo(Duration::from_secs(3600), 99.0);
        assert_eq!(overrun.span, Overrun::MAX_SPAN);
        // The factor follows within `EVERY` completions once the window is full of new ones.
        let later = now + Duration::from_secs(22);
        for _ in 0..Overrun::CAPACITY {
            overrun.record(later, 100 * MS, 130 * MS);
        }
        assert_factor(&overrun, 1.3);
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
        assert!(times.settled());
        times.knobs_changed();
        for _ in 0..BatchTimes::SETTLED - 1 {
            times.record(80 * MS);
            assert!(!times.settled());
        }
        times.record(80 * MS);
        assert!(times.settled());
        assert_eq!(
            times.estimate(),
            Some(80 * MS),
            "slower batches at new knobs show once settled"
        );
    }
}
