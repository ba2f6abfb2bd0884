//! `/metrics` in the OpenMetrics text format, through `prometheus-client`. Every per-tenant
//! series is labelled `model` (the tenant's name) and `namespace` (its namespace; empty in
//! standalone mode), and is read from the tenants' statistics at scrape time.
//!
//! - Triton's names where Triton has a counterpart: `nv_inference_request_success`,
//!   `nv_inference_request_failure` (`reason` `REJECTED`: refused by admission control, or
//!   `BACKEND`: failed to run), `nv_inference_count` (rows), `nv_inference_exec_count` (batches),
//!   the cumulative `nv_inference_request_duration_us`, `nv_inference_queue_duration_us` and
//!   `nv_inference_compute_infer_duration_us`, and `nv_inference_pending_request_count`, also
//!   labelled `version` like Triton's. Triton exposes its counters without the `_total` suffix
//!   OpenMetrics gives counters, so they are typed `unknown` here to keep Triton's exact names:
//!   queries written for Triton work unchanged.
//! - The GPU from NVML (`crate::nvml`), per device (`gpu_uuid`), with Triton's names.
//! - cotenant's own: requests, completions, errors, answers within the SLO, refusals by reason,
//!   state, knobs, the SLO, window attainment and p99, arrival rate, admission's overrun factor,
//!   latency histograms by stage (queueing, compute, end to end), batches by rows, and the bytes
//!   requests hold.

use super::AppState;
use crate::registry::{Entry, State as TenantState};
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use cotenant_executor::runtime::Tenant;
use cotenant_executor::runtime::stats::{Counts, Histogram, ShedReason, WindowSummary};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::sync::Arc;

/// Bucket bounds (seconds) exposed for latency histograms: a subset of the stats' finer bins.
const BOUNDS: [f64; 16] = [
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// The model version every tenant is served as (the one `/v2/models/<m>/versions/1` names).
const VERSION: &str = "1";

pub async fn render(State(app): State<Arc<AppState>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text(&app),
    )
}

fn text(app: &AppState) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(TenantMetrics {
        entries: app.registry.all(),
        inflight_bytes: app.budget.in_flight(),
    }));
    registry.register_collector(Box::new(crate::nvml::GpuMetrics));
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &registry) {
        tracing::error!(error = %e, "encoding /metrics failed");
    }
    out
}

/// The tenants as they are at this scrape.
struct TenantMetrics {
    entries: Vec<Arc<Entry>>,
    inflight_bytes: u64,
}

impl std::fmt::Debug for TenantMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantMetrics")
            .field("tenants", &self.entries.len())
            .finish()
    }
}

/// A tenant's `model` and `namespace` labels: its ModelTenant's, or its served name alone.
fn labels(e: &Entry) -> Vec<(&'static str, String)> {
    match &e.tenant_ref {
        Some(t) => vec![
            ("model", t.name.clone()),
            ("namespace", t.namespace.clone()),
        ],
        None => vec![("model", e.name.clone()), ("namespace", String::new())],
    }
}

fn with(mut labels: Vec<(&'static str, String)>, key: &'static str, value: &str) -> Labels {
    labels.push((key, value.to_string()));
    labels
}

type Labels = Vec<(&'static str, String)>;

/// A metric family read from each tenant: its name, help, and how to read its value.
type Read<T, V> = (&'static str, &'static str, fn(&T) -> V);

/// One Ready tenant at this scrape: its labels, replica, totals and window (each read once).
struct Serving<'a> {
    labels: Labels,
    tenant: &'a Tenant,
    entry: &'a Entry,
    totals: Counts,
    window: WindowSummary,
}

/// Writes one metric family: its descriptor, then one sample per `(labels, value)`.
fn family<V>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    samples: impl IntoIterator<Item = (Labels, V)>,
    mut write: impl FnMut(&mut MetricEncoder, V) -> Result<(), std::fmt::Error>,
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, value) in samples {
        write(&mut metric.encode_family(&labels)?, value)?;
    }
    Ok(())
}

fn counter(m: &mut MetricEncoder, v: u64) -> Result<(), std::fmt::Error> {
    m.encode_counter::<NoLabelSet, u64, f64>(&v, None)
}

fn gauge(m: &mut MetricEncoder, v: f64) -> Result<(), std::fmt::Error> {
    m.encode_gauge(&v)
}

fn integer(m: &mut MetricEncoder, v: u64) -> Result<(), std::fmt::Error> {
    m.encode_gauge(&v)
}

