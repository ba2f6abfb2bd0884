//! `/metrics` in the Prometheus text format: per-tenant counters, queue depth, knobs, latency
//! histograms by stage (queueing, compute, end to end), batch sizes and SLO attainment, and the
//! bytes requests hold.

use super::AppState;
use crate::registry::State as TenantState;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use cotenant_executor::runtime::stats::{Counts, Histogram, ShedReason};
use std::fmt::Write;
use std::sync::Arc;

/// Bucket bounds (seconds) exposed for latency histograms: a subset of the stats' finer bins.
const BOUNDS: [f64; 16] = [
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0,
];

pub async fn render(State(app): State<Arc<AppState>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text(&app),
    )
}

fn text(app: &AppState) -> String {
    let mut out = String::new();
    let entries = app.registry.all();
    let _ = writeln!(
        out,
        "# HELP cotenant_agent_inflight_bytes Bytes requests hold now (bodies, decoded tensors), against --max-inflight-bytes."
    );
    let _ = writeln!(out, "# TYPE cotenant_agent_inflight_bytes gauge");
    let _ = writeln!(
        out,
        "cotenant_agent_inflight_bytes {}",
        app.budget.in_flight()
    );
    let _ = writeln!(
        out,
        "# HELP cotenant_agent_tenant_state 1 for the state each tenant is in."
    );
    let _ = writeln!(out, "# TYPE cotenant_agent_tenant_state gauge");
    for e in &entries {
        for state in ["Loading", "Ready", "Failed"] {
            let v = u8::from(e.state.word() == state);
            let _ = writeln!(
                out,
                "cotenant_agent_tenant_state{{tenant=\"{}\",state=\"{state}\"}} {v}",
                e.name
            );
        }
    }
    let ready: Vec<_> = entries
        .iter()
        .filter_map(|e| match &e.state {
            TenantState::Ready { tenant, .. } => Some((e.name.as_str(), tenant)),
            _ => None,
        })
        .collect();
    let counter = |out: &mut String, name: &str, help: &str, f: &dyn Fn(&Counts) -> u64| {
        let _ = writeln!(out, "# HELP cotenant_agent_{name} {help}");
        let _ = writeln!(out, "# TYPE cotenant_agent_{name} counter");
        for (tenant, t) in &ready {
            let _ = writeln!(
                out,
                "cotenant_agent_{name}{{tenant=\"{tenant}\"}} {}",
                f(&t.stats().totals())
            );
        }
    };
    counter(&mut out, "requests_total", "Requests that arrived.", &|c| {
        c.arrivals
    });
    counter(&mut out, "completions_total", "Requests answered.", &|c| {
        c.completions
    });
    counter(
        &mut out,
        "errors_total",
        "Requests that failed (invalid or failed to run).",
        &|c| c.errors,
    );
    counter(
        &mut out,
        "within_slo_total",
        "Requests answered within the latency SLO.",
        &|c| c.within_slo,
    );

    let _ = writeln!(
        out,
        "# HELP cotenant_agent_shed_total Requests refused by admission control."
    );
    let _ = writeln!(out, "# TYPE cotenant_agent_shed_total counter");
    for (tenant, t) in &ready {
        let totals = t.stats().totals();
        for (i, reason) in ShedReason::ALL.iter().enumerate() {
            let _ = writeln!(
                out,
                "cotenant_agent_shed_total{{tenant=\"{tenant}\",reason=\"{}\"}} {}",
                reason.as_str(),
                totals.shed[i]
            );
        }
    }

    let gauge = |out: &mut String,
                 name: &str,
                 help: &str,
                 f: &dyn Fn(&cotenant_executor::runtime::Tenant) -> Option<f64>| {
        let _ = writeln!(out, "# HELP cotenant_agent_{name} {help}");
        let _ = writeln!(out, "# TYPE cotenant_agent_{name} gauge");
        for (tenant, t) in &ready {
            if let Some(v) = f(t) {
                let _ = writeln!(out, "cotenant_agent_{name}{{tenant=\"{tenant}\"}} {v}");
            }
        }
    };
    gauge(&mut out, "queue_depth", "Requests waiting.", &|t| {
        Some(t.queue_depth() as f64)
    });
    gauge(
        &mut out,
        "admission_overrun",
        "How far recent requests overran admission's latency predictions, at the SLO's percentile; admission scales its predictions by it.",
        &|t| Some(t.admission_overrun()),
    );
    gauge(
        &mut out,
        "batch_size_knob",
        "Largest batch per instance.",
        &|t| Some(t.knobs().0 as f64),
    );
    gauge(
        &mut out,
        "instances_knob",
        "Instances serving the tenant.",
        &|t| Some(t.knobs().1 as f64),
    );
    gauge(
        &mut out,
        "slo_attainment",
        "Fraction of requests within the SLO over the window.",
        &|t| t.stats().window().slo_attainment,
    );
    gauge(
        &mut out,
        "latency_p99_seconds",
        "End-to-end p99 latency over the window.",
        &|t| t.stats().window().latency_p99_ms.map(|ms| ms / 1e3),
    );
    gauge(
        &mut out,
        "arrival_rate",
        "Requests per second arriving over the window.",
        &|t| Some(t.stats().window().arrival_rate_per_sec),
    );

    let _ = writeln!(
        out,
        "# HELP cotenant_agent_request_duration_seconds Request latency by stage."
    );
    let _ = writeln!(
        out,
        "# TYPE cotenant_agent_request_duration_seconds histogram"
    );
    for (tenant, t) in &ready {
        let totals = t.stats().totals();
        for (stage, h) in [
            ("queue", &totals.queue),
            ("compute", &totals.compute),
            ("end_to_end", &totals.end_to_end),
        ] {
            histogram(&mut out, tenant, stage, h);
        }
    }
    let _ = writeln!(
        out,
        "# HELP cotenant_agent_batches_total Batches run, by rows (64 means 64 or more)."
    );
    let _ = writeln!(out, "# TYPE cotenant_agent_batches_total counter");
    for (tenant, t) in &ready {
        for (i, n) in t
            .stats()
            .totals()
            .batch_sizes
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
        {
            let _ = writeln!(
                out,
                "cotenant_agent_batches_total{{tenant=\"{tenant}\",rows=\"{}\"}} {n}",
                i + 1
            );
        }
    }
    out
}

fn histogram(out: &mut String, tenant: &str, stage: &str, h: &Histogram) {
    let cumulative: Vec<(f64, u64)> = h.cumulative().collect();
    for bound in BOUNDS {
        // The stats bins are finer; a bucket counts every bin whose upper bound is within it.
        let count = cumulative
            .iter()
            .take_while(|(upper, _)| *upper <= bound)
            .last()
            .map_or(0, |(_, c)| *c);
        let _ = writeln!(
            out,
            "cotenant_agent_request_duration_seconds_bucket{{tenant=\"{tenant}\",stage=\"{stage}\",le=\"{bound}\"}} {count}"
        );
    }
    let _ = writeln!(
        out,
        "cotenant_agent_request_duration_seconds_bucket{{tenant=\"{tenant}\",stage=\"{stage}\",le=\"+Inf\"}} {}",
        h.count()
    );
    let _ = writeln!(
        out,
        "cotenant_agent_request_duration_seconds_sum{{tenant=\"{tenant}\",stage=\"{stage}\"}} {}",
        h.sum_secs()
    );
    let _ = writeln!(
        out,
        "cotenant_agent_request_duration_seconds_count{{tenant=\"{tenant}\",stage=\"{stage}\"}} {}",
        h.count()
    );
}
