"""Draws the closed-loop comparison: the highest load each knob policy holds at >= 99% SLO
attainment, relative to static b=1 m=1, per model; simulator and real agent side by side.

Usage: python plot_max_load.py OUT.svg SIM.json [REAL.json ...]
  SIM.json:  cargo run --release -p cotenant-policy --example max_load -- --json SIM.json
  REAL.json: node-agent/bench/agent_bench.py --agent BIN --max-load --json REAL.json
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

POLICIES = ["static b=1 m=1", "DNNScaler", "Clipper AIMD"]


def main():
    out, inputs = sys.argv[1], sys.argv[2:]
    rows = [r for path in inputs for r in json.load(open(path))]
    devices = list(dict.fromkeys(r["device"] for r in rows))
    fig, axes = plt.subplots(1, len(devices), figsize=(4.2 * len(devices), 3.8), squeeze=False)
    for ax, device in zip(axes[0], devices):
        mine = [r for r in rows if r["device"] == device]
        models = list(dict.fromkeys(r["model"] for r in mine))
        width = 0.8 / len(POLICIES)
        for i, policy in enumerate(POLICIES):
            ys = []
            for m in models:
                load = {r["policy"]: r["max_load"] for r in mine if r["model"] == m}
                base = load.get(POLICIES[0], 0)
                ys.append(load.get(policy, 0) / base if base > 0 else 0)
            ax.bar([j + (i - 1) * width for j in range(len(models))], ys, width, label=policy)
        ax.set_xticks(range(len(models)), models, rotation=20)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set(title=device, ylabel="max load at >= 99% / static b=1 m=1")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out)


if __name__ == "__main__":
    main()
