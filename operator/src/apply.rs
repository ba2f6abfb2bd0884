//! Writes a round's decisions to the API: GpuAgent assignments, agent pods, the copies of
//! tenants' model credentials the assignments name, tenant Services and EndpointSlices,
//! statuses, finalizers and Events. Every write compares with what exists first (the watches'
//! view, `crate::world`), so a round that changes nothing makes no API call at all; every API
//! call passes the leader fence first (`crate::leader`), so a replica that lost its lease writes
//! nothing more, and then the client-side budget (`crate::ratelimit`).
//!
//! The operator changes only what it owns: a Service or EndpointSlice of a tenant's name that
//! is not controlled by that tenant is left alone, and the tenant says so in its Ready condition
//! and an Event.

use crate::decide::Route;
use crate::decide::{PoolOutcome, TenantOutcome};
use crate::leader::{Fence, FenceError};
use crate::manifests::{self, DRAINING, POOL_LABEL, TENANT_LABEL};
use crate::ratelimit::RateLimit;
use crate::reason::{EventReason, Reason};
use cotenant_crds::conditions::set_condition;
use cotenant_crds::patch::status_patch;
use cotenant_crds::storage::COPY_LABEL;
use cotenant_crds::{
    GpuAgent, GpuPool, GpuPoolStatus, ModelTenant, ModelTenantStatus, TenantPhase,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource, ResourceExt};
use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const FIELD_MANAGER: &str = "cotenant-operator";
/// Held on every tenant until its replicas are unassigned and its routes removed.
pub const FINALIZER: &str = "cotenant.dev/cleanup";

pub struct Writer {
    pub client: Client,
    pub recorder: Recorder,
    /// The operator's ServiceAccount user, written into agent pods as the `/report` reader.
    pub report_reader: String,
    /// The audience of the operator's report token, which agents must require.
    pub report_audience: String,
    /// Routes last written per tenant UID, when, and the conflict found then, if any: the
    /// watches may not show a write for a moment, and a conflict is checked again only every
    /// [`CONFLICT_RECHECK`].
    pub written_routes: std::sync::Mutex<HashMap<String, Written>>,
    /// Every API call checks it first: only the leader writes.
    pub fence: Arc<Fence>,
    /// Every API call takes a token from it first (`crate::ratelimit`).
    pub limit: RateLimit,
    /// Most objects written at once by [`Writer::each`]: the budget, not one call's round trip,
    /// bounds how fast a round's writes go.
    pub concurrent_writes: usize,
    /// When each tenant's status was last written, by UID ([`STATUS_EVERY`]).
    pub status_written: std::sync::Mutex<HashMap<String, Instant>>,
    /// Most tenants written per round whose writes could wait ([`Writer::this_round`]).
    pub paced_per_round: usize,
}

/// What was last written for one tenant's routes.
#[derive(Clone, Debug)]
pub struct Written {
    routes: Vec<Route>,
    at: Instant,
    conflict: Option<String>,
}

/// How long the operator trusts its own write of a tenant's routes over the watches, which may
/// not show it yet.
const WATCH_LAG: Duration = Duration::from_secs(30);
/// How often a tenant whose Service name is taken is checked again.
const CONFLICT_RECHECK: Duration = Duration::from_secs(60);
/// Least time between two writes of one tenant's status, unless where it runs, its spec or its
/// failure changed ([`urgent`]): a tenant going through loading, profiling and its first knob
/// steps is written once per period with where it got to, not once per step, so the budget
/// goes to placing the tenants still waiting.
const STATUS_EVERY: Duration = Duration::from_secs(10);

/// The tenants' Services and EndpointSlices as the watches last saw them, by namespace and
/// name (slices by the Service they belong to).
#[derive(Default)]
pub struct Published {
    services: HashMap<(String, String), Arc<Service>>,
    slices: HashMap<(String, String), Vec<Arc<EndpointSlice>>>,
}