fn micros(h: &Histogram) -> u64 {
    (h.sum_secs() * 1e6).round() as u64
}

impl Collector for TenantMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let serving: Vec<Serving> = self
            .entries
            .iter()
            .filter_map(|e| match &e.state {
                TenantState::Ready { tenant, .. } => Some(Serving {
                    labels: labels(e),
                    tenant,
                    entry: e,
                    totals: tenant.stats().totals(),
                    window: tenant.stats().window(),
                }),
                _ => None,
            })
            .collect();
        let triton = |s: &Serving| with(s.labels.clone(), "version", VERSION);
        let e = &mut encoder;

        // Triton's names.
        let triton_counters: [Read<Counts, u64>; 6] = [
            (
                "nv_inference_request_success",
                "Requests answered (Triton's name).",
                |c| c.completions,
            ),
            (
                "nv_inference_count",
                "Rows inferred, a batch of n rows counting n (Triton's name).",
                |c| c.rows,
            ),
            (
                "nv_inference_exec_count",
                "Batches run (Triton's name).",
                |c| c.batch_sizes.iter().sum(),
            ),
            (
                "nv_inference_request_duration_us",
                "Cumulative end-to-end time of the requests answered, in microseconds (Triton's name).",
                |c| micros(&c.end_to_end),
            ),
            (
                "nv_inference_queue_duration_us",
                "Cumulative time requests waited in the queue, in microseconds (Triton's name).",
                |c| micros(&c.queue),
            ),
            (
                "nv_inference_compute_infer_duration_us",
                "Cumulative time requests spent in compute, in microseconds (Triton's name).",
                |c| micros(&c.compute),
            ),
        ];
        for (name, help, value) in triton_counters {
            family(
                e,
                name,
                help,
                MetricType::Unknown,
                serving.iter().map(|s| (triton(s), value(&s.totals))),
                integer,
            )?;
        }
        family(
            e,
            "nv_inference_request_failure",
            "Requests that failed, by reason: REJECTED (refused by admission control) or BACKEND (invalid or failed to run) (Triton's name).",
            MetricType::Unknown,
            serving.iter().flat_map(|s| {
                [
                    (
                        with(triton(s), "reason", "REJECTED"),
                        s.totals.shed.iter().sum(),
                    ),
                    (with(triton(s), "reason", "BACKEND"), s.totals.errors),
                ]
            }),
            integer,
        )?;
        family(
            e,
            "nv_inference_pending_request_count",
            "Requests waiting in the queue (Triton's name).",
            MetricType::Gauge,
            serving
                .iter()
                .map(|s| (triton(s), s.tenant.queue_depth() as u64)),
            integer,
        )?;

        // cotenant's own.
        family(
            e,
            "cotenant_agent_inflight_bytes",
            "Bytes requests hold now (bodies, decoded tensors), against --max-inflight-bytes.",
            MetricType::Gauge,
            [(Labels::new(), self.inflight_bytes)],
            integer,
        )?;
        family(
            e,
            "cotenant_agent_tenant_state",
            "1 for the state each tenant is in.",
            MetricType::Gauge,
            self.entries.iter().flat_map(|entry| {
                ["Loading", "Ready", "Failed"].map(|state| {
                    let v = u64::from(entry.state.word() == state);
                    (with(labels(entry), "state", state), v)
                })
            }),
            integer,
        )?;
        let counters: [Read<Counts, u64>; 4] = [
            ("cotenant_agent_requests", "Requests that arrived.", |c| {
                c.arrivals
            }),
            ("cotenant_agent_completions", "Requests answered.", |c| {
                c.completions
            }),
            (
                "cotenant_agent_errors",
                "Requests that failed (invalid or failed to run).",
                |c| c.errors,
            ),
            (
                "cotenant_agent_within_slo",
                "Requests answered within the latency SLO.",
                |c| c.within_slo,
            ),
        ];
        for (name, help, value) in counters {
            family(
                e,
                name,
                help,
                MetricType::Counter,
                serving.iter().map(|s| (s.labels.clone(), value(&s.totals))),
                counter,
            )?;
        }
        family(
            e,
            "cotenant_agent_shed",
            "Requests refused by admission control, by reason.",
            MetricType::Counter,
            serving.iter().flat_map(|s| {
                ShedReason::ALL.iter().enumerate().map(|(i, reason)| {
                    (
                        with(s.labels.clone(), "reason", reason.as_str()),
                        s.totals.shed[i],
                    )
                })
            }),
            counter,
        )?;
        let gauges: [Read<Serving, Option<f64>>; 9] = [
            ("cotenant_agent_queue_depth", "Requests waiting.", |s| {
                Some(s.tenant.queue_depth() as f64)
            }),
            (
                "cotenant_agent_admission_overrun",
                "How far recent requests overran admission's latency predictions, at the SLO's percentile; admission scales its predictions by it.",
                |s| Some(s.tenant.admission_overrun()),
            ),
            (
                "cotenant_agent_batch_size_knob",
                "Largest batch per instance.",
                |s| Some(s.tenant.knobs().0 as f64),
            ),
            (
                "cotenant_agent_instances_knob",
                "Instances serving the tenant.",
                |s| Some(s.tenant.knobs().1 as f64),
            ),
            (
                "cotenant_agent_slo_latency_seconds",
                "The tenant's latency SLO.",
                |s| Some(s.entry.slo_millis / 1e3),
            ),
            (
                "cotenant_agent_slo_percentile",
                "The percentile of requests the SLO bounds (99 for p99).",
                |s| Some(s.entry.percentile),
            ),
            (
                "cotenant_agent_slo_attainment",
                "Fraction of requests within the SLO over the window.",
                |s| s.window.slo_attainment,
            ),
            (
                "cotenant_agent_latency_p99_seconds",
                "End-to-end p99 latency over the window.",
                |s| s.window.latency_p99_ms.map(|ms| ms / 1e3),
            ),
            (
                "cotenant_agent_arrival_rate",
                "Requests per second arriving over the window.",
                |s| Some(s.window.arrival_rate_per_sec),
            ),
        ];
        for (name, help, value) in gauges {
            family(
                e,
                name,
                help,
                MetricType::Gauge,
                serving
                    .iter()
                    .filter_map(|s| Some((s.labels.clone(), value(s)?))),
                gauge,
            )?;
        }
        family(
            e,
            "cotenant_agent_request_duration_seconds",
            "Request latency by stage: queue, compute, end_to_end.",
            MetricType::Histogram,
            serving.iter().flat_map(|s| {
                [
                    ("queue", &s.totals.queue),
                    ("compute", &s.totals.compute),
                    ("end_to_end", &s.totals.end_to_end),
                ]
                .map(|(stage, h)| (with(s.labels.clone(), "stage", stage), h))
            }),
            |m, h| m.encode_histogram::<NoLabelSet>(h.sum_secs(), h.count(), &buckets(h), None),
        )?;
        family(
            e,
            "cotenant_agent_batches",
            "Batches run, by rows (64 means 64 or more).",
            MetricType::Counter,
            serving.iter().flat_map(|s| {
                s.totals
                    .batch_sizes
                    .iter()
                    .enumerate()
                    .filter(|(_, n)| **n > 0)
                    .map(|(i, n)| (with(s.labels.clone(), "rows", &(i + 1).to_string()), *n))
            }),
            counter,
        )
    }
}

