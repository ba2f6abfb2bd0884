#!/usr/bin/env python3
"""Benchmarks the cotenant executor against onnxruntime on the same zoo models and machine.

For resnet50, mobilenet_v2 and the BERT encoder (seq 128), and the int8 versions of resnet50 and
BERT (`resnet50_int8`, `bert_int8`, see QUANTIZE), at batch 1 and 8 it measures latency
percentiles, throughput and peak RSS of `cotenant-agent bench --json` and of an onnxruntime
session with the same thread count, then prints a markdown table of ratios (ours / onnxruntime).
Peak RSS of both sides is measured the same way: ru_maxrss of a child process, read by a small
wrapper process that runs only that child.

Usage: compare.py --agent target/release/cotenant-agent [--threads 2] [--duration 10]
                  [--models resnet50,mobilenet_v2,bert,resnet50_int8,bert_int8] [--batches 1,8] [--workdir DIR]

The int8 models are written from the zoo's float ones by onnxruntime's own quantizer (in this
Python), and both sides then run the same quantized file.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

# Runs argv as a child and prints its stdout, then a last line with the child's peak RSS in KiB.
RSS_WRAPPER = r"""
import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=sys.stderr)
sys.stdout.write(r.stdout.decode())
print("\nMAXRSS_KIB", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(r.returncode)
"""

# Writes the int8 version of a float zoo model: argv = float model, int8 model, kind. `static`
# (resnet50): QDQ format, per-channel QInt8 weights and QUInt8 activations (onnxruntime's CPU
# default, u8 x s8), calibrated on a few seeded random inputs, after onnxruntime's recommended
# pre-processing (which folds the BatchNormalizations into the Convs). `dynamic` (BERT): QInt8 weights,
# activations quantized at run time (DynamicQuantizeLinear + MatMulInteger). Both with 7-bit weights
# (`reduce_range`), as onnxruntime advises for x86 CPUs without VNNI: its u8 x s8 kernels there
# saturate 16-bit pair sums of full-range weights (wrong answers, see BENCH.md).
QUANTIZE = r"""
import os, sys
import numpy as np
import onnx
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                      quantize_dynamic, quantize_static)
from onnxruntime.quantization.shape_inference import quant_pre_process
src, dst, kind = sys.argv[1], sys.argv[2], sys.argv[3]
if kind == "dynamic":
    quantize_dynamic(src, dst, weight_type=QuantType.QInt8, reduce_range=True)
    sys.exit(0)
rng = np.random.default_rng(1)
inputs = []
for i in onnx.load(src, load_external_data=False).graph.input:
    dims = [d.dim_value if d.HasField("dim_value") else 1 for d in i.type.tensor_type.shape.dim]
    inputs.append((i.name, dims))
class Reader(CalibrationDataReader):
    def __init__(self):
        self.feeds = iter([{n: rng.standard_normal(d).astype(np.float32) for n, d in inputs} for _ in range(4)])
    def get_next(self):
        return next(self.feeds, None)
pre = dst + ".pre.onnx"
quant_pre_process(src, pre)
quantize_static(pre, dst, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, reduce_range=True)
os.remove(pre)
"""

# The int8 models: their float zoo model and how onnxruntime quantizes it.
INT8 = {"resnet50_int8": ("resnet50", "static"), "bert_int8": ("bert", "dynamic")}

ORT_BENCH = r"""
import json, sys, time
import numpy as np
import onnxruntime as ort
model, batch, threads, duration = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
so = ort.SessionOptions()
so.intra_op_num_threads = threads
so.inter_op_num_threads = 1
sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
rng = np.random.default_rng(1)
feeds = {}
for i in sess.get_inputs():
    shape = [batch if not isinstance(d, int) else d for d in i.shape]
    if "int64" in i.type:
        feeds[i.name] = rng.integers(0, 100, shape).astype(np.int64)
    else:
        feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
for _ in range(2):
    sess.run(None, feeds)
lat = []
start = time.perf_counter()
while time.perf_counter() - start < duration or not lat:
    t0 = time.perf_counter()
    sess.run(None, feeds)
    lat.append((time.perf_counter() - t0) * 1e3)
