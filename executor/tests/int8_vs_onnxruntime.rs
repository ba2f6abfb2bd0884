//! Small models made by onnxruntime's own tools, run by the executor and by onnxruntime on the
//! same inputs: squeezenet by quantize_static, in the QDQ format (per-channel int8 weights,
//! uint8 activations: the quantized Conv and Add paths) and in the operator format (QLinearConv,
//! com.microsoft.QLinearConcat, QLinearGlobalAveragePool); a two-layer BERT by quantize_dynamic
//! (DynamicQuantizeLinear + MatMulInteger: the packed MatMul path), by the transformer optimizer
//! (com.microsoft fused operators) and by both. The largest difference relative to the output's
//! scale must stay within onnxruntime's int8 tolerance, 1e-2 (the two sides round differently
//! at quantization ties, and a flipped step propagates), and 1e-4 for the float model.

mod common;

use cotenant_executor::zoo::{self, BertOptions, ZooOptions};
use cotenant_executor::{CpuBackend, Model, npy};
use std::process::Command;

/// quantize_static (after onnxruntime's pre-processing) or quantize_dynamic, as
/// executor/bench/compare.py does for resnet50 and BERT, with 7-bit weights.
const QUANTIZE: &str = r#"
import os, sys
import numpy as np
import onnx
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                      quantize_dynamic, quantize_static)
from onnxruntime.quantization.shape_inference import quant_pre_process
src, dst, kind = sys.argv[1], sys.argv[2], sys.argv[3]
if kind.startswith("transformers"):
    # onnxruntime's transformer optimizer: Attention, SkipLayerNormalization, FastGelu...
    from onnxruntime.transformers.optimizer import optimize_model
    optimized = optimize_model(src, model_type="bert", num_heads=int(sys.argv[4]),
                               hidden_size=int(sys.argv[5]), opt_level=0)
    optimized.save_model_to_file(dst if kind == "transformers" else dst + ".opt.onnx")
    if kind == "transformers_dynamic":
        # onnx's shape inference does not type the fused operators' outputs.
        quantize_dynamic(dst + ".opt.onnx", dst, weight_type=QuantType.QInt8, reduce_range=True,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    ops = sorted({f"{n.domain}.{n.op_type}" for n in onnx.load(dst).graph.node if n.domain})
    print(" ".join(ops))
    sys.exit(0)
# 7-bit weights (reduce_range): without VNNI, onnxruntime's u8 x s8 kernels sum pairs of
# products in 16 bits with saturation (vpmaddubsw), which full-range weights can reach
# (bert: 2e-2 off the exact sums); the executor sums exactly on every CPU.
if kind == "dynamic":
    quantize_dynamic(src, dst, weight_type=QuantType.QInt8, reduce_range=True)
    sys.exit(0)
rng = np.random.default_rng(1)
inputs = [(i.name, [d.dim_value if d.HasField("dim_value") else 1 for d in i.type.tensor_type.shape.dim])
          for i in onnx.load(src).graph.input]
class Reader(CalibrationDataReader):
    def __init__(self):
        self.feeds = iter([{n: rng.standard_normal(d).astype(np.float32) for n, d in inputs} for _ in range(2)])
    def get_next(self):
        return next(self.feeds, None)
pre = dst + ".pre.onnx"
quant_pre_process(src, pre)
quant_format = QuantFormat.QOperator if kind == "qoperator" else QuantFormat.QDQ
quantize_static(pre, dst, Reader(), quant_format=quant_format, per_channel=True,
                reduce_range=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
print(" ".join(sorted({f"{n.domain}.{n.op_type}" for n in onnx.load(dst).graph.node if n.domain})))
"#;

#[test]
#[ignore = "needs COTENANT_PYTHON: run cargo xtask test"]
fn int8_models_match_onnxruntime() {
    let python = common::python();
    let dir = std::env::temp_dir().join(format!("cotenant-int8-vs-ort-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let small_bert = BertOptions {
        layers: 2,
        hidden: 64,
        heads: 2,
        seq: 16,
        vocab: 500,
    };
    let mut report = Vec::new();
    // What each model is made into, and how close the two runtimes must be on it.
    let kinds = [
        ("squeezenet", "static", 1e-2),
        ("squeezenet", "qoperator", 1e-2),
        ("bert", "dynamic", 1e-2),
        ("bert", "transformers", 1e-4),
        ("bert", "transformers_dynamic", 1e-2),
    ];
    for (name, kind, tolerance) in kinds {
        let float = dir.join(format!("{name}.onnx"));
        let int8 = dir.join(format!("{name}_{kind}.onnx"));
        let options = ZooOptions {
            seed: 3,
            bert: small_bert.clone(),
        };
        zoo::write(name, &options, &float).unwrap();
        let out = Command::new(&python)
            .arg("-c")
            .arg(QUANTIZE)
            .args([&float, &int8])
            .arg(kind)
            .args([small_bert.heads, small_bert.hidden].map(|v| v.to_string()))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "quantizing {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let written = String::from_utf8_lossy(&out.stdout);
        if kind.starts_with("transformers") {
            // The optimizer fused what it matches in the zoo's BERT (not its attention, which
            // has no mask): otherwise this checks nothing of its operators.
            for op in ["SkipLayerNormalization", "BiasGelu"] {
                assert!(
                    written.contains(op),
                    "{kind}: the optimizer wrote only {written}"
                );
            }
        }
        report.push(format!("{name} {kind} writes {}", written.trim()));
        let model = Model::load(&int8).unwrap_or_else(|e| panic!("{name} {kind}: {e}"));
        // The weights the integer kernels hold packed count against the tenant's memory too:
        // they are most of the file.
        let file = std::fs::metadata(&int8).unwrap().len() as usize;
        assert!(
            model.plan.weight_bytes() >= file * 3 / 4,
            "{name}: {} weight bytes for a {file}-byte file",
            model.plan.weight_bytes()
        );
        let backend = CpuBackend::new(2);
        for batch in [1usize, 3] {
            let ins = common::random_inputs(&model, batch, 5 + batch as u64, 500);
            let ort_dir =
                common::onnxruntime_outputs(&int8, &ins, &dir, &format!("{name}_{kind}_{batch}"));
            for (oname, t) in model.plan.run(&backend, ins).unwrap() {
                let reference = npy::read(&ort_dir.join(format!("{oname}.npy"))).unwrap();
                assert_eq!(t.shape, reference.shape, "{name} batch {batch} {oname}");
                let (ours, theirs) = (t.as_f32().unwrap(), reference.as_f32().unwrap());
                let scale = theirs.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
                let worst = ours
                    .iter()
                    .zip(theirs)
                    .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                let rel = worst / scale;
                report.push(format!(
                    "{name} {kind} batch {batch}: max |diff| / max |ref| = {rel:.2e}"
                ));
                assert!(rel <= tolerance, "{}", report.join("\n"));
            }
        }
    }
    eprintln!("{}", report.join("\n"));
    std::fs::remove_dir_all(&dir).ok();
}
