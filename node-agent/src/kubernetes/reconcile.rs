//! Turning the GpuAgent's assignments into served tenants. One task owns this state; loading,
//! profiling and draining run on blocking threads and report back through `Done`, so a slow or
//! broken model never holds up the others.
//!
//! - new assignment: load (download, check, plan, start) → Ready, or Failed with the reason;
//! - removed assignment: out of the registry at once (new requests get 404), then drained
//!   (queued and running requests finish) while the status says Unloading;
//! - knobs or SLO changed: applied to the running replica, nothing dropped;
//! - caller credentials changed: the new token digests apply to the next request;
//! - model or tenant UID changed: the new model loads while the old one keeps serving, then
//!   replaces it; when the new one fails the tenant is Failed and the old one is drained;
//! - a load that fails is tried again after 10 s, doubling up to 5 min, while the tenant stays
//!   Failed with the latest reason;
//! - `profile` set: the DNNScaler points are measured once per (UID, model, profile knobs), while
//!   the tenant keeps serving (so the points include the interference of live traffic), on a
//!   blocking thread and within `dnnscaler::PROFILE_DEADLINE`;
//! - a model that crashes a worker (a panic while running a batch): the tenant is Failed with
//!   the reason and drained, and loaded again like a failed load;
//! - the status never runs a model: activation bytes come from the measurements the load made.

use crate::credentials::TenantTokens;
use crate::dnnscaler;
use crate::load;
use crate::registry::{Entry, Registry, State};
use cotenant_crds::report::served_name;
use cotenant_crds::{Assignment, Knobs, LoadedTenant, ReplicaState, TenantRef};
use cotenant_executor::Device;
use cotenant_executor::runtime::{CoSchedule, Tenant};
use cotenant_policy::Profile;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedSender;

/// How long each profile point is measured.
const PROFILE_POINT: Duration = Duration::from_secs(1);

/// What the GpuAgent asks for.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    /// False once the GpuAgent is gone (deleted).
    pub exists: bool,
    pub generation: Option<i64>,
    pub assignments: Vec<Assignment>,
}

/// A blocking job that finished.
pub enum Done {
    Loaded {
        name: String,
        attempt: u64,
        result: Result<load::Loaded, String>,
    },
    Profiled {
        name: String,
        attempt: u64,
        key: ProfileKey,
        result: Result<Profile, String>,
    },
    Unloaded {
        name: String,
        attempt: u64,
    },
    /// The serving replica's model crashed a worker.
    Crashed {
        name: String,
        attempt: u64,
        reason: String,
    },
    /// Time to load a Failed tenant again.
    Retry {
        name: String,
        attempt: u64,
    },
}

/// What a profile was measured for: a new tenant, model or set of profile knobs re-measures.
#[derive(Clone, Debug, PartialEq)]
pub struct ProfileKey {
    uid: String,
    uri: String,
    sha256: Option<String>,
    knobs: Knobs,
}

enum Phase {
    Loading,
    Ready,
    Failed(String),
}

/// One assignment as this agent holds it.
struct Held {
    assignment: Assignment,
    /// The load whose result counts; older ones are discarded when they finish.
    attempt: u64,
    phase: Phase,
    /// The replica serving now (during a reload, the old model's).
    serving: Option<Arc<Tenant>>,
    profiling: Option<ProfileKey>,
    profiled: Option<ProfileKey>,
    profile_error: Option<String>,
    /// Failed loads in a row of this assignment, for the retry backoff.
    failures: u32,
}

fn slo_of(a: &Assignment) -> Duration {
    Duration::from_secs_f64(a.slo.latency_millis.max(0.0) / 1e3)
}

fn apply_knobs(tenant: &Tenant, a: &Assignment) {
    let slo = slo_of(a);
    tenant.set_slo(slo, a.slo.percentile);
    tenant.set_knobs(
        a.knobs.batch_size as usize,
        a.knobs.instances as usize,
        slo / 10,
    );
}

