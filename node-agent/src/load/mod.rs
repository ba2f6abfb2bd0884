//! Turning a tenant's model source into a running `Tenant`: resolve the URI, check the SHA-256,
//! import and plan the model, run it once (which also yields the output signature), and start
//! the serving runtime. Every failure is a message naming the tenant's model and what went wrong.

mod download;
mod source;

pub use download::install_crypto_provider;
pub use source::{
    DEFAULT_CONCURRENT_LOADS, Sources, is_http, model_bytes, read_regular, resolve_file,
};

use crate::registry::TensorMeta;
use crate::serve::wire_name;
use cotenant_executor::graph::Dim;
use cotenant_executor::runtime::{CoSchedule, Tenant, TenantConfig};
use cotenant_executor::{Device, Model};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// A model loaded and serving, with its signature.
pub struct Loaded {
    pub tenant: Arc<Tenant>,
    pub inputs: Vec<TensorMeta>,
    pub outputs: Vec<TensorMeta>,
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

/// Imports `bytes`, runs it once at batch 1 and starts serving it with `config`.
/// Imports `bytes`, checks the model runs, and starts serving it (in seats of `co`, if given).
pub fn start(
    bytes: &[u8],
    config: TenantConfig,
    co: Option<Arc<CoSchedule>>,
) -> Result<Loaded, String> {
    let model = Model::from_bytes(bytes).map_err(|e| format!("not a usable ONNX model: {e}"))?;
    let model = Arc::new(model);
    // A trial on the tenant's device: its weights fit its memory budget, an instance can be
    // made, and the model runs there; any of these failing fails this tenant alone, with the
    // reason. The placed weights then serve.
    let placed = config.device.place(&config.name, &model)?;
    let mut trial = placed.engine(config.threads_per_instance, None)?;
    let example = model.plan.example_inputs(1);
    let outputs = trial
        .run(example)
        .map_err(|e| format!("the model fails on a batch-1 example input: {e}"))?;
    drop(trial);
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
        tenant: Arc::new(Tenant::start_on(placed, config, co)),
        inputs,
        outputs,
    })
}

/// Serving settings for a tenant with latency objective `slo` at `percentile` on `device`: the
/// batcher may hold a request for at most a tenth of the SLO waiting for a fuller batch.
pub fn config(
    name: &str,
    slo: Duration,
    percentile: f64,
    max_batch: usize,
    instances: usize,
    threads_per_instance: usize,
    device: &Device,
) -> TenantConfig {
    TenantConfig {
        name: name.to_string(),
        max_batch,
        instances,
        threads_per_instance,
        queue_capacity: 256,
        max_queue_delay: slo / 10,
        slo,
        slo_percentile: percentile,
        max_request_rows: 1024,
        device: device.clone(),
    }
}
