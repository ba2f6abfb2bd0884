#!/bin/bash
# Regenerates cpu-measured.json from real runs of the agent's bench tool (3 s per point).
#   CARGO_TARGET_DIR=target-policy cargo build --release -p cotenant-agent
#   policy/profiles/measure-cpu.sh target-policy/release/cotenant-agent > policy/profiles/cpu-measured.json
set -euo pipefail
agent=${1:?path to the cotenant-agent binary}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for m in mobilenet_v2 squeezenet resnet18; do
  "$agent" zoo "$m" --out "$work/$m.onnx" >&2
  for bm in "1 1" "2 1" "4 1" "8 1" "1 2" "1 4" "4 2"; do
    set -- $bm
    "$agent" bench --model "$work/$m.onnx" --batch "$1" --instances "$2" --duration 3s --json \
      | sed "s|\"$work/\([a-z0-9_]*\).onnx\"|\"\1\"|" >> "$work/points.jsonl"
  done
done
python3 - "$work/points.jsonl" "$(nproc)" <<'PY'
import json, sys
models = {}
for line in open(sys.argv[1]):
    d = json.loads(line)
    m = models.setdefault(d["model"], {"model": d["model"], "weight_bytes": d["weight_bytes"], "points": []})
    m["points"].append({"batch": d["batch"], "instances": d["instances"],
                        "throughput": d["throughput_per_s"], "p99_ms": d["p99_ms"],
                        "peak_activation_bytes": d["peak_activation_bytes"]})
print(json.dumps({
    "source": "measured: cotenant-agent bench --duration 3s --json per point (policy/profiles/measure-cpu.sh)",
    "device": f"CPU, {sys.argv[2]} cores, shared with other builds while measuring (noisy)",
    "models": list(models.values())}, indent=1))
PY
