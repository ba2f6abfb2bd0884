//! Per-tenant measurements over a sliding window: arrivals, completions, sheds, latency
//! histograms (queueing, compute, end to end), batch sizes and SLO attainment. Fixed memory:
//! one-second buckets in a ring, each with log-spaced latency histograms.
//!
//! The window has epochs: [`Stats::start_epoch`] (the runtime calls it when a tenant's knobs
//! change) begins a new one, and the window covers the last [`WINDOW_SECS`] seconds of the
//! current epoch only, so what it says is about the knobs that run now. The totals since start
//! are not cut.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Seconds of history the window keeps.
pub const WINDOW_SECS: usize = 30;
/// Latency bins: bin i covers [MIN·R^i, MIN·R^(i+1)) with R = 1.1, from 10 µs to ~10 min.
const MIN_SECS: f64 = 1e-5;
const RATIO: f64 = 1.1;
const BINS: usize = 190;
/// Batch-size bins: exact up to 64, then one bin.
const BATCH_BINS: usize = 65;

/// A histogram of durations with log-spaced bins.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    counts: Vec<u64>,
    sum_secs: f64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; BINS],
            sum_secs: 0.0,
        }
    }
}

impl Histogram {
    fn bin(secs: f64) -> usize {
        if secs <= MIN_SECS {
            return 0;
        }
        let i = ((secs / MIN_SECS).ln() / RATIO.ln()) as usize;
        i.min(BINS - 1)
    }

    /// Upper bound of bin `i` in seconds.
    pub fn bin_upper(i: usize) -> f64 {
        MIN_SECS * RATIO.powi(i as i32 + 1)
    }

    pub fn record(&mut self, d: Duration) {
        let secs = d.as_secs_f64();
        self.counts[Self::bin(secs)] += 1;
        self.sum_secs += secs;
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.sum_secs += other.sum_secs;
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    pub fn sum_secs(&self) -> f64 {
        self.sum_secs
    }

    /// How many recorded values are at most `limit` (bin resolution: 10%).
    pub fn count_at_most(&self, limit: Duration) -> u64 {
        let last = Self::bin(limit.as_secs_f64());
        self.counts[..=last].iter().sum()
    }

    /// The `p`-th percentile (0–100) as the upper bound of its bin; `None` when empty.
    pub fn percentile(&self, p: f64) -> Option<Duration> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((p / 100.0) * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(Duration::from_secs_f64(Self::bin_upper(i)));
            }
        }
        None
    }

    /// Cumulative counts at each bin's upper bound, for Prometheus-style histograms.
    pub fn cumulative(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        let mut seen = 0;
        self.counts.iter().enumerate().map(move |(i, c)| {
            seen += c;
            (Self::bin_upper(i), seen)
        })
    }
}

/// Why a request was refused before it ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShedReason {
    QueueFull,
    WouldMissSlo,
    NotReady,
}

impl ShedReason {
    pub const ALL: [ShedReason; 3] = [
        ShedReason::QueueFull,
        ShedReason::WouldMissSlo,
        ShedReason::NotReady,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ShedReason::QueueFull => "queue_full",
            ShedReason::WouldMissSlo => "would_miss_slo",
            ShedReason::NotReady => "not_ready",
        }
    }
}

/// Counters and histograms for one second (or, in `totals`, since start).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counts {
    pub arrivals: u64,
    pub completions: u64,
    pub errors: u64,
    pub within_slo: u64,
    /// Rows run in batches (one request may carry several).
    pub rows: u64,
    pub shed: [u64; 3],
    pub queue: Histogram,
    pub compute: Histogram,
    pub end_to_end: Histogram,
    pub batch_sizes: Vec<u64>,
}

impl Counts {
    fn merge(&mut self, other: &Counts) {
        self.arrivals += other.arrivals;
        self.completions += other.completions;
        self.errors += other.errors;
        self.within_slo += other.within_slo;
        self.rows += other.rows;
        for (a, b) in self.shed.iter_mut().zip(other.shed) {
            *a += b;
        }
        self.queue.merge(&other.queue);
        self.compute.merge(&other.compute);
        self.end_to_end.merge(&other.end_to_end);
        if self.batch_sizes.len() < BATCH_BINS {
            self.batch_sizes.resize(BATCH_BINS, 0);
        }
        for (a, b) in self.batch_sizes.iter_mut().zip(&other.batch_sizes) {
            *a += b;
        }
    }

