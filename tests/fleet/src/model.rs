//! Synthetic, self-consistent measurements of one tenant replica, so the operator sees a cluster
//! that behaves like one: a service time that grows with the batch size and with co-located
//! instances, a capacity that follows from it, and a tail latency that grows with utilisation
//! (queueing), over the tenant's offered load split across its replicas. Each tenant's base
//! service time and load come from a hash of its name, so a run is reproducible. A ripple of
//! ±3% on the latency keeps the numbers from being perfectly still, as real windows never are;
//! the load itself is steady, so a tenant near saturation does not swing by more than that.

use cotenant_crds::Knobs;
use cotenant_crds::report::{Serving, Window};
use cotenant_policy::{Profile, ProfilePoint};

/// Every replica's weights: a mid-sized model.
const WEIGHT_BYTES: u64 = 2 << 30;
/// Activations of one request in flight.
const ACTIVATION_BYTES: u64 = 64 << 20;
/// The window the agent's report covers.
const WINDOW_S: f64 = 30.0;

#[derive(Clone, Copy, Debug)]
pub struct Model {
    /// Service time of one request alone, in milliseconds.
    base_ms: f64,
    /// Requests per second offered to the whole tenant.
    arrival: f64,
    /// Phase of the ripple.
    phase: f64,
}

impl Model {
    /// The model of tenant `key` (its namespace and name).
    pub fn of(key: &str) -> Model {
        let h = fnv(key);
        let unit = |shift: u32| ((h >> shift) & 0xffff) as f64 / 65535.0;
        Model {
            base_ms: 2.0 + 18.0 * unit(0),
            // 2 to 30 requests a second: at the knobs DNNScaler settles on, 2,000 tenants keep
            // about 150 agents busy, so a pool of 200 has room to pack them into.
            arrival: 2.0 + 28.0 * unit(16),
            phase: std::f64::consts::TAU * unit(32),
        }
    }

    fn service_ms(&self, k: Knobs) -> f64 {
        let (b, m) = (f64::from(k.batch_size), f64::from(k.instances));
        self.base_ms * (0.6 + 0.4 * b) * (1.0 + 0.25 * (m - 1.0))
    }

    /// Requests per second one replica completes at `k` when saturated.
    fn capacity(&self, k: Knobs) -> f64 {
        f64::from(k.batch_size * k.instances) * 1000.0 / self.service_ms(k)
    }

    fn point(&self, batch: u32, instances: u32) -> ProfilePoint {
        let k = Knobs {
            batch_size: batch,
            instances,
        };
        ProfilePoint {
            batch,
            instances,
            throughput: self.capacity(k),
            p99_ms: self.service_ms(k),
            peak_activation_bytes: ACTIVATION_BYTES * u64::from(batch * instances),
            gpu_util: None,
        }
    }

    /// What DNNScaler's profiler would measure at the single knobs: (1, 1), (k, 1) and (1, k).
    /// No joint point: the fleet's tenants run Batching or MultiTenancy, whose memory the
    /// bench's pool is sized for.
    pub fn profile(&self, model: &str, k: Knobs) -> Profile {
        Profile {
            model: model.to_string(),
            weight_bytes: WEIGHT_BYTES,
            points: vec![
                self.point(1, 1),
                self.point(k.batch_size.max(2), 1),
                self.point(1, k.instances.max(2)),
            ],
        }
    }

    /// One replica's report at `knobs`, one of `replicas`, `t` seconds into the run and
    /// `since_s` seconds after its knobs last changed (the window covers no more than that).
    pub fn serving(
        &self,
        knobs: Knobs,
        replicas: u32,
        slo_ms: f64,
        t: f64,
        since_s: f64,
    ) -> Serving {
        let ripple = 1.0 + 0.03 * (t / 20.0 + self.phase).sin();
        let arrival = self.arrival / f64::from(replicas.max(1));
        let capacity = self.capacity(knobs);
        let rho = (arrival / capacity).min(0.97);
        let latency = self.service_ms(knobs) * (1.0 + 3.0 * rho / (1.0 - rho)) * ripple;
        let throughput = arrival.min(capacity);
        let window_s = WINDOW_S.min(since_s);
        let completions = (throughput * window_s) as u64;
        let attainment = if latency <= slo_ms { 0.995 } else { 0.9 };
        Serving {
            knobs,
            queue_depth: 0,
            admission_overrun: 1.0,
            latency_at_percentile_millis: Some(latency),
            compute_at_percentile_millis: Some(self.service_ms(knobs)),
            window: Window {
                seconds: window_s,
                arrival_rate_per_second: arrival,
                throughput_per_second: throughput,
                completions,
                slo_attainment: Some(attainment),
                latency_p99_millis: Some(latency),
                compute_p99_millis: Some(self.service_ms(knobs)),
                ..Window::default()
            },
            weight_bytes: WEIGHT_BYTES,
            since_knobs_changed_seconds: since_s,
        }
    }

    pub fn weight_bytes(&self) -> u64 {
        WEIGHT_BYTES
    }

    pub fn activation_bytes(&self, k: Knobs) -> u64 {
        ACTIVATION_BYTES * u64::from(k.batch_size * k.instances)
    }
}

/// FNV-1a, 64 bits.
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batching_raises_capacity_and_latency_grows_with_load() {
        let m = Model::of("team/a");
        let one = Knobs {
            batch_size: 1,
            instances: 1,
        };
        let four = Knobs {
            batch_size: 4,
            instances: 1,
        };
        assert!(m.capacity(four) > m.capacity(one));
        assert!(m.service_ms(four) > m.service_ms(one));
        let busy = m.serving(one, 1, 1e9, 0.0, 60.0);
        let spread = m.serving(one, 4, 1e9, 0.0, 60.0);
        assert!(spread.latency_at_percentile_millis < busy.latency_at_percentile_millis);
        assert!(busy.window.throughput_per_second <= m.capacity(one) + 1e-9);
    }
}
