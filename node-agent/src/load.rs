//! Turning a tenant's model source into a running `Tenant`: resolve the URI, check the SHA-256,
//! import and plan the model, run it once (which also yields the output signature), and start
//! the serving runtime. Every failure is a message naming the tenant's model and what went wrong.

use crate::registry::TensorMeta;
use crate::serve::wire_name;
use cotenant_executor::graph::Dim;
use cotenant_executor::runtime::{Tenant, TenantConfig};
use cotenant_executor::{CpuBackend, Model};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// A model loaded and serving, with its signature.
pub struct Loaded {
    pub tenant: Arc<Tenant>,
    pub inputs: Vec<TensorMeta>,
    pub outputs: Vec<TensorMeta>,
}

/// Where a `file://` URI points: absolute paths as they are, relative ones from `base`.
pub fn resolve_file(uri: &str, base: &Path) -> Result<PathBuf, String> {
    let Some(path) = uri.strip_prefix("file://") else {
        return Err(format!(
            "{uri}: only file:// models can be loaded by this agent version (http and https are not built yet)"
        ));
    };
    let path = Path::new(path);
    Ok(if path.is_absolute() {
        path.to_path_buf()
    } else {
        base.join(path)
    })
}

/// The annotation that lets standalone mode write a missing model file from the model zoo.
pub const ZOO_ANNOTATION: &str = "cotenant.dev/zoo-model";

/// Writes zoo model `name` (seed 0) to `path` unless the file exists: how the examples get their
/// models on a fresh machine.
pub fn ensure_zoo_model(name: &str, path: &Path) -> Result<(), String> {
    if path.exists() {
        return Ok(());
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    tracing::info!(model = name, path = %path.display(), "writing the zoo model (first run)");
    let options = cotenant_executor::zoo::ZooOptions {
        seed: 0,
        bert: Default::default(),
    };
    cotenant_executor::zoo::write(name, &options, path)
        .map(drop)
        .map_err(|e| format!("cannot write zoo model {name:?} to {}: {e}", path.display()))
}

/// Reads the model bytes and checks them against `sha256` when given.
pub fn read_model(path: &Path, sha256: Option<&str>) -> Result<Vec<u8>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if let Some(expected) = sha256 {
        let actual: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        if !actual.eq_ignore_ascii_case(expected) {
            return Err(format!(
                "{}: sha256 is {actual}, the tenant expects {expected}",
                path.display()
            ));
        }
    }
    Ok(bytes)
}

/// Imports `bytes`, runs it once at batch 1 and starts serving it with `config`.
pub fn start(bytes: &[u8], config: TenantConfig) -> Result<Loaded, String> {
    let model = Model::from_bytes(bytes).map_err(|e| format!("not a usable ONNX model: {e}"))?;
    let example = model.plan.example_inputs(1);
    let outputs = model
        .plan
        .run(&CpuBackend::new(config.threads_per_instance), example)
        .map_err(|e| format!("the model fails on a batch-1 example input: {e}"))?;
    let batchable = cotenant_executor::runtime::batchable(&model.plan.inputs);
    let inputs = model
        .plan
        .inputs
        .iter()
        .map(|i| TensorMeta {
            name: i.name.clone(),
            datatype: wire_name(i.dtype).to_string(),
            shape: i
                .dims
                .as_ref()
                .map(|dims| {
                    dims.iter()
                        .map(|d| match d {
                            Dim::Fixed(n) => i64::try_from(*n).unwrap_or(-1),
                            Dim::Symbol(_) => -1,
                        })
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect();
    let outputs = outputs
        .iter()
        .map(|(name, t)| TensorMeta {
            name: name.clone(),
            datatype: wire_name(t.dtype()).to_string(),
            shape: t
                .shape
                .iter()
                .enumerate()
                .map(|(axis, &n)| {
                    if axis == 0 && batchable {
                        -1
                    } else {
                        i64::try_from(n).unwrap_or(-1)
                    }
                })
                .collect(),
        })
        .collect();
    Ok(Loaded {
        tenant: Arc::new(Tenant::start(Arc::new(model), config)),
        inputs,
        outputs,
    })
}

/// Serving settings for a tenant with latency objective `slo`: the batcher may hold a request
/// for at most a tenth of the SLO waiting for a fuller batch.
pub fn config(
    name: &str,
    slo: Duration,
    max_batch: usize,
    instances: usize,
    threads_per_instance: usize,
) -> TenantConfig {
    TenantConfig {
        name: name.to_string(),
        max_batch,
        instances,
        threads_per_instance,
        queue_capacity: 256,
        max_queue_delay: slo / 10,
        slo,
        max_request_rows: 1024,
    }
}
