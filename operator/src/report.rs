//! Agent reports: what each agent's `/report` endpoint says about its tenants, scraped by the
//! leader concurrently with a timeout, authenticated with the operator's ServiceAccount token.
//!
//! A report is what one agent says, and an agent runs other teams' models: the operator reads at
//! most [`MAX_REPORT_BYTES`] of it, counters saturate instead of failing or overflowing, and
//! [`AgentReport::sanitize`] drops or bounds values the rest of the operator (and the API server,
//! when they reach a status) would choke on.

use cotenant_policy::Profile;
use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// Largest report body read from an agent: far above what 64 tenants produce.
pub const MAX_REPORT_BYTES: usize = 4 << 20;
/// Most tenant entries kept from one report (a GpuAgent holds at most 64 assignments).
const MAX_TENANTS: usize = 256;
/// Most profile points kept for one tenant.
const MAX_PROFILE_POINTS: usize = 64;
/// Longest error text kept from an agent: it ends up in a condition and an Event.
const MAX_ERROR_CHARS: usize = 1024;
/// Largest rate or latency believed, per second or in milliseconds.
const MAX_MEASURE: f64 = 1e9;
/// Counters and byte sizes saturate here: the API server stores integers as int64.
const MAX_COUNT: u64 = i64::MAX as u64;

/// One agent's report.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct AgentReport {
    #[serde(default)]
    pub tenants: Vec<TenantReport>,
}

/// One tenant replica as its agent reports it.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TenantReport {
    /// `namespace`, `name` and `uid` of the ModelTenant (Kubernetes mode).
    #[serde(default)]
    pub tenant: Option<ReportedTenant>,
    /// `Loading`, `Profiling`, `Ready` or `Failed`.
    pub state: String,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub knobs: Option<ReportedKnobs>,
    #[serde(default, deserialize_with = "saturating_opt")]
    pub queue_depth: Option<u64>,
    #[serde(default)]
    pub latency_at_percentile_millis: Option<f64>,
    /// Compute time (the request's batch, no queueing) at the SLO's percentile; older agents
    /// do not send it.
    #[serde(default)]
    pub compute_at_percentile_millis: Option<f64>,
    #[serde(default)]
    pub window: Option<Window>,
    #[serde(default, deserialize_with = "saturating_opt")]
    pub weight_bytes: Option<u64>,
    #[serde(default)]
    pub profile: Option<Profile>,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct ReportedTenant {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReportedKnobs {
    pub batch_size: u32,
    pub instances: u32,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Window {
    #[serde(default)]
    pub arrival_rate_per_second: f64,
    #[serde(default)]
    pub throughput_per_second: f64,
    #[serde(default, deserialize_with = "saturating")]
    pub completions: u64,
    #[serde(default)]
    pub slo_attainment: Option<f64>,
    /// Requests admission control refused.
    #[serde(default, deserialize_with = "saturating")]
    pub shed: u64,
}

/// A count as any JSON number: negative is 0, fractions are cut, anything above [`MAX_COUNT`]
/// is `MAX_COUNT`.
fn count(n: &serde_json::Number) -> u64 {
    match (n.as_u64(), n.as_i64(), n.as_f64()) {
        (Some(u), _, _) => u.min(MAX_COUNT),
        (None, Some(_), _) => 0,
        (None, None, Some(f)) if f >= MAX_COUNT as f64 => MAX_COUNT,
        (None, None, Some(f)) if f > 0.0 => f as u64,
        _ => 0,
    }
}

fn saturating<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    serde_json::Number::deserialize(d).map(|n| count(&n))
}

fn saturating_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Option::<serde_json::Number>::deserialize(d).map(|n| n.as_ref().map(count))
}

/// A measured rate or latency: finite and within `[0, MAX_MEASURE]`, else nothing.
fn measure(x: f64) -> Option<f64> {
    (x.is_finite() && (0.0..=MAX_MEASURE).contains(&x)).then_some(x)
}

/// At most `max` characters of `text`.
fn truncate(text: &mut String, max: usize) {
    if let Some((cut, _)) = text.char_indices().nth(max) {
        text.truncate(cut);
        text.push('…');
    }
}