impl Published {
    pub fn new(services: Vec<Arc<Service>>, slices: Vec<Arc<EndpointSlice>>) -> Published {
        let key = |ns: Option<String>, name: &str| (ns.unwrap_or_default(), name.to_string());
        let mut published = Published::default();
        for s in services {
            published
                .services
                .insert(key(s.namespace(), &s.name_any()), s);
        }
        for slice in slices {
            if let Some(service) = slice.labels().get("kubernetes.io/service-name") {
                let k = key(slice.namespace(), service);
                published.slices.entry(k).or_default().push(slice);
            }
        }
        published
    }

    /// Whether `t`'s Service and EndpointSlices are already exactly what `routes` needs, so
    /// nothing is written.
    fn in_place(&self, t: &ModelTenant, routes: &[Route]) -> bool {
        let key = (t.namespace().unwrap_or_default(), t.name_any());
        let Some(service) = self.services.get(&key) else {
            return false;
        };
        if !owned_by(service.as_ref(), t)
            || service_ports(service) != service_ports(&manifests::service(t))
        {
            return false;
        }
        let wanted = manifests::endpoint_slices(t, routes);
        let existing: Vec<&EndpointSlice> = self
            .slices
            .get(&key)
            .into_iter()
            .flatten()
            .map(|s| s.as_ref())
            .filter(|s| owned_by(*s, t))
            .collect();
        existing.len() == wanted.len()
            && wanted.iter().all(|w| {
                existing
                    .iter()
                    .any(|e| e.name_any() == w.name_any() && same_slice(e, w))
            })
    }
}

/// A Service's ports as the operator writes them: name, port and application protocol.
fn service_ports(s: &Service) -> Vec<(Option<String>, i32, Option<String>)> {
    let mut p: Vec<_> = s
        .spec
        .iter()
        .flat_map(|spec| spec.ports.iter().flatten())
        .map(|p| (p.name.clone(), p.port, p.app_protocol.clone()))
        .collect();
    p.sort();
    p
}

/// Whether two EndpointSlices route to the same endpoints on the same ports.
fn same_slice(a: &EndpointSlice, b: &EndpointSlice) -> bool {
    let endpoints = |s: &EndpointSlice| {
        let mut e: Vec<_> = s
            .endpoints
            .iter()
            .map(|e| (e.addresses.clone(), e.node_name.clone()))
            .collect();
        e.sort();
        e
    };
    let ports = |s: &EndpointSlice| {
        let mut p: Vec<_> = s
            .ports
            .iter()
            .flatten()
            .map(|p| (p.name.clone(), p.port, p.app_protocol.clone()))
            .collect();
        p.sort();
        p
    };
    a.address_type == b.address_type && endpoints(a) == endpoints(b) && ports(a) == ports(b)
}

/// Why a write failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error(transparent)]
    Fence(#[from] FenceError),
}

impl WriteError {
    /// The API server's status code, when it answered.
    fn code(&self) -> Option<u16> {
        match self {
            WriteError::Api(kube::Error::Api(e)) => Some(e.code),
            _ => None,
        }
    }
}

type Result<T = ()> = std::result::Result<T, WriteError>;

/// Whether `object` is controlled by `tenant` (an owner reference to its UID).
fn owned_by<K: Resource>(object: &K, tenant: &ModelTenant) -> bool {
    let Some(uid) = tenant.meta().uid.as_deref() else {
        return false;
    };
    object
        .meta()
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == uid && o.controller == Some(true))
}

