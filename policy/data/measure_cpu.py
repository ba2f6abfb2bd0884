"""Measures the simulator's CPU ground truth on this machine with the agent's own tools and writes
three files next to this script:

- cpu-service-times.json: batch-time distributions (mean, p50, p95, p99 of one batch on one
  instance, no queueing) over the grid batch {1,2,4,8} x instances {1,2,4}, all threads
  (`cotenant-agent bench --json`), 2 s per point in three interleaved passes, keeping per point
  the pass with the median mean: what simulated batches take.
- cpu-profile.json: a separate, short pass (1 s per point, as the agent's profiler does) at the
  points the agent profiles, (1,1), (4,1), (1,4) and the joint point (4,2), in the profile-table
  format: what the simulated policies see.
- cpu-interference.json: co-located runs. For each pair of models (a model with itself included),
  each alone with half the threads, then both at once, each with half the threads (the split a
  standalone agent gives two tenants under the default multi-stream schedule). pair[A][B] =
  A's mean batch time beside B / A's alone, at half the threads (the median of three rounds over
  all pairs, each pair's alone runs just before its co-located one); share[A] = A's mean alone at half
  the threads / at all of them (what hosting a second tenant costs even when it idles).

Usage: python3 policy/data/measure_cpu.py --agent target/release/cotenant-agent
           [--models squeezenet,mobilenet_v2,resnet18] [--threads 2]
           [--interference-only | --profile-only]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def bench(agent, model, batch, instances, threads, seconds, warmup=2):
    return subprocess.Popen(
        [agent, "bench", "--model", model, "--batch", str(batch), "--instances", str(instances),
         "--threads", str(threads), "--duration", f"{seconds}s", "--warmup", str(warmup), "--json"],
        stdout=subprocess.PIPE, text=True)


def result(proc):
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"bench failed ({proc.returncode})")
    return json.loads(out)


def run(agent, model, batch, instances, threads, seconds):
    return result(bench(agent, model, batch, instances, threads, seconds))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agent", required=True)
    ap.add_argument("--models", default="squeezenet,mobilenet_v2,resnet18")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--interference-only", action="store_true",
                    help="measure the co-located runs only (the batch-1 baseline from cpu-service-times.json)")
    ap.add_argument("--profile-only", action="store_true", help="measure cpu-profile.json only")
    args = ap.parse_args()
    names = args.models.split(",")
    work = tempfile.mkdtemp(prefix="cotenant-measure-")
    paths = {}
    for n in names:
        paths[n] = os.path.join(work, f"{n}.onnx")
        subprocess.run([args.agent, "zoo", n, "--out", paths[n], "--seed", "1"], check=True, capture_output=True)
    cmd = "python3 policy/data/measure_cpu.py --agent target/release/cotenant-agent " \
          f"--models {args.models} --threads {args.threads}"
    device = f"CPU, {os.cpu_count()} cores, {args.threads} threads, shared with other builds while measuring (noisy)"

    if args.profile_only:
        return write_profile(args, names, paths, cmd, device)
    if args.interference_only:
        with open(os.path.join(HERE, "cpu-service-times.json")) as f:
            service = json.load(f)["models"]
        return interference(args, names, paths, service, cmd, device)
    # The grid three times over, interleaved, keeping per point the pass with the median mean:
    # one disturbed pass (other builds share these cores) does not make a point.
    grid = [(b, m) for b in (1, 2, 4, 8) for m in (1, 2, 4)]
    passes = {(n, b, m): [] for n in names for b, m in grid}
    for _ in range(3):
        for n in names:
            for b, m in grid:
                r = run(args.agent, paths[n], b, m, args.threads, 2)
                passes[(n, b, m)].append(r)
                print(f"{n} b={b} m={m}: mean {r['mean_ms']:.1f} ms p99 {r['p99_ms']:.1f} ms", file=sys.stderr)
    service = []
    for n in names:
        points = []
        for b, m in grid:
            rs = sorted(passes[(n, b, m)], key=lambda r: r["mean_ms"])
            r = rs[len(rs) // 2]
            points.append({"batch": b, "instances": m, "mean_ms": r["mean_ms"], "p50_ms": r["p50_ms"],
                           "p95_ms": r["p95_ms"], "p99_ms": r["p99_ms"], "runs": r["runs"],
                           "pass_means_ms": [x["mean_ms"] for x in passes[(n, b, m)]]})
        service.append({"model": n, "points": points})
    with open(os.path.join(HERE, "cpu-service-times.json"), "w") as f:
        json.dump({"source": f"measured: cotenant-agent bench --json, 2 s per point, the median of 3 interleaved passes ({cmd})", "device": device,
                   "models": service}, f, indent=1)
    write_profile(args, names, paths, cmd, device)
    interference(args, names, paths, service, cmd, device)


def write_profile(args, names, paths, cmd, device):
    """The agent profiler's points, 1 s each, as cpu-profile.json."""
    profile = []
    for n in names:
        ppoints, weight = [], 0
        for b, m in ((1, 1), (4, 1), (1, 4), (4, 2)):
            r = run(args.agent, paths[n], b, m, args.threads, 1)
            weight = r["weight_bytes"]
            ppoints.append({"batch": b, "instances": m, "throughput": r["throughput_per_s"], "p99_ms": r["p99_ms"],
                            "peak_activation_bytes": r["peak_activation_bytes"]})
        profile.append({"model": n, "weight_bytes": weight, "points": ppoints})
    with open(os.path.join(HERE, "cpu-profile.json"), "w") as f:
        json.dump({"source": f"measured: cotenant-agent bench --json, 1 s per point, the agent profiler's points ({cmd})",
                   "device": device, "models": profile}, f, indent=1)


