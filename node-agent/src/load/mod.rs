//! Turning a tenant's model source into a running `Tenant`: fetch it (a file, an HTTP(S) URL or
//! an object store, downloads through the agent's model cache), check the SHA-256,
//! import and plan the model, hold it to the tenant's memory limit (weights plus activations at
//! the largest batch it may run), run it once (which also yields the output signature), and
//! start the serving runtime. Every failure is a message naming the tenant's model and what went
//! wrong; a panic in any of it fails that tenant alone.

mod cache;
mod download;
mod source;
mod store;

pub use download::{DEFAULT_READ_TIMEOUT, install_crypto_provider};
pub use source::{
    DEFAULT_CONCURRENT_LOADS, DEFAULT_MODEL_CACHE_MAX_BYTES, Downloads, Sources, model_bytes,
    read_regular, resolve_file,
};
pub use store::SecretReader;

use crate::registry::TensorMeta;
use crate::serve::wire_name;
use cotenant_executor::graph::Dim;
use cotenant_executor::memory::{self, MemoryBudget};
use cotenant_executor::runtime::{self, CoSchedule, Tenant, TenantConfig, panic_message};
use cotenant_executor::{Device, Model};
use std::panic::{AssertUnwindSafe, catch_unwind};
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

/// What a tenant's model may hold in host memory, and the largest batch it must fit at.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sizing {
    /// Bytes of weights and activations (`--tenant-memory-limit`).
    pub memory_limit: u64,
    /// The largest batch the tenant may be asked to run (its knobs, profile or bounds).
    pub largest_batch: usize,
}

/// The default of `--tenant-memory-limit`: room for the zoo's largest models (VGG-16, BERT-base)
/// at a batch of 32, well under the memory of a GPU node.
pub const DEFAULT_TENANT_MEMORY_LIMIT: &str = "4Gi";

/// Bytes from `4294967296`, `4Gi`, `512Mi`, `64Ki` or `2G`, `500M`, `100k` (binary or decimal
/// suffixes, an optional trailing `B`).
pub fn parse_memory(text: &str) -> Result<u64, String> {
    let bad = || format!("{text:?} is not a size: use bytes or a suffix like 512Mi or 4Gi");
    let t = text.trim();
    let t = t.strip_suffix('B').unwrap_or(t);
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(split);
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let unit: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "k" | "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => return Err(bad()),
    };
    let bytes = n.checked_mul(unit).ok_or_else(bad)?;
    if bytes == 0 {
        return Err(format!("{text:?}: a tenant needs some memory"));
    }
    Ok(bytes)
}

/// Bytes as MiB with one decimal, for messages.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// Imports `bytes`, checks it fits `sizing` and runs on the device, and starts serving it (in
/// seats of `co`, if given). A panic anywhere in this fails the tenant alone, with the reason.
#[tracing::instrument(name = "load", skip_all, fields(tenant = %config.name, bytes = bytes.len()))]
pub fn start(
    bytes: &[u8],
    config: TenantConfig,
    sizing: Sizing,
    co: Option<Arc<CoSchedule>>,
) -> Result<Loaded, String> {
    catch_unwind(AssertUnwindSafe(|| {
        #[cfg(test)]
        tests::maybe_crash(&config.name);
        start_checked(bytes, config, sizing, co)
    }))
    .unwrap_or_else(|panic| {
        Err(format!(
            "the model crashed the agent while loading: {}",
            panic_message(panic.as_ref())
        ))
    })
}