impl Writer {
    /// Runs `write` for every item, at most `concurrent_writes` at once (each one's own calls
    /// stay in order), and returns the results in no particular order.
    pub async fn each<'a, I, F, Fut, T>(&'a self, items: I, write: F) -> Vec<T>
    where
        I: IntoIterator,
        F: Fn(&'a Writer, I::Item) -> Fut,
        Fut: Future<Output = T>,
    {
        futures::stream::iter(items)
            .map(|item| write(self, item))
            .buffer_unordered(self.concurrent_writes.max(1))
            .collect()
            .await
    }

    /// Applies `outcome` for `pool`, whose agents are `agents`; `model_copies` are the copies of
    /// tenants' model credentials its assignments name (`crate::credentials`), and `copies` the
    /// copies that exist in the agent namespaces (from the watch).
    #[tracing::instrument(name = "apply_pool", skip_all, fields(pool = %pool.name_any()))]
    pub async fn pool(
        &self,
        pool: &GpuPool,
        agents: &[Arc<GpuAgent>],
        outcome: &PoolOutcome,
        model_copies: &[Secret],
        copies: &[Arc<Secret>],
    ) -> Result {
        let ns = &pool.spec.agent_namespace;
        let agent_api: Api<GpuAgent> = Api::namespaced(self.client.clone(), ns);
        let pod_api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        // The copies exist before an assignment names them, and go once none does.
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), ns);
        let existing: Vec<&Secret> = copies
            .iter()
            .map(|c| c.as_ref())
            .filter(|c| {
                c.namespace().as_deref() == Some(ns.as_str())
                    && c.labels().get(COPY_LABEL).is_some_and(|v| v == "true")
                    && c.labels().get(POOL_LABEL) == Some(&pool.name_any())
            })
            .collect();
        for copy in model_copies {
            let same = existing.iter().any(|e| {
                e.name_any() == copy.name_any()
                    && e.data == copy.data
                    && e.annotations() == copy.annotations()
                    && e.labels() == copy.labels()
            });
            if !same {
                let apply = PatchParams::apply(FIELD_MANAGER).force();
                self.fenced(secrets.patch(&copy.name_any(), &apply, &Patch::Apply(copy)))
                    .await?;
            }
        }
        for (name, wanted) in &outcome.assignments {
            let Some(agent) = agents.iter().find(|a| &a.name_any() == name) else {
                continue;
            };
            if &agent.spec.assignments != wanted {
                let patch = serde_json::json!({ "spec": { "assignments": wanted } });
                self.fenced(agent_api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)))
                    .await?;
            }
        }
        for stale in existing
            .iter()
            .filter(|e| !model_copies.iter().any(|c| c.name_any() == e.name_any()))
        {
            ignore_missing(
                self.fenced(secrets.delete(&stale.name_any(), &DeleteParams::default()))
                    .await,
            )?;
        }
        for (names, draining) in [(&outcome.drain, true), (&outcome.undrain, false)] {
            for name in names {
                let value = draining.then_some("true");
                let patch =
                    serde_json::json!({ "metadata": { "annotations": { DRAINING: value } } });
                self.fenced(agent_api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)))
                    .await?;
            }
        }
        for name in &outcome.remove {
            tracing::info!(agent = %name, pool = %pool.name_any(), "removing agent");
            ignore_missing(
                self.fenced(pod_api.delete(name, &DeleteParams::default()))
                    .await,
            )?;
            ignore_missing(
                self.fenced(agent_api.delete(name, &DeleteParams::default()))
                    .await,
            )?;
        }
        for _ in 0..outcome.add_agents {
            let name = format!("{}-agent-{}", pool.name_any(), suffix());
            let pod = manifests::agent_pod(pool, &name, &self.report_reader, &self.report_audience);
            let pod = self
                .fenced(pod_api.create(&PostParams::default(), &pod))
                .await?;
            tracing::info!(agent = %name, pool = %pool.name_any(), "created agent pod");
            self.fenced(
                agent_api.create(&PostParams::default(), &manifests::gpu_agent(pool, &pod)),
            )
            .await?;
        }
        self.pool_status(pool, &outcome.status).await?;
        for e in &outcome.events {
            self.event(&pool.object_ref(&()), e.reason, &e.message)
                .await;
        }
        Ok(())
    }

    /// Writes `status` on `pool` when it differs.
    pub async fn pool_status(&self, pool: &GpuPool, status: &GpuPoolStatus) -> Result {
        if pool.status.as_ref() == Some(status) {
            return Ok(());
        }
        let patch = status_patch(pool.status.as_ref(), status);
        let pools = Api::<GpuPool>::all(self.client.clone());
        self.fenced(pools.patch_status(
            &pool.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        ))
        .await?;
        Ok(())
    }

    /// The GpuAgent of an agent pod whose GpuAgent is missing (the operator stopped between the
    /// two creates).
    pub async fn adopt_pod(&self, pool: &GpuPool, pod: &Pod) -> Result {
        let api: Api<GpuAgent> = Api::namespaced(self.client.clone(), &pool.spec.agent_namespace);
        match self
            .fenced(api.create(&PostParams::default(), &manifests::gpu_agent(pool, pod)))
            .await
        {
            Err(e) if e.code() == Some(409) => Ok(()),
            other => other.map(|_| ()),
        }
    }

    /// Writes one tenant's routes, status and Events.
    #[tracing::instrument(
        name = "apply_tenant",
        skip_all,
        fields(tenant = %outcome.tenant.name_any())
    )]
    pub async fn tenant(&self, outcome: &TenantOutcome, published: &Published) -> Result {
        let t = &outcome.tenant;
        let uid = t.uid().unwrap_or_default();
        let (skip, mut conflict) = self.routes_kept(outcome, published);
        if !skip {
            let written = self.routes(t, &outcome.routes, published).await;
            let mut cache = self
                .written_routes
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            match written {
                Ok(found) => {
                    conflict = found.clone();
                    cache.insert(
                        uid.clone(),
                        Written {
                            routes: outcome.routes.clone(),
                            at: Instant::now(),
                            conflict: found,
                        },
                    );
                }
                Err(e) => {
                    cache.remove(&uid);
                    return Err(e);
                }
            };
        }
        let mut status = outcome.status.clone();
        if let Some(why) = &conflict {
            service_conflict(&mut status, t, why);
            if !has_ready_reason(t, Reason::ServiceConflict) {
                self.event(&t.object_ref(&()), EventReason::ServiceConflict, why)
                    .await;
            }
        }
        let recent = self
            .status_written
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&uid)
            .is_some_and(|at| at.elapsed() < STATUS_EVERY);
        let due = conflict.is_some() || !recent || urgent(t.status.as_ref(), &status);
        if due && self.status(t, &status).await? {
            self.status_written
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(uid, Instant::now());
        }
        for e in &outcome.events {
            self.event(&t.object_ref(&()), e.reason, &e.message).await;
        }
        Ok(())
    }

    /// Whether the tenant's routes need no write this round (written recently or in place), and
    /// the conflict found when they were last written.
    fn routes_kept(
        &self,
        outcome: &TenantOutcome,
        published: &Published,
    ) -> (bool, Option<String>) {
        let uid = outcome.tenant.uid().unwrap_or_default();
        let last = self
            .written_routes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&uid)
            .cloned()
            .filter(|w| w.routes == outcome.routes);
        match &last {
            Some(w) if w.conflict.is_some() => {
                (w.at.elapsed() < CONFLICT_RECHECK, w.conflict.clone())
            }
            Some(w) if w.at.elapsed() < WATCH_LAG => (true, None),
            _ => (published.in_place(&outcome.tenant, &outcome.routes), None),
        }
    }

    /// Which of a round's tenants to write now, in order: first those that cannot wait (a
    /// replica placed or removed, a spec change, a failure, routes to publish),
    /// then at most `paced_per_round` of the others with something to write, longest unwritten
    /// first. The rest are
    /// decided again next round and only have their Events recorded now, so a busy round
    /// stays short and the next one places the tenants still waiting.
    pub fn this_round<'a>(
        &self,
        tenants: &'a [TenantOutcome],
        published: &Published,
    ) -> (Vec<&'a TenantOutcome>, Vec<&'a TenantOutcome>) {
        let mut now = Vec::new();
        let mut rest = Vec::new();
        let mut later = Vec::new();
        for t in tenants {
            let routes_due = !self.routes_kept(t, published).0;
            if urgent(t.tenant.status.as_ref(), &t.status) || (routes_due && !t.routes.is_empty()) {
                now.push(t);
            } else if routes_due || t.tenant.status.as_ref() != Some(&t.status) {
                rest.push(t);
            } else {
                // Nothing to write but its Events.
                later.push(t);
            }
        }
        let written = self
            .status_written
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let last_write =
            |t: &TenantOutcome| written.get(&t.tenant.uid().unwrap_or_default()).copied();
        // Never written sorts first (None < Some), then the oldest write.
        rest.sort_by_key(|t| last_write(t));
        later.extend(rest.split_off(rest.len().min(self.paced_per_round)));
        now.extend(rest);
        (now, later)
    }

    /// Records a deferred tenant's Events (its status and routes wait for a later round).
    pub async fn events_only(&self, outcome: &TenantOutcome) {
        for e in &outcome.events {
            self.event(&outcome.tenant.object_ref(&()), e.reason, &e.message)
                .await;
        }
    }

    /// Keeps the tenant's Service and exactly the EndpointSlices for `routes`, among the objects
    /// the tenant controls, starting from what the watches show (`published`) and writing only
    /// what differs. `Ok(Some(why))` when an object of the same name belongs to someone else:
    /// then nothing is written, and the slices already written are removed, so no endpoint of
    /// the tenant is attached to a Service it does not own. An object the watches do not show
    /// yet is found by its create's conflict, and read then.
    async fn routes(
        &self,
        t: &ModelTenant,
        routes: &[Route],
        published: &Published,
    ) -> Result<Option<String>> {
        let ns = t.namespace().unwrap_or_default();
        let name = t.name_any();
        let key = (ns.clone(), name.clone());
        let services: Api<Service> = Api::namespaced(self.client.clone(), &ns);
        let slices: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &ns);
        let apply = PatchParams::apply(FIELD_MANAGER).force();
        let create = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        let taken = |kind: &str, object: &str| {
            format!(
                "{kind} {ns}/{object} exists and is not controlled by this ModelTenant: the \
                 operator leaves it alone; delete it, or give the tenant another name"
            )
        };
        let service = manifests::service(t);
        let mut seen = published.services.get(&key).map(|s| s.as_ref().clone());
        if seen.is_none() {
            match self.fenced(services.create(&create, &service)).await {
                Ok(_) => {}
                Err(e) if e.code() == Some(409) => {
                    seen = self.fenced(services.get_opt(&name)).await?;
                }
                Err(e) => return Err(e),
            }
        }
        let conflict = match seen {
            Some(existing) if owned_by(&existing, t) => {
                if service_ports(&existing) != service_ports(&service) {
                    self.fenced(services.patch(&name, &apply, &Patch::Apply(&service)))
                        .await?;
                }
                None
            }
            Some(_) => Some(taken("Service", &name)),
            None => None,
        };
        let existing: Vec<EndpointSlice> = published
            .slices
            .get(&key)
            .into_iter()
            .flatten()
            .map(|s| s.as_ref().clone())
            .collect();
        let wanted = if conflict.is_some() {
            Vec::new()
        } else {
            manifests::endpoint_slices(t, routes)
        };
        let mut conflict = conflict;
        // The tenant's slices: those that existed, and those created now.
        let mut ours: BTreeSet<String> = existing
            .iter()
            .filter(|s| owned_by(*s, t))
            .map(|s| s.name_any())
            .collect();
        for slice in &wanted {
            let slice_name = slice.name_any();
            let mut found = existing
                .iter()
                .find(|s| s.name_any() == slice_name)
                .cloned();
            if found.is_none() {
                match self.fenced(slices.create(&create, slice)).await {
                    Ok(_) => {
                        ours.insert(slice_name);
                        continue;
                    }
                    Err(e) if e.code() == Some(409) => {
                        found = self.fenced(slices.get_opt(&slice_name)).await?;
                    }
                    Err(e) => return Err(e),
                }
            }
            match found {
                Some(s) if owned_by(&s, t) => {
                    ours.insert(slice_name.clone());
                    if !same_slice(&s, slice) {
                        self.fenced(slices.patch(&slice_name, &apply, &Patch::Apply(slice)))
                            .await?;
                    }
                }
                Some(_) => {
                    conflict = Some(taken("EndpointSlice", &slice_name));
                    break;
                }
                // Deleted between the conflict and the read: the next round creates it.
                None => {}
            }
        }
        let keep: BTreeSet<String> = if conflict.is_some() {
            BTreeSet::new()
        } else {
            wanted.iter().map(|s| s.name_any()).collect()
        };
        for name in ours.difference(&keep) {
            ignore_missing(
                self.fenced(slices.delete(name, &DeleteParams::default()))
                    .await,
            )?;
        }
        Ok(conflict)
    }

    /// Writes `status` on `t` when it differs; whether it wrote.
    pub async fn status(&self, t: &ModelTenant, status: &ModelTenantStatus) -> Result<bool> {
        if t.status.as_ref() == Some(status) {
            return Ok(false);
        }
        let api: Api<ModelTenant> =
            Api::namespaced(self.client.clone(), &t.namespace().unwrap_or_default());
        let patch = status_patch(t.status.as_ref(), status);
        self.fenced(api.patch_status(
            &t.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        ))
        .await?;
        Ok(true)
    }

    /// Adds the cleanup finalizer to a live tenant.
    pub async fn add_finalizer(&self, t: &ModelTenant) -> Result {
        if t.finalizers().iter().any(|f| f == FINALIZER) {
            return Ok(());
        }
        let mut finalizers = t.finalizers().to_vec();
        finalizers.push(FINALIZER.to_string());
        self.set_finalizers(t, finalizers).await
    }

    /// Deletes a deleted tenant's routes and lets it go.
    pub async fn finish_deletion(&self, t: &ModelTenant) -> Result {
        if !t.finalizers().iter().any(|f| f == FINALIZER) {
            return Ok(());
        }
        let ns = t.namespace().unwrap_or_default();
        let slices: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &ns);
        let existing = self
            .fenced(
                slices.list(
                    &ListParams::default().labels(&format!("{TENANT_LABEL}={}", t.name_any())),
                ),
            )
            .await?;
        for slice in existing.iter().filter(|s| owned_by(*s, t)) {
            ignore_missing(
                self.fenced(slices.delete(&slice.name_any(), &DeleteParams::default()))
                    .await,
            )?;
        }
        let services: Api<Service> = Api::namespaced(self.client.clone(), &ns);
        if let Some(svc) = self.fenced(services.get_opt(&t.name_any())).await?
            && owned_by(&svc, t)
        {
            ignore_missing(
                self.fenced(services.delete(&t.name_any(), &DeleteParams::default()))
                    .await,
            )?;
        }
        let finalizers = t
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect();
        self.set_finalizers(t, finalizers).await?;
        let uid = t.uid().unwrap_or_default();
        self.written_routes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&uid);
        self.status_written
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&uid);
        tracing::info!(tenant = %format!("{ns}/{}", t.name_any()), "tenant removed");
        Ok(())
    }

    async fn set_finalizers(&self, t: &ModelTenant, finalizers: Vec<String>) -> Result {
        let api: Api<ModelTenant> =
            Api::namespaced(self.client.clone(), &t.namespace().unwrap_or_default());
        // The resourceVersion makes this a compare-and-swap on the list.
        let patch = serde_json::json!({
            "metadata": { "finalizers": finalizers, "resourceVersion": t.resource_version() }
        });
        match self
            .fenced(api.patch(
                &t.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            ))
            .await
        {
            Err(e) if matches!(e.code(), Some(404 | 409)) => Ok(()),
            other => other.map(|_| ()),
        }
    }

    /// Runs one API call, within the client-side budget, if this replica still leads, and
    /// abandons it once the write grace after the end of its term has passed.
    async fn fenced<T>(&self, call: impl Future<Output = kube::Result<T>>) -> Result<T> {
        let deadline = self.fence.write_deadline(Instant::now())?;
        let limited = async {
            self.limit.acquire().await;
            call.await
        };
        match tokio::time::timeout_at(deadline.into(), limited).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(FenceError::Abandoned.into()),
        }
    }

    /// Says on `agent` that its report is of another version, so the operator does not use it.
    pub async fn report_version_mismatch(&self, agent: &GpuAgent, message: &str) {
        self.event(
            &agent.object_ref(&()),
            EventReason::ReportVersionMismatch,
            message,
        )
        .await;
    }

    async fn event(&self, reference: &ObjectReference, reason: EventReason, note: &str) {
        let event = Event {
            type_: if reason.is_warning() {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.as_str().into(),
            note: Some(note.chars().take(1000).collect()),
            action: reason.as_str().into(),
            secondary: None,
        };
        if let Err(e) = self.fenced(self.recorder.publish(&event, reference)).await {
            tracing::warn!(error = %e, %reason, "could not record an event");
        }
    }
}