fn model_changed(old: &Assignment, new: &Assignment) -> bool {
    old.model != new.model || old.tenant.uid != new.tenant.uid
}

/// The tokens an assignment's callers must present. Digests that do not parse (the schema
/// forbids them) admit nobody rather than everybody.
fn tokens_of(a: &Assignment) -> Option<TenantTokens> {
    let credentials = a.credentials.as_ref()?;
    Some(
        TenantTokens::from_hex(&credentials.token_sha256).unwrap_or_else(|e| {
            tracing::error!(tenant = %a.tenant.key(), error = %e, "unusable caller credentials: refusing every caller");
            TenantTokens::deny_all()
        }),
    )
}

/// A registry entry for `a` served as `name`, in `state`.
fn entry_of(name: &str, a: &Assignment, state: State) -> Entry {
    Entry {
        state,
        tenant_ref: Some(a.tenant.clone()),
        tokens: tokens_of(a),
        ..Entry::loading(name, &a.model.uri, a.slo.latency_millis, a.slo.percentile)
    }
}

/// The agent's assignments and what became of them.
pub struct Reconciler {
    registry: Arc<Registry>,
    threads: usize,
    /// The co-schedule every replica joins, if any.
    co: Option<Arc<CoSchedule>>,
    /// Where the replicas compute.
    device: Device,
    /// Host memory each tenant's model may hold (`--tenant-memory-limit`).
    memory_limit: u64,
    /// Where models may come from.
    sources: Arc<load::Sources>,
    runtime: tokio::runtime::Handle,
    done: UnboundedSender<Done>,
    held: BTreeMap<String, Held>,
    /// Replicas draining after their assignment went away, by (served name, attempt).
    unloading: BTreeMap<(String, u64), TenantRef>,
    next_attempt: u64,
    /// Whether the GpuAgent has been read at least once.
    pub initialised: bool,
    pub generation: Option<i64>,
}

impl Reconciler {
    pub fn new(
        registry: Arc<Registry>,
        threads: usize,
        co: Option<Arc<CoSchedule>>,
        device: Device,
        memory_limit: u64,
        sources: Arc<load::Sources>,
        done: UnboundedSender<Done>,
    ) -> Self {
        Reconciler {
            registry,
            threads: threads.max(1),
            co,
            device,
            memory_limit,
            sources,
            runtime: tokio::runtime::Handle::current(),
            done,
            held: BTreeMap::new(),
            unloading: BTreeMap::new(),
            next_attempt: 0,
            initialised: false,
            generation: None,
        }
    }

    /// Moves toward `desired`.
    pub fn apply(&mut self, desired: Desired) {
        if !desired.exists {
            if self.initialised {
                tracing::warn!("the GpuAgent is gone: unloading every tenant");
                let names: Vec<String> = self.held.keys().cloned().collect();
                for name in names {
                    self.unload(&name);
                }
            }
            return;
        }
        self.initialised = true;
        self.generation = desired.generation;
        let mut wanted: BTreeMap<String, Assignment> = BTreeMap::new();
        for a in desired.assignments {
            let name = served_name(&a.tenant.namespace, &a.tenant.name);
            if wanted.contains_key(&name) {
                tracing::error!(tenant = %name, "the GpuAgent assigns this tenant twice; serving the first");
                continue;
            }
            wanted.insert(name, a);
        }
        let gone: Vec<String> = self
            .held
            .keys()
            .filter(|n| !wanted.contains_key(*n))
            .cloned()
            .collect();
        for name in gone {
            self.unload(&name);
        }
        let count = wanted.len();
        for (name, a) in wanted {
            match self.held.get_mut(&name) {
                None => self.load(&name, a, count),
                Some(h) if model_changed(&h.assignment, &a) => {
                    tracing::info!(tenant = %name, uri = %a.model.uri, "model changed: loading it beside the serving one");
                    self.load(&name, a, count);
                }
                Some(h) => {
                    if h.assignment.knobs != a.knobs || h.assignment.slo != a.slo {
                        if let Some(t) = &h.serving {
                            apply_knobs(t, &a);
                            tracing::info!(tenant = %name, batch = a.knobs.batch_size, instances = a.knobs.instances, slo_ms = a.slo.latency_millis, "knobs applied");
                        }
                        let slo = a.slo.clone();
                        self.registry.update(&name, |e| {
                            e.slo_millis = slo.latency_millis;
                            e.percentile = slo.percentile;
                        });
                    }
                    if h.assignment.credentials != a.credentials {
                        let tokens = tokens_of(&a);
                        tracing::info!(tenant = %name, guarded = tokens.is_some(), "caller credentials changed");
                        self.registry.update(&name, |e| e.tokens = tokens);
                    }
                    h.assignment = a;
                }
            }
            self.maybe_profile(&name);
        }
    }

