//! Turning a tenant's model source into a running `Tenant`: resolve the URI, check the SHA-256,
//! import and plan the model, run it once (which also yields the output signature), and start
//! the serving runtime. Every failure is a message naming the tenant's model and what went wrong.

mod download;

pub use download::install_crypto_provider;

use crate::registry::TensorMeta;
use crate::serve::wire_name;
use cotenant_executor::graph::Dim;
use cotenant_executor::runtime::{CoSchedule, Tenant, TenantConfig};
use cotenant_executor::{Device, Model};
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

/// Where a `file://` URI points: absolute paths as they are, relative ones from `base` (none in
/// Kubernetes mode, where a relative path names nothing).
pub fn resolve_file(uri: &str, base: Option<&Path>) -> Result<PathBuf, String> {
    let Some(path) = uri.strip_prefix("file://") else {
        return Err(format!("{uri}: not a file:// URI"));
    };
    let path = Path::new(path);
    if path.is_absolute() {
        return Ok(path.to_path_buf());
    }
    match base {
        Some(base) => Ok(base.join(path)),
        None => Err(format!(
            "{uri}: a relative file:// path means nothing to an agent pod; use an absolute path or http(s)://"
        )),
    }
}

/// Whether `uri` is fetched over HTTP.
pub fn is_http(uri: &str) -> bool {
    uri.starts_with("http://") || uri.starts_with("https://")
}

/// The model bytes behind `uri` (`file://` or `http(s)://`), checked against `sha256` when
/// given. Blocking: call it off the async workers; `runtime` runs the download.
pub fn model_bytes(
    uri: &str,
    sha256: Option<&str>,
    base: Option<&Path>,
    runtime: &tokio::runtime::Handle,
) -> Result<Vec<u8>, String> {
    if is_http(uri) {
        let bytes = runtime.block_on(download::get(uri))?;
        check_sha256(&bytes, sha256, uri)?;
        Ok(bytes)
    } else if uri.starts_with("file://") {
        read_model(&resolve_file(uri, base)?, sha256)
    } else {
        Err(format!(
            "{uri}: unsupported model URI (file://, http:// and https:// are)"
        ))
    }
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
    check_sha256(&bytes, sha256, &path.display().to_string())?;
    Ok(bytes)
}

/// Checks `bytes` against the expected SHA-256 (hex, any case), if there is one.
pub fn check_sha256(bytes: &[u8], sha256: Option<&str>, what: &str) -> Result<(), String> {
    let Some(expected) = sha256 else {
        return Ok(());
    };
    let actual: String = Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if actual.eq_ignore_ascii_case(expected) {
        Ok(())
    } else {
        Err(format!(
            "{what}: sha256 is {actual}, the tenant expects {expected}"
        ))
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_file_uris_need_a_base() {
        let base = Path::new("/tenants");
        assert_eq!(
            resolve_file("file://models/m.onnx", Some(base)),
            Ok(PathBuf::from("/tenants/models/m.onnx"))
        );
        assert_eq!(
            resolve_file("file:///srv/m.onnx", None),
            Ok(PathBuf::from("/srv/m.onnx"))
        );
        let e = resolve_file("file://models/m.onnx", None).expect_err("no base");
        assert!(e.contains("absolute"), "{e}");
    }

    #[test]
    fn sha256_mismatch_names_both_digests() {
        let empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(check_sha256(b"", Some(empty), "x"), Ok(()));
        assert_eq!(check_sha256(b"", Some(&empty.to_uppercase()), "x"), Ok(()));
        let e = check_sha256(b"a", Some(empty), "m.onnx").expect_err("differs");
        assert!(e.contains(empty) && e.starts_with("m.onnx"), "{e}");
    }

    #[test]
    fn other_schemes_are_refused() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let e = model_bytes("s3://bucket/m.onnx", None, None, runtime.handle()).expect_err("s3");
        assert!(e.contains("unsupported"), "{e}");
    }
}
