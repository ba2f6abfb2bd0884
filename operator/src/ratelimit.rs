//! A client-side budget on the operator's API calls: a token bucket of `burst` calls refilled
//! at `qps` a second, the way client-go and controller-runtime bound a controller. The
//! operator's defaults are 100 QPS with a burst of 200 (`--api-qps`, `--api-burst`): each new
//! tenant needs about ten writes as it is placed, loads, is profiled and serves (statuses, its
//! Service and EndpointSlices, Events), so the budget bounds how fast a burst of new tenants
//! comes up (`operator/SCALE.md`), while a steady cluster uses almost none of it. Every write
//! and every read outside the watches waits for a token, so a round that has a lot to change
//! spreads it out instead of flooding the API server; watches are not counted.

use std::sync::Mutex;
use std::time::{Duration, Instant};

pub struct RateLimit {
    qps: f64,
    burst: f64,
    state: Mutex<Bucket>,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

impl RateLimit {
    /// `qps` calls a second on average, up to `burst` at once. A non-positive `qps` means no
    /// limit.
    pub fn new(qps: f64, burst: u32) -> RateLimit {
        let burst = f64::from(burst.max(1));
        RateLimit {
            qps,
            burst,
            state: Mutex::new(Bucket {
                tokens: burst,
                at: Instant::now(),
            }),
        }
    }

    /// How long the caller must wait for its token at `now`; the token is taken either way.
    fn reserve(&self, now: Instant) -> Duration {
        if !(self.qps > 0.0 && self.qps.is_finite()) {
            return Duration::ZERO;
        }
        let mut b = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + elapsed * self.qps).min(self.burst);
        b.at = now.max(b.at);
        b.tokens -= 1.0;
        if b.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-b.tokens / self.qps)
        }
    }

    /// Waits for one call's token.
    pub async fn acquire(&self) {
        let wait = self.reserve(Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_calls_are_spaced_at_the_rate() {
        let limit = RateLimit::new(10.0, 3);
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(limit.reserve(t0), Duration::ZERO);
        }
        // The fourth and fifth wait 0.1 s and 0.2 s.
        let w4 = limit.reserve(t0).as_secs_f64();
        let w5 = limit.reserve(t0).as_secs_f64();
        assert!(
            (w4 - 0.1).abs() < 1e-9 && (w5 - 0.2).abs() < 1e-9,
            "{w4} {w5}"
        );
        // After a quiet second the bucket is full again, never fuller.
        let t1 = t0 + Duration::from_secs(10);
        for _ in 0..3 {
            assert_eq!(limit.reserve(t1), Duration::ZERO);
        }
        assert!(limit.reserve(t1) > Duration::ZERO);
    }

    #[test]
    fn no_rate_means_no_limit() {
        let limit = RateLimit::new(0.0, 1);
        let t0 = Instant::now();
        for _ in 0..100 {
            assert_eq!(limit.reserve(t0), Duration::ZERO);
        }
    }
}