/// The histogram's counts per exposed bucket (not cumulative; the encoder adds them up), the
/// last one `+Inf`. The stats' bins are finer: a bucket counts every bin whose upper bound is
/// within it.
fn buckets(h: &Histogram) -> Vec<(f64, u64)> {
    let cumulative: Vec<(f64, u64)> = h.cumulative().collect();
    let mut out = Vec::with_capacity(BOUNDS.len() + 1);
    let mut below = 0;
    for bound in BOUNDS {
        let upto = cumulative
            .iter()
            .take_while(|(upper, _)| *upper <= bound)
            .last()
            .map_or(0, |(_, c)| *c);
        out.push((bound, upto - below));
        below = upto;
    }
    out.push((f64::INFINITY, h.count() - below));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_add_up_to_the_count() {
        let mut h = Histogram::default();
        for ms in [0.5, 3.0, 3.0, 40.0, 200_000.0] {
            h.record(std::time::Duration::from_secs_f64(ms / 1e3));
        }
        let b = buckets(&h);
        assert_eq!(b.len(), BOUNDS.len() + 1);
        assert_eq!(b.iter().map(|(_, n)| n).sum::<u64>(), 5);
        assert_eq!(b[0], (0.001, 1), "0.5 ms");
        assert_eq!(b.last(), Some(&(f64::INFINITY, 1)), "200 s is past 120 s");
    }
}