    /// Starts loading `a` as `name`; a replica already serving keeps serving meanwhile.
    fn load(&mut self, name: &str, a: Assignment, tenants: usize) {
        let serving = match self.held.remove(name) {
            Some(h) => h.serving,
            None => None,
        };
        if serving.is_none() {
            self.registry.put(entry_of(name, &a, State::Loading));
        } else {
            // The old model serves until the new one is ready, to the new model's callers.
            let tokens = tokens_of(&a);
            self.registry.update(name, |e| e.tokens = tokens);
        }
        let attempt = self.spawn_load(name, &a, tenants);
        self.held.insert(
            name.to_string(),
            Held {
                assignment: a,
                attempt,
                phase: Phase::Loading,
                serving,
                profiling: None,
                profiled: None,
                profile_error: None,
                failures: 0,
            },
        );
    }

    /// Starts the blocking load of `a`; returns its attempt number.
    fn spawn_load(&mut self, name: &str, a: &Assignment, tenants: usize) -> u64 {
        self.next_attempt += 1;
        let attempt = self.next_attempt;
        let per_tenant = (self.threads / tenants.max(1)).max(1);
        let config = load::config(
            name,
            slo_of(a),
            a.slo.percentile,
            a.knobs.batch_size as usize,
            a.knobs.instances as usize,
            (per_tenant / a.knobs.instances.max(1) as usize).max(1),
            &self.device,
        );
        // Sized for the largest batch it is assigned or asked to profile.
        let sizing = load::Sizing {
            memory_limit: self.memory_limit,
            largest_batch: a
                .profile
                .map_or(0, |k| k.batch_size)
                .max(a.knobs.batch_size)
                .max(1) as usize,
        };
        let (uri, model) = (a.model.uri.clone(), a.model.clone());
        let (done, runtime, name) = (self.done.clone(), self.runtime.clone(), name.to_string());
        let (co, sources) = (self.co.clone(), self.sources.clone());
        tracing::info!(tenant = %name, %uri, "loading");
        tokio::task::spawn_blocking(move || {
            // The fetched bytes hold a load slot until the model is loaded.
            let result = load::model_bytes(&model, None, &sources, &runtime)
                .and_then(|bytes| load::start(&bytes, config, sizing, co));
            let _ = done.send(Done::Loaded {
                name,
                attempt,
                result,
            });
        });
        attempt
    }

    /// Loads a Failed tenant again (its state stays Failed until the load succeeds).
    fn retry(&mut self, name: &str, attempt: u64) {
        let tenants = self.held.len();
        let Some(h) = self.held.get(name).filter(|h| h.attempt == attempt) else {
            return;
        };
        if !matches!(h.phase, Phase::Failed(_)) {
            return;
        }
        let a = h.assignment.clone();
        let next = self.spawn_load(name, &a, tenants);
        if let Some(h) = self.held.get_mut(name) {
            h.attempt = next;
        }
    }

