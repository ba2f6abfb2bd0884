//! The leader's control loop: every round (a couple of seconds, sooner when something changes)
//! it scrapes every agent's report, decides each pool (`crate::decide`) and writes the result
//! (`crate::apply`). Tenants naming no existing pool, or with an invalid spec, get a status that
//! says so.

use crate::apply::Writer;
use crate::context::Context;
use crate::credentials::Credentials;
use crate::decide::{self, AgentView, Memory, PodState};
use crate::manifests::{DRAINING, POOL_LABEL};
use crate::report::Scraper;
use crate::world::World;
use cotenant_crds::conditions::set_condition;
use cotenant_crds::{GpuAgent, GpuPool, ModelTenant, ModelTenantStatus, TenantPhase};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest wait between rounds.
pub const ROUND: Duration = Duration::from_secs(2);

pub struct Controller {
    pub context: Arc<Context>,
    pub world: World,
    pub writer: Writer,
    pub scraper: Scraper,
    /// Tenants' caller credentials, read from their Secrets.
    credentials: Credentials,
    memory: Memory,
    /// Since when each agent's report has failed, by agent name.
    unreachable_since: HashMap<String, Instant>,
    started: Instant,
}

impl Controller {
    pub fn new(
        context: Arc<Context>,
        world: World,
        writer: Writer,
        scraper: Scraper,
        tuning: decide::Tuning,
    ) -> Self {
        let credentials = Credentials::new(writer.client.clone());
        Controller {
            context,
            world,
            writer,
            scraper,
            credentials,
            memory: Memory::new(tuning),
            unreachable_since: HashMap::new(),
            started: Instant::now(),
        }
    }

    /// Forgets everything learned while leading (a new term starts from the API).
    pub fn reset(&mut self) {
        self.memory = Memory::new(self.memory.tuning);
        self.unreachable_since.clear();
    }

    /// One round over every pool and tenant.
    pub async fn round(&mut self) {
        let started = Instant::now();
        let now_s = self.started.elapsed().as_secs_f64();
        let now_rfc3339 = Timestamp::now().to_string();
        let pools = self.world.pools.state();
        let tenants = self.world.tenants.state();
        let agents = self.world.agents.state();
        let pods = self.world.pods.state();

        // Scrape every agent that says where its report is.
        let targets: Vec<(String, String)> = agents
            .iter()
            .filter_map(|a| {
                let address = a.status.as_ref()?.admin_address.clone()?;
                Some((agent_key(a), address))
            })
            .collect();
        let mut reports = self.scraper.scrape_all(targets).await;
        let mut views_by_pool: BTreeMap<String, Vec<AgentView>> = BTreeMap::new();
        for a in &agents {
            let key = agent_key(a);
            let report = match reports.remove(&key) {
                Some(Ok(r)) => {
                    self.unreachable_since.remove(&key);
                    Some(r)
                }
                Some(Err(e)) => {
                    tracing::debug!(agent = %key, error = %e, "report unavailable");
                    self.unreachable_since.entry(key.clone()).or_insert(started);
                    None
                }
                None => {
                    self.unreachable_since.entry(key.clone()).or_insert(started);
                    None
                }
            };
            let unreachable_for_s = self
                .unreachable_since
                .get(&key)
                .map_or(0.0, |since| since.elapsed().as_secs_f64());
            let pod = pods
                .iter()
                .find(|p| p.namespace() == a.namespace() && p.name_any() == a.name_any());
            views_by_pool
                .entry(a.spec.pool.clone())
                .or_default()
                .push(AgentView {
                    name: a.name_any(),
                    assignments: a.spec.assignments.clone(),
                    status: a.status.clone(),
                    pod: pod.map_or(PodState::Gone, |p| pod_state(p)),
                    report,
                    unreachable_for_s,
                    draining: a.annotations().get(DRAINING).is_some_and(|v| v == "true"),
                });
        }
        self.unreachable_since
            .retain(|k, _| agents.iter().any(|a| &agent_key(a) == k));

        let mut failed = false;
        for pool in &pools {
            let name = pool.name_any();
            let pool_tenants: Vec<Arc<ModelTenant>> = tenants
                .iter()
                .filter(|t| t.spec.pool == name && t.spec.validate().is_ok())
                .cloned()
                .collect();
            let pool_agents: Vec<Arc<GpuAgent>> = agents
                .iter()
                .filter(|a| {
                    a.spec.pool == name
                        && a.namespace().as_deref() == Some(pool.spec.agent_namespace.as_str())
                })
                .cloned()
                .collect();
            let views: Vec<AgentView> = views_by_pool
                .remove(&name)
                .unwrap_or_default()
                .into_iter()
                .filter(|v| pool_agents.iter().any(|a| a.name_any() == v.name))
                .collect();
            let mut outcome = decide::decide_pool(
                pool,
                &pool_tenants,
                &views,
                &mut self.memory,
                now_s,
                &now_rfc3339,
            );
            self.credentials.apply(&mut outcome).await;
            if let Err(e) = self.writer.pool(pool, &pool_agents, &outcome).await {
                tracing::warn!(pool = %name, error = %e, "could not apply the pool's decisions");
                failed = true;
                continue;
            }
            for pod in pods.iter().filter(|p| {
                p.labels().get(POOL_LABEL) == Some(&name)
                    && p.metadata.deletion_timestamp.is_none()
                    && !pool_agents.iter().any(|a| a.name_any() == p.name_any())
            }) {
                if let Err(e) = self.writer.adopt_pod(pool, pod).await {
                    tracing::warn!(pod = %pod.name_any(), error = %e, "could not create its GpuAgent");
                }
            }
            for t in &outcome.tenants {
                if let Err(e) = self.writer.tenant(t).await {
                    tracing::warn!(tenant = %key_of(&t.tenant), error = %e, "could not write the tenant");
                    failed = true;
                }
            }
        }

        // Tenants outside every pool's round: deleting ones, missing pools, invalid specs.
        for t in &tenants {
            let result = if t.metadata.deletion_timestamp.is_some() {
                // Its replicas were unassigned in its pool's round (or its pool is gone).
                let still_assigned = agents.iter().any(|a| {
                    a.spec
                        .assignments
                        .iter()
                        .any(|x| Some(&x.tenant.uid) == t.uid().as_ref())
                });
                if still_assigned {
                    Ok(())
                } else {
                    self.writer.finish_deletion(t).await
                }
            } else {
                let mut result = self.writer.add_finalizer(t).await;
                if let Some(status) = unplaceable(t, &pools) {
                    result = result.and(self.writer.status(t, &status).await);
                }
                result
            };
            if let Err(e) = result {
                tracing::warn!(tenant = %key_of(t), error = %e, "could not write the tenant");
                failed = true;
            }
        }
        self.context
            .count("round", if failed { "error" } else { "ok" });
        tracing::debug!(elapsed = ?started.elapsed(), "round done");
    }
}

