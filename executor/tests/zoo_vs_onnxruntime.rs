//! Every zoo model at batch 1 and 8, run by the executor and by onnxruntime on the same inputs:
//! the largest difference relative to the output's scale must stay within 1e-4 (fp32).

mod common;

use cotenant_executor::zoo::{self, ZooOptions};
use cotenant_executor::{CpuBackend, Model, npy};

/// max |ours - ref| / max |ref|, and the largest per-element relative error above a 1e-3·scale floor.
fn errors(ours: &[f32], reference: &[f32]) -> (f64, f64) {
    let scale = reference
        .iter()
        .fold(0.0f64, |m, v| m.max(v.abs() as f64))
        .max(1e-12);
    let mut worst = 0.0f64;
    let mut worst_elem = 0.0f64;
    for (a, b) in ours.iter().zip(reference) {
        let d = (*a as f64 - *b as f64).abs();
        worst = worst.max(d);
        worst_elem = worst_elem.max(d / (b.abs() as f64 + 1e-3 * scale));
    }
    (worst / scale, worst_elem)
}

#[test]
#[ignore = "needs COTENANT_PYTHON: run cargo xtask test"]
fn zoo_models_match_onnxruntime() {
    let dir = std::env::temp_dir().join(format!("cotenant-zoo-vs-ort-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let only = std::env::var("ZOO_FILTER").unwrap_or_default();
    let mut report = Vec::new();
    let mut failures = Vec::new();
    for name in zoo::NAMES.iter().filter(|n| n.contains(&only)) {
        let path = dir.join(format!("{name}.onnx"));
        zoo::write(
            name,
            &ZooOptions {
                seed: 7,
                ..Default::default()
            },
            &path,
        )
        .unwrap();
        let model = Model::load(&path).unwrap();
        let backend = CpuBackend::new(2);
        for batch in [1usize, 8] {
            let ins = common::random_inputs(&model, batch, 42 + batch as u64, 30522);
            let ort_dir =
                common::onnxruntime_outputs(&path, &ins, &dir, &format!("{name}_{batch}"));
            let ours = model.plan.run(&backend, ins).unwrap();
            for (oname, t) in ours {
                let reference = npy::read(&ort_dir.join(format!("{oname}.npy"))).unwrap();
                assert_eq!(
                    t.shape, reference.shape,
                    "{name} batch {batch} output {oname}"
                );
                let (rel, elem) = errors(t.as_f32().unwrap(), reference.as_f32().unwrap());
                report.push(format!("{name:<13} batch {batch}: max |diff| / max |ref| = {rel:.2e}, worst element rel = {elem:.2e}"));
                if rel.is_nan() || rel > 1e-4 {
                    failures.push(report.last().unwrap().clone());
                }
            }
        }
        std::fs::remove_file(&path).ok();
    }
    eprintln!("{}", report.join("\n"));
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        failures.is_empty(),
        "zoo models differ from onnxruntime:\n{}",
        failures.join("\n")
    );
}
