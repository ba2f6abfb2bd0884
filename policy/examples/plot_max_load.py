"""Draws the closed-loop comparison: the highest load (requests/s) each knob policy holds at
>= 99% SLO attainment, per model, with DNNScaler's ratio to static b=1 m=1 over its bar; one
panel per source (simulator devices, real agent).

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
            xs, ys, notes = [], [], []
            for j, m in enumerate(models):
                load = {r["policy"]: r["max_load"] for r in mine if r["model"] == m}
                base = load.get(POLICIES[0], 0)
                xs.append(j + (i - 1) * width)
                ys.append(load.get(policy, 0))
                notes.append(f"{load.get(policy, 0) / base:.2f}x" if base > 0 and i > 0 else "")
            bars = ax.bar(xs, ys, width, label=policy)
            for bar, note in zip(bars, notes):
                if note:
                    ax.annotate(note, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                                va="bottom", fontsize=7)
        ax.set_xticks(range(len(models)), models, rotation=20)
        ax.set(title=device, ylabel="max load at >= 99% within SLO (req/s)")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out)


if __name__ == "__main__":
    main()