    fn record_batch(&mut self, rows: usize) {
        if self.batch_sizes.len() < BATCH_BINS {
            self.batch_sizes.resize(BATCH_BINS, 0);
        }
        self.batch_sizes[rows.clamp(1, BATCH_BINS) - 1] += 1;
        self.rows += rows as u64;
    }
}

struct Bucket {
    second: u64,
    /// The epoch its counts were recorded in.
    epoch: u64,
    counts: Counts,
}

struct Inner {
    ring: Vec<Bucket>,
    totals: Counts,
    /// The current epoch, counted from 0 at start.
    epoch: u64,
    /// When it began, on the window's clock.
    epoch_started: Duration,
}

impl Inner {
    /// The buckets of the current epoch within the last [`WINDOW_SECS`] before second `now`.
    fn window(&self, now: u64) -> impl Iterator<Item = &Bucket> {
        self.ring.iter().filter(move |b| {
            b.second != u64::MAX
                && b.epoch == self.epoch
                && now.saturating_sub(b.second) < WINDOW_SECS as u64
        })
    }
}

/// Where a window's time comes from.
enum Clock {
    /// Time since the window was created.
    Real(Instant),
    /// Time moved only by [`Stats::advance`].
    Manual(Mutex<Duration>),
}

impl Clock {
    fn elapsed(&self) -> Duration {
        match self {
            Clock::Real(started) => started.elapsed(),
            Clock::Manual(at) => *at.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }
}

/// The measurements of one tenant replica.
pub struct Stats {
    clock: Clock,
    slo: Mutex<Duration>,
    inner: Mutex<Inner>,
    /// Milliseconds since the Unix epoch when a request last finished; 0 before the first.
    last_completion_ms: AtomicU64,
}

/// A summary of the window, what reports and the scaler consume.
#[derive(Clone, Debug, PartialEq)]
pub struct WindowSummary {
    /// How long the window spans: at most [`WINDOW_SECS`], and no further back than the epoch.
    pub window_secs: f64,
    /// Seconds since the current epoch began (since start, when it is the first).
    pub epoch_secs: f64,
    pub arrival_rate_per_sec: f64,
    pub throughput_per_sec: f64,
    pub completions: u64,
    pub errors: u64,
    pub shed: u64,
    pub slo_attainment: Option<f64>,
    pub queue_p50_ms: Option<f64>,
    pub queue_p99_ms: Option<f64>,
    pub compute_p50_ms: Option<f64>,
    pub compute_p99_ms: Option<f64>,
    pub latency_p50_ms: Option<f64>,
    pub latency_p95_ms: Option<f64>,
    pub latency_p99_ms: Option<f64>,
    /// Batches by rows (index 0 = 1 row; the last bin is "64 or more").
    pub batch_sizes: Vec<u64>,
}

fn ms(d: Option<Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64() * 1e3)
}

impl Stats {
    pub fn new(slo: Duration) -> Stats {
        Stats::with_clock(slo, Clock::Real(Instant::now()))
    }

    /// A window whose clock moves only by [`Stats::advance`]: replays a recorded stream of
    /// measurements through the same window a serving replica keeps.
    pub fn replay(slo: Duration) -> Stats {
        Stats::with_clock(slo, Clock::Manual(Mutex::new(Duration::ZERO)))
    }

    /// Moves a [`Stats::replay`] window's clock forward by `by`; a serving window's clock is
    /// the wall clock, which this leaves alone.
    pub fn advance(&self, by: Duration) {
        if let Clock::Manual(at) = &self.clock {
            *at.lock().unwrap_or_else(|e| e.into_inner()) += by;
        }
    }

    fn with_clock(slo: Duration, clock: Clock) -> Stats {
        Stats {
            clock,
            slo: Mutex::new(slo),
            inner: Mutex::new(Inner {
                ring: (0..WINDOW_SECS)
                    .map(|_| Bucket {
                        second: u64::MAX,
                        epoch: 0,
                        counts: Counts::default(),
                    })
                    .collect(),
                totals: Counts::default(),
                epoch: 0,
                epoch_started: Duration::ZERO,
            }),
            last_completion_ms: AtomicU64::new(0),
        }
    }

