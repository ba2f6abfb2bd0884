#!/usr/bin/env python3
"""Where the executor's time goes against onnxruntime's, per kind of convolution layer.

Runs one zoo model (or any ONNX file whose convolutions carry constant weights) through
`cotenant-agent bench` with `COTENANT_PROFILE=node` and through an onnxruntime session with its
profiler on, the same batch and thread count, and prints per layer kind the milliseconds per
run of each, their ratio and the GFLOP/s each reaches. A kind is the kernel size, stride and
output size of a Conv ("conv3x3s1@14": 3x3, stride 1, 14x14 outputs; "dw" for depthwise).
Both sides fuse the batch normalisation, activation and residual Add that follow a Conv into it;
their time is counted with that Conv. Nodes that are no Conv keep their operator as kind.

Use one thread for a table that a busy machine does not distort; the ratios hold on two.

Usage: layers.py --agent target/release/cotenant-agent --model resnet50 [--batch 1]
                 [--threads 1] [--duration 8] [--workdir DIR]
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import shape_inference

# Ops both runtimes fold into the Conv that feeds them.
FOLDED = ("BatchNormalization", "Relu", "Clip", "Add")


def layer_kinds(model, batch):
    """(kind per node name, FLOPs per Conv node name) with the batch axis set to `batch`."""
    for i in model.graph.input:
        dims = i.type.tensor_type.shape.dim
        if dims:
            dims[0].ClearField("dim_param")
            dims[0].dim_value = batch
    inferred = shape_inference.infer_shapes(model)
    shapes = {
        v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]
    }
    weights = {t.name: list(t.dims) for t in model.graph.initializer}
    kind, flops = {}, {}
    for n in model.graph.node:
        kind[n.name] = n.op_type
        w, out = weights.get(n.input[1]) if len(n.input) > 1 else None, shapes.get(n.output[0])
        if n.op_type != "Conv" or w is None or len(w) != 4 or not out or len(out) != 4:
            continue
        attrs = {a.name: a for a in n.attribute}
        group = attrs["group"].i if "group" in attrs else 1
        stride = attrs["strides"].ints[0] if "strides" in attrs else 1
        prefix = "dw" if group > 1 and group == w[0] else "conv"
        kind[n.name] = f"{prefix}{w[2]}x{w[3]}s{stride}@{out[2]}"
        flops[n.name] = 2 * int(np.prod(out)) * int(np.prod(w[1:]))
    producer = {o: n for n in model.graph.node for o in n.output}
    for n in model.graph.node:
        if n.op_type not in FOLDED or not n.input:
            continue
        p = producer.get(n.input[0])
        while p is not None and p.op_type in FOLDED:
            p = producer.get(p.input[0])
        if p is not None and p.op_type == "Conv":
            kind[n.name] = kind[p.name]
    return kind, flops


def ours(agent, path, batch, threads, duration, kind):
    """Milliseconds per run per kind, from the agent's per-node profile."""
    env = dict(os.environ, COTENANT_PROFILE="node")
    argv = [agent, "bench", "--model", path, "--batch", str(batch), "--threads", str(threads), "--duration", f"{duration}s", "--json"]
    r = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    runs = json.loads(next(l for l in r.stdout.splitlines() if l.startswith("{")))["runs"]
    per_kind = collections.Counter()
    for line in r.stderr.splitlines():
        fields = line.split()
        if "calls" not in fields:
            continue
        # "  <node> <op> <calls> calls <ms> ms <share>%": the node's name comes first.
        ms = float(fields[fields.index("calls") + 1])
        per_kind[kind.get(fields[0], fields[1] if len(fields) > 1 else fields[0])] += ms / runs
    return per_kind


def theirs(path, batch, threads, duration, kind, workdir):
    """Milliseconds per run per kind, from onnxruntime's profiler (fused nodes keep a name)."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(workdir, "ort-profile")
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    feeds = {}
    for i in sess.get_inputs():
        shape = [batch if not isinstance(d, int) else d for d in i.shape]
        if "int64" in i.type:
            feeds[i.name] = rng.integers(0, 100, shape).astype(np.int64)
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < duration or runs < 3:
        sess.run(None, feeds)
        runs += 1
    with open(sess.end_profiling()) as f:
        events = json.load(f)
    per_kind = collections.Counter()
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        name = e["name"][: -len("_kernel_time")]
        # The NCHWc pass renames the nodes it rewrites by a suffix.
        k = kind.get(name) or kind.get(name.split("_nchwc")[0]) or e["args"].get("op_name", name)
        per_kind[k] += e["dur"] / 1e3 / runs
    return per_kind


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agent", required=True, help="path to a release cotenant-agent binary")
    p.add_argument("--model", required=True, help="a zoo model's name, or the path of an ONNX file")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--duration", type=float, default=8.0, help="seconds per side")
    p.add_argument("--workdir", default=None, help="where zoo models and profiles go (default: a temp dir)")
    a = p.parse_args()
    work = a.workdir or tempfile.mkdtemp(prefix="cotenant-layers-")
    os.makedirs(work, exist_ok=True)
    path = a.model
    if not os.path.exists(path):
        path = os.path.join(work, f"{a.model}.onnx")
        if not os.path.exists(path):
            subprocess.run([a.agent, "zoo", a.model, "--out", path, "--seed", "1"], check=True)
    kind, flops = layer_kinds(onnx.load(path), a.batch)
    flops_per_kind = collections.Counter()
    for name, f in flops.items():
        flops_per_kind[kind[name]] += f
    mine = ours(a.agent, path, a.batch, a.threads, a.duration, kind)
    ref = theirs(path, a.batch, a.threads, a.duration, kind, work)
    print(f"model {os.path.basename(path)}, batch {a.batch}, threads {a.threads}: ours {sum(mine.values()):.2f} ms per run, onnxruntime {sum(ref.values()):.2f} ms (profiled)\n")
    print("| layer kind | ms ours | ms onnxruntime | ratio | GFLOP/s ours | GFLOP/s onnxruntime |")
    print("|---|---|---|---|---|---|")
    rate = lambda f, ms: f"{f / ms / 1e6:.0f}" if f and ms else "-"
    for k in sorted(set(mine) | set(ref), key=lambda k: -max(mine.get(k, 0), ref.get(k, 0))):
        o, r = mine.get(k, 0.0), ref.get(k, 0.0)
        ratio = f"{o / r:.2f}" if o and r else "-"
        print(f"| {k} | {o:.2f} | {r:.2f} | {ratio} | {rate(flops_per_kind[k], o)} | {rate(flops_per_kind[k], r)} |")


if __name__ == "__main__":
    main()
