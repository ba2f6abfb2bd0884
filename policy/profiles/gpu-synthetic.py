#!/usr/bin/env python3
"""Writes gpu-synthetic.json: a SYNTHETIC GPU profile table, not a measurement.

Its shapes follow the DNNScaler paper's observations: large compute-heavy nets (resnet50, vgg16)
leave a GPU underused at batch 1 and gain most from batching, while small nets (mobilenet_v2,
squeezenet) gain most from co-located instances. Batch time is t(b) = t1 * (a + (1 - a) * b)
(a = fixed share at batch 1); m instances at batch 1 take t1 * (1 + k * (m - 1)) each (k =
contention). p99 is 1.15x the mean. Weights are the zoo models' sizes.
Run: python3 policy/profiles/gpu-synthetic.py > policy/profiles/gpu-synthetic.json
"""
import json

MIB = 1 << 20
# name: (t1 ms, fixed share a, contention k, util at (1,1), weights MiB, activations MiB/sample)
NETS = {
    "resnet50": (6.0, 0.80, 0.85, 0.45, 98, 24),
    "vgg16": (9.0, 0.75, 0.90, 0.55, 528, 60),
    "mobilenet_v2": (3.0, 0.55, 0.30, 0.12, 14, 6),
    "squeezenet": (2.0, 0.60, 0.25, 0.10, 5, 4),
}
KNOBS = [(1, 1), (2, 1), (4, 1), (8, 1), (16, 1), (32, 1), (1, 2), (1, 4), (1, 8), (4, 2), (8, 4)]

models = []
for name, (t1, a, k, u1, w, act) in NETS.items():
    points = []
    for b, m in KNOBS:
        batch_ms = t1 * (a + (1 - a) * b) * (1 + k * (m - 1))
        throughput = m * b * 1000.0 / batch_ms
        base = 1000.0 / t1
        points.append({
            "batch": b, "instances": m,
            "throughput": round(throughput, 3),
            "p99_ms": round(1.15 * batch_ms, 3),
            "peak_activation_bytes": act * MIB * b,
            "gpu_util": round(min(1.0, u1 * throughput / base), 3),
        })
    models.append({"model": name, "weight_bytes": w * MIB, "points": points})
print(json.dumps({
    "source": "SYNTHETIC (not measured): shapes from the DNNScaler paper, see gpu-synthetic.py",
    "device": "synthetic GPU, 16 GiB",
    "models": models}, indent=1))
