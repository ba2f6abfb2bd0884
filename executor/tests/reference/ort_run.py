"""Runs an ONNX model with onnxruntime (CPU) on .npy inputs and writes each output as .npy.

Usage: ort_run.py --model m.onnx --input NAME=path.npy ... --output-dir DIR [--threads N]
Output file names follow `cotenant-agent run`: characters other than letters, digits, '.', '_',
'-' become '_'.
"""

import argparse
import os
import re

import numpy as np
import onnxruntime as ort


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--input", action="append", default=[])
    p.add_argument("--output-dir", required=True)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(a.model, so, providers=["CPUExecutionProvider"])
    feeds = {}
    for spec in a.input:
        name, path = spec.split("=", 1)
        feeds[name] = np.load(path)
    outs = sess.run(None, feeds)
    os.makedirs(a.output_dir, exist_ok=True)
    for meta, value in zip(sess.get_outputs(), outs):
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", meta.name)
        np.save(os.path.join(a.output_dir, safe + ".npy"), value)


if __name__ == "__main__":
    main()
