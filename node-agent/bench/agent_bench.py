"""`cargo xtask bench agent`: throughput within the SLO of one tenant on a standalone agent under
three knob policies, measured in the same run on the same machine, plus the HTTP overhead.

For each zoo model: the SLO is fixed at --slo-factor x the executor's own batch-1 p50 (measured
first with `cotenant-agent bench`). Each policy (static b=1 m=1, DNNScaler, Clipper-style AIMD)
then gets a fresh agent (`standalone --knob-policy ...`) and the same open-loop Poisson overload
(--load-factors x the batch-1 capacity): --warmup seconds to settle, then the agent's 30 s report
window is read. Goodput = completions per second within the SLO (throughput x SLO attainment, as
the agent measures them, queueing included). Overload is shed with 429, so goodput is what a
policy gets out of the hardware at that SLO. Ratios are against static b=1 m=1.

HTTP overhead: one request at a time to a static b=1 m=1 agent before its overload (client p50, and
the agent's own end-to-end vs compute p50), against the executor alone at batch 1.

With --load-factors A,B,... every policy runs at each offered load, and --plot FILE draws SLO
attainment and goodput against the offered load, one panel per model (matplotlib).

With --max-load: the closed-loop "maximum throughput at the SLO" comparison instead. For each model
and policy, a bisection over the offered Poisson rate (--steps trials, between 0 and --max-factor
x the batch-1 capacity) finds the highest rate at which at least 99% of the requests offered after
the warm-up came back 200 within the SLO, as the client measures them (refused requests are
misses). Every trial gets a fresh agent (profiled again) and --warmup + --measure seconds of load.
--json FILE writes the results for policy/examples/plot_max_load.py.

Usage: agent_bench.py --agent BIN [--models squeezenet,mobilenet_v2,resnet18] [--threads 2]
                      [--load-factors 3] [--plot attainment.svg]
       agent_bench.py --agent BIN --max-load [--steps 4] [--max-factor 1] [--warmup 10]
                      [--measure 20] [--json max-load.json]
"""

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "python"))
from load import body_for, drive_poisson, report  # noqa: E402

