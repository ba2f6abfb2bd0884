//! Standalone mode: serve the ModelTenant YAML files of one directory on this machine, with no
//! Kubernetes. A bad file is reported with its path and the offending field and skipped; a model
//! that fails to load marks only its tenant Failed. A tenant file may name a token file
//! (annotation `cotenant.dev/token-file`, relative to the tenant file): then only callers
//! presenting one of its tokens may use the tenant.

use crate::credentials::TenantTokens;
use crate::registry::{Entry, Registry, Scaling, State};
use crate::serve::{self, AppState, ReportAuth};
use crate::{dnnscaler, load};
use anyhow::Context;
use cotenant_crds::ModelTenant;
use cotenant_executor::Device;
use cotenant_executor::runtime::CoSchedule;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long each DNNScaler profile point is measured.
const PROFILE_POINT: Duration = Duration::from_secs(1);
/// How often the scaler looks at each tenant's window.
pub(crate) const SCALE_EVERY: Duration = Duration::from_secs(2);

/// The annotation naming a tenant's token file: one bearer token per line.
pub const TOKEN_FILE_ANNOTATION: &str = "cotenant.dev/token-file";

/// The largest token file read (32 tokens of a few hundred characters fit easily).
const TOKEN_FILE_LIMIT: u64 = 64 << 10;

/// A tenant read from a file.
pub struct TenantFile {
    pub path: PathBuf,
    pub tenant: ModelTenant,
    /// The tokens its callers must present, from its token file; `None`: open to every caller.
    pub tokens: Option<TenantTokens>,
}

/// Reads every `*.yaml`/`*.yml` in `dir` (not recursing). Documents of other kinds are skipped;
/// invalid ModelTenants come back as errors with their path.
pub fn read_dir(dir: &Path) -> anyhow::Result<(Vec<TenantFile>, Vec<String>)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read the tenants directory {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file() && matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
        })
        .collect();
    files.sort();
    let mut tenants = Vec::new();
    let mut errors = Vec::new();
    for path in files {
        match read_file(&path) {
            Ok(found) => tenants.extend(found),
            Err(e) => errors.push(format!("{}: {e}", path.display())),
        }
    }
    Ok((tenants, errors))
}

fn read_file(path: &Path) -> Result<Vec<TenantFile>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let mut found = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value = serde_yaml::Value::deserialize(doc).map_err(|e| format!("not YAML: {e}"))?;
        if value.is_null() {
            continue;
        }
        let kind = value
            .get("kind")
            .and_then(|k| k.as_str())
            .unwrap_or_default();
        if kind != "ModelTenant" {
            continue;
        }
        let api = value
            .get("apiVersion")
            .and_then(|k| k.as_str())
            .unwrap_or_default();
        if api != "cotenant.dev/v1alpha1" {
            return Err(format!("apiVersion {api:?} is not cotenant.dev/v1alpha1"));
        }
        let tenant: ModelTenant =
            serde_yaml::from_value(value).map_err(|e| format!("invalid ModelTenant: {e}"))?;
        tenant
            .spec
            .validate()
            .map_err(|e| format!("invalid ModelTenant: {e}"))?;
        if tenant
            .metadata
            .name
            .as_deref()
            .unwrap_or_default()
            .is_empty()
        {
            return Err("metadata.name: Required value".into());
        }
        let tokens = tokens_of(&tenant, path)?;
        found.push(TenantFile {
            path: path.to_path_buf(),
            tenant,
            tokens,
        });
    }
    Ok(found)
}

/// The tokens a tenant file's token file holds. A tenant naming a Secret is refused: standalone
/// mode cannot read Secrets, and serving it open would ignore what its author asked for.
fn tokens_of(tenant: &ModelTenant, path: &Path) -> Result<Option<TenantTokens>, String> {
    let file = tenant
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(TOKEN_FILE_ANNOTATION));
    let Some(file) = file else {
        if tenant.spec.credentials.is_some() {
            return Err(format!(
                "spec.credentials names a Secret, which standalone mode cannot read: name a token file with the {TOKEN_FILE_ANNOTATION} annotation instead"
            ));
        }
        return Ok(None);
    };
    let file = path.parent().unwrap_or(Path::new(".")).join(file);
    // A regular file of a few tokens: never a device or a FIFO that would be read forever.
    let bytes = load::read_regular(&file, TOKEN_FILE_LIMIT, false)
        .map_err(|e| format!("{TOKEN_FILE_ANNOTATION}: {e}"))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| format!("{TOKEN_FILE_ANNOTATION} {}: not UTF-8 text", file.display()))?;
    TenantTokens::parse(&text)
        .map(Some)
        .map_err(|e| format!("{TOKEN_FILE_ANNOTATION} {}: {e}", file.display()))
}