    /// Takes `name` out of service and drains it.
    fn unload(&mut self, name: &str) {
        let Some(h) = self.held.remove(name) else {
            return;
        };
        self.registry.remove(name);
        tracing::info!(tenant = %name, "unassigned: draining");
        if let Some(tenant) = h.serving {
            self.unloading
                .insert((name.to_string(), h.attempt), h.assignment.tenant.clone());
            let (done, name, attempt) = (self.done.clone(), name.to_string(), h.attempt);
            tokio::task::spawn_blocking(move || {
                tenant.shutdown();
                let _ = done.send(Done::Unloaded { name, attempt });
            });
        }
    }

    /// Profiles `name` when its assignment asks for points not measured yet.
    fn maybe_profile(&mut self, name: &str) {
        let Some(h) = self.held.get_mut(name) else {
            return;
        };
        let (Phase::Ready, Some(tenant), Some(knobs), None) =
            (&h.phase, &h.serving, h.assignment.profile, &h.profiling)
        else {
            return;
        };
        let key = ProfileKey {
            uid: h.assignment.tenant.uid.clone(),
            uri: h.assignment.model.uri.clone(),
            sha256: h.assignment.model.sha256.clone(),
            knobs,
        };
        if h.profiled.as_ref() == Some(&key) {
            return;
        }
        h.profiling = Some(key.clone());
        self.registry.update(name, |e| e.profiling = true);
        let (tenant, done, attempt) = (tenant.clone(), self.done.clone(), h.attempt);
        let (name, threads) = (name.to_string(), self.threads);
        tracing::info!(tenant = %name, batch = knobs.batch_size, instances = knobs.instances, "profiling");
        let deadline = std::time::Instant::now() + dnnscaler::PROFILE_DEADLINE;
        tokio::task::spawn_blocking(move || {
            let result = dnnscaler::profile_points(
                &name,
                &tenant,
                knobs.batch_size,
                knobs.instances,
                threads,
                PROFILE_POINT,
                deadline,
            )
            .map_err(|e| e.to_string());
            let _ = done.send(Done::Profiled {
                name,
                attempt,
                key,
                result,
            });
        });
    }

    /// Takes in a finished job.
    pub fn on_done(&mut self, done: Done) {
        match done {
            Done::Loaded {
                name,
                attempt,
                result,
            } => self.on_loaded(&name, attempt, result),
            Done::Profiled {
                name,
                attempt,
                key,
                result,
            } => {
                let Some(h) = self.held.get_mut(&name).filter(|h| h.attempt == attempt) else {
                    return;
                };
                h.profiling = None;
                h.profiled = Some(key);
                match result {
                    Ok(profile) => {
                        tracing::info!(tenant = %name, points = profile.points.len(), "profiled");
                        h.profile_error = None;
                        self.registry.update(&name, |e| {
                            e.profiling = false;
                            e.profile = Some(profile);
                        });
                    }
                    Err(e) => {
                        tracing::warn!(tenant = %name, error = %e, "profiling failed");
                        h.profile_error = Some(format!("profiling failed: {e}"));
                        self.registry.update(&name, |e| e.profiling = false);
                    }
                }
                self.maybe_profile(&name);
            }
            Done::Retry { name, attempt } => self.retry(&name, attempt),
            Done::Crashed {
                name,
                attempt,
                reason,
            } => {
                let serving = self
                    .held
                    .get(&name)
                    .is_some_and(|h| h.attempt == attempt && matches!(h.phase, Phase::Ready));
                if serving {
                    let reason = format!("the model crashed while serving: {reason}");
                    tracing::error!(tenant = %name, %reason, "failed");
                    self.fail(&name, attempt, reason);
                }
            }
            Done::Unloaded { name, attempt } => {
                tracing::info!(tenant = %name, "drained and unloaded");
                self.unloading.remove(&(name, attempt));
            }
        }
    }

