//! Offline tools of the agent binary: `zoo` (write model-zoo ONNX files), `run` (run a model on
//! .npy inputs) and `bench` (throughput and latency percentiles of a model on this machine).

pub mod bench;
pub mod run;
pub mod zoo;

use anyhow::Context;
use cotenant_executor::{DType, Model, Target, Tensor};

/// Loads and plans a model for `target`, with the path in the error.
pub fn load_model(path: &std::path::Path, target: Target) -> anyhow::Result<Model> {
    Model::load_for(path, target).with_context(|| format!("loading model {}", path.display()))
}

/// Inputs given as `NAME=path.npy` (`--input`), read.
pub fn read_inputs(specs: &[String]) -> anyhow::Result<Vec<(String, Tensor)>> {
    specs
        .iter()
        .map(|spec| {
            let Some((name, path)) = spec.split_once('=') else {
                anyhow::bail!("--input {spec:?} is not NAME=path.npy")
            };
            let t = cotenant_executor::npy::read(std::path::Path::new(path))
                .with_context(|| format!("reading input {name} from {path}"))?;
            Ok((name.to_string(), t))
        })
        .collect()
}

/// Default thread budget: every core this process may use.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Deterministic synthetic inputs at `batch` (normal floats; small non-negative integers so
/// that token ids stay inside any vocabulary).
pub fn synthetic_inputs(model: &Model, batch: usize, seed: u64) -> Vec<(String, Tensor)> {
    let mut rng = cotenant_executor::zoo::Rng::new(seed);
    model
        .plan
        .example_inputs(batch)
        .into_iter()
        .map(|(name, t)| {
            let data = match t.dtype() {
                DType::F32 => {
                    cotenant_executor::Data::F32((0..t.len()).map(|_| rng.normal()).collect())
                }
                DType::I64 => cotenant_executor::Data::I64(
                    (0..t.len())
                        .map(|_| (rng.next_u64() % 100) as i64)
                        .collect(),
                ),
                _ => t.data.clone(),
            };
            (
                name,
                Tensor {
                    shape: t.shape,
                    data,
                },
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn inputs_name_what_is_wrong_with_them() {
        let e = super::read_inputs(&["x".into()]).unwrap_err().to_string();
        assert!(e.contains("\"x\" is not NAME=path.npy"), "{e}");
        let e = super::read_inputs(&["x=/nonexistent/x.npy".into()]).unwrap_err();
        assert!(
            format!("{e:#}").contains("reading input x from /nonexistent/x.npy"),
            "{e:#}"
        );
    }
}