elapsed = time.perf_counter() - start
lat.sort()
pct = lambda p: lat[min(len(lat) - 1, round(p / 100 * (len(lat) - 1)))]
print(json.dumps({"throughput_per_s": len(lat) * batch / elapsed, "p50_ms": pct(50), "p95_ms": pct(95), "p99_ms": pct(99), "runs": len(lat)}))
"""


def measured(argv):
    """Runs argv under the RSS wrapper; returns (parsed JSON of its stdout, peak RSS in MiB)."""
    out = subprocess.run([sys.executable, "-c", RSS_WRAPPER, *argv], stdout=subprocess.PIPE, check=True).stdout.decode()
    rss_kib = int(out.strip().splitlines()[-1].split()[1])
    obj = next(json.loads(l) for l in out.splitlines() if l.strip().startswith("{"))
    return obj, rss_kib / 1024.0


def cpu() -> str:
    """The CPU's model and widest float vector ISA: the tables are only comparable on the same."""
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
    except OSError:
        pass
    isa = "avx512f" if "avx512f" in flags else "avx2+fma" if {"avx2", "fma"} <= flags else "no avx2"
    return f"{model}, {isa}, {os.cpu_count()} logical CPUs"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agent", required=True, help="path to a release cotenant-agent binary")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--duration", type=float, default=10.0, help="seconds per measurement")
    p.add_argument("--models", default="resnet50,mobilenet_v2,bert,resnet50_int8,bert_int8")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--workdir", default=None, help="where to write the zoo models (default: a temp dir)")
    p.add_argument("--plot", help="write the ratio chart to this SVG or PNG")
    a = p.parse_args()
    work = a.workdir or tempfile.mkdtemp(prefix="cotenant-bench-")
    os.makedirs(work, exist_ok=True)
    rows = []
    for model in a.models.split(","):
        path = os.path.join(work, f"{model}.onnx")
        base, kind = INT8.get(model, (model, None))
        base_path = os.path.join(work, f"{base}.onnx")
        if not os.path.exists(base_path):
            subprocess.run([a.agent, "zoo", base, "--out", base_path, "--seed", "1"], check=True)
        if kind and not os.path.exists(path):
            subprocess.run([sys.executable, "-c", QUANTIZE, base_path, path, kind], check=True)
        for batch in [int(b) for b in a.batches.split(",")]:
            ours, ours_rss = measured([a.agent, "bench", "--model", path, "--batch", str(batch), "--instances", "1", "--threads", str(a.threads), "--duration", f"{a.duration}s", "--json"])
            ort, ort_rss = measured([sys.executable, "-c", ORT_BENCH, path, str(batch), str(a.threads), str(a.duration)])
            rows.append((model, batch, ours, ort, ours_rss, ort_rss))
            print(f"# {model} b{batch}: ours p50 {ours['p50_ms']:.1f} ms, ort p50 {ort['p50_ms']:.1f} ms", file=sys.stderr)
    spin = "off" if os.environ.get("COTENANT_SPIN") == "0" else "on"
    kernels = ", ".join(sorted({o["device"] for _, _, o, *_ in rows}))
    print(f"\nthreads: {a.threads}, duration per measurement: {a.duration}s, spinning (COTENANT_SPIN): {spin}, CPU: {cpu()}, ours on: {kernels}\n")
    print("| model | batch | p50 ms ours / ort | p99 ms ours / ort | latency ratio p50 (p99) | throughput/s ours / ort | throughput ratio | peak RSS MiB ours / ort | RSS ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model, batch, o, r, orss, rrss in rows:
        print(
            f"| {model} | {batch} | {o['p50_ms']:.1f} / {r['p50_ms']:.1f} | {o['p99_ms']:.1f} / {r['p99_ms']:.1f} | "
            f"{o['p50_ms'] / r['p50_ms']:.2f} ({o['p99_ms'] / r['p99_ms']:.2f}) | {o['throughput_per_s']:.1f} / {r['throughput_per_s']:.1f} | "
            f"{o['throughput_per_s'] / r['throughput_per_s']:.2f} | {orss:.0f} / {rrss:.0f} | {orss / rrss:.2f} |"
        )
    if a.plot:
        plot(a.plot, rows, a.threads)
        print(f"\nplot: {a.plot}")


def plot(path, rows, threads):
    """Throughput and peak-RSS ratios against onnxruntime per model and batch (1.0 = parity)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{model}\nbatch {batch}" for model, batch, *_ in rows]
    throughput = [o["throughput_per_s"] / r["throughput_per_s"] for _, _, o, r, _, _ in rows]
    rss = [orss / rrss for *_, orss, rrss in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(rows) + 2), 4.5))
    ax.bar([i - 0.2 for i in x], throughput, width=0.4, label="throughput, ours / onnxruntime (higher is better)")
    ax.bar([i + 0.2 for i in x], rss, width=0.4, label="peak RSS, ours / onnxruntime (lower is better)")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(list(x), labels)
    ax.set_ylabel("ratio")
    ax.set_title(f"cotenant executor vs onnxruntime on the CPU, {threads} threads", fontsize="medium")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=1, fontsize="small")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    main()