    fn on_loaded(&mut self, name: &str, attempt: u64, result: Result<load::Loaded, String>) {
        let Some(h) = self.held.get_mut(name).filter(|h| h.attempt == attempt) else {
            // Superseded or unassigned while loading.
            if let Ok(loaded) = result {
                drain(loaded.tenant);
            }
            return;
        };
        let a = &h.assignment;
        let replaced = match result {
            Ok(loaded) => {
                apply_knobs(&loaded.tenant, a);
                // A crash while serving comes back as a job, to be handled like a failed load.
                let (done, crashed) = (self.done.clone(), name.to_string());
                loaded.tenant.on_crash(Box::new(move |reason| {
                    let _ = done.send(Done::Crashed {
                        name: crashed,
                        attempt,
                        reason,
                    });
                }));
                tracing::info!(tenant = %name, "ready");
                self.registry.put(entry_of(
                    name,
                    a,
                    State::Ready {
                        tenant: loaded.tenant.clone(),
                        inputs: loaded.inputs,
                        outputs: loaded.outputs,
                    },
                ));
                h.phase = Phase::Ready;
                h.serving.replace(loaded.tenant)
            }
            Err(reason) => {
                tracing::error!(tenant = %name, %reason, "failed to load");
                self.fail(name, attempt, reason);
                return;
            }
        };
        if let Some(old) = replaced {
            drain(old);
        }
        self.maybe_profile(name);
    }

    /// Marks `name` Failed with `reason`, drains what it served, and loads it again after the
    /// backoff.
    fn fail(&mut self, name: &str, attempt: u64, reason: String) {
        let Some(h) = self.held.get_mut(name) else {
            return;
        };
        self.registry
            .put(entry_of(name, &h.assignment, State::Failed(reason.clone())));
        h.phase = Phase::Failed(reason);
        h.failures += 1;
        let delay = retry_delay(h.failures);
        tracing::info!(tenant = %name, retry_in = ?delay, "will load it again");
        let (done, retried) = (self.done.clone(), name.to_string());
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = done.send(Done::Retry {
                name: retried,
                attempt,
            });
        });
        if let Some(old) = h.serving.take() {
            drain(old);
        }
    }

    /// Every assignment Ready or Failed (none loading or profiling).
    pub fn settled(&self) -> bool {
        self.held
            .values()
            .all(|h| !matches!(h.phase, Phase::Loading) && h.profiling.is_none())
    }

    /// Each assignment (and each replica still draining) as the status reports it.
    pub fn tenants(&self) -> Vec<LoadedTenant> {
        let mut out: Vec<LoadedTenant> = self
            .held
            .values()
            .map(|h| {
                let state = match (&h.phase, &h.profiling) {
                    (Phase::Loading, _) => ReplicaState::Loading,
                    (Phase::Failed(_), _) => ReplicaState::Failed,
                    (Phase::Ready, Some(_)) => ReplicaState::Profiling,
                    (Phase::Ready, None) => ReplicaState::Ready,
                };
                // A serving replica's notes: a failed profile, and why requests never share a
                // batch where the model's inputs look batchable.
                let batching = h
                    .serving
                    .as_ref()
                    .and_then(|t| t.batch_refusal())
                    .map(|why| format!("batching refused: {why}"));
                let error = match &h.phase {
                    Phase::Failed(reason) => Some(reason.clone()),
                    _ => match (h.profile_error.clone(), batching) {
                        (Some(p), Some(b)) => Some(format!("{p}; {b}")),
                        (p, b) => p.or(b),
                    },
                };
                let mut t = LoadedTenant {
                    tenant: h.assignment.tenant.clone(),
                    state,
                    knobs: None,
                    weight_bytes: None,
                    activation_bytes: None,
                    error,
                };
                if let Some(serving) = &h.serving {
                    let (batch, instances) = serving.knobs();
                    let plan = &serving.model().plan;
                    t.knobs = Some(Knobs {
                        batch_size: u32::try_from(batch).unwrap_or(u32::MAX),
                        instances: u32::try_from(instances).unwrap_or(u32::MAX),
                    });
                    t.weight_bytes = Some(plan.weight_bytes() as u64);
                    // Never a run here (this is the async runtime): what the load measured.
                    t.activation_bytes =
                        plan.measured_peak_activation_bytes(batch).map(|b| b as u64);
                }
                t
            })
            .collect();
        out.extend(self.unloading.values().map(|tenant| LoadedTenant {
            tenant: tenant.clone(),
            state: ReplicaState::Unloading,
            knobs: None,
            weight_bytes: None,
            activation_bytes: None,
            error: None,
        }));
        out
    }

    /// Bytes of weights of every serving replica.
    pub fn weight_bytes(&self) -> u64 {
        self.held
            .values()
            .filter_map(|h| h.serving.as_ref())
            .map(|t| t.model().plan.weight_bytes() as u64)
            .sum()
    }

    /// Stops holding anything and returns the serving replicas, for the caller to drain.
    pub fn take_all(&mut self) -> Vec<Arc<Tenant>> {
        std::mem::take(&mut self.held)
            .into_iter()
            .filter_map(|(name, h)| {
                self.registry.remove(&name);
                h.serving
            })
            .collect()
    }
}

