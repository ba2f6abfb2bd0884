#!/usr/bin/env python3
"""Time and rate of a QDQ model's quantized convolutions, per layer kind.

Runs `cotenant-agent bench` with `COTENANT_PROFILE=node` on a QDQ-quantized model (such as the
`resnet50_int8.onnx` that compare.py writes into its --workdir), takes each QConv node's time per
run, and sums them per layer kind (kernel, output size, reduction length K = C·kh·kw and output
channels M), with the rate in GMAC/s from the Conv shapes that onnx shape inference gives.

Usage: qconv_layers.py --agent target/release/cotenant-agent --model resnet50_int8.onnx
                       [--batch 8] [--threads 1] [--duration 4]
"""

import argparse
import os
import re
import subprocess

import onnx
from onnx import shape_inference


def conv_shapes(path):
    """Conv node name -> (MACs per image, weight shape, output shape)."""
    g = shape_inference.infer_shapes(onnx.load(path)).graph
    shapes = {
        v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in list(g.value_info) + list(g.output) + list(g.input)
    }
    inits = {i.name: list(i.dims) for i in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    out = {}
    for n in g.node:
        if n.op_type != "Conv":
            continue
        w = n.input[1]
        # The weights are a constant, or DequantizeLinear of one.
        w = inits.get(w) or inits[producer[w].input[0]]
        y = shapes[n.output[0]]
        out[n.name] = (y[2] * y[3] * w[0] * w[1] * w[2] * w[3], w, y)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--agent", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--duration", type=float, default=4.0)
    a = p.parse_args()
    env = dict(os.environ, COTENANT_PROFILE="node")
    cmd = [a.agent, "bench", "--model", a.model, "--batch", str(a.batch), "--threads",
           str(a.threads), "--duration", f"{a.duration}s"]
    text = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    lines = (text.stdout + text.stderr).splitlines()
    convs = conv_shapes(a.model)
    kinds = {}
    for line in lines:
        m = re.match(r"\s+(\S+) QConv\S*\s+(\d+) calls\s+([\d.]+) ms", line)
        if not m or m.group(1) not in convs:
            continue
        ms = float(m.group(3)) / int(m.group(2))
        macs, w, y = convs[m.group(1)]
        key = f"{w[2]}x{w[3]} @{y[2]} K={w[1] * w[2] * w[3]} M={w[0]}"
        k = kinds.setdefault(key, [0.0, 0.0])
        k[0] += ms
        k[1] += macs * a.batch
    print(next((l for l in lines if l.startswith("runs ")), ""))
    print(f"quantized convolutions: {sum(k[0] for k in kinds.values()):.1f} ms per run")
    print("| layer kind | ms per run | GMAC/s |")
    print("|---|---|---|")
    for key, (ms, macs) in sorted(kinds.items(), key=lambda kv: -kv[1][0]):
        print(f"| {key} | {ms:.1f} | {macs / ms / 1e6:.0f} |")


if __name__ == "__main__":
    main()