    pub fn slo(&self) -> Duration {
        *self.slo.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_slo(&self, slo: Duration) {
        *self.slo.lock().unwrap_or_else(|e| e.into_inner()) = slo;
    }

    fn with_now(&self, f: impl Fn(&mut Counts)) {
        let second = self.clock.elapsed().as_secs();
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let slot = (second % WINDOW_SECS as u64) as usize;
        let epoch = inner.epoch;
        let bucket = &mut inner.ring[slot];
        if bucket.second != second || bucket.epoch != epoch {
            bucket.second = second;
            bucket.epoch = epoch;
            bucket.counts = Counts::default();
        }
        f(&mut bucket.counts);
        f(&mut inner.totals);
    }

    pub fn arrival(&self) {
        self.with_now(|c| c.arrivals += 1);
    }

    pub fn shed(&self, reason: ShedReason) {
        let i = ShedReason::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        self.with_now(|c| c.shed[i] += 1);
    }

    pub fn error(&self) {
        self.with_now(|c| c.errors += 1);
    }

    /// One batch of `rows` rows that ran in `compute`.
    pub fn batch(&self, rows: usize) {
        self.with_now(|c| c.record_batch(rows));
    }

    /// One request finished: its time in the queue and in compute.
    pub fn completion(&self, queue: Duration, compute: Duration) {
        let total = queue + compute;
        let within = total <= self.slo();
        self.with_now(|c| {
            c.completions += 1;
            c.within_slo += u64::from(within);
            c.queue.record(queue);
            c.compute.record(compute);
            c.end_to_end.record(total);
        });
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let ms = u64::try_from(now.as_millis()).unwrap_or(u64::MAX);
        self.last_completion_ms.store(ms, Ordering::Release);
    }

    /// When a request last finished, in milliseconds since the Unix epoch (`None` before the
    /// first).
    pub fn last_completion_ms(&self) -> Option<u64> {
        Some(self.last_completion_ms.load(Ordering::Acquire)).filter(|ms| *ms > 0)
    }

    /// Begins a new epoch: from now on the window holds only what is recorded from here.
    pub fn start_epoch(&self) {
        let now = self.clock.elapsed();
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.epoch += 1;
        inner.epoch_started = now;
    }

    /// Everything since start (Prometheus counters and histograms).
    pub fn totals(&self) -> Counts {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .totals
            .clone()
    }

    /// The last `WINDOW_SECS` seconds of the current epoch (fewer just after start or after
    /// [`Stats::start_epoch`]), the current second included.
    pub fn window(&self) -> WindowSummary {
        let elapsed = self.clock.elapsed();
        let now = elapsed.as_secs();
        let mut merged = Counts::default();
        let epoch_secs = {
            let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            for b in inner.window(now) {
                merged.merge(&b.counts);
            }
            elapsed.saturating_sub(inner.epoch_started).as_secs_f64()
        };
        let secs = epoch_secs.clamp(1e-3, WINDOW_SECS as f64);
        WindowSummary {
            window_secs: secs,
            epoch_secs,
            arrival_rate_per_sec: merged.arrivals as f64 / secs,
            throughput_per_sec: merged.completions as f64 / secs,
            completions: merged.completions,
            errors: merged.errors,
            shed: merged.shed.iter().sum(),
            slo_attainment: (merged.completions > 0)
                .then(|| merged.within_slo as f64 / merged.completions as f64),
            queue_p50_ms: ms(merged.queue.percentile(50.0)),
            queue_p99_ms: ms(merged.queue.percentile(99.0)),
            compute_p50_ms: ms(merged.compute.percentile(50.0)),
            compute_p99_ms: ms(merged.compute.percentile(99.0)),
            latency_p50_ms: ms(merged.end_to_end.percentile(50.0)),
            latency_p95_ms: ms(merged.end_to_end.percentile(95.0)),
            latency_p99_ms: ms(merged.end_to_end.percentile(99.0)),
            batch_sizes: merged.batch_sizes,
        }
    }

    /// The end-to-end latency at percentile `p` over the window (the current epoch's).
    pub fn latency_percentile(&self, p: f64) -> Option<Duration> {
        self.window_percentile(p, |c| &c.end_to_end)
    }

    /// The compute time (the request's batch, no queueing) at percentile `p` over the window
    /// (the current epoch's).
    pub fn compute_percentile(&self, p: f64) -> Option<Duration> {
        self.window_percentile(p, |c| &c.compute)
    }

    fn window_percentile(&self, p: f64, of: impl Fn(&Counts) -> &Histogram) -> Option<Duration> {
        let now = self.clock.elapsed().as_secs();
        let mut merged = Histogram::default();
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        for b in inner.window(now) {
            merged.merge(of(&b.counts));
        }
        merged.percentile(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_within_one_bin() {
        let mut h = Histogram::default();
        for ms in 1..=100 {
            h.record(Duration::from_millis(ms));
        }
        let p99 = h.percentile(99.0).expect("non-empty").as_secs_f64() * 1e3;
        assert!((99.0..=99.0 * 1.1 + 0.01).contains(&p99), "{p99}");
        let p50 = h.percentile(50.0).expect("non-empty").as_secs_f64() * 1e3;
        assert!((50.0..=55.1).contains(&p50), "{p50}");
        assert_eq!(h.count(), 100);
        assert_eq!(h.count_at_most(Duration::from_secs(10)), 100);
        assert!(Histogram::default().percentile(99.0).is_none());
    }

    #[test]
    fn extreme_durations_land_in_the_end_bins() {
        let mut h = Histogram::default();
        h.record(Duration::ZERO);
        h.record(Duration::from_secs(100_000));
        assert_eq!(h.counts[0], 1);
        assert_eq!(h.counts[BINS - 1], 1);
    }

    #[test]
    fn window_summarises_rates_and_attainment() {
        let stats = Stats::new(Duration::from_millis(10));
        for _ in 0..10 {
            stats.arrival();
        }
        for i in 0..10 {
            stats.completion(
                Duration::from_millis(1),
                Duration::from_millis(if i < 8 { 5 } else { 50 }),
            );
        }
        stats.batch(4);
        stats.shed(ShedReason::QueueFull);
        let w = stats.window();
        assert_eq!(w.completions, 10);
        assert_eq!(w.shed, 1);
        assert_eq!(w.slo_attainment, Some(0.8));
        assert_eq!(w.batch_sizes[3], 1);
        assert!(w.latency_p99_ms.expect("p99") >= 50.0);
        assert_eq!(stats.totals().completions, 10);
    }

    fn completions(stats: &Stats, n: u32, compute: Duration) {
        for _ in 0..n {
            stats.arrival();
            stats.completion(Duration::from_millis(1), compute);
        }
    }

    #[test]
    fn a_new_epoch_cuts_the_window_and_leaves_the_totals() {
        let stats = Stats::replay(Duration::from_millis(100));
        for _ in 0..10 {
            completions(&stats, 10, Duration::from_millis(150));
            stats.advance(Duration::from_millis(500));
        }
        let before = stats.window();
        assert_eq!((before.completions, before.epoch_secs), (100, 5.0));
        // The new knobs take effect halfway through a second; what that second measured
        // before them is not theirs.
        stats.start_epoch();
        let empty = stats.window();
        assert_eq!((empty.completions, empty.latency_p99_ms), (0, None));
        assert_eq!(stats.latency_percentile(99.0), None);
        completions(&stats, 10, Duration::from_millis(20));
        stats.advance(Duration::from_millis(1500));
        completions(&stats, 10, Duration::from_millis(20));
        let after = stats.window();
        assert_eq!(after.completions, 20);
        assert_eq!((after.window_secs, after.epoch_secs), (1.5, 1.5));
        assert!((after.arrival_rate_per_sec - 20.0 / 1.5).abs() < 1e-9);
        let p99 = stats.latency_percentile(99.0).expect("p99").as_secs_f64() * 1e3;
        assert!(p99 < 30.0, "{p99}");
        let compute = stats.compute_percentile(99.0).expect("p99").as_secs_f64() * 1e3;
        assert!(compute < 30.0, "{compute}");
        assert_eq!(stats.totals().completions, 120);
    }

    #[test]
    fn within_one_epoch_the_window_slides() {
        let stats = Stats::replay(Duration::from_millis(100));
        completions(&stats, 10, Duration::from_millis(150));
        stats.advance(Duration::from_secs(WINDOW_SECS as u64 + 5));
        completions(&stats, 10, Duration::from_millis(20));
        let w = stats.window();
        assert_eq!(w.completions, 10);
        assert_eq!(w.window_secs, WINDOW_SECS as f64);
        assert_eq!(w.epoch_secs, WINDOW_SECS as f64 + 5.0);
    }
}