/// How long after its `failures`-th failed load in a row a tenant is loaded again: 10 s,
/// doubling up to 5 minutes. A download that failed for a moment recovers by itself; a model
/// that is really broken costs one attempt every few minutes.
fn retry_delay(failures: u32) -> Duration {
    let base = Duration::from_secs(10);
    base.saturating_mul(1 << failures.saturating_sub(1).min(5))
        .min(Duration::from_secs(300))
}

/// Finishes a replica's requests off the async workers.
fn drain(tenant: Arc<Tenant>) {
    tokio::task::spawn_blocking(move || tenant.shutdown());
}

#[cfg(test)]
mod tests {
    use super::*;
    use cotenant_crds::{ModelSource, Slo};
    use cotenant_executor::runtime::{Completed, faults};
    use cotenant_executor::{RunError, Tensor};
    use std::path::Path;
    use tokio::sync::mpsc::UnboundedReceiver;

    fn assignment(name: &str, file: &Path) -> Assignment {
        Assignment {
            tenant: TenantRef {
                namespace: "team".into(),
                name: name.into(),
                uid: format!("uid-{name}"),
            },
            model: ModelSource {
                uri: format!("file://{}", file.display()),
                sha256: None,
                format: Default::default(),
                credentials_secret: None,
            },
            slo: Slo {
                latency_millis: 5000.0,
                percentile: 99.0,
            },
            knobs: Knobs {
                batch_size: 4,
                instances: 1,
            },
            profile: None,
            credentials: Default::default(),
        }
    }