fn start_checked(
    bytes: &[u8],
    config: TenantConfig,
    sizing: Sizing,
    co: Option<Arc<CoSchedule>>,
) -> Result<Loaded, String> {
    let mut model = Model::from_bytes_for(bytes, config.device.target())
        .map_err(|e| format!("not a usable ONNX model: {e}"))?;
    // The budget: what the weights leave of the limit is what its runs may hold at once.
    let limit = sizing.memory_limit;
    let weights = model.plan.weight_bytes() as u64;
    let over = |what: String| {
        format!(
            "{what}, over the tenant memory limit of {} (--tenant-memory-limit)",
            mib(limit)
        )
    };
    let activations = limit
        .checked_sub(weights)
        .filter(|a| *a > 0)
        .ok_or_else(|| over(format!("its weights take {}", mib(weights))))?;
    let activations = usize::try_from(activations).unwrap_or(usize::MAX);
    model
        .plan
        .set_memory_budget(Arc::new(MemoryBudget::new(activations)));
    // The trial's inputs are priced before they are made: a declared shape can be absurd.
    let trial_inputs = memory::example_input_bytes(&model.plan, 1)
        .filter(|&b| b <= activations)
        .ok_or_else(|| over("its declared inputs alone".into()))?;
    let model = Arc::new(model);
    // A trial on the tenant's device: its weights fit its memory budget, an instance can be
    // made, and the model runs there; any of these failing fails this tenant alone, with the
    // reason. The placed weights then serve.
    let placed = config.device.place(&config.name, &model)?;
    let mut trial = placed.engine(config.threads_per_instance, None)?;
    let outputs = trial
        .run(model.plan.example_inputs(1))
        .map_err(|e| format!("the model fails on a batch-1 example input: {e}"))?;
    drop(trial);
    if config.device.is_gpu() {
        // What the GPU cannot run: each such step costs a copy down, a host wait and a copy up.
        let fallbacks = placed.host_fallbacks(1)?;
        tracing::info!(
            tenant = %config.name,
            host_fallbacks = fallbacks.len(),
            steps = model.plan.steps.len(),
            "GPU coverage"
        );
        for f in &fallbacks {
            tracing::info!(tenant = %config.name, step = %f, "runs on the host");
        }
    }
    // What it needs at the largest batch it may run (1 where requests never share a batch).
    let batchable = runtime::batchable(&model.plan);
    let largest = if batchable {
        sizing.largest_batch.max(1)
    } else {
        1
    };
    let peak = model
        .plan
        .peak_activation_bytes(largest)
        .map_err(|e| format!("measuring its activations failed: {e}"))?
        .max(trial_inputs) as u64;
    // Batch 2 measured too, so that the status can report any batch the knobs move to
    // without running it (see `Plan::measured_peak_activation_bytes`).
    if batchable {
        model
            .plan
            .peak_activation_bytes(2)
            .map_err(|e| format!("measuring its activations failed: {e}"))?;
    }
    let needed = weights.saturating_add(peak);
    if needed > limit {
        return Err(over(format!(
            "at batch {largest} it needs {} (weights {} and activations {})",
            mib(needed),
            mib(weights),
            mib(peak)
        )));
    }
    // Inputs and outputs travel in the inference protocol's datatypes, which have no float8,
    // float4, int4 or int2.
    let untyped = model
        .plan
        .inputs
        .iter()
        .map(|i| ("input", &i.name, i.dtype))
        .chain(outputs.iter().map(|(n, t)| ("output", n, t.dtype())))
        .find(|(_, _, dtype)| wire_name(*dtype).is_none());
    if let Some((what, name, dtype)) = untyped {
        let kind = match dtype {
            cotenant_executor::DType::Low(low) => format!("{low:?}"),
            other => format!("{other:?}"),
        };
        return Err(format!(
            "{what} {name:?} is {kind}, which the inference protocol has no datatype for"
        ));
    }
    // Metadata marks the first axis variable wherever requests may carry any number of rows.
    let variable_rows = batchable || model.plan.batch_refusal.is_some();
    let inputs = model
        .plan
        .inputs
        .iter()
        .map(|i| TensorMeta {
            name: i.name.clone(),
            datatype: wire_name(i.dtype).unwrap_or_default().to_string(),
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
            datatype: wire_name(t.dtype()).unwrap_or_default().to_string(),
            shape: t
                .shape
                .iter()
                .enumerate()
                .map(|(axis, &n)| {
                    if axis == 0 && variable_rows {
                        -1
                    } else {
                        i64::try_from(n).unwrap_or(-1)
                    }
                })
                .collect(),
        })
        .collect();
    if let Some(why) = &model.plan.batch_refusal {
        tracing::info!(tenant = %config.name, %why, "requests will not share batches");
    }
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
pub(crate) mod tests {
    use super::*;
    use cotenant_executor::proto::{
        AttributeProto, DimValue, Dimension, GraphProto, ModelProto, NodeProto, OperatorSetIdProto,
        TensorShapeProto, TypeProto, TypeProtoTensor, ValueInfoProto, attribute_type,
    };
    use cotenant_executor::zoo::{self, ZooOptions};
    use prost::Message;
    use std::sync::Mutex;

    /// Tenants whose load panics (no real model is known to make it panic any more).
    static CRASH_AT_LOAD: Mutex<Vec<String>> = Mutex::new(Vec::new());

    pub(crate) fn crash_at_load(name: &str) {
        CRASH_AT_LOAD
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(name.to_string());
    }

    pub(super) fn maybe_crash(name: &str) {
        let crash = CRASH_AT_LOAD
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|n| n == name);
        if crash {
            panic!("injected fault: loading {name:?} panics");
        }
    }

    pub(crate) fn squeezenet() -> Vec<u8> {
        zoo::build("squeezenet", &ZooOptions::default())
            .expect("zoo")
            .encode_to_vec()
    }

    /// y = x - mean(x over the batch), x: [batch, 4]: a real ONNX model whose rows meet.
    pub(crate) fn batch_normalising_model() -> Vec<u8> {
        let info = |name: &str| ValueInfoProto {
            name: name.into(),
            r#type: Some(TypeProto {
                tensor_type: Some(TypeProtoTensor {
                    elem_type: 1,
                    shape: Some(TensorShapeProto {
                        dim: vec![
                            Dimension {
                                value: Some(DimValue::DimParam("batch".into())),
                                denotation: String::new(),
                            },
                            Dimension {
                                value: Some(DimValue::DimValue(4)),
                                denotation: String::new(),
                            },
                        ],
                    }),
                }),
                denotation: String::new(),
            }),
            doc_string: String::new(),
        };
        let node = |op: &str, inputs: &[&str], out: &str, attribute| NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![out.into()],
            name: out.into(),
            op_type: op.into(),
            attribute,
            ..Default::default()
        };
        let axes = AttributeProto {
            name: "axes".into(),
            r#type: attribute_type::INTS,
            ints: vec![0],
            ..Default::default()
        };
        ModelProto {
            ir_version: 8,
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: 13,
            }],
            graph: Some(GraphProto {
                node: vec![
                    node("ReduceMean", &["x"], "batch_mean", vec![axes]),
                    node("Sub", &["x", "batch_mean"], "y", vec![]),
                ],
                input: vec![info("x")],
                output: vec![info("y")],
                ..Default::default()
            }),
            ..Default::default()
        }
        .encode_to_vec()
    }

    fn sized(memory_limit: u64, largest_batch: usize) -> Sizing {
        Sizing {
            memory_limit,
            largest_batch,
        }
    }

    fn cfg(name: &str) -> TenantConfig {
        config(name, Duration::from_secs(5), 99.0, 1, 1, 1, &Device::Cpu)
    }

    #[test]
    fn sizes_parse_with_binary_and_decimal_suffixes() {
        assert_eq!(parse_memory("4Gi"), Ok(4 << 30));
        assert_eq!(parse_memory("512MiB"), Ok(512 << 20));
        assert_eq!(parse_memory("2G"), Ok(2_000_000_000));
        assert_eq!(parse_memory("1048576"), Ok(1 << 20));
        assert_eq!(
            parse_memory(DEFAULT_TENANT_MEMORY_LIMIT),
            Ok(4 << 30),
            "the documented default"
        );
        for bad in ["", "4 GB", "-1", "4Xi", "0", "99999999999999999999Gi"] {
            assert!(parse_memory(bad).is_err(), "{bad:?}");
        }
    }

    /// A model over the tenant's memory limit is refused at load with the numbers: by its
    /// weights alone, or at the largest batch it may run; under the limit it serves.
    #[test]
    fn a_model_over_its_memory_limit_is_refused_with_the_numbers() {
        let model = squeezenet();
        let e = start(&model, cfg("tiny"), sized(1 << 20, 1), None).err();
        let e = e.expect("weights over 1 MiB");
        assert!(
            e.contains("its weights take") && e.contains("1.0 MiB"),
            "{e}"
        );
        let e = start(&model, cfg("batch"), sized(64 << 20, 64), None).err();
        let e = e.expect("64 images over 64 MiB");
        assert!(
            e.contains("at batch 64 it needs") && e.contains("64.0 MiB"),
            "{e}"
        );
        let loaded = start(&model, cfg("fits"), sized(64 << 20, 2), None).expect("fits");
        let budget = loaded
            .tenant
            .model()
            .plan
            .memory_budget()
            .map(|b| b.limit());
        let weights = loaded.tenant.model().plan.weight_bytes();
        assert_eq!(budget, Some((64 << 20) - weights));
        loaded.tenant.shutdown();
    }

    /// A model whose output is float8 cannot answer over the inference protocol, which has no
    /// such datatype: its load fails and names the output.
    #[test]
    fn a_model_with_a_float8_output_is_refused_at_load() {
        let mut model = ModelProto::decode(batch_normalising_model().as_slice()).expect("model");
        let graph = model.graph.as_mut().expect("graph");
        let to = AttributeProto {
            name: "to".into(),
            r#type: attribute_type::INT,
            i: 17,
            ..Default::default()
        };
        graph.node = vec![NodeProto {
            input: vec!["x".into()],
            output: vec!["y".into()],
            op_type: "Cast".into(),
            attribute: vec![to],
            ..Default::default()
        }];
        let output = graph.output[0]
            .r#type
            .as_mut()
            .and_then(|t| t.tensor_type.as_mut());
        output.expect("tensor type").elem_type = 17;
        model.opset_import[0].version = 21;
        let e = start(&model.encode_to_vec(), cfg("f8"), sized(64 << 20, 2), None).err();
        let e = e.expect("float8 output refused");
        assert!(
            e.contains("output \"y\" is F8E4M3FN") && e.contains("no datatype"),
            "{e}"
        );
    }

    /// A panic while loading fails that load with the reason instead of taking the thread (and
    /// in Kubernetes mode, the tenant's status) with it.
    #[test]
    fn a_panic_while_loading_is_a_failed_load() {
        crash_at_load("crashes-at-load");
        let e = start(
            &squeezenet(),
            cfg("crashes-at-load"),
            sized(1 << 30, 1),
            None,
        )
        .err()
        .expect("crashed");
        assert!(
            e.contains("crashed the agent while loading") && e.contains("injected fault"),
            "{e}"
        );
    }
}
