"""`cargo xtask bench triton`: Triton's own load generator, perf_analyzer, against a standalone agent
over HTTP and over gRPC, next to the executor alone on the same model in the same run.

For each zoo model: the executor's batch-1 p50 (`cotenant-agent bench`, one instance, no server),
then one agent serving that model alone (knobs held at batch 1, one instance, a generous SLO so
nothing is shed) and perf_analyzer at each concurrency over each protocol. The table gives
throughput, client p50/p99, the server's queue and compute per request from the statistics
extension, and the client p50 over the executor's p50: what the protocol and the server add.

Usage: triton_perf.py --agent BIN --perf-analyzer BIN [--models squeezenet,mobilenet_v2,resnet18]
       [--threads 2] [--concurrency-range 1:4:3] [--window-ms 4000]
"""

import argparse
import csv
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def executor_p50_ms(agent, model, threads):
    out = subprocess.run([agent, "bench", "--model", model, "--batch", "1", "--instances", "1",
                          "--duration", "10s", "--threads", str(threads), "--json"],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["p50_ms"]


def serve(agent, workdir, name, model, threads):
    tenants = os.path.join(workdir, f"tenants-{name}")
    os.makedirs(tenants, exist_ok=True)
    with open(os.path.join(tenants, f"{name}.yaml"), "w") as f:
        f.write("apiVersion: cotenant.dev/v1alpha1\nkind: ModelTenant\n"
                f"metadata:\n  name: {name}\nspec:\n  model:\n    uri: file://{os.path.abspath(model)}\n"
                "  slo:\n    latencyMillis: 10000\n")
    http, grpc = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    log = open(os.path.join(workdir, f"agent-{name}.log"), "w")
    proc = subprocess.Popen([agent, "standalone", "--tenants", tenants, "--listen", http, "--grpc-listen", grpc,
                             "--threads", str(threads), "--knob-policy", "static:1x1"],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://{http}/v2/models/{name}/ready", timeout=5) as r:
                if r.status == 200:
                    return proc, http, grpc
        except OSError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    proc.kill()
    sys.exit(f"the agent for {name} did not become ready; see {log.name}")


def perf(perf_analyzer, name, url, protocol, concurrency, window_ms, workdir):
    out = os.path.join(workdir, f"{name}-{protocol}.csv")
    cmd = [perf_analyzer, "-m", name, "-u", url, "-i", protocol, "--concurrency-range", concurrency,
           "--measurement-interval", str(window_ms), "--max-trials", "6", "-f", out]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if run.returncode != 0:
        sys.exit(f"perf_analyzer failed ({run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-2000:]}")
    with open(out) as f:
        return list(csv.DictReader(f))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--agent", required=True)
    p.add_argument("--perf-analyzer", required=True)
    p.add_argument("--models", default="squeezenet,mobilenet_v2,resnet18")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--concurrency-range", default="1:4:3", help="perf_analyzer's start:end:step")
    p.add_argument("--window-ms", type=int, default=4000)
    a = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for name in a.models.split(","):
            model = os.path.join(workdir, f"{name}.onnx")
            subprocess.run([a.agent, "zoo", name, "--out", model], check=True, capture_output=True)
            base = executor_p50_ms(a.agent, model, a.threads)
            proc, http, grpc = serve(a.agent, workdir, name, model, a.threads)
            try:
                for protocol, url in [("http", http), ("grpc", grpc)]:
                    for r in perf(a.perf_analyzer, name, url, protocol, a.concurrency_range, a.window_ms, workdir):
                        c = int(r["Concurrency"])
                        p50, p99 = int(r["p50 latency"]) / 1e3, int(r["p99 latency"]) / 1e3
                        rows.append((name, protocol, c, float(r["Inferences/Second"]), p50, p99,
                                     int(r["Server Queue"]) / 1e3, int(r["Server Compute Infer"]) / 1e3, base, p50 / base))
            finally:
                proc.terminate()
                proc.wait(timeout=60)
    print("| model | protocol | concurrency | inferences/s | p50 ms | p99 ms | server queue ms | server compute ms "
          "| executor alone p50 ms | p50 / executor p50 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.1f} | {r[4]:.1f} | {r[5]:.1f} | {r[6]:.2f} | {r[7]:.1f} | {r[8]:.1f} | {r[9]:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