fn agent_key(a: &GpuAgent) -> String {
    format!("{}/{}", a.namespace().unwrap_or_default(), a.name_any())
}

fn key_of(t: &ModelTenant) -> String {
    format!("{}/{}", t.namespace().unwrap_or_default(), t.name_any())
}

fn pod_state(p: &Pod) -> PodState {
    if p.metadata.deletion_timestamp.is_some() {
        return PodState::Gone;
    }
    match p.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Running") => PodState::Running,
        Some("Pending") | None => PodState::Pending,
        _ => PodState::Gone,
    }
}

/// The status of a tenant that no pool's round covers: its pool is missing or its spec is
/// invalid (admission normally rejects those; an older CRD version may not have).
fn unplaceable(t: &ModelTenant, pools: &[Arc<GpuPool>]) -> Option<ModelTenantStatus> {
    let (reason, message) = if let Err(e) = t.spec.validate() {
        ("InvalidSpec", e.to_string())
    } else if !pools.iter().any(|p| p.name_any() == t.spec.pool) {
        (
            "PoolNotFound",
            format!(
                "GpuPool {:?} does not exist: create it or set spec.pool",
                t.spec.pool
            ),
        )
    } else {
        return None;
    };
    let generation = t.metadata.generation;
    let mut status = t.status.clone().unwrap_or_default();
    set_condition(
        &mut status.conditions,
        "Ready",
        false,
        reason,
        &message,
        generation,
    );
    status.phase = Some(if reason == "InvalidSpec" {
        TenantPhase::Failed
    } else {
        TenantPhase::Pending
    });
    status.ready_replicas = Some(0);
    status.placements.clear();
    status.observed_generation = generation;
    Some(status)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cotenant_crds::ModelTenantSpec;

    fn tenant(pool: &str) -> ModelTenant {
        let spec: ModelTenantSpec = serde_json::from_value(serde_json::json!({
            "model": {"uri": "file:///m.onnx"},
            "slo": {"latencyMillis": 10},
            "pool": pool
        }))
        .expect("spec");
        let mut tenant = ModelTenant::new("t", spec);
        tenant.metadata.generation = Some(3);
        tenant
    }

    #[test]
    fn a_missing_pool_is_named_in_the_ready_condition() {
        let status = unplaceable(&tenant("gpus"), &[]).expect("unplaceable");
        let ready = &status.conditions[0];
        assert_eq!(
            (ready.type_.as_str(), ready.status.as_str()),
            ("Ready", "False")
        );
        assert_eq!(ready.reason, "PoolNotFound");
        assert!(ready.message.contains("\"gpus\""));
        assert_eq!(status.observed_generation, Some(3));
    }

    #[test]
    fn an_existing_pool_leaves_the_tenant_to_its_pool_round() {
        let pool: cotenant_crds::GpuPoolSpec = serde_json::from_value(serde_json::json!({
            "agentNamespace": "a", "template": {"image": "i"}
        }))
        .expect("pool");
        let pools = vec![Arc::new(GpuPool::new("gpus", pool))];
        assert_eq!(unplaceable(&tenant("gpus"), &pools), None);
    }
}