POLICIES = [("static b=1 m=1", "static:1x1"), ("DNNScaler", "dnnscaler"), ("Clipper AIMD", "aimd")]
TOKEN = "bench"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def executor_p50(agent, model, threads, seconds):
    out = subprocess.run(
        [agent, "bench", "--model", model, "--batch", "1", "--instances", "1",
         "--duration", f"{seconds}s", "--threads", str(threads), "--json"],
        check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["p50_ms"]


class Agent:
    def __init__(self, agent, workdir, name, model, slo_ms, threads, policy):
        tenants = os.path.join(workdir, f"tenants-{policy.replace(':', '-')}")
        os.makedirs(tenants, exist_ok=True)
        with open(os.path.join(tenants, f"{name}.yaml"), "w") as f:
            f.write(
                "apiVersion: cotenant.dev/v1alpha1\nkind: ModelTenant\n"
                f"metadata:\n  name: {name}\nspec:\n  model:\n    uri: file://{os.path.abspath(model)}\n"
                f"  slo:\n    latencyMillis: {slo_ms:.1f}\n  scaling:\n    maxBatchSize: 32\n    maxInstances: 8\n")
        token = os.path.join(workdir, "token")
        with open(token, "w") as f:
            f.write(TOKEN)
        self.url = f"127.0.0.1:{free_port()}"
        self.log = open(os.path.join(workdir, f"agent-{name}-{policy.replace(':', '-')}.log"), "w")
        self.proc = subprocess.Popen(
            [agent, "standalone", "--tenants", tenants, "--listen", self.url, "--grpc-listen", "127.0.0.1:0", "--threads", str(threads),
             "--report-token-file", token, "--knob-policy", policy],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.name = name

    def wait_controlled(self, timeout=300):
        """Until the tenant is profiled and its knob controller runs."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the agent exited; see {self.log.name}")
            try:
                t = next(t for t in report(self.url, TOKEN)["tenants"] if t["name"] == self.name)
                if t.get("approach"):
                    return
            except (urllib.error.URLError, ConnectionError, StopIteration, OSError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} was not profiled in {timeout} s; see {self.log.name}")

    def tenant(self):
        return next(t for t in report(self.url, TOKEN)["tenants"] if t["name"] == self.name)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def sequential_p50(url, name, body, headers, seconds):
    latencies = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        req = urllib.request.Request(f"http://{url}/v2/models/{name}/infer", data=body, headers=headers)
        t0 = time.monotonic()
        with urllib.request.urlopen(req, timeout=60) as r:
            r.read()
        latencies.append((time.monotonic() - t0) * 1e3)
    latencies.sort()
    return latencies[len(latencies) // 2], len(latencies)


async def drive_recorded(url, model, rate, duration, body, headers, seed=11):
    """Open-loop Poisson arrivals at `rate` for `duration` s; returns (sent offset s, status,
    latency ms) per request."""
    import aiohttp

    records = []
    rng = random.Random(seed)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.monotonic()

        async def one():
            t0 = time.monotonic()
            try:
                async with session.post(f"http://{url}/v2/models/{model}/infer", data=body, headers=headers) as r:
                    await r.read()
                    status = r.status
            except Exception as e:  # noqa: BLE001 - any transport failure is a miss
                status = type(e).__name__
            records.append((t0 - start, status, (time.monotonic() - t0) * 1e3))

        tasks = []
        next_at = start
        while next_at - start < duration:
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one()))
            next_at += rng.expovariate(rate)
        await asyncio.gather(*tasks)
    return records


def max_load_main(args):
    """The --max-load mode: per model and policy, the highest offered rate held at >= 99%."""
    target = 0.99
    workdir = tempfile.mkdtemp(prefix="cotenant-agent-maxload-")
    results, trials = [], []
    for name in args.models.split(","):
        model = os.path.join(workdir, f"{name}.onnx")
        subprocess.run([args.agent, "zoo", name, "--out", model, "--seed", "1"], check=True, capture_output=True)
        p50 = executor_p50(args.agent, model, args.threads, 5)
        slo = args.slo_factor * p50
        capacity = 1000.0 / p50
        for label, policy in POLICIES:
            lo, hi = 0.0, args.max_factor * capacity
            for _ in range(args.steps):
                rate = (lo + hi) / 2
                agent = Agent(args.agent, workdir, name.replace("_", "-"), model, slo, args.threads, policy)
                try:
                    agent.wait_controlled()
                    body, headers = body_for(agent.url, agent.name)
                    recs = asyncio.run(drive_recorded(agent.url, agent.name, rate, args.warmup + args.measure,
                                                      body, headers))
                    knobs = agent.tenant().get("knobs", {})
                finally:
                    agent.stop()
                after = [r for r in recs if r[0] >= args.warmup]
                met = sum(1 for _, st, lat in after if st == 200 and lat <= slo)
                shed = sum(1 for _, st, _ in after if st != 200)
                att = met / len(after) if after else 1.0
                held = att >= target
                trials.append((name, label, f"{rate:.1f}", f"{att:.3f}", f"{shed}/{len(after)}", "yes" if held else "no",
                               f"{knobs.get('batchSize')}x{knobs.get('instances')}"))
                print(f"{name} {label} rate {rate:.1f}/s: attainment {att:.3f} ({len(after)} offered)", file=sys.stderr)
                lo, hi = (rate, hi) if held else (lo, rate)
            results.append({"device": "real agent, CPU", "model": name, "slo_ms": round(slo, 1),
                            "policy": label, "max_load": round(lo, 2)})
    print(f"\nhighest offered load (requests/s) held at >= {target:.0%} of the offered requests within the SLO "
          f"(threads {args.threads}, SLO = {args.slo_factor} x batch-1 p50, {args.steps} bisection steps over "
          f"(0, {args.max_factor} x batch-1 capacity], {args.warmup:.0f} s warm-up + {args.measure:.0f} s measured per trial)\n")
    print("| model | SLO ms | static b=1 m=1 | DNNScaler | Clipper AIMD | DNNScaler / static | DNNScaler / AIMD |")
    print("|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        mine = {r["policy"]: r for r in results if r["model"] == name}
        loads = [mine[label]["max_load"] for label, _ in POLICIES]

        def ratio(a, b):
            return f"{a / b:.2f}" if b > 0 else "-"
        print(f"| {name} | {mine[POLICIES[0][0]]['slo_ms']:.1f} | {loads[0]:.1f} | {loads[1]:.1f} | {loads[2]:.1f} | "
              f"{ratio(loads[1], loads[0])} | {ratio(loads[1], loads[2])} |")
    print("\ntrials\n")
    print("| model | policy | offered /s | attainment | refused / offered | held | knobs at end (b x m) |")
    print("|---|---|---|---|---|---|---|")
    for t in trials:
        print("| " + " | ".join(t) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
        print(f"\nwrote {args.json}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agent", required=True)
    ap.add_argument("--models", default="squeezenet,mobilenet_v2,resnet18")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slo-factor", type=float, default=5.0)
    ap.add_argument("--load-factors", default="3", help="offered loads, x batch-1 capacity (comma-separated)")
    ap.add_argument("--warmup", type=float, help="seconds of load before measuring (20; 10 with --max-load)")
    ap.add_argument("--plot", help="write attainment and goodput against load to this SVG or PNG")
    ap.add_argument("--max-load", action="store_true", help="bisect the highest load held at >= 99%% instead")
    ap.add_argument("--steps", type=int, default=4, help="--max-load: bisection trials per model and policy")
    ap.add_argument("--max-factor", type=float, default=1.0, help="--max-load: top of the search, x batch-1 capacity")
    ap.add_argument("--measure", type=float, default=20.0, help="--max-load: seconds measured after the warm-up")
    ap.add_argument("--json", help="--max-load: write the results to this file")
    args = ap.parse_args()
    if args.warmup is None:
        args.warmup = 10.0 if args.max_load else 20.0
    if args.max_load:
        return max_load_main(args)
    loads = [float(f) for f in args.load_factors.split(",")]
    workdir = tempfile.mkdtemp(prefix="cotenant-agent-bench-")
    rows, overhead, points = [], [], []
    for name in args.models.split(","):
        model = os.path.join(workdir, f"{name}.onnx")
        subprocess.run([args.agent, "zoo", name, "--out", model, "--seed", "1"], check=True, capture_output=True)
        p50 = executor_p50(args.agent, model, args.threads, 5)
        slo = args.slo_factor * p50
        for load, (label, policy) in [(load, p) for load in loads for p in POLICIES]:
            rate = load * 1000.0 / p50
            if policy == POLICIES[0][1]:
                base = None
            agent = Agent(args.agent, workdir, name.replace("_", "-"), model, slo, args.threads, policy)
            try:
                agent.wait_controlled()
                body, headers = body_for(agent.url, agent.name)
                if policy == "static:1x1" and load == loads[0]:
                    # Before the overload, so that neither the agent's window nor the host's
                    # state still holds it (the window falls out of the report below).
                    client_p50, n = sequential_p50(agent.url, agent.name, body, headers, 10.0)
                    t = agent.tenant()["window"]
                    overhead.append((name, f"{p50:.1f}", f"{client_p50:.1f}", f"{client_p50 / p50:.2f}",
                                     f"{t['latencyP50Millis']:.1f}", f"{t['computeP50Millis']:.1f}", str(n)))
                statuses, _, _ = asyncio.run(
                    drive_poisson(agent.url, agent.name, rate, args.warmup + 30.0, body, headers, agent.proc.pid))
                t = agent.tenant()
                w = t["window"]
                goodput = w["throughputPerSecond"] * w["sloAttainment"]
                base = goodput if base is None else base
                knobs = t.get("knobs", {})
                points.append({"model": name, "policy": label, "load": load,
                               "attainment": w["sloAttainment"], "goodput": goodput})
                rows.append((name, f"{slo:.0f}", f"{load:g}", label, f"{knobs.get('batchSize')}x{knobs.get('instances')}",
                             f"{goodput:.1f}", f"{goodput / base:.2f}" if base else "-",
                             f"{w['latencyP99Millis']:.0f}", f"{w['sloAttainment']:.3f}",
                             f"{statuses.get(429, 0) + statuses.get(503, 0)}/{sum(statuses.values())}"))
            finally:
                agent.stop()
    print(f"\nthroughput within the SLO (threads {args.threads}, SLO = {args.slo_factor} x batch-1 p50, "
          f"offered load in x batch-1 capacity, report window 30 s after {args.warmup:.0f} s warm-up)\n")
    print("| model | SLO ms | load | policy | knobs at end (b x m) | goodput /s | vs b=1 m=1 | p99 ms | attainment | shed / offered |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print("\nHTTP overhead at batch 1 (one request at a time)\n")
    print("| model | executor alone p50 ms | agent via HTTP, client p50 ms | ratio | agent end-to-end p50 ms | agent compute p50 ms | requests |")
    print("|---|---|---|---|---|---|---|")
    for r in overhead:
        print("| " + " | ".join(r) + " |")
    if args.plot:
        plot(args.plot, points)
        print(f"\nplot: {args.plot}")


def plot(path, points):
    """SLO attainment (top) and goodput (bottom) against offered load, one column per model."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(p["model"] for p in points))
    fig, axes = plt.subplots(2, len(models), figsize=(4.5 * len(models), 6.5), squeeze=False, sharex="col")
    for col, model in enumerate(models):
        for label, _ in POLICIES:
            mine = sorted((p["load"], p["attainment"], p["goodput"]) for p in points
                          if p["model"] == model and p["policy"] == label)
            x = [m[0] for m in mine]
            axes[0][col].plot(x, [m[1] for m in mine], marker="o", label=label)
            axes[1][col].plot(x, [m[2] for m in mine], marker="o", label=label)
        axes[0][col].set(title=model, ylabel="SLO attainment", ylim=(0, 1.05))
        axes[1][col].set(xlabel="offered load (x batch-1 capacity)", ylabel="goodput within the SLO (/s)")
        for ax in axes[:, col]:
            ax.grid(alpha=0.3)
    axes[0][0].legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    main()
