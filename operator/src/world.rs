//! What the operator watches, cached in reflector stores: ModelTenants and GpuPools cluster-wide,
//! GpuAgents and agent pods only in the agent namespaces (where the operator holds a Role). Any
//! change wakes the control loop.

use cotenant_crds::{GpuAgent, GpuPool, ModelTenant};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
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
    /// Notified on every change of any watched object.
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
                &changed,
            ),
            pools: watch(
                Api::all(client.clone()),
                watcher::Config::default(),
                &changed,
            ),
            agents: watch_each(
                client,
                agent_namespaces,
                &watcher::Config::default(),
                &changed,
            ),
            pods: watch_each(
                client,
                agent_namespaces,
                &watcher::Config::default().labels(AGENT_LABEL),
                &changed,
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
    changed: &Arc<Notify>,
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

fn watch<K>(api: Api<K>, config: watcher::Config, changed: &Arc<Notify>) -> Store<K>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let changed = changed.clone();
    let stream = reflector::reflector(writer, watcher(api, config))
        .default_backoff()
        .touched_objects();
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => changed.notify_one(),
                Err(e) => tracing::warn!(error = %e, "watch failed; retrying"),
            }
        }
    });
    reader
}