def interference(args, names, paths, service, cmd, device):
    """Pairs of models at half the threads each, alone then together, three rounds over all the
    pairs; per pair the median ratio."""
    half = max(1, args.threads // 2)
    runs, pairs = [], []
    full = {s["model"]: next(p for p in s["points"] if p["batch"] == 1 and p["instances"] == 1)["mean_ms"]
            for s in service}
    alone_all = {n: [] for n in names}
    ratios = {}
    for _ in range(3):
        for i, a in enumerate(names):
            for b in names[i:]:
                alone_a = run(args.agent, paths[a], 1, 1, half, 3)["mean_ms"]
                alone_b = run(args.agent, paths[b], 1, 1, half, 3)["mean_ms"]
                pa = bench(args.agent, paths[a], 1, 1, half, 4)
                pb = bench(args.agent, paths[b], 1, 1, half, 4)
                ta, tb = result(pa)["mean_ms"], result(pb)["mean_ms"]
                alone_all[a].append(alone_a)
                alone_all[b].append(alone_b)
                runs.append({"a": a, "b": b, "a_alone_ms": alone_a, "b_alone_ms": alone_b,
                             "a_together_ms": ta, "b_together_ms": tb})
                ratios.setdefault((a, b), []).append(ta / alone_a)
                if b != a:
                    ratios.setdefault((b, a), []).append(tb / alone_b)
                print(f"{a} beside {b}: {ta / alone_a:.2f}x, {b} beside {a}: {tb / alone_b:.2f}x", file=sys.stderr)
    for (a, b), rs in ratios.items():
        pairs.append({"victim": a, "other": b, "factor": round(sorted(rs)[len(rs) // 2], 3),
                      "rounds": [round(r, 3) for r in rs]})
    share = [{"model": n, "factor": round(sorted(alone_all[n])[len(alone_all[n]) // 2] / full[n], 3)} for n in names]
    mean_pair = sum(p["factor"] for p in pairs) / len(pairs)
    mean_share = sum(s["factor"] for s in share) / len(share)
    with open(os.path.join(HERE, "cpu-interference.json"), "w") as f:
        json.dump({
            "source": f"measured: co-located cotenant-agent bench runs at batch 1, {half} of {args.threads} threads each, "
                      f"median of 3 rounds "
                      f"({cmd}{' --interference-only' if args.interference_only else ''})",
            "device": device, "synthetic": False,
            "default_share": round(mean_share, 3), "default_pair": round(mean_pair, 3),
            "share": share, "pairs": pairs,
            "batch1_all_threads_mean_ms": full, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
