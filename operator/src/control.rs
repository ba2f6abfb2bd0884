//! The leader's control loop: every round (a couple of seconds, sooner when something changes)
//! it scrapes every agent's report, decides each pool (`crate::decide`) and writes the result
//! (`crate::apply`). Tenants naming no usable pool, or with an invalid spec or name, get a status
//! that says so. Agents are reached at their Pod's IP, never at an address an agent wrote. An
//! agent whose report is of another version is named in an Event on its GpuAgent, and its
//! report is not used.
//! A round that completes while leading publishes what it decided as gauges (`crate::metrics`).

use crate::apply::{Published, Writer};
use crate::context::Context;
use crate::credentials::Credentials;
use crate::decide::{self, AgentView, PodState, Recall, split_address};
use crate::manifests::{DRAINING, POOL_LABEL, TEMPLATE_HASH, host_port, template_hash};
use crate::metrics::{PoolGauges, Snapshot, TenantGauges};
use crate::reason::Reason;
use crate::report::{OtherVersions, ScrapeError, Scraper};
use crate::world::World;
use cotenant_crds::conditions::set_condition;
use cotenant_crds::report::AgentReport;
use cotenant_crds::{GpuAgent, GpuPool, ModelTenant, ModelTenantStatus, TenantPhase};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest wait between rounds.
pub const ROUND: Duration = Duration::from_secs(2);
/// Shortest time between two scrapes of every agent: rounds that changes wake sooner reuse
/// the last reports.
pub const SCRAPE_EVERY: Duration = Duration::from_secs(2);

pub struct Controller {
    pub context: Arc<Context>,
    pub world: World,
    pub writer: Writer,
    pub scraper: Scraper,
    /// Namespaces the operator may run agents in (it holds a Role there).
    pub agent_namespaces: BTreeSet<String>,
    /// Tenants' caller credentials, read from their Secrets.
    credentials: Credentials,
    recall: Recall,
    /// Since when each agent's report has failed, by agent name.
    unreachable_since: HashMap<String, Instant>,
    /// The last scrape's reports by agent key, and when it ran.
    reports: BTreeMap<String, Result<AgentReport, ScrapeError>>,
    scraped_at: Option<Instant>,
    /// Each agent's Lease as last seen: its renew time, and when this operator saw it change
    /// (its own clock, as the node lifecycle controller does, so clock skew does not matter).
    leases: HashMap<String, (String, Instant)>,
    /// Agents that answer with a report of another version.
    other_versions: OtherVersions,
    started: Instant,
}

impl Controller {
    pub fn new(
        context: Arc<Context>,
        world: World,
        writer: Writer,
        scraper: Scraper,
        agent_namespaces: BTreeSet<String>,
        tuning: decide::Tuning,
    ) -> Self {
        let credentials = Credentials::new(writer.client.clone());
        Controller {
            context,
            world,
            writer,
            scraper,
            agent_namespaces,
            credentials,
            recall: Recall::new(tuning),
            unreachable_since: HashMap::new(),
            reports: BTreeMap::new(),
            scraped_at: None,
            leases: HashMap::new(),
            other_versions: OtherVersions::default(),
            started: Instant::now(),
        }
    }

    /// Forgets everything learned while leading (a new term starts from the API).
    pub fn reset(&mut self) {
        self.recall = Recall::new(self.recall.tuning);
        self.unreachable_since.clear();
        self.reports.clear();
        self.scraped_at = None;
        self.leases.clear();
        self.other_versions = OtherVersions::default();
    }

    /// Whether this replica may still write; a round stops at once when it may not.
    fn leading(&self) -> bool {
        self.writer.fence.current_term().is_some()
    }

    /// Seconds since each agent's Lease expired, by agent key (0 while it holds). An agent's
    /// Lease is renewed every 10 s for 40 s; one that has expired makes its agent unreachable
    /// from the expiry on, like a report that fails. An agent without a Lease is judged by its
    /// reports alone.
    fn lease_silence(&mut self, leases: &[Arc<Lease>]) -> HashMap<String, f64> {
        let mut silent = HashMap::new();
        for lease in leases {
            let key = format!(
                "{}/{}",
                lease.namespace().unwrap_or_default(),
                lease.name_any()
            );
            let spec = lease.spec.as_ref();
            let renewed = spec
                .and_then(|s| s.renew_time.as_ref())
                .map(|t| t.0.to_string())
                .unwrap_or_default();
            let duration = spec
                .and_then(|s| s.lease_duration_seconds)
                .map_or(40.0, f64::from);
            let seen = self
                .leases
                .entry(key.clone())
                .or_insert_with(|| (renewed.clone(), Instant::now()));
            if seen.0 != renewed {
                *seen = (renewed, Instant::now());
            }
            silent.insert(key, (seen.1.elapsed().as_secs_f64() - duration).max(0.0));
        }
        silent
    }

