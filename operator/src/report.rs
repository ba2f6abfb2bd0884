//! Agent reports: what each agent's `/report` endpoint says about its tenants
//! ([`cotenant_crds::report`]), scraped by the leader with bounded concurrency and a timeout each,
//! authenticated with the operator's ServiceAccount token.
//!
//! A report is what one agent says, and an agent runs other teams' models: the operator reads at
//! most [`MAX_REPORT_BYTES`] of it, uses it only when it is of the operator's own version, and
//! [`sanitize`] drops or bounds values the rest of the operator (and the API server, when they
//! reach a status) would choke on. An agent of another version answers, so it is alive, but
//! what it says is not used: [`OtherVersions`] says so once per agent.

use cotenant_crds::report::{AgentReport, REPORT_VERSION, ReportError, State};
use cotenant_policy::Profile;
use futures::StreamExt;
use std::collections::{BTreeMap, HashMap};
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
/// Counters and byte sizes are at most this when read (the API server stores int64).
const MAX_COUNT: u64 = cotenant_crds::report::MAX_COUNT;

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

/// Parses a report body of the operator's version and bounds what it says; see [`sanitize`].
pub fn parse(body: &[u8]) -> Result<AgentReport, ReportError> {
    let mut report = AgentReport::from_slice(body)?;
    sanitize(&mut report);
    Ok(report)
}