    /// Feeds finished jobs back until `done` holds.
    async fn drive(
        r: &mut Reconciler,
        jobs: &mut UnboundedReceiver<Done>,
        done: impl Fn(&Reconciler) -> bool,
    ) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        while !done(r) {
            let job = tokio::time::timeout_at(deadline, jobs.recv()).await;
            r.on_done(job.expect("in time").expect("a job"));
        }
    }

    async fn infer(registry: &Registry, name: &str) -> Result<Completed, RunError> {
        let entry = registry.resolve(name).expect("held");
        let State::Ready { tenant, .. } = &entry.state else {
            panic!("{name} is {}", entry.state.word());
        };
        let x = Tensor::f32(vec![1, 3, 224, 224], vec![0.5; 3 * 224 * 224]).expect("x");
        let (tx, rx) = tokio::sync::oneshot::channel();
        tenant
            .submit(
                vec![("input".into(), x)],
                Box::new(move |r| drop(tx.send(r))),
            )
            .expect("accepted");
        rx.await.expect("answered")
    }

    /// The agent's reconciler with three tenants on one agent: a model that crashes its worker
    /// (an injected fault: no real model is known to) is Failed in the status with the reason,
    /// its request answered with a device error (a 5xx), while the tenant beside it keeps
    /// serving; a model whose rows meet is Ready with batching refused, and the status says why.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_crashing_model_fails_its_tenant_alone_and_refused_batching_is_reported() {
        let dir = std::env::temp_dir().join(format!("cotenant-reconcile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let squeezenet = dir.join("squeezenet.onnx");
        std::fs::write(&squeezenet, crate::load::tests::squeezenet()).expect("write");
        let mixing = dir.join("mixing.onnx");
        std::fs::write(&mixing, crate::load::tests::batch_normalising_model()).expect("write");
        let registry = Arc::new(Registry::default());
        let (tx, mut jobs) = tokio::sync::mpsc::unbounded_channel();
        // The models directory is the agent's model root, as a pool's volume would be.
        let downloads = crate::load::Downloads {
            cache_dir: dir.join("cache"),
            cache_max_bytes: 1 << 30,
            read_timeout: crate::load::DEFAULT_READ_TIMEOUT,
            concurrent_loads: 2,
        };
        let sources = crate::load::Sources::kubernetes(std::slice::from_ref(&dir), &downloads)
            .expect("model root");
        let mut r = Reconciler::new(
            registry.clone(),
            2,
            None,
            Device::Cpu,
            1 << 30,
            Arc::new(sources),
            tx,
        );
        r.apply(Desired {
            exists: true,
            generation: Some(1),
            assignments: vec![
                assignment("crashes", &squeezenet),
                assignment("fine", &squeezenet),
                assignment("mixes", &mixing),
            ],
        });
        drive(&mut r, &mut jobs, Reconciler::settled).await;
        let state = |r: &Reconciler, name: &str| {
            r.tenants()
                .into_iter()
                .find(|t| t.tenant.name == name)
                .expect("reported")
        };
        for name in ["crashes", "fine", "mixes"] {
            assert_eq!(state(&r, name).state, ReplicaState::Ready, "{name}");
        }
        let mixes = state(&r, "mixes");
        let note = mixes.error.unwrap_or_default();
        assert!(
            note.starts_with("batching refused:") && note.contains("batch_mean"),
            "{note}"
        );
        assert_eq!(mixes.knobs.map(|k| k.batch_size), Some(1));
        assert!(state(&r, "fine").error.is_none());
        let at_batch_4 = state(&r, "fine").activation_bytes.expect("measured");
        // Knobs far past what was ever run: the status reports the memory plan at that batch
        // without running it (it is written from the async runtime).
        let mut bigger = assignment("fine", &squeezenet);
        bigger.knobs.batch_size = 1024;
        r.apply(Desired {
            exists: true,
            generation: Some(2),
            assignments: vec![
                assignment("crashes", &squeezenet),
                bigger,
                assignment("mixes", &mixing),
            ],
        });
        let at_1024 = state(&r, "fine");
        assert_eq!(at_1024.knobs.map(|k| k.batch_size), Some(1024));
        assert!(
            at_1024
                .activation_bytes
                .is_some_and(|b| b > 200 * at_batch_4),
            "{:?} vs {at_batch_4} at batch 4",
            at_1024.activation_bytes
        );

        faults::panic_in_batches_of("team.crashes", true);
        match infer(&registry, "team.crashes").await {
            Err(RunError::Device(why)) => assert!(why.contains("crashed"), "{why}"),
            other => panic!("expected the crash as a device error, got {other:?}"),
        }
        drive(&mut r, &mut jobs, |r| {
            state(r, "crashes").state == ReplicaState::Failed
        })
        .await;
        let crashed = state(&r, "crashes");
        let why = crashed.error.unwrap_or_default();
        assert!(
            why.contains("crashed while serving") && why.contains("injected fault"),
            "{why}"
        );
        assert!(matches!(
            registry.resolve("team.crashes").map(|e| e.state.word()),
            Ok("Failed")
        ));
        assert!(infer(&registry, "team.fine").await.is_ok());
        assert_eq!(state(&r, "fine").state, ReplicaState::Ready);
        faults::panic_in_batches_of("team.crashes", false);
        for tenant in r.take_all() {
            tenant.shutdown();
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn retries_back_off_to_five_minutes() {
        let delays: Vec<u64> = (1..=8).map(|n| retry_delay(n).as_secs()).collect();
        assert_eq!(delays, [10, 20, 40, 80, 160, 300, 300, 300]);
    }
}
