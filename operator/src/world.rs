//! What the operator watches, cached in reflector stores, so a round reads the cluster without a
//! single list call: ModelTenants and GpuPools cluster-wide; tenants' Services and EndpointSlices
//! (by the tenant label) cluster-wide; GpuAgents, agent pods, agents' Leases and the copies of
//! model credentials only in the agent namespaces (where the operator holds a Role). A change of
//! anything but a Lease or a copy wakes the control loop: Leases are renewed every few seconds
//! and read when a round runs anyway, and copies are the operator's own writes.

use crate::manifests::TENANT_LABEL;
use cotenant_crds::storage::COPY_LABEL;
use cotenant_crds::{GpuAgent, GpuPool, ModelTenant};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use std::collections::BTreeSet;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// Label every agent pod carries.
pub const AGENT_LABEL: &str = "app.kubernetes.io/name=cotenant-agent";

pub struct World {
    pub tenants: Store<ModelTenant>,
    pub pools: Store<GpuPool>,
    pub agents: Stores<GpuAgent>,
    pub pods: Stores<Pod>,
    /// Agents' Leases (`cotenant-agent`'s liveness), by agent name.
    pub leases: Stores<Lease>,
    /// The copies of tenants' model credentials in the agent namespaces.
    pub copies: Stores<Secret>,
    /// Tenants' Services and EndpointSlices.
    pub services: Store<Service>,
    pub slices: Store<EndpointSlice>,
    /// Notified on every change of a watched object that wakes the loop.
    pub changed: Arc<Notify>,
}

/// One store per agent namespace, read as one.
pub struct Stores<K: Resource + Clone + 'static>(Vec<Store<K>>)
where
    K::DynamicType: Eq + Hash + Clone;

impl<K> Stores<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    /// Every object of every namespace.
    pub fn state(&self) -> Vec<Arc<K>> {
        self.0.iter().flat_map(Store::state).collect()
    }

    async fn ready(&self) -> bool {
        for store in &self.0 {
            if store.wait_until_ready().await.is_err() {
                return false;
            }
        }
        true
    }
}

impl World {
    /// Starts the watches; they run until the process ends.
    pub fn watch(client: &Client, agent_namespaces: &BTreeSet<String>) -> World {
        let changed = Arc::new(Notify::new());
        World {
            tenants: watch(
                Api::all(client.clone()),
                watcher::Config::default(),
                Some(&changed),
            ),
            pools: watch(
                Api::all(client.clone()),
                watcher::Config::default(),
                Some(&changed),
            ),
            agents: watch_each(
                client,
                agent_namespaces,
                &watcher::Config::default(),
                Some(&changed),
            ),
            pods: watch_each(
                client,
                agent_namespaces,
                &watcher::Config::default().labels(AGENT_LABEL),
                Some(&changed),
            ),
            leases: watch_each(
                client,
                agent_namespaces,
                &watcher::Config::default().labels(AGENT_LABEL),
                None,
            ),
            copies: watch_each(
                client,
                agent_namespaces,
                &watcher::Config::default().labels(&format!("{COPY_LABEL}=true")),
                None,
            ),
            services: watch(
                Api::all(client.clone()),
                watcher::Config::default().labels(TENANT_LABEL),
                Some(&changed),
            ),
            slices: watch(
                Api::all(client.clone()),
                watcher::Config::default().labels(TENANT_LABEL),
                Some(&changed),
            ),
            changed,
        }
    }

    /// Resolves once every store has listed once.
    pub async fn synced(&self) {
        // `wait_until_ready` wakes only its latest waiter; ask again until it answers.
        loop {
            let all = async {
                self.tenants.wait_until_ready().await.is_ok()
                    && self.pools.wait_until_ready().await.is_ok()
                    && self.agents.ready().await
                    && self.pods.ready().await
                    && self.leases.ready().await
                    && self.copies.ready().await
                    && self.services.wait_until_ready().await.is_ok()
                    && self.slices.wait_until_ready().await.is_ok()
            };
            if let Ok(true) = tokio::time::timeout(Duration::from_secs(1), all).await {
                return;
            }
        }
    }
}

/// One watch per namespace of `namespaces`.
fn watch_each<K>(
    client: &Client,
    namespaces: &BTreeSet<String>,
    config: &watcher::Config,
    changed: Option<&Arc<Notify>>,
) -> Stores<K>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + Debug
        + DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    Stores(
        namespaces
            .iter()
            .map(|ns| watch(Api::namespaced(client.clone(), ns), config.clone(), changed))
            .collect(),
    )
}

/// A store of what `api` and `config` select; each change notifies `changed`, when given.
fn watch<K>(api: Api<K>, config: watcher::Config, changed: Option<&Arc<Notify>>) -> Store<K>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let changed = changed.cloned();
    let stream = reflector::reflector(writer, watcher(api, config))
        .default_backoff()
        .touched_objects();
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => {
                    if let Some(changed) = &changed {
                        changed.notify_one();
                    }
                }
                Err(e) => tracing::warn!(error = %e, "watch failed; retrying"),
            }
        }
    });
    reader
}
