//! Agent reports: what each agent's `/report` endpoint says about its tenants, scraped by the
//! leader concurrently with a timeout, authenticated with the operator's ServiceAccount token.

use cotenant_policy::Profile;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

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
    #[serde(default)]
    pub queue_depth: Option<u64>,
    #[serde(default)]
    pub latency_at_percentile_millis: Option<f64>,
    /// Compute time (the request's batch, no queueing) at the SLO's percentile; older agents
    /// do not send it.
    #[serde(default)]
    pub compute_at_percentile_millis: Option<f64>,
    #[serde(default)]
    pub window: Option<Window>,
    #[serde(default)]
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
    #[serde(default)]
    pub completions: u64,
    #[serde(default)]
    pub slo_attainment: Option<f64>,
    /// Requests admission control refused.
    #[serde(default)]
    pub shed: u64,
}

impl AgentReport {
    /// The replica of tenant `uid` on this agent.
    pub fn tenant(&self, uid: &str) -> Option<&TenantReport> {
        self.tenants
            .iter()
            .find(|t| t.tenant.as_ref().is_some_and(|r| r.uid == uid))
    }
}

/// Scrapes agents' `/report` with the operator's token.
pub struct Scraper {
    http: reqwest::Client,
    token_file: Option<PathBuf>,
}

impl Scraper {
    pub fn new(token_file: Option<PathBuf>, timeout: Duration) -> anyhow::Result<Scraper> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
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
        let body = response
            .bytes()
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        if !status.is_success() {
            return Err(format!(
                "GET {url}: {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(200)])
            ));
        }
        serde_json::from_slice(&body).map_err(|e| format!("GET {url}: bad report: {e}"))
    }
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
}
