#!/usr/bin/env python3
"""Latency of a BERT as exported and as onnxruntime's own tools rewrite it, against onnxruntime.

A 4-layer BERT (hidden 384, 6 heads, sequence 128 with the last 28 positions masked, batch 1)
laid out as PyTorch exports it (`executor/tests/reference/hf_bert.py`); the transformer
optimizer's version of it (EmbedLayerNormalization, Attention, SkipLayerNormalization,
BiasGelu); and `quantize_dynamic` of each. Ours through `cotenant-agent bench --json`,
onnxruntime 1.32 in this process, as `third_party.py` measures them.

Usage: ort_tools.py --agent target/release/cotenant-agent [--threads 1] [--duration 4]
"""

import argparse
import os
import sys
import tempfile

import numpy as np
import onnx
from onnxruntime.quantization import QuantType, quantize_dynamic
from onnxruntime.transformers.optimizer import optimize_model

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "reference"))
from hf_bert import bert  # noqa: E402
from third_party import onnxruntime_p50, ours_p50  # noqa: E402

HIDDEN, HEADS, SEQ = 384, 6, 128


def models(work):
    """(name, path) of the four models, written into `work`."""
    rng = np.random.default_rng(0)
    exported = os.path.join(work, "exported.onnx")
    onnx.save(bert(rng, layers=4, hidden=HIDDEN, heads=HEADS, vocab=3000, max_positions=SEQ),
              exported)
    optimized = os.path.join(work, "optimized.onnx")
    optimize_model(exported, model_type="bert", num_heads=HEADS, hidden_size=HIDDEN,
                   opt_level=0).save_model_to_file(optimized)
    out = [("exported", exported), ("optimized", optimized)]
    for name, path in list(out):
        int8 = os.path.join(work, name + "_int8.onnx")
        quantize_dynamic(path, int8, weight_type=QuantType.QInt8,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
        out.append((name + ", int8", int8))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--agent", required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--duration", type=float, default=4.0, help="seconds per measurement")
    a = p.parse_args()
    rng = np.random.default_rng(7)
    mask = np.ones((1, SEQ), np.int64)
    mask[0, SEQ - 28:] = 0
    feeds = {"input_ids": rng.integers(0, 3000, (1, SEQ)), "attention_mask": mask,
             "token_type_ids": rng.integers(0, 2, (1, SEQ))}
    with tempfile.TemporaryDirectory() as work:
        args = []
        for k, v in feeds.items():
            np.save(os.path.join(work, k + ".npy"), v)
            args += ["--input", f"{k}={os.path.join(work, k + '.npy')}"]
        print("| model | p50 ms ours | p50 ms onnxruntime | onnxruntime / ours |")
        print("|---|---|---|---|")
        for name, path in models(work):
            theirs = onnxruntime_p50(path, feeds, a.threads, a.duration)
            ours = ours_p50(a.agent, path, args, a.threads, a.duration)
            print(f"| {name} | {ours:.2f} | {theirs:.2f} | {theirs / ours:.2f} |", flush=True)


if __name__ == "__main__":
    main()
