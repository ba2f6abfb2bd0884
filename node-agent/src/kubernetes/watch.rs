//! Watching this agent's own GpuAgent (a field selector on its name), and nothing else. Watch
//! failures are retried with backoff; meanwhile the last assignments stay in force.

use super::reconcile::Desired;
use cotenant_crds::GpuAgent;
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;

/// Publishes what GpuAgent `name` asks for whenever it changes, and its UID in `uid`, until the
/// receiver is gone.
pub async fn watch_own(
    api: Api<GpuAgent>,
    name: String,
    desired: watch::Sender<Option<Desired>>,
    uid: watch::Sender<Option<String>>,
) {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    // Whether a (re)list found the object; a list without it means it does not exist.
    let mut listed = false;
    while let Some(event) = events.next().await {
        let found = match event {
            Ok(Event::Init) => {
                listed = false;
                continue;
            }
            Ok(Event::Apply(agent) | Event::InitApply(agent)) => {
                listed = true;
                Some(agent)
            }
            Ok(Event::InitDone) if listed => continue,
            Ok(Event::InitDone) => {
                tracing::warn!(gpuagent = %name, "the GpuAgent does not exist (yet); waiting for it");
                None
            }
            Ok(Event::Delete(_)) => None,
            Err(e) => {
                tracing::warn!(error = %e, "watching the GpuAgent failed; retrying, serving the last assignments");
                continue;
            }
        };
        uid.send_replace(found.as_ref().and_then(|a| a.metadata.uid.clone()));
        let next = match found {
            Some(agent) => Desired {
                exists: true,
                generation: agent.metadata.generation,
                assignments: agent.spec.assignments,
            },
            None => Desired {
                exists: false,
                generation: None,
                assignments: Vec::new(),
            },
        };
        let changed = desired.send_if_modified(|current| {
            if current.as_ref() == Some(&next) {
                false
            } else {
                *current = Some(next);
                true
            }
        });
        if changed {
            tracing::debug!(gpuagent = %name, "assignments changed");
        }
        if desired.is_closed() {
            return;
        }
    }
}
