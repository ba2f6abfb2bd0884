//! The tenants this agent holds, by served model name, each Loading, Ready or Failed. A failed
//! tenant keeps its reason and never disturbs the others. In Kubernetes mode a tenant is served
//! as `<namespace>.<name>`, and its bare name resolves while it is the only one of that name.
//! A tenant taken off the agent is remembered for a while: a request that a client's stale route
//! still sends here is told to retry elsewhere, not that the model does not exist. A tenant
//! may require callers to present one of its tokens.

use crate::credentials::TenantTokens;
use cotenant_executor::runtime::Tenant;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// How long a removed tenant is remembered: longer than the routes of a Service take to follow
/// an EndpointSlice change.
pub const DEPARTED_FOR: Duration = Duration::from_secs(120);

/// One tensor of a model's signature as metadata reports it (`-1` for a variable dimension).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TensorMeta {
    pub name: String,
    pub datatype: String,
    pub shape: Vec<i64>,
}

/// What a tenant is doing.
#[derive(Clone)]
pub enum State {
    Loading,
    Ready {
        tenant: Arc<Tenant>,
        inputs: Vec<TensorMeta>,
        outputs: Vec<TensorMeta>,
    },
    Failed(String),
}

impl State {
    pub fn word(&self) -> &'static str {
        match self {
            State::Loading => "Loading",
            State::Ready { .. } => "Ready",
            State::Failed(_) => "Failed",
        }
    }
}

/// A tenant replica on this agent.
#[derive(Clone)]
pub struct Entry {
    /// Name clients use in `/v2/models/<name>`.
    pub name: String,
    /// Where the model came from (for errors and reports).
    pub source: String,
    pub slo_millis: f64,
    pub percentile: f64,
    pub state: State,
    /// DNNScaler's choice and the profile behind it, once profiled (standalone mode).
    pub scaling: Option<Scaling>,
    /// The ModelTenant this replica serves (Kubernetes mode).
    pub tenant_ref: Option<cotenant_crds::TenantRef>,
    /// Profile points the operator asked for, once measured (Kubernetes mode).
    pub profile: Option<cotenant_policy::Profile>,
    /// Whether the profile points are being measured now (the tenant serves meanwhile).
    pub profiling: bool,
    /// The tokens a caller must present; `None`: the tenant is open to every caller.
    pub tokens: Option<TenantTokens>,
}

impl Entry {
    /// A Loading entry with nothing measured yet.
    pub fn loading(name: &str, source: &str, slo_millis: f64, percentile: f64) -> Entry {
        Entry {
            name: name.to_string(),
            source: source.to_string(),
            slo_millis,
            percentile,
            state: State::Loading,
            scaling: None,
            tenant_ref: None,
            profile: None,
            profiling: false,
            tokens: None,
        }
    }
}

/// What DNNScaler decided for a tenant and why.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Scaling {
    pub approach: String,
    pub profile: cotenant_policy::Profile,
}

/// All tenants of the agent.
#[derive(Default)]
pub struct Registry {
    entries: RwLock<BTreeMap<String, Arc<Entry>>>,
    /// Served and bare names of removed tenants, when they left and whether they required tokens.
    departed: Mutex<BTreeMap<String, (Instant, bool)>>,
}