/// Keeps at most [`MAX_TENANTS`] entries; in each, drops measurements that are not finite,
/// negative or absurd, clamps the SLO attainment to [0, 1], clamps knobs into the API's range,
/// cuts long errors, and drops a profile the API server would refuse in a status (knobs out of
/// range, bad numbers).
pub fn sanitize(report: &mut AgentReport) {
    report.tenants.truncate(MAX_TENANTS);
    for t in &mut report.tenants {
        if t.profile.as_ref().is_some_and(|p| !profile_in_range(p)) {
            t.profile = None;
        }
        match &mut t.state {
            State::Failed { error } => truncate(error, MAX_ERROR_CHARS),
            State::Ready(s) => {
                s.knobs.batch_size = s.knobs.batch_size.clamp(1, 1024);
                s.knobs.instances = s.knobs.instances.clamp(1, 64);
                s.latency_at_percentile_millis = s.latency_at_percentile_millis.and_then(measure);
                s.compute_at_percentile_millis = s.compute_at_percentile_millis.and_then(measure);
                let w = &mut s.window;
                w.arrival_rate_per_second = measure(w.arrival_rate_per_second).unwrap_or(0.0);
                w.throughput_per_second = measure(w.throughput_per_second).unwrap_or(0.0);
                w.slo_attainment = w
                    .slo_attainment
                    .filter(|a| a.is_finite())
                    .map(|a| a.clamp(0.0, 1.0));
            }
            State::Loading => {}
        }
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

/// Why an agent's report is not used this round.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ScrapeError {
    /// The agent answered with a report of another version (`None`: unversioned): it is
    /// alive, but what it says is not used.
    #[error("{}", other_version(*.0))]
    OtherVersion(Option<u32>),
    /// The agent could not be reached, refused, or answered with something that is no report.
    #[error("{0}")]
    Failed(String),
}

/// What the operator says of an agent whose report is of version `found`.
fn other_version(found: Option<u32>) -> String {
    let writes = found.map_or("an unversioned report".to_string(), |v| {
        format!("report version {v}")
    });
    format!(
        "the agent writes {writes} and this operator reads version {REPORT_VERSION}: its report \
         is not used, so its replicas get no traffic until agent and operator run the same version"
    )
}

/// Which agents answer with a report of another version, so that each is named once (an
/// Event), not every round.
#[derive(Default)]
pub struct OtherVersions {
    seen: HashMap<String, String>,
}

impl OtherVersions {
    /// Records what agent `key` answered; returns the message to publish when it newly
    /// writes another version (or another one than before).
    pub fn saw(
        &mut self,
        key: &str,
        result: Option<&Result<AgentReport, ScrapeError>>,
    ) -> Option<String> {
        match result {
            Some(Err(e @ ScrapeError::OtherVersion(_))) => {
                let message = e.to_string();
                let before = self.seen.insert(key.to_string(), message.clone());
                (before.as_ref() != Some(&message)).then_some(message)
            }
            Some(Ok(_)) => {
                self.seen.remove(key);
                None
            }
            // Unreachable says nothing about its version.
            _ => None,
        }
    }

    /// Forgets agents that no longer exist.
    pub fn retain(&mut self, exists: impl Fn(&str) -> bool) {
        self.seen.retain(|k, _| exists(k));
    }
}

/// Scrapes agents' `/report` with the operator's token.
pub struct Scraper {
    http: reqwest::Client,
    token_file: Option<PathBuf>,
    /// Most scrapes in flight at once.
    concurrency: usize,
}

impl Scraper {
    /// A scraper that gives each agent `timeout` and keeps at most `concurrency` scrapes in
    /// flight, so a pool of silent agents costs `agents / concurrency × timeout` a round, and an
    /// agent that stops answering degrades only its own tenants.
    pub fn new(
        token_file: Option<PathBuf>,
        timeout: Duration,
        concurrency: usize,
    ) -> anyhow::Result<Scraper> {
        // No redirects: an agent must not send the operator (and its token) elsewhere.
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(Scraper {
            http,
            token_file,
            concurrency: concurrency.max(1),
        })
    }

    /// Every agent's report by agent name; an agent whose report cannot be used maps to why.
    pub async fn scrape_all(
        &self,
        admin_addresses: Vec<(String, String)>,
    ) -> BTreeMap<String, Result<AgentReport, ScrapeError>> {
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
                    Err(e) => Err(ScrapeError::Failed(e)),
                };
                (agent, result)
            }
        });
        futures::stream::iter(scrapes)
            .buffer_unordered(self.concurrency)
            .collect()
            .await
    }

    async fn scrape(&self, address: &str, token: &str) -> Result<AgentReport, ScrapeError> {
        let url = format!("http://{address}/report");
        let failed = |e: String| ScrapeError::Failed(format!("GET {url}: {e}"));
        let response = self
            .http
            .get(&url)
            .bearer_auth(token)
            .send()
            .await
            .map_err(|e| failed(e.to_string()))?;
        let status = response.status();
        let body = read_capped(response, MAX_REPORT_BYTES)
            .await
            .map_err(failed)?;
        if !status.is_success() {
            return Err(failed(format!(
                "{status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(200)])
            )));
        }
        parse(&body).map_err(|e| match e {
            ReportError::OtherVersion { found } => ScrapeError::OtherVersion(found),
            ReportError::Malformed(_) => failed(format!("bad report: {e}")),
        })
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
    use cotenant_crds::report::TenantReport;
    use serde_json::{Value, json};

    /// The report every agent of this version writes, as `crds/tests/fixtures` commits it.
    fn fixture() -> Value {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!(
            "../crds/tests/fixtures/report-v{REPORT_VERSION}.json"
        ));
        let body = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_slice(&body).expect("JSON")
    }

    /// What the operator decides from, read from the committed fixture: a field the agent's
    /// test and the crds test hold it to, read here without loss.
    #[test]
    fn the_committed_fixture_is_read_whole_and_aggregated() {
        let body = serde_json::to_vec(&fixture()).expect("json");
        let report = parse(&body).expect("the operator reads the fixture");
        let exact = AgentReport::from_slice(&body).expect("parses");
        assert_eq!(report, exact, "sanitising changed a sane report");
        let bert = report.tenant("uid-bert").expect("bert");
        assert_eq!(bert.profile.as_ref().map(|p| p.points.len()), Some(3));
        let a = crate::decide::tenant::aggregate(&[bert]);
        assert_eq!(
            (a.replicas, a.arrival_rate, a.throughput, a.latency_ms),
            (1, 120.0, 118.5, 41.5)
        );
        assert_eq!((a.compute_ms, a.attainment), (Some(12.25), Some(0.995)));
        assert_eq!((a.queue_depth, a.completions, a.shed), (2, 3555, 12));
        let broken = report.tenant("uid-broken").expect("broken");
        assert_eq!(broken.error(), Some("not a usable ONNX model: no graph"));
        assert!(
            report
                .tenant("uid-resnet")
                .is_some_and(|t| t.serving().is_none())
        );
    }

    /// The fixture's Ready tenant with `fields` replaced (`window` merged), as sanitised.
    fn one_tenant(fields: Value) -> TenantReport {
        let mut entry = fixture()["tenants"][0].clone();
        for (k, v) in fields.as_object().into_iter().flatten() {
            match (k.as_str(), entry["window"].as_object_mut(), v.as_object()) {
                ("window", Some(w), Some(v)) => w.extend(v.clone()),
                _ => entry[k] = v.clone(),
            }
        }
        let body = serde_json::to_vec(&json!({"version": REPORT_VERSION, "tenants": [entry]}))
            .expect("json");
        parse(&body).expect("parses").tenants[0].clone()
    }

    #[test]
    fn measurements_are_bounded_and_knobs_clamped() {
        let t = one_tenant(json!({
            "latencyAtPercentileMillis": -1.0,
            "computeAtPercentileMillis": 1e300,
            "knobs": {"batchSize": 0, "instances": 1000},
            "window": {"arrivalRatePerSecond": 1e300, "throughputPerSecond": -3.0,
                       "sloAttainment": 7.5}
        }));
        let s = t.serving().expect("serving");
        assert_eq!(s.latency_at_percentile_millis, None);
        assert_eq!(s.compute_at_percentile_millis, None);
        assert_eq!((s.knobs.batch_size, s.knobs.instances), (1, 64));
        let w = &s.window;
        assert_eq!(
            (w.arrival_rate_per_second, w.throughput_per_second),
            (0.0, 0.0)
        );
        assert_eq!(w.slo_attainment, Some(1.0));
    }

    #[test]
    fn a_long_error_is_cut() {
        let mut entry = fixture()["tenants"][2].clone();
        entry["error"] = json!("x".repeat(100_000));
        let body = serde_json::to_vec(&json!({"version": REPORT_VERSION, "tenants": [entry]}))
            .expect("json");
        let report = parse(&body).expect("parses");
        assert!(
            report.tenants[0]
                .error()
                .is_some_and(|e| e.chars().count() <= MAX_ERROR_CHARS + 1)
        );
    }

    #[test]
    fn a_profile_the_status_could_not_hold_is_dropped() {
        let point = |batch: u32, throughput: f64| json!({"batch": batch, "instances": 1, "throughput": throughput, "p99_ms": 5.0});
        let profile = |points: Vec<Value>| {
            one_tenant(json!({"profile": {"model": "m", "weight_bytes": 10, "points": points}}))
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
        let loading = fixture()["tenants"][1].clone();
        let entries = vec![loading; MAX_TENANTS + 10];
        let body = serde_json::to_vec(&json!({"version": REPORT_VERSION, "tenants": entries}))
            .expect("json");
        assert_eq!(parse(&body).expect("parses").tenants.len(), MAX_TENANTS);
    }

    fn scraper() -> Scraper {
        // What main does first: one TLS provider for the binary.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Scraper::new(None, Duration::from_secs(10), 4).expect("scraper")
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
        let e = scraper
            .scrape(&declared, "t")
            .await
            .expect_err("too large")
            .to_string();
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
        let e = scraper
            .scrape(&endless, "t")
            .await
            .expect_err("too large")
            .to_string();
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
            .expect_err("not followed")
            .to_string();
        assert!(e.contains("307"), "{e}");
    }

    /// An agent that answers 200 with `body`.
    async fn agent_reporting(body: String) -> String {
        agent_answering(
            format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            ),
            0,
        )
        .await
    }

    /// A report of another version is not used, and is told apart from one that is broken; a
    /// report of this version missing a field is broken, not read with the field absent.
    #[tokio::test]
    async fn a_report_of_another_version_is_not_used_and_a_missing_field_is_an_error() {
        let scraper = scraper();
        let newer = json!({"version": REPORT_VERSION + 1, "tenants": [{"renamed": true}]});
        let address = agent_reporting(newer.to_string()).await;
        let e = scraper
            .scrape(&address, "t")
            .await
            .expect_err("another version");
        assert!(matches!(e, ScrapeError::OtherVersion(_)), "{e}");

        let mut missing = fixture();
        missing["tenants"][0]
            .as_object_mut()
            .map(|t| t.remove("window"));
        let address = agent_reporting(missing.to_string()).await;
        let e = scraper.scrape(&address, "t").await.expect_err("malformed");
        assert!(
            matches!(&e, ScrapeError::Failed(m) if m.contains("missing field `window`")),
            "{e}"
        );

        let mut newer_field = fixture();
        newer_field["tenants"][0]["addedLater"] = json!(1);
        let address = agent_reporting(newer_field.to_string()).await;
        let report = scraper
            .scrape(&address, "t")
            .await
            .expect("an added field is ignored");
        assert_eq!(report.tenants.len(), 4);
    }

    #[test]
    fn an_agent_of_another_version_is_named_once_until_it_changes() {
        let mut versions = OtherVersions::default();
        let other = |v: u32| -> Result<AgentReport, ScrapeError> {
            Err(ScrapeError::OtherVersion(Some(v)))
        };
        let message = versions.saw("agents/a", Some(&other(2))).expect("named");
        assert!(
            message.contains("writes report version 2")
                && message.contains(&format!("reads version {REPORT_VERSION}"))
                && message.contains("not used"),
            "{message}"
        );
        assert_eq!(versions.saw("agents/a", Some(&other(2))), None);
        // Unreachable for a while says nothing about its version.
        let unreachable = Err(ScrapeError::Failed("timed out".into()));
        assert_eq!(versions.saw("agents/a", Some(&unreachable)), None);
        assert_eq!(versions.saw("agents/a", Some(&other(2))), None);
        assert!(versions.saw("agents/a", Some(&other(3))).is_some());
        // Replaced by an agent of this version, then by another of version 2 again.
        let current = Ok(AgentReport::new(Vec::new()));
        assert_eq!(versions.saw("agents/a", Some(&current)), None);
        assert!(versions.saw("agents/a", Some(&other(2))).is_some());
    }
}