use serde::Deserialize;

/// Options of `cotenant-agent standalone`.
pub struct Options {
    pub tenants: PathBuf,
    pub listen: String,
    /// Where gRPC is served.
    pub grpc_listen: String,
    pub threads: usize,
    pub report_token: Option<String>,
    /// What moves each tenant's knobs (DNNScaler unless comparing).
    pub knob_policy: cotenant_policy::Strategy,
    /// The co-schedule every tenant joins (`--schedule`), if any.
    pub co: Option<Arc<CoSchedule>>,
    /// Where the tenants compute (`--device`).
    pub device: Device,
    /// Host memory each tenant's model may hold (`--tenant-memory-limit`).
    pub tenant_memory_limit: u64,
    /// Bytes requests may hold, and their deadlines.
    pub budget: Arc<serve::budget::Budget>,
    pub limits: serve::Limits,
    pub connections: serve::ConnectionLimits,
    /// Where models may come from.
    pub sources: load::Sources,
}

/// Serves until Ctrl-C or SIGTERM.
pub async fn run(options: Options) -> anyhow::Result<()> {
    let (tenants, errors) = read_dir(&options.tenants)?;
    for e in &errors {
        tracing::error!("skipping {e}");
    }
    if tenants.is_empty() {
        anyhow::bail!("no valid ModelTenant in {}", options.tenants.display());
    }
    let registry = Arc::new(Registry::default());
    let mut names = std::collections::BTreeSet::new();
    for file in &tenants {
        let name = file.tenant.metadata.name.clone().unwrap_or_default();
        if !names.insert(name.clone()) {
            tracing::error!(
                "skipping {}: a tenant named {name:?} is already served",
                file.path.display()
            );
            continue;
        }
        let spec = &file.tenant.spec;
        registry.put(Entry {
            tokens: file.tokens.clone(),
            ..Entry::loading(
                &name,
                &spec.model.uri,
                spec.slo.latency_millis,
                spec.slo.percentile,
            )
        });
    }
    let threads_per_tenant = (options.threads / names.len().max(1)).max(1);
    let sources = Arc::new(options.sources);
    let scaler: Arc<Mutex<Vec<dnnscaler::Controlled>>> = Arc::default();
    tokio::spawn(scale_loop(scaler.clone()));
    crate::nvml::start_for(&options.device);
    for file in tenants {
        let registry = registry.clone();
        let scaler = scaler.clone();
        let runtime = tokio::runtime::Handle::current();
        // Loading and profiling are CPU-bound; they must not stall the server.
        let policy = options.knob_policy;
        let share = Share {
            threads: threads_per_tenant,
            co: options.co.clone(),
            device: options.device.clone(),
            memory_limit: options.tenant_memory_limit,
            sources: sources.clone(),
        };
        tokio::task::spawn_blocking(move || {
            bring_up(&file, &registry, &scaler, share, policy, &runtime)
        });
    }

    let app = Arc::new(AppState {
        registry: registry.clone(),
        report_auth: ReportAuth::Token(options.report_token),
        initialised: AtomicBool::new(true),
        draining: AtomicBool::new(false),
        budget: options.budget,
        limits: options.limits,
    });
    let listener = crate::bind(&options.listen).await?;
    let grpc_listener = crate::bind(&options.grpc_listen).await?;
    tracing::info!(
        listen = %listener.local_addr()?,
        grpc_listen = %grpc_listener.local_addr()?,
        tenants = names.len(),
        "serving the Open Inference Protocol"
    );
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        crate::shutdown_signal().await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut stop: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    tokio::join!(
        serve::serve(
            listener,
            serve::router(app.clone()),
            options.connections,
            serve::Protocol::Http1,
            stopped(stop_rx.clone()),
        ),
        serve::serve(
            grpc_listener,
            serve::grpc_router(app),
            options.connections,
            serve::Protocol::Http2,
            stopped(stop_rx),
        ),
    );
    // Finish what was accepted before exiting.
    for entry in registry.all() {
        if let State::Ready { tenant, .. } = &entry.state {
            tenant.shutdown();
        }
    }
    Ok(())
}

/// What one tenant gets of the agent: CPU threads, the co-schedule it joins, the device, and
/// host memory for its model, and where that model may come from.
struct Share {
    threads: usize,
    co: Option<Arc<CoSchedule>>,
    device: Device,
    memory_limit: u64,
    sources: Arc<load::Sources>,
}