impl Registry {
    pub fn all(&self) -> Vec<Arc<Entry>> {
        self.entries
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Adds or replaces an entry.
    pub fn put(&self, entry: Entry) {
        self.entries
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(entry.name.clone(), Arc::new(entry));
    }

    /// Finds the tenant a client names: its served name, or a bare tenant name when exactly one
    /// held tenant has it. The error lists the qualified names when the bare name is ambiguous.
    pub fn resolve(&self, name: &str) -> Result<Arc<Entry>, String> {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = entries.get(name) {
            return Ok(entry.clone());
        }
        let matching: Vec<&Arc<Entry>> = entries
            .values()
            .filter(|e| e.tenant_ref.as_ref().is_some_and(|t| t.name == name))
            .collect();
        match matching.as_slice() {
            [one] => Ok((*one).clone()),
            [] => Err(format!("unknown model {name:?}")),
            many => Err(format!(
                "model name {name:?} is ambiguous: use one of {:?}",
                many.iter().map(|e| e.name.as_str()).collect::<Vec<_>>()
            )),
        }
    }

    /// Removes `name`, returning its entry; its names are remembered for [`DEPARTED_FOR`].
    pub fn remove(&self, name: &str) -> Option<Arc<Entry>> {
        let removed = self
            .entries
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        if let Some(entry) = &removed {
            let now = Instant::now();
            let mut departed = self.departed.lock().unwrap_or_else(|e| e.into_inner());
            departed.retain(|_, (at, _)| now.duration_since(*at) < DEPARTED_FOR);
            let guarded = entry.tokens.is_some();
            departed.insert(entry.name.clone(), (now, guarded));
            if let Some(t) = &entry.tenant_ref {
                departed.insert(t.name.clone(), (now, guarded));
            }
        }
        removed
    }

    /// How long ago a tenant a client names (served or bare name) was removed, if it was within
    /// [`DEPARTED_FOR`] and it is not held again.
    pub fn departed(&self, name: &str) -> Option<Duration> {
        if self.resolve(name).is_ok() {
            return None;
        }
        let departed = self.departed.lock().unwrap_or_else(|e| e.into_inner());
        let ago = departed.get(name)?.0.elapsed();
        (ago < DEPARTED_FOR).then_some(ago)
    }

    /// Whether any tenant held here, or removed within [`DEPARTED_FOR`], requires tokens: then
    /// a name that resolves to nothing must not be told apart from a guarded one.
    pub fn guards_any(&self) -> bool {
        let held = self
            .entries
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .any(|e| e.tokens.is_some());
        held || self
            .departed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .any(|(at, guarded)| *guarded && at.elapsed() < DEPARTED_FOR)
    }

    /// Changes `name`'s entry with `f`, keeping the rest.
    pub fn update(&self, name: &str, f: impl FnOnce(&mut Entry)) {
        let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = entries.get(name) {
            let mut next = Entry::clone(entry);
            f(&mut next);
            entries.insert(name.to_string(), Arc::new(next));
        }
    }

    /// Changes the state of `name`, keeping the rest of its entry.
    pub fn set_state(&self, name: &str, state: State) {
        let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = entries.get(name) {
            let mut next = Entry::clone(entry);
            next.state = state;
            entries.insert(name.to_string(), Arc::new(next));
        }
    }

    /// Records DNNScaler's choice for `name`.
    pub fn set_scaling(&self, name: &str, scaling: Scaling) {
        let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = entries.get(name) {
            let mut next = Entry::clone(entry);
            next.scaling = Some(scaling);
            entries.insert(name.to_string(), Arc::new(next));
        }
    }

    /// Ready for traffic once nothing is still loading.
    pub fn settled(&self) -> bool {
        self.all()
            .iter()
            .all(|e| !matches!(e.state, State::Loading))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cotenant_crds::TenantRef;

    fn held(namespace: &str, name: &str) -> Entry {
        let mut e = Entry::loading(
            &format!("{namespace}.{name}"),
            "file:///m.onnx",
            100.0,
            99.0,
        );
        e.tenant_ref = Some(TenantRef {
            namespace: namespace.into(),
            name: name.into(),
            uid: format!("uid-{namespace}-{name}"),
        });
        e
    }

    #[test]
    fn bare_names_resolve_only_when_unambiguous() {
        let registry = Registry::default();
        registry.put(held("team-a", "resnet"));
        registry.put(held("team-a", "bert"));
        registry.put(held("team-b", "bert"));
        assert_eq!(
            registry.resolve("team-a.resnet").map(|e| e.name.clone()),
            Ok("team-a.resnet".into())
        );
        assert_eq!(
            registry.resolve("resnet").map(|e| e.name.clone()),
            Ok("team-a.resnet".into())
        );
        let ambiguous = registry.resolve("bert").map(|e| e.name.clone());
        let message = ambiguous.expect_err("two tenants are called bert");
        assert!(
            message.contains("team-a.bert") && message.contains("team-b.bert"),
            "{message}"
        );
        assert!(registry.resolve("vgg").is_err());
        registry.remove("team-b.bert");
        assert_eq!(
            registry.resolve("bert").map(|e| e.name.clone()),
            Ok("team-a.bert".into())
        );
    }

    #[test]
    fn removed_tenants_are_remembered_as_departed() {
        let registry = Registry::default();
        registry.put(held("team-a", "resnet"));
        assert_eq!(registry.departed("team-a.resnet"), None, "still held");
        registry.remove("team-a.resnet");
        assert!(registry.resolve("team-a.resnet").is_err());
        for name in ["team-a.resnet", "resnet"] {
            assert!(
                registry.departed(name).is_some_and(|d| d < DEPARTED_FOR),
                "{name}"
            );
        }
        assert_eq!(registry.departed("vgg"), None, "never held");
        // Held again: served, not departed.
        registry.put(held("team-a", "resnet"));
        assert_eq!(registry.departed("resnet"), None);
    }

    #[test]
    fn standalone_names_are_not_split() {
        let registry = Registry::default();
        registry.put(Entry::loading("resnet", "file://m.onnx", 100.0, 99.0));
        assert!(registry.resolve("resnet").is_ok());
        assert!(registry.resolve("x.resnet").is_err());
    }
}
