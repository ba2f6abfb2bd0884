//! onnxruntime's own operators (the `com.microsoft` domain its optimizers and quantizers write,
//! and `SimplifiedLayerNormalization`, which it registers in the default domain), each as a
//! one-node model on random inputs, and a BERT its transformer optimizer and quantize_dynamic
//! wrote, run by the executor and by onnxruntime with its graph optimisations off. The cases are
//! written by `reference/ort_contrib_cases.py`. Float outputs must agree within 1e-4 of the
//! output's scale (1e-2 for the quantized BERT, onnxruntime's int8 tolerance), integer outputs
//! exactly, and quantized (8- and 16-bit) outputs within one step: the two sides round a float result to 8 bits
//! separately, and a value on a rounding tie can land either side.

mod common;

use cotenant_executor::{CpuBackend, DType, Model, Tensor, npy};
use std::path::Path;
use std::process::Command;

/// Why `ours` is not `reference`, if it is not.
fn differs(ours: &Tensor, reference: &Tensor, tolerance: f64) -> Option<String> {
    if ours.shape != reference.shape || ours.dtype() != reference.dtype() {
        return Some(format!(
            "{:?} {:?}, expected {:?} {:?}",
            ours.dtype(),
            ours.shape,
            reference.dtype(),
            reference.shape
        ));
    }
    let (a, b) = (ours.to_f64_vec(), reference.to_f64_vec());
    let worst = a
        .iter()
        .zip(&b)
        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
    match ours.dtype() {
        DType::F32 => {
            let scale = b.iter().fold(1e-12f64, |m, v| m.max(v.abs()));
            (worst / scale > tolerance || worst.is_nan())
                .then(|| format!("max |diff| / max |ref| = {:.2e}", worst / scale))
        }
        DType::U8 | DType::I8 | DType::U16 | DType::I16 => {
            (worst > 1.0).then(|| format!("off by {worst} steps"))
        }
        _ => (worst != 0.0).then(|| format!("{a:?} vs {b:?}")),
    }
}

#[test]
#[ignore = "needs COTENANT_PYTHON: run cargo xtask test"]
fn onnxruntime_operators_match_onnxruntime() {
    let python = common::python();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/ort_contrib_cases.py");
    let dir = std::env::temp_dir().join(format!("cotenant-contrib-vs-ort-{}", std::process::id()));
    let out = Command::new(&python)
        .arg(&script)
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "writing the cases: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let backend = CpuBackend::new(2);
    let cases = std::fs::read_to_string(dir.join("cases.tsv")).unwrap();
    let mut failures = Vec::new();
    let mut count = 0;
    for line in cases.lines() {
        let [name, inputs, outputs, tolerance] = line.split('\t').collect::<Vec<_>>()[..] else {
            panic!("bad line {line:?}");
        };
        let tolerance: f64 = tolerance.parse().unwrap();
        count += 1;
        let model = match Model::load(dir.join(format!("{name}.onnx"))) {
            Ok(m) => m,
            Err(e) => {
                failures.push(format!("{name}: load: {e}"));
                continue;
            }
        };
        let feeds = inputs
            .split(',')
            .map(|n| {
                let t = npy::read(&dir.join(format!("{name}_in_{n}.npy"))).unwrap();
                (n.to_string(), t)
            })
            .collect();
        let ours = match model.plan.run(&backend, feeds) {
            Ok(o) => o,
            Err(e) => {
                failures.push(format!("{name}: run: {e}"));
                continue;
            }
        };
        for output in outputs.split(',') {
            let reference = npy::read(&dir.join(format!("{name}_out_{output}.npy"))).unwrap();
            let Some((_, t)) = ours.iter().find(|(n, _)| n == output) else {
                failures.push(format!("{name}: no output {output}"));
                continue;
            };
            if let Some(why) = differs(t, &reference, tolerance) {
                failures.push(format!("{name} output {output}: {why}"));
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    assert!(count >= 91, "only {count} cases written");
    assert!(
        failures.is_empty(),
        "onnxruntime's operators differ from onnxruntime:\n{}",
        failures.join("\n")
    );
}