impl AgentReport {
    /// Parses a report body and bounds what it says; see [`AgentReport::sanitize`].
    pub fn parse(body: &[u8]) -> Result<AgentReport, serde_json::Error> {
        let mut report: AgentReport = serde_json::from_slice(body)?;
        report.sanitize();
        Ok(report)
    }

    /// Keeps at most [`MAX_TENANTS`] entries; in each, drops measurements that are not finite,
    /// negative or absurd, clamps the SLO attainment to [0, 1], cuts long errors, and drops a
    /// profile the API server would refuse in a status (knobs out of range, bad numbers).
    pub fn sanitize(&mut self) {
        self.tenants.truncate(MAX_TENANTS);
        for t in &mut self.tenants {
            truncate(&mut t.state, 32);
            if let Some(e) = &mut t.error {
                truncate(e, MAX_ERROR_CHARS);
            }
            t.latency_at_percentile_millis = t.latency_at_percentile_millis.and_then(measure);
            t.compute_at_percentile_millis = t.compute_at_percentile_millis.and_then(measure);
            if let Some(w) = &mut t.window {
                w.arrival_rate_per_second = measure(w.arrival_rate_per_second).unwrap_or(0.0);
                w.throughput_per_second = measure(w.throughput_per_second).unwrap_or(0.0);
                w.slo_attainment = w
                    .slo_attainment
                    .filter(|a| a.is_finite())
                    .map(|a| a.clamp(0.0, 1.0));
            }
            if t.knobs
                .is_some_and(|k| !knobs_in_range(k.batch_size, k.instances))
            {
                t.knobs = None;
            }
            if t.profile.as_ref().is_some_and(|p| !profile_in_range(p)) {
                t.profile = None;
            }
        }
    }

    /// The replica of tenant `uid` on this agent.
    pub fn tenant(&self, uid: &str) -> Option<&TenantReport> {
        self.tenants
            .iter()
            .find(|t| t.tenant.as_ref().is_some_and(|r| r.uid == uid))
    }
}

/// Knobs the API accepts (`Knobs` in the CRDs).
fn knobs_in_range(batch: u32, instances: u32) -> bool {
    (1..=1024).contains(&batch) && (1..=64).contains(&instances)
}

/// A profile whose every number can be written to a tenant's status and planned with.
fn profile_in_range(p: &Profile) -> bool {
    !p.points.is_empty()
        && p.points.len() <= MAX_PROFILE_POINTS
        && p.weight_bytes <= MAX_COUNT
        && p.points.iter().all(|q| {
            knobs_in_range(q.batch, q.instances)
                && measure(q.throughput).is_some()
                && measure(q.p99_ms).is_some()
                && q.peak_activation_bytes <= MAX_COUNT
                && q.gpu_util
                    .is_none_or(|u| u.is_finite() && (0.0..=1.0).contains(&u))
        })
}

/// Scrapes agents' `/report` with the operator's token.
pub struct Scraper {
    http: reqwest::Client,
    token_file: Option<PathBuf>,
}

impl Scraper {
    pub fn new(token_file: Option<PathBuf>, timeout: Duration) -> anyhow::Result<Scraper> {
        // No redirects: an agent must not send the operator (and its token) elsewhere.
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(Scraper { http, token_file })
    }

    /// Every agent's report by agent name; an agent that cannot be read maps to its error.
    pub async fn scrape_all(
        &self,
        admin_addresses: Vec<(String, String)>,
    ) -> BTreeMap<String, Result<AgentReport, String>> {
        // Re-read each round: projected tokens rotate.
        let token = match &self.token_file {
            Some(path) => std::fs::read_to_string(path)
                .map(|t| t.trim().to_string())
                .map_err(|e| format!("cannot read the report token {}: {e}", path.display())),
            None => Err("no report token configured (COTENANT_REPORT_TOKEN_FILE)".to_string()),
        };
        let scrapes = admin_addresses.into_iter().map(|(agent, address)| {
            let token = token.clone();
            async move {
                let result = match token {
                    Ok(token) => self.scrape(&address, &token).await,
                    Err(e) => Err(e),
                };
                (agent, result)
            }
        });
        futures::future::join_all(scrapes)
            .await
            .into_iter()
            .collect()
    }

