#!/usr/bin/env python3
"""Latency of the third-party models (tests/third_party/models.json) against onnxruntime.

Each model runs on the inputs the correctness test feeds it (the manifest's shapes and value
ranges, seed 7): ours through `cotenant-agent bench --input ... --json`, onnxruntime 1.32 in
this process with `intra_op_num_threads` set to the same thread count and its default graph
optimisations, each for `--duration` seconds after two untimed runs. Prints one row per model:
both p50 latencies and the ratio onnxruntime / ours (higher is better for us; 1.0 is parity).

Usage: third_party.py --agent target/release/cotenant-agent --cache DIR [--threads 1]
                      [--duration 2] [--only NAME,...]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
MANIFEST = os.path.join(HERE, "..", "..", "tests", "third_party")
sys.path.insert(0, MANIFEST)
import compare  # noqa: E402  (the manifest's fetch and input rules)


def onnxruntime_p50(path, feeds, threads, duration):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    for _ in range(2):
        session.run(None, feeds)
    times, start = [], time.perf_counter()
    while time.perf_counter() - start < duration:
        t = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e3


def ours_p50(agent, path, args, threads, duration):
    cmd = [agent, "bench", "--model", path, *args, "--threads", str(threads),
           "--duration", f"{duration}s", "--json"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError((run.stderr.strip().splitlines() or ["?"])[-1])
    return json.loads(run.stdout.strip().splitlines()[-1])["p50_ms"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--agent", required=True)
    p.add_argument("--cache", required=True, help="the third-party model cache (compare.py's)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--duration", type=float, default=2.0, help="seconds per measurement")
    p.add_argument("--only", help="comma-separated model names")
    a = p.parse_args()
    with open(os.path.join(MANIFEST, "models.json")) as f:
        models = json.load(f)
    only = set(a.only.split(",")) if a.only else None
    print(f"threads: {a.threads}, duration per measurement: {a.duration}s\n")
    print("| model | precision | p50 ms ours | p50 ms onnxruntime | onnxruntime / ours |")
    print("|---|---|---|---|---|")
    failed = False
    with tempfile.TemporaryDirectory() as work:
        for m in models:
            if only and m["name"] not in only:
                continue
            path = compare.fetch(m, a.cache)
            rng = np.random.default_rng(7)
            feeds, args = {}, []
            for i, spec in enumerate(m["inputs"]):
                value = compare.make_input(spec, rng)
                npy = os.path.join(work, f"{m['name']}-{i}.npy")
                np.save(npy, value)
                feeds[spec["name"]] = value
                args += ["--input", f"{spec['name']}={npy}"]
            theirs = onnxruntime_p50(path, feeds, a.threads, a.duration)
            try:
                ours = ours_p50(a.agent, path, args, a.threads, a.duration)
            except RuntimeError as e:
                print(f"| {m['name']} | {m['precision']} | failed: {e} | {theirs:.2f} | |")
                failed = True
                continue
            print(f"| {m['name']} | {m['precision']} | {ours:.2f} | {theirs:.2f} | "
                  f"{theirs / ours:.2f} |", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
