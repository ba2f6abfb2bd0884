//! Helpers shared by the tests that need the Python reference environment.

#![allow(dead_code)]

pub mod proto;

use cotenant_executor::{DType, Data, Model, Tensor, npy, zoo};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs onnxruntime (`tests/reference/ort_run.py`) on the model at `model` with `inputs`,
/// written as `{tag}_{input}.npy` into `dir`; returns the directory of its outputs, one
/// `{output}.npy` each (`{tag}_ort` in `dir`).
pub fn onnxruntime_outputs(
    model: &Path,
    inputs: &[(String, Tensor)],
    dir: &Path,
    tag: &str,
) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/ort_run.py");
    let out_dir = dir.join(format!("{tag}_ort"));
    let mut cmd = Command::new(python());
    cmd.arg(&script)
        .arg("--model")
        .arg(model)
        .arg("--output-dir")
        .arg(&out_dir);
    for (n, t) in inputs {
        let p = dir.join(format!("{tag}_{n}.npy"));
        npy::write(&p, t).unwrap();
        cmd.arg("--input").arg(format!("{n}={}", p.display()));
    }
    let out = cmd.output().expect("running COTENANT_PYTHON");
    assert!(
        out.status.success(),
        "onnxruntime failed on {tag}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out_dir
}

/// Seeded inputs for `model` at `batch`: normal floats, and integer ids below `vocab` (token
/// ids that stay inside the model's vocabulary).
pub fn random_inputs(model: &Model, batch: usize, seed: u64, vocab: u64) -> Vec<(String, Tensor)> {
    let mut rng = zoo::Rng::new(seed);
    model
        .plan
        .example_inputs(batch)
        .into_iter()
        .map(|(name, t)| {
            let data = match t.dtype() {
                DType::I64 => Data::I64(
                    (0..t.len())
                        .map(|_| (rng.next_u64() % vocab) as i64)
                        .collect(),
                ),
                _ => Data::F32((0..t.len()).map(|_| rng.normal()).collect()),
            };
            let shape = t.shape;
            (name, Tensor { shape, data })
        })
        .collect()
}

/// The interpreter of the reference venv (numpy, onnx 1.22, onnxruntime). These tests are
/// `#[ignore]`d for plain `cargo test`; when run they must not silently pass without it.
pub fn python() -> PathBuf {
    match std::env::var_os("COTENANT_PYTHON") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => panic!(
            "COTENANT_PYTHON is not set: this test needs the reference venv; run `cargo xtask test`"
        ),
    }
}

/// Runs a Python snippet and returns its stdout.
pub fn py(code: &str) -> String {
    let out = Command::new(python())
        .arg("-c")
        .arg(code)
        .output()
        .expect("running COTENANT_PYTHON");
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Relative error check used by the numeric tests: |a-b| <= atol + rtol*|b|, NaNs equal.
pub fn close(a: f64, b: f64, rtol: f64, atol: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= atol + rtol * b.abs()
}