    async fn scrape(&self, address: &str, token: &str) -> Result<AgentReport, String> {
        let url = format!("http://{address}/report");
        let response = self
            .http
            .get(&url)
            .bearer_auth(token)
            .send()
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        let status = response.status();
        let body = read_capped(response, MAX_REPORT_BYTES)
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        if !status.is_success() {
            return Err(format!(
                "GET {url}: {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(200)])
            ));
        }
        AgentReport::parse(&body).map_err(|e| format!("GET {url}: bad report: {e}"))
    }
}

/// The body of `response`, or an error as soon as it is known to exceed `cap` bytes (from its
/// Content-Length, or while reading it), so a hostile agent cannot make the operator buffer more.
async fn read_capped(mut response: reqwest::Response, cap: usize) -> Result<Vec<u8>, String> {
    let too_large = || format!("the report is larger than {cap} bytes");
    if response.content_length().is_some_and(|n| n > cap as u64) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| e.to_string())? {
        if body.len() + chunk.len() > cap {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_report_parses_with_and_without_optional_parts() {
        let report: AgentReport = serde_json::from_value(serde_json::json!({"tenants": [
            {"name": "a.t", "state": "Ready", "tenant": {"namespace": "a", "name": "t", "uid": "u1"},
             "knobs": {"batchSize": 4, "instances": 1}, "queueDepth": 0,
             "latencyAtPercentileMillis": 12.5, "computeAtPercentileMillis": 4.5,
             "window": {"seconds": 30, "arrivalRatePerSecond": 3.0, "throughputPerSecond": 3.0,
                        "completions": 90, "sloAttainment": 1.0},
             "weightBytes": 1000,
             "profile": {"model": "m", "weight_bytes": 1000, "points": [
                 {"batch": 1, "instances": 1, "throughput": 10.0, "p99_ms": 5.0}]}},
            {"name": "a.u", "state": "Failed", "error": "no such file",
             "tenant": {"namespace": "a", "name": "u", "uid": "u2"}}
        ]}))
        .expect("parses");
        let ready = report.tenant("u1").expect("u1");
        assert_eq!(ready.latency_at_percentile_millis, Some(12.5));
        assert_eq!(ready.compute_at_percentile_millis, Some(4.5));
        assert_eq!(ready.profile.as_ref().map(|p| p.points.len()), Some(1));
        let failed = report.tenant("u2").expect("u2");
        assert_eq!(failed.error.as_deref(), Some("no such file"));
        assert!(report.tenant("u3").is_none());
    }

    fn one_tenant(fields: serde_json::Value) -> TenantReport {
        let mut entry = serde_json::json!({
            "state": "Ready", "tenant": {"namespace": "a", "name": "t", "uid": "u"}
        });
        if let (Some(e), Some(f)) = (entry.as_object_mut(), fields.as_object()) {
            e.extend(f.clone());
        }
        let body = serde_json::to_vec(&serde_json::json!({"tenants": [entry]})).expect("json");
        AgentReport::parse(&body).expect("parses").tenants[0].clone()
    }

    #[test]
    fn counters_saturate_instead_of_failing_or_overflowing() {
        // 2^64 and 1e30 do not fit a u64; -5 is not a count.
        let body = br#"{"tenants": [{"state": "Ready", "queueDepth": 18446744073709551616,
            "weightBytes": -5, "window": {"completions": 1e30, "shed": 12.7}}]}"#;
        let report = AgentReport::parse(body).expect("a hostile report still parses");
        let t = &report.tenants[0];
        assert_eq!(t.queue_depth, Some(MAX_COUNT));
        assert_eq!(t.weight_bytes, Some(0));
        let w = t.window.as_ref().expect("window");
        assert_eq!((w.completions, w.shed), (MAX_COUNT, 12));
        let exact = one_tenant(serde_json::json!({"window": {"completions": u64::MAX}}));
        assert_eq!(exact.window.map(|w| w.completions), Some(MAX_COUNT));
    }

    #[test]
    fn measurements_are_bounded_and_errors_cut() {
        let t = one_tenant(serde_json::json!({
            "latencyAtPercentileMillis": -1.0,
            "computeAtPercentileMillis": 1e300,
            "error": "x".repeat(100_000),
            "knobs": {"batchSize": 0, "instances": 1},
            "window": {"arrivalRatePerSecond": 1e300, "throughputPerSecond": -3.0,
                       "sloAttainment": 7.5}
        }));
        assert_eq!(t.latency_at_percentile_millis, None);
        assert_eq!(t.compute_at_percentile_millis, None);
        assert!(
            t.error
                .as_ref()
                .is_some_and(|e| e.chars().count() <= MAX_ERROR_CHARS + 1)
        );
        assert_eq!(t.knobs, None);
        let w = t.window.expect("window");
        assert_eq!(
            (w.arrival_rate_per_second, w.throughput_per_second),
            (0.0, 0.0)
        );
        assert_eq!(w.slo_attainment, Some(1.0));
    }

    #[test]
    fn a_profile_the_status_could_not_hold_is_dropped() {
        let point = |batch: u32, throughput: f64| {
            serde_json::json!({"batch": batch, "instances": 1, "throughput": throughput,
                               "p99_ms": 5.0})
        };
        let profile = |points: Vec<serde_json::Value>| {
            one_tenant(
                serde_json::json!({"profile": {"model": "m", "weight_bytes": 10,
                                                      "points": points}}),
            )
            .profile
        };
        assert!(profile(vec![point(1, 10.0), point(4, 30.0)]).is_some());
        assert!(profile(vec![point(1, 10.0), point(5000, 30.0)]).is_none());
        assert!(profile(vec![point(1, 1e300)]).is_none());
        assert!(profile(vec![]).is_none());
        assert!(profile((0..65).map(|_| point(1, 1.0)).collect()).is_none());
    }

    #[test]
    fn at_most_max_tenants_entries_are_kept() {
        let entries: Vec<serde_json::Value> = (0..MAX_TENANTS + 10)
            .map(|i| serde_json::json!({"state": "Ready", "name": format!("t{i}")}))
            .collect();
        let body = serde_json::to_vec(&serde_json::json!({"tenants": entries})).expect("json");
        assert_eq!(
            AgentReport::parse(&body).expect("parses").tenants.len(),
            MAX_TENANTS
        );
    }

    fn scraper() -> Scraper {
        // What main does first: one TLS provider for the binary.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Scraper::new(None, Duration::from_secs(10)).expect("scraper")
    }

    /// Serves one raw HTTP response to every connection on a loopback port.
    async fn agent_answering(head: String, body_bytes: usize) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("addr").to_string();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let head = head.clone();
                tokio::spawn(async move {
                    let mut request = [0u8; 2048];
                    let _ = stream.read(&mut request).await;
                    let _ = stream.write_all(head.as_bytes()).await;
                    let chunk = vec![b' '; 64 << 10];
                    let mut sent = 0;
                    while sent < body_bytes {
                        let n = chunk.len().min(body_bytes - sent);
                        if stream.write_all(&chunk[..n]).await.is_err() {
                            return;
                        }
                        sent += n;
                    }
                });
            }
        });
        address
    }

    #[tokio::test]
    async fn a_report_larger_than_the_cap_is_refused_without_reading_it_all() {
        let scraper = scraper();
        let size = MAX_REPORT_BYTES + 1;
        // Declared too large.
        let declared = agent_answering(
            format!(
                "HTTP/1.1 200 OK
Content-Length: {size}
Connection: close

"
            ),
            size,
        )
        .await;
        let e = scraper.scrape(&declared, "t").await.expect_err("too large");
        assert!(e.contains("larger than"), "{e}");
        // Undeclared: a body that never ends.
        let endless = agent_answering(
            "HTTP/1.1 200 OK
Connection: close

"
            .into(),
            usize::MAX,
        )
        .await;
        let e = scraper.scrape(&endless, "t").await.expect_err("too large");
        assert!(e.contains("larger than"), "{e}");
    }

    #[tokio::test]
    async fn a_redirect_is_not_followed() {
        let scraper = scraper();
        let redirecting = agent_answering(
            "HTTP/1.1 307 Temporary Redirect
Location: http://169.254.169.254/
Content-Length: 0
Connection: close

"
            .into(),
            0,
        )
        .await;
        let e = scraper
            .scrape(&redirecting, "t")
            .await
            .expect_err("not followed");
        assert!(e.contains("307"), "{e}");
    }
}
