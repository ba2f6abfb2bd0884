//! Standalone mode: serve the ModelTenant YAML files of one directory on this machine, with no
//! Kubernetes. A bad file is reported with its path and the offending field and skipped; a model
//! that fails to load marks only its tenant Failed.

use crate::load;
use crate::registry::{Entry, Registry, State};
use crate::serve::{self, AppState};
use anyhow::Context;
use cotenant_crds::ModelTenant;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// A tenant read from a file.
pub struct TenantFile {
    pub path: PathBuf,
    pub tenant: ModelTenant,
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
            Ok(found) => tenants.extend(found.into_iter().map(|tenant| TenantFile {
                path: path.clone(),
                tenant,
            })),
            Err(e) => errors.push(format!("{}: {e}", path.display())),
        }
    }
    Ok((tenants, errors))
}

fn read_file(path: &Path) -> Result<Vec<ModelTenant>, String> {
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
        found.push(tenant);
    }
    Ok(found)
}

use serde::Deserialize;

/// Options of `cotenant-agent standalone`.
pub struct Options {
    pub tenants: PathBuf,
    pub listen: String,
    pub threads: usize,
    pub report_token: Option<String>,
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
            name: name.clone(),
            source: spec.model.uri.clone(),
            slo_millis: spec.slo.latency_millis,
            percentile: spec.slo.percentile,
            state: State::Loading,
        });
    }
    let threads_per_tenant = (options.threads / names.len().max(1)).max(1);
    for file in tenants {
        let name = file.tenant.metadata.name.clone().unwrap_or_default();
        let base = file
            .path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let registry = registry.clone();
        // Loading is CPU-bound; it must not stall the server.
        tokio::task::spawn_blocking(move || {
            let spec = &file.tenant.spec;
            let slo = Duration::from_secs_f64(spec.slo.latency_millis / 1e3);
            let loaded = load::resolve_file(&spec.model.uri, &base)
                .and_then(|path| load::read_model(&path, spec.model.sha256.as_deref()))
                .and_then(|bytes| {
                    load::start(&bytes, load::config(&name, slo, 1, 1, threads_per_tenant))
                });
            match loaded {
                Ok(l) => {
                    tracing::info!(tenant = %name, "ready");
                    registry.set_state(
                        &name,
                        State::Ready {
                            tenant: l.tenant,
                            inputs: l.inputs,
                            outputs: l.outputs,
                        },
                    );
                }
                Err(reason) => {
                    tracing::error!(tenant = %name, %reason, "failed to load");
                    registry.set_state(&name, State::Failed(reason));
                }
            }
        });
    }

    let app = Arc::new(AppState {
        registry: registry.clone(),
        report_token: options.report_token,
    });
    let listener = tokio::net::TcpListener::bind(&options.listen)
        .await
        .with_context(|| format!("cannot listen on {}", options.listen))?;
    tracing::info!(listen = %options.listen, tenants = names.len(), "serving the Open Inference Protocol");
    axum::serve(listener, serve::router(app))
        .with_graceful_shutdown(crate::shutdown_signal())
        .await
        .context("the server failed")?;
    // Finish what was accepted before exiting.
    for entry in registry.all() {
        if let State::Ready { tenant, .. } = &entry.state {
            tenant.shutdown();
        }
    }
    Ok(())
}