/// Whether a tenant's status must be written now rather than within [`STATUS_EVERY`]: a
/// replica was placed or removed (a new tenant's first placement included), its spec changed,
/// or it failed. A new tenant still waiting for an agent is not urgent: under a tight budget
/// its first status waits its turn, and placing the others goes first.
fn urgent(old: Option<&ModelTenantStatus>, new: &ModelTenantStatus) -> bool {
    let Some(old) = old else {
        return !new.placements.is_empty() || new.phase == Some(TenantPhase::Failed);
    };
    let agents = |s: &ModelTenantStatus| {
        s.placements
            .iter()
            .map(|p| p.agent.clone())
            .collect::<BTreeSet<_>>()
    };
    agents(old) != agents(new)
        || old.observed_generation != new.observed_generation
        || (new.phase == Some(TenantPhase::Failed)) != (old.phase == Some(TenantPhase::Failed))
}

fn ignore_missing<T>(r: Result<T>) -> Result {
    match r {
        Ok(_) => Ok(()),
        Err(e) if e.code() == Some(404) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Whether the tenant's Ready condition already has `reason`.
fn has_ready_reason(t: &ModelTenant, reason: Reason) -> bool {
    t.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| reason == c.reason.as_str())
}

/// Marks `status` as not routable: the tenant's Service name belongs to someone else.
fn service_conflict(status: &mut ModelTenantStatus, t: &ModelTenant, why: &str) {
    status.phase = Some(TenantPhase::Failed);
    set_condition(
        &mut status.conditions,
        "Ready",
        false,
        Reason::ServiceConflict.as_str(),
        why,
        t.metadata.generation,
    );
}

/// Five random lowercase characters, like a ReplicaSet's pod names.
fn suffix() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    let mut x = h.finish();
    (0..5)
        .map(|_| {
            let c = b"bcdfghjklmnpqrstvwxz2456789"[(x % 27) as usize];
            x /= 27;
            c as char
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cotenant_crds::ReplicaPlacement;

    fn on(agents: &[&str], ready: bool) -> ModelTenantStatus {
        ModelTenantStatus {
            phase: Some(TenantPhase::Serving),
            observed_generation: Some(1),
            placements: agents
                .iter()
                .map(|a| ReplicaPlacement {
                    agent: a.to_string(),
                    node: None,
                    ready,
                })
                .collect(),
            ..ModelTenantStatus::default()
        }
    }

    #[test]
    fn placements_spec_changes_and_failures_are_written_at_once() {
        let now = on(&["a"], true);
        assert!(urgent(None, &now), "a first status with a placement");
        assert!(
            !urgent(None, &on(&[], false)),
            "a new tenant waiting for an agent"
        );
        assert!(
            urgent(Some(&now), &on(&["a", "b"], false)),
            "a replica placed"
        );
        assert!(urgent(Some(&now), &on(&[], false)), "a replica removed");
        let respec = ModelTenantStatus {
            observed_generation: Some(2),
            ..now.clone()
        };
        assert!(urgent(Some(&now), &respec), "a spec change");
        let failed = ModelTenantStatus {
            phase: Some(TenantPhase::Failed),
            ..now.clone()
        };
        assert!(urgent(Some(&now), &failed));
        // Readiness, knobs and phases between them wait for the period.
        assert!(!urgent(Some(&on(&["a"], false)), &now));
        let profiling = ModelTenantStatus {
            phase: Some(TenantPhase::Profiling),
            ..now.clone()
        };
        assert!(!urgent(Some(&profiling), &now));
    }
}