/// Loads one tenant, marks it Ready (or Failed with the reason), then profiles it and hands it
/// to the scaler with DNNScaler's chosen knobs.
fn bring_up(
    file: &TenantFile,
    registry: &Arc<Registry>,
    scaler: &Mutex<Vec<dnnscaler::Controlled>>,
    share: Share,
    knob_policy: cotenant_policy::Strategy,
    runtime: &tokio::runtime::Handle,
) {
    let name = file.tenant.metadata.name.clone().unwrap_or_default();
    let spec = &file.tenant.spec;
    let base = file
        .path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let slo = Duration::from_secs_f64(spec.slo.latency_millis / 1e3);
    let zoo = file
        .tenant
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(load::ZOO_ANNOTATION));
    let Share {
        threads,
        co,
        device,
        memory_limit,
        sources,
    } = share;
    let (bounds, slo_view) = cotenant_crds::convert::bounds_and_slo(spec);
    let uri = &spec.model.uri;
    let zoo_written = match zoo {
        Some(zoo) if uri.starts_with("file://") => {
            load::resolve_file(uri, Some(&base)).and_then(|path| load::ensure_zoo_model(zoo, &path))
        }
        _ => Ok(()),
    };
    let bytes =
        zoo_written.and_then(|()| load::model_bytes(&spec.model, Some(&base), &sources, runtime));
    let config = load::config(&name, slo, spec.slo.percentile, 1, 1, threads, &device);
    // Sized for the largest batch its bounds let the scaler choose.
    let sizing = load::Sizing {
        memory_limit,
        largest_batch: bounds.max_batch.max(1) as usize,
    };
    let loaded = bytes.and_then(|bytes| load::start(&bytes, config, sizing, co));
    let loaded = match loaded {
        Ok(loaded) => loaded,
        Err(reason) => {
            tracing::error!(tenant = %name, %reason, "failed to load");
            registry.set_state(&name, State::Failed(reason));
            return;
        }
    };
    tracing::info!(tenant = %name, "ready");
    let tenant = loaded.tenant.clone();
    if let Some(why) = tenant.batch_refusal() {
        tracing::warn!(tenant = %name, %why, "batching refused: requests never share a batch");
    }
    // A model that crashes a worker is Failed from then on (standalone mode loads once).
    let (failed, failed_name) = (registry.clone(), name.clone());
    tenant.on_crash(Box::new(move |reason| {
        let reason = format!("the model crashed while serving: {reason}");
        tracing::error!(tenant = %failed_name, %reason, "failed");
        failed.set_state(&failed_name, State::Failed(reason));
    }));
    registry.set_state(
        &name,
        State::Ready {
            tenant: loaded.tenant,
            inputs: loaded.inputs,
            outputs: loaded.outputs,
        },
    );
    let slo = slo_view;
    let profile = match dnnscaler::profile(&name, &tenant, &bounds, threads, PROFILE_POINT) {
        Ok(profile) => profile,
        Err(e) => {
            tracing::warn!(tenant = %name, error = %e, "profiling failed; serving at batch 1, 1 instance");
            return;
        }
    };
    let choice = cotenant_policy::choose_approach(&profile, &slo, &bounds);
    let controlled =
        dnnscaler::Controlled::start(&name, tenant, &profile, slo, bounds, knob_policy);
    let knobs = controlled.round.controller.knobs();
    tracing::info!(
        tenant = %name,
        policy = %knob_policy.name(),
        approach = %controlled.round.controller.approach(),
        batch = knobs.batch,
        instances = knobs.instances,
        gain_batching = choice.gain_batching,
        gain_multi_tenancy = choice.gain_multi_tenancy,
        "knobs chosen"
    );
    registry.set_scaling(
        &name,
        Scaling {
            approach: controlled.round.controller.approach(),
            profile,
        },
    );
    scaler
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(controlled);
}

/// Moves every profiled tenant's knobs under feedback, forever.
async fn scale_loop(scaler: Arc<Mutex<Vec<dnnscaler::Controlled>>>) {
    let mut tick = tokio::time::interval(SCALE_EVERY);
    loop {
        tick.tick().await;
        let mut controlled = scaler.lock().unwrap_or_else(|e| e.into_inner());
        for c in controlled.iter_mut() {
            match c.step() {
                cotenant_policy::Decision::SetKnobs(k) => {
                    tracing::info!(tenant = %c.name, batch = k.batch, instances = k.instances, "the knobs moved");
                }
                cotenant_policy::Decision::NeedReplicas => {
                    tracing::debug!(tenant = %c.name, "SLO missed at the knobs' limits; standalone mode has no other replica");
                }
                cotenant_policy::Decision::Hold => {}
            }
        }
    }
}