    /// One round over every pool and tenant.
    #[tracing::instrument(name = "round", skip_all)]
    pub async fn round(&mut self) {
        let started = Instant::now();
        let now_s = self.started.elapsed().as_secs_f64();
        let now_rfc3339 = Timestamp::now().to_string();
        let pools = self.world.pools.state();
        let tenants = self.world.tenants.state();
        let agents = self.world.agents.state();
        let pods = self.world.pods.state();
        let copies = self.world.copies.state();
        let leases = self.world.leases.state();
        let published = Published::new(self.world.services.state(), self.world.slices.state());

        let pod_of = |a: &GpuAgent| {
            pods.iter()
                .find(|p| p.namespace() == a.namespace() && p.name_any() == a.name_any())
        };
        // Scrape every agent at its pod's IP, on the admin port it says it serves on.
        let targets: Vec<(String, String)> = agents
            .iter()
            .filter_map(|a| {
                let (_, port) = split_address(a.status.as_ref()?.admin_address.as_deref()?)?;
                let ip = pod_ip(pod_of(a)?)?;
                Some((agent_key(a), host_port(&ip, port)))
            })
            .collect();
        if self
            .scraped_at
            .is_none_or(|at| at.elapsed() >= SCRAPE_EVERY)
        {
            self.reports = self.scraper.scrape_all(targets).await;
            self.scraped_at = Some(Instant::now());
        }
        let lease_silent_s = self.lease_silence(&leases);
        let templates: HashMap<String, String> = pools
            .iter()
            .map(|p| (p.name_any(), template_hash(p)))
            .collect();
        let mut views_by_pool: BTreeMap<String, Vec<AgentView>> = BTreeMap::new();
        let mut other_version = Vec::new();
        for a in &agents {
            let key = agent_key(a);
            let scraped = self.reports.get(&key).cloned();
            if let Some(message) = self.other_versions.saw(&key, scraped.as_ref()) {
                tracing::warn!(agent = %key, %message, "report of another version");
                other_version.push((Arc::clone(a), message));
            }
            let pod = pod_of(a);
            let (report, answered) = match scraped {
                Some(Ok(r)) => (Some(r), true),
                // It answers, so it is alive and stays; what it says is not used.
                Some(Err(ScrapeError::OtherVersion(_))) => (None, true),
                Some(Err(ScrapeError::Failed(e))) => {
                    tracing::debug!(agent = %key, error = %e, "report unavailable");
                    (None, false)
                }
                None => (None, false),
            };
            let running = pod.is_some_and(|p| pod_state(p) == PodState::Running);
            let unreachable_for_s = silent_for(
                &mut self.unreachable_since,
                &key,
                answered,
                running,
                started,
            )
            .max(lease_silent_s.get(&key).copied().unwrap_or(0.0));
            views_by_pool
                .entry(a.spec.pool.clone())
                .or_default()
                .push(AgentView {
                    name: a.name_any(),
                    assignments: a.spec.assignments.clone(),
                    status: a.status.clone(),
                    pod: pod.map_or(PodState::Gone, |p| pod_state(p)),
                    pod_ip: pod.and_then(|p| pod_ip(p)),
                    node: pod.and_then(|p| p.spec.as_ref()?.node_name.clone()),
                    report,
                    unreachable_for_s,
                    draining: a.annotations().get(DRAINING).is_some_and(|v| v == "true"),
                    outdated: pod.is_some_and(|p| {
                        p.annotations().get(TEMPLATE_HASH) != templates.get(&a.spec.pool)
                    }),
                });
        }
        let known: BTreeSet<String> = agents.iter().map(|a| agent_key(a)).collect();
        self.unreachable_since.retain(|k, _| known.contains(k));
        self.reports.retain(|k, _| known.contains(k));
        self.leases.retain(|k, _| known.contains(k));
        self.other_versions
            .retain(|k| agents.iter().any(|a| agent_key(a) == k));
        for (agent, message) in &other_version {
            if !self.leading() {
                return;
            }
            self.writer.report_version_mismatch(agent, message).await;
        }

        let mut failed = false;
        if !self.leading() {
            return;
        }
        // Finalizers first: the status writes below move each tenant's resourceVersion, which
        // the finalizer's compare-and-swap names.
        let live = tenants
            .iter()
            .filter(|t| t.metadata.deletion_timestamp.is_none());
        for (t, result) in self
            .writer
            .each(live, |w, t| async move { (t, w.add_finalizer(t).await) })
            .await
        {
            if let Err(e) = result {
                tracing::warn!(tenant = %key_of(t), error = %e, "could not add the finalizer");
                failed = true;
            }
        }
        let mut snapshot = Snapshot::default();
        for pool in &pools {
            if !self.leading() {
                return;
            }
            let name = pool.name_any();
            if !self.agent_namespaces.contains(&pool.spec.agent_namespace) {
                // Its tenants are told below; the pool itself says it here.
                let status = unmanaged_pool_status(pool);
                snapshot.pools.push(PoolGauges::new(pool, &status));
                if let Err(e) = self.writer.pool_status(pool, &status).await {
                    tracing::warn!(pool = %name, error = %e, "could not write the pool's status");
                    failed = true;
                }
                continue;
            }
            let pool_tenants: Vec<Arc<ModelTenant>> = tenants
                .iter()
                .filter(|t| t.spec.pool == name && servable(t))
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
                &mut self.recall,
                now_s,
                &now_rfc3339,
            );
            self.credentials.apply(&mut outcome).await;
            let model_copies = self.credentials.model_copies(pool, &mut outcome).await;
            snapshot.pools.push(PoolGauges::new(pool, &outcome.status));
            snapshot.tenants.extend(
                outcome
                    .tenants
                    .iter()
                    .map(|t| TenantGauges::new(&t.tenant, &t.status)),
            );
            if let Err(e) = self
                .writer
                .pool(pool, &pool_agents, &outcome, &model_copies, &copies)
                .await
            {
                tracing::warn!(pool = %name, error = %e, "could not apply the pool's decisions");
                failed = true;
                if !self.leading() {
                    return;
                }
                // Say why on the pool (a refused agent pod, say), and still tell the tenants.
                let status = apply_failed_status(pool, &outcome.status, &e.to_string());
                if let Err(e) = self.writer.pool_status(pool, &status).await {
                    tracing::warn!(pool = %name, error = %e, "could not write the pool's status");
                }
            }
            // Only pods this pool made: a labelled pod someone else created gets no GpuAgent,
            // so no tenant is ever placed (and routed) to it.
            for pod in pods.iter().filter(|p| {
                p.labels().get(POOL_LABEL) == Some(&name)
                    && controlled_by(p, pool)
                    && p.metadata.deletion_timestamp.is_none()
                    && !pool_agents.iter().any(|a| a.name_any() == p.name_any())
            }) {
                if let Err(e) = self.writer.adopt_pod(pool, pod).await {
                    tracing::warn!(pod = %pod.name_any(), error = %e, "could not create its GpuAgent");
                }
            }
            let published = &published;
            let (now, later) = self.writer.this_round(&outcome.tenants, published);
            for (t, result) in self
                .writer
                .each(now, |w, t| async move { (t, w.tenant(t, published).await) })
                .await
            {
                if let Err(e) = result {
                    tracing::warn!(tenant = %key_of(&t.tenant), error = %e, "could not write the tenant");
                    failed = true;
                }
            }
            self.writer
                .each(later, |w, t| async move { w.events_only(t).await })
                .await;
        }

