//! Writes a round's decisions to the API: GpuAgent assignments, agent pods, tenant Services and
//! EndpointSlices, statuses, finalizers and Events. Every write compares with what exists first,
//! so a round that changes nothing writes nothing.

use crate::decide::Route;
use crate::decide::{PoolOutcome, TenantOutcome};
use crate::manifests::{self, DRAINING, TENANT_LABEL};
use cotenant_crds::{GpuAgent, GpuPool, ModelTenant, ModelTenantStatus};
use k8s_openapi::api::core::v1::{ObjectReference, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource, ResourceExt};
use std::collections::{BTreeSet, HashMap};
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
    /// Routes last written per tenant UID, and when: unchanged routes are rewritten only every
    /// few minutes (to heal a hand-deleted Service), so a steady round costs no writes.
    pub written_routes: std::sync::Mutex<HashMap<String, (Vec<Route>, Instant)>>,
}

/// How often unchanged routes are written again anyway.
const ROUTES_REFRESH: Duration = Duration::from_secs(300);

type Result<T = ()> = std::result::Result<T, kube::Error>;

impl Writer {
    /// Applies `outcome` for `pool`, whose agents are `agents`.
    pub async fn pool(
        &self,
        pool: &GpuPool,
        agents: &[Arc<GpuAgent>],
        outcome: &PoolOutcome,
    ) -> Result {
        let ns = &pool.spec.agent_namespace;
        let agent_api: Api<GpuAgent> = Api::namespaced(self.client.clone(), ns);
        let pod_api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        for (name, wanted) in &outcome.assignments {
            let Some(agent) = agents.iter().find(|a| &a.name_any() == name) else {
                continue;
            };
            if &agent.spec.assignments != wanted {
                let patch = serde_json::json!({ "spec": { "assignments": wanted } });
                agent_api
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }
        }
        for (names, draining) in [(&outcome.drain, true), (&outcome.undrain, false)] {
            for name in names {
                let value = draining.then_some("true");
                let patch =
                    serde_json::json!({ "metadata": { "annotations": { DRAINING: value } } });
                agent_api
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }
        }
        for name in &outcome.remove {
            tracing::info!(agent = %name, pool = %pool.name_any(), "removing agent");
            ignore_missing(pod_api.delete(name, &DeleteParams::default()).await)?;
            ignore_missing(agent_api.delete(name, &DeleteParams::default()).await)?;
        }
        for _ in 0..outcome.add_agents {
            let name = format!("{}-agent-{}", pool.name_any(), suffix());
            let pod = manifests::agent_pod(pool, &name, &self.report_reader, &self.report_audience);
            let pod = pod_api.create(&PostParams::default(), &pod).await?;
            tracing::info!(agent = %name, pool = %pool.name_any(), "created agent pod");
            agent_api
                .create(&PostParams::default(), &manifests::gpu_agent(pool, &pod))
                .await?;
        }
        if pool.status.as_ref() != Some(&outcome.status) {
            let patch = serde_json::json!({ "status": outcome.status });
            Api::<GpuPool>::all(self.client.clone())
                .patch_status(
                    &pool.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await?;
        }
        for note in &outcome.notes {
            self.event(&pool.object_ref(&()), note.reason, &note.message)
                .await;
        }
        Ok(())
    }

    /// The GpuAgent of an agent pod whose GpuAgent is missing (the operator stopped between the
    /// two creates).
    pub async fn adopt_pod(&self, pool: &GpuPool, pod: &Pod) -> Result {
        let api: Api<GpuAgent> = Api::namespaced(self.client.clone(), &pool.spec.agent_namespace);
        match api
            .create(&PostParams::default(), &manifests::gpu_agent(pool, pod))
            .await
        {
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            other => other.map(|_| ()),
        }
    }

    /// Writes one tenant's routes, status and Events.
    pub async fn tenant(&self, outcome: &TenantOutcome) -> Result {
        let t = &outcome.tenant;
        let uid = t.uid().unwrap_or_default();
        let fresh = self
            .written_routes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&uid)
            .is_some_and(|(r, at)| r == &outcome.routes && at.elapsed() < ROUTES_REFRESH);
        if !fresh {
            let written = self.routes(t, &outcome.routes).await;
            let mut cache = self
                .written_routes
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            match written {
                Ok(()) => cache.insert(uid, (outcome.routes.clone(), Instant::now())),
                Err(e) => {
                    cache.remove(&uid);
                    return Err(e);
                }
            };
        }
        self.status(t, &outcome.status).await?;
        for note in &outcome.notes {
            self.event(&t.object_ref(&()), note.reason, &note.message)
                .await;
        }
        Ok(())
    }

    /// Keeps the tenant's Service and exactly the EndpointSlices for `routes`.
    async fn routes(&self, t: &ModelTenant, routes: &[Route]) -> Result {
        let ns = t.namespace().unwrap_or_default();
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let services: Api<Service> = Api::namespaced(self.client.clone(), &ns);
        services
            .patch(
                &t.name_any(),
                &params,
                &Patch::Apply(&manifests::service(t)),
            )
            .await?;
        let slices: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &ns);
        let wanted = manifests::endpoint_slices(t, routes);
        let names: BTreeSet<String> = wanted.iter().map(|s| s.name_any()).collect();
        for slice in &wanted {
            slices
                .patch(&slice.name_any(), &params, &Patch::Apply(slice))
                .await?;
        }
        let existing = slices
            .list(&ListParams::default().labels(&format!("{TENANT_LABEL}={}", t.name_any())))
            .await?;
        for slice in existing {
            if !names.contains(&slice.name_any()) {
                ignore_missing(
                    slices
                        .delete(&slice.name_any(), &DeleteParams::default())
                        .await,
                )?;
            }
        }
        Ok(())
    }

    pub async fn status(&self, t: &ModelTenant, status: &ModelTenantStatus) -> Result {
        if t.status.as_ref() == Some(status) {
            return Ok(());
        }
        let api: Api<ModelTenant> =
            Api::namespaced(self.client.clone(), &t.namespace().unwrap_or_default());
        let patch = serde_json::json!({ "status": status });
        api.patch_status(
            &t.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
        Ok(())
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
        let existing = slices
            .list(&ListParams::default().labels(&format!("{TENANT_LABEL}={}", t.name_any())))
            .await?;
        for slice in existing {
            ignore_missing(
                slices
                    .delete(&slice.name_any(), &DeleteParams::default())
                    .await,
            )?;
        }
        let services: Api<Service> = Api::namespaced(self.client.clone(), &ns);
        if let Some(svc) = services.get_opt(&t.name_any()).await?
            && svc
                .owner_references()
                .iter()
                .any(|o| Some(&o.uid) == t.uid().as_ref())
        {
            ignore_missing(
                services
                    .delete(&t.name_any(), &DeleteParams::default())
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
        self.written_routes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&t.uid().unwrap_or_default());
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
        match api
            .patch(
                &t.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
            other => other.map(|_| ()),
        }
    }

    async fn event(&self, reference: &ObjectReference, reason: &str, note: &str) {
        let event = Event {
            type_: if matches!(reason, "LoadFailed" | "ModelTooLarge" | "AtMaxAgents") {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.into(),
            note: Some(note.chars().take(1000).collect()),
            action: reason.into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, reference).await {
            tracing::warn!(error = %e, reason, "could not record an event");
        }
    }
}

fn ignore_missing<T>(r: Result<T>) -> Result {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
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