        // Tenants outside every pool's round: deleting ones, missing pools, invalid specs.
        for t in &tenants {
            if !self.leading() {
                return;
            }
            let decided = snapshot
                .tenants
                .iter()
                .any(|g| Some(&g.namespace) == t.namespace().as_ref() && g.name == t.name_any());
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
                let mut result = Ok(());
                if let Some(status) = unplaceable(t, &pools, &self.agent_namespaces) {
                    snapshot.tenants.push(TenantGauges::new(t, &status));
                    result = result.and(self.writer.status(t, &status).await.map(drop));
                } else if !decided {
                    snapshot
                        .tenants
                        .push(TenantGauges::new(t, &t.status.clone().unwrap_or_default()));
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
        if self.leading() {
            self.context.publish(snapshot);
        }
        tracing::debug!(elapsed = ?started.elapsed(), "round done");
    }
}

fn agent_key(a: &GpuAgent) -> String {
    format!("{}/{}", a.namespace().unwrap_or_default(), a.name_any())
}

fn key_of(t: &ModelTenant) -> String {
    format!("{}/{}", t.namespace().unwrap_or_default(), t.name_any())
}

/// The pod's IP from its status, which the kubelet writes.
fn pod_ip(p: &Pod) -> Option<String> {
    p.status
        .as_ref()?
        .pod_ip
        .clone()
        .filter(|ip| ip.parse::<std::net::IpAddr>().is_ok())
}

/// Whether `pod` is controlled by `pool` (created by the operator for it).
fn controlled_by(pod: &Pod, pool: &GpuPool) -> bool {
    let Some(uid) = pool.metadata.uid.as_deref() else {
        return false;
    };
    pod.owner_references()
        .iter()
        .any(|o| o.uid == uid && o.controller == Some(true))
}

/// Whether a pool round may serve `t`: its spec and its name are valid.
fn servable(t: &ModelTenant) -> bool {
    t.spec.validate().is_ok() && cotenant_crds::validate_tenant_name(&t.name_any()).is_ok()
}

/// `decided` with Ready False because writing the round's decisions failed with `error`
/// (for example, an agent pod that admission refused).
fn apply_failed_status(
    pool: &GpuPool,
    decided: &cotenant_crds::GpuPoolStatus,
    error: &str,
) -> cotenant_crds::GpuPoolStatus {
    let mut status = decided.clone();
    let error: String = error.chars().take(1000).collect();
    set_condition(
        &mut status.conditions,
        "Ready",
        false,
        Reason::ApplyFailed.as_str(),
        &format!("the operator could not carry out this pool's decisions: {error}"),
        pool.metadata.generation,
    );
    status
}

/// The status of a pool whose agent namespace the operator has no Role in.
fn unmanaged_pool_status(pool: &GpuPool) -> cotenant_crds::GpuPoolStatus {
    let mut status = pool.status.clone().unwrap_or_default();
    set_condition(
        &mut status.conditions,
        "Ready",
        false,
        Reason::NamespaceNotManaged.as_str(),
        &format!(
            "the operator runs no agents in namespace {:?}: add it to the chart's \
             agents.namespace (the operator's --agent-namespaces)",
            pool.spec.agent_namespace
        ),
        pool.metadata.generation,
    );
    status.observed_generation = pool.metadata.generation;
    status
}

/// Seconds the agent at `key` has not answered its scrape, as of `now`. The clock runs only
/// while its pod runs: a pod waiting for a node (the cluster autoscaler may take minutes) has
/// not failed, and counting the wait would remove it as dead the moment it starts.
fn silent_for(
    since: &mut HashMap<String, Instant>,
    key: &str,
    answered: bool,
    running: bool,
    now: Instant,
) -> f64 {
    if answered || !running {
        since.remove(key);
        return 0.0;
    }
    let from = *since.entry(key.to_string()).or_insert(now);
    now.saturating_duration_since(from).as_secs_f64()
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

/// The status of a tenant that no pool's round covers: its spec or name is invalid (admission
/// normally rejects those; an older CRD version may not have), or its pool is missing or runs
/// its agents where the operator may not.
fn unplaceable(
    t: &ModelTenant,
    pools: &[Arc<GpuPool>],
    agent_namespaces: &BTreeSet<String>,
) -> Option<ModelTenantStatus> {
    let pool = pools.iter().find(|p| p.name_any() == t.spec.pool);
    let (reason, message) = if let Err(e) = t.spec.validate() {
        (Reason::InvalidSpec, e.to_string())
    } else if let Err(e) = cotenant_crds::validate_tenant_name(&t.name_any()) {
        (Reason::InvalidName, e.to_string())
    } else if pool.is_none() {
        (
            Reason::PoolNotFound,
            format!(
                "GpuPool {:?} does not exist: create it or set spec.pool",
                t.spec.pool
            ),
        )
    } else if pool.is_some_and(|p| !agent_namespaces.contains(&p.spec.agent_namespace)) {
        (
            Reason::PoolNotManaged,
            format!(
                "GpuPool {:?} runs its agents in a namespace the operator does not manage; see \
                 the pool's Ready condition",
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
        reason.as_str(),
        &message,
        generation,
    );
    status.phase = Some(
        if matches!(reason, Reason::InvalidSpec | Reason::InvalidName) {
            TenantPhase::Failed
        } else {
            TenantPhase::Pending
        },
    );
    status.ready_replicas = Some(0);
    status.placements.clear();
    status.observed_generation = generation;
    Some(status)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cotenant_crds::ModelTenantSpec;
    use kube::Resource;

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

    fn managed() -> BTreeSet<String> {
        BTreeSet::from(["a".to_string()])
    }

    fn pools(agent_namespace: &str) -> Vec<Arc<GpuPool>> {
        let pool: cotenant_crds::GpuPoolSpec = serde_json::from_value(serde_json::json!({
            "agentNamespace": agent_namespace, "template": {"image": "i"}
        }))
        .expect("pool");
        vec![Arc::new(GpuPool::new("gpus", pool))]
    }

    #[test]
    fn the_silence_clock_runs_only_while_the_pod_runs() {
        let mut since = HashMap::new();
        let t0 = Instant::now();
        let later = |s: u64| t0 + std::time::Duration::from_secs(s);
        // Pending for a minute, waiting for a node: never silent.
        for s in [0, 30, 60] {
            assert_eq!(silent_for(&mut since, "a", false, false, later(s)), 0.0);
        }
        // Running from 60 s: silent from then on, not from when it was created.
        assert_eq!(silent_for(&mut since, "a", false, true, later(60)), 0.0);
        assert_eq!(silent_for(&mut since, "a", false, true, later(72)), 12.0);
        // An answer resets the clock; the next silence counts from the next miss.
        assert_eq!(silent_for(&mut since, "a", true, true, later(73)), 0.0);
        assert_eq!(silent_for(&mut since, "a", false, true, later(80)), 0.0);
        assert_eq!(silent_for(&mut since, "a", false, true, later(95)), 15.0);
        // Back to pending (the pod was recreated): the clock stops.
        assert_eq!(silent_for(&mut since, "a", false, false, later(96)), 0.0);
        assert!(since.is_empty());
    }

    #[test]
    fn a_missing_pool_is_named_in_the_ready_condition() {
        let status = unplaceable(&tenant("gpus"), &[], &managed()).expect("unplaceable");
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
        assert_eq!(unplaceable(&tenant("gpus"), &pools("a"), &managed()), None);
        assert!(servable(&tenant("gpus")));
    }

    #[test]
    fn a_name_that_is_no_service_name_gets_a_status_and_no_replicas() {
        for name in ["bert.large", "3net", &"a".repeat(64)] {
            let mut t = tenant("gpus");
            t.metadata.name = Some(name.to_string());
            assert!(!servable(&t), "{name} must stay out of the pool round");
            let status = unplaceable(&t, &pools("a"), &managed()).expect(name);
            let ready = &status.conditions[0];
            assert_eq!(
                (ready.status.as_str(), ready.reason.as_str()),
                ("False", "InvalidName")
            );
            assert!(ready.message.contains("metadata.name"), "{}", ready.message);
            assert_eq!(status.phase, Some(TenantPhase::Failed));
        }
    }

    #[test]
    fn a_pool_in_an_unmanaged_namespace_says_so() {
        let status =
            unplaceable(&tenant("gpus"), &pools("elsewhere"), &managed()).expect("unplaceable");
        assert_eq!(status.conditions[0].reason, "PoolNotManaged");
        let pool = pools("elsewhere");
        let status = unmanaged_pool_status(&pool[0]);
        assert_eq!(status.conditions[0].reason, "NamespaceNotManaged");
        assert!(status.conditions[0].message.contains("\"elsewhere\""));
    }

    #[test]
    fn a_refused_write_is_named_on_the_pool() {
        let pool = pools("a");
        let refused = format!(
            "pods \"x\" is forbidden: violates PodSecurity {}",
            "x".repeat(5000)
        );
        let status = apply_failed_status(&pool[0], &Default::default(), &refused);
        let ready = &status.conditions[0];
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "ApplyFailed")
        );
        assert!(ready.message.contains("violates PodSecurity"));
        assert!(ready.message.len() < 1200);
    }

    #[test]
    fn only_pods_the_pool_controls_are_adopted() {
        let mut pool = pools("a")[0].as_ref().clone();
        pool.metadata.uid = Some("pool-uid".into());
        let mut pod = Pod::default();
        assert!(!controlled_by(&pod, &pool));
        pod.metadata.owner_references = pool.controller_owner_ref(&()).map(|o| vec![o]);
        assert!(controlled_by(&pod, &pool));
        // The same owner, but not as controller: someone else's pod naming the pool.
        if let Some(o) = pod
            .metadata
            .owner_references
            .as_mut()
            .and_then(|o| o.first_mut())
        {
            o.controller = None;
        }
        assert!(!controlled_by(&pod, &pool));
    }

    #[test]
    fn the_pod_ip_comes_from_the_pod_status_and_must_be_an_ip() {
        let mut pod = Pod::default();
        assert_eq!(pod_ip(&pod), None);
        pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
            pod_ip: Some("10.1.2.3".into()),
            ..Default::default()
        });
        assert_eq!(pod_ip(&pod).as_deref(), Some("10.1.2.3"));
        if let Some(s) = pod.status.as_mut() {
            s.pod_ip = Some("metadata.internal".into());
        }
        assert_eq!(pod_ip(&pod), None);
    }
}
