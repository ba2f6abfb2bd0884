"""The agent on a GPU host, as a user runs it: `cotenant-agent standalone --device cuda` with the
example tenants, once per schedule. For each schedule it checks and prints:

- every tenant's answer against onnxruntime on the CPU (same ONNX file, same random request,
  max |agent - ort| / max |ort| <= 1e-3);
- bad requests on the GPU path: a wrong shape and out-of-vocabulary token ids get 400, and the
  tenant answers the next good request;
- closed-loop load (--clients concurrent clients per tenant, each sending its next request when the
  last returns), each tenant alone and then all tenants together: rows/s, p50 and p99 as the
  client sees them, and the status codes;
- the approach and knobs DNNScaler chose from its GPU profile, with the profile points;
- the agent's NVML series (`nv_gpu_*`) from /metrics.

Writes one markdown report (--out) and exits 1 when a check failed, 2 when the agent never served.
Needs numpy, onnxruntime and aiohttp (the GPU host's image has them).

Usage: gpu_agent_check.py --agent BIN --tenants DIR --out report.md
                          [--schedules multi-stream,gacer] [--clients 16] [--secs 10] [--device cpu]
"""

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import aiohttp
import numpy as np

TOKEN = "device-check"
WIRE = {"FP32": np.float32, "INT64": np.int64, "INT32": np.int32, "FP16": np.float16,
        "BOOL": np.bool_, "INT8": np.int8, "UINT8": np.uint8}
TOLERANCE = 1e-3


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url, token=None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:
        return json.load(r)


def request_arrays(meta, rng, seq=16, vocab=1000):
    """Random inputs for one request of batch 1: unknown axes other than the batch become `seq`."""
    arrays = {}
    for inp in meta["inputs"]:
        shape = [1 if i == 0 and d == -1 else (seq if d == -1 else d) for i, d in enumerate(inp["shape"])]
        dtype = WIRE[inp["datatype"]]
        name = inp["name"].lower()
        if dtype == np.float32:
            arrays[inp["name"]] = rng.random(shape, dtype=np.float32)
        elif "mask" in name:
            arrays[inp["name"]] = np.ones(shape, dtype=dtype)
        elif "type" in name:
            arrays[inp["name"]] = np.zeros(shape, dtype=dtype)
        else:
            arrays[inp["name"]] = rng.integers(0, vocab, shape).astype(dtype)
    return arrays


def encode(meta, arrays):
    """A binary-extension request (Triton's `binary_data_size`): JSON header, then raw tensors."""
    blobs, inputs = [], []
    for inp in meta["inputs"]:
        a = np.ascontiguousarray(arrays[inp["name"]])
        blobs.append(a.tobytes())
        inputs.append({"name": inp["name"], "shape": list(a.shape), "datatype": inp["datatype"],
                       "parameters": {"binary_data_size": len(blobs[-1])}})
    outputs = [{"name": o["name"], "parameters": {"binary_data": True}} for o in meta["outputs"]]
    header = json.dumps({"inputs": inputs, "outputs": outputs}).encode()
    return header + b"".join(blobs), {"Inference-Header-Content-Length": str(len(header)),
                                      "Content-Type": "application/octet-stream"}


def decode(body, header_len):
    head = json.loads(body[:header_len])
    out, at = {}, header_len
    for o in head["outputs"]:
        size = o["parameters"]["binary_data_size"]
        out[o["name"]] = np.frombuffer(body[at:at + size], dtype=WIRE[o["datatype"]]).reshape(o["shape"])
        at += size
    return out


def post(url, body, headers):
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read(), r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers


def check_against_ort(base, model, uri_path, rng):
    import onnxruntime as ort
    meta = get_json(f"{base}/v2/models/{model}")
    arrays = request_arrays(meta, rng)
    body, headers = encode(meta, arrays)
    status, answer, rheaders = post(f"{base}/v2/models/{model}/infer", body, headers)
    if status != 200:
        return False, f"status {status}: {answer[:200]!r}"
    ours = decode(answer, int(rheaders["Inference-Header-Content-Length"]))
    session = ort.InferenceSession(uri_path, providers=["CPUExecutionProvider"])
    theirs = session.run(None, arrays)
    worst = 0.0
    for o, t in zip(session.get_outputs(), theirs):
        a = ours[o.name].astype(np.float64)
        scale = max(float(np.abs(t).max()), 1e-30)
        worst = max(worst, float(np.abs(a - t).max()) / scale)
    return worst <= TOLERANCE, f"{worst:.2e}"


def check_bad_requests(base, model, rng):
    """Wrong shapes and out-of-range ids get a 4xx; the tenant then still answers."""
    meta = get_json(f"{base}/v2/models/{model}")
    arrays = request_arrays(meta, rng)
    findings = []
    first = meta["inputs"][0]["name"]
    bad = dict(arrays)
    bad[first] = np.concatenate([arrays[first].ravel(), arrays[first].ravel()[:3]])
    status, _, _ = post(f"{base}/v2/models/{model}/infer", *encode(meta, bad))
    findings.append(("wrong shape", status, 400 <= status < 500))
    ids = [i for i in meta["inputs"] if i["datatype"] == "INT64" and "mask" not in i["name"].lower()
           and "type" not in i["name"].lower()]
    if ids:
        bad = dict(arrays)
        bad[ids[0]["name"]] = np.full(arrays[ids[0]["name"]].shape, 10**9, dtype=np.int64)
        status, _, _ = post(f"{base}/v2/models/{model}/infer", *encode(meta, bad))
        findings.append(("token id 1e9", status, status == 400))
    status, _, _ = post(f"{base}/v2/models/{model}/infer", *encode(meta, arrays))
    findings.append(("good request after them", status, status == 200))
    return findings


async def closed_loop(base, models, clients, secs):
    """`clients` concurrent clients per model for `secs` seconds. Per model: (completions, sorted
    latencies in ms, statuses)."""
    rng = np.random.default_rng(3)
    bodies = {}
    for m in models:
        meta = get_json(f"{base}/v2/models/{m}")
        bodies[m] = encode(meta, request_arrays(meta, rng))
    results = {m: ([], {}) for m in models}
    deadline = time.monotonic() + secs
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as s:
        async def client(m):
            lat, statuses = results[m]
            body, headers = bodies[m]
            while time.monotonic() < deadline:
                t0 = time.monotonic()
                try:
                    async with s.post(f"{base}/v2/models/{m}/infer", data=body, headers=headers) as r:
                        await r.read()
                        status = r.status
                except Exception as e:  # noqa: BLE001 - any transport failure is a finding
                    status = type(e).__name__
                statuses[status] = statuses.get(status, 0) + 1
                if status == 200:
                    lat.append((time.monotonic() - t0) * 1e3)
                else:
                    await asyncio.sleep(0.01)

        await asyncio.gather(*[client(m) for m in models for _ in range(clients)])
    return {m: (sorted(lat), st) for m, (lat, st) in results.items()}


def pct(sorted_ms, p):
    if not sorted_ms:
        return float("nan")
    return sorted_ms[min(len(sorted_ms) - 1, int(len(sorted_ms) * p / 100))]


def run_schedule(args, schedule, lines):
    work = tempfile.mkdtemp(prefix="cotenant-gpu-")
    tenants = args.tenants
    token_file = os.path.join(work, "token")
    with open(token_file, "w") as f:
        f.write(TOKEN)
    port, grpc = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(os.path.join(args.log_dir, f"agent-{schedule}.log"), "w")
    agent = subprocess.Popen(
        [args.agent, "standalone", "--tenants", tenants, "--listen", f"127.0.0.1:{port}",
         "--grpc-listen", f"127.0.0.1:{grpc}", "--device", args.device, "--schedule", schedule,
         "--report-token-file", token_file],
        stdout=log, stderr=subprocess.STDOUT)
    failed = 0
    lines.append(f"\n## Schedule `{schedule}`\n")
    try:
        started = time.monotonic()
        models = []
        while time.monotonic() - started < args.ready_secs:
            if agent.poll() is not None:
                break
            try:
                rep = get_json(f"{base}/report", TOKEN)
                models = [t["name"] for t in rep["tenants"] if t["state"] == "Ready"]
                # Settled: every tenant failed, or serves with the approach its profile chose.
                if rep["tenants"] and all(t["state"] == "Failed" or t.get("approach")
                                          for t in rep["tenants"]):
                    break
            except (urllib.error.URLError, ConnectionError, KeyError):
                pass
            time.sleep(1)
        if not models:
            lines.append(f"the agent served no tenant within {args.ready_secs} s "
                         f"(exit {agent.poll()}); see agent-{schedule}.log\n")
            return 2
        lines.append(f"Tenants serving after {time.monotonic() - started:.0f} s (load, profile): "
                     f"{', '.join(models)}.\n")
        rep = get_json(f"{base}/report", TOKEN)
        lines.append("| tenant | approach | knobs | profile: batch x instances → rows/s (p99 ms) |")
        lines.append("|---|---|---|---|")
        for t in rep["tenants"]:
            prof = (t.get("profile") or {}).get("points", [])
            pts = ", ".join(f"{p['batch']}x{p['instances']} → {p['throughput']:.0f} ({p['p99_ms']:.1f})"
                            for p in prof)
            knobs = t.get("knobs") or {}
            lines.append(f"| {t['name']} | {t.get('approach', '')} | "
                         f"{knobs.get('batchSize', '?')}x{knobs.get('instances', '?')} | {pts} |")
        lines.append("\n| tenant | check | result | ok |\n|---|---|---|---|")
        rng = np.random.default_rng(7)
        for m in models:
            path = find_model_file(tenants, m)
            if path is None:
                lines.append(f"| {m} | vs onnxruntime | no model file found | no |")
                failed += 1
                continue
            ok, what = check_against_ort(base, m, path, rng)
            failed += not ok
            lines.append(f"| {m} | vs onnxruntime (max rel err) | {what} | {'yes' if ok else 'NO'} |")
            for name, status, ok in check_bad_requests(base, m, rng):
                failed += not ok
                lines.append(f"| {m} | {name} | {status} | {'yes' if ok else 'NO'} |")
        lines.append(f"\nClosed loop, {args.clients} clients per tenant, {args.secs} s each; latency "
                     "as the client sees it (HTTP, binary tensors).\n")
        lines.append("| load | tenant | rows/s | p50 ms | p99 ms | statuses |\n|---|---|---|---|---|---|")
        for group in [[m] for m in models] + [models]:
            label = "alone" if len(group) == 1 else "all together"
            res = asyncio.run(closed_loop(base, group, args.clients, args.secs))
            for m, (lat, st) in res.items():
                lines.append(f"| {label} | {m} | {len(lat) / args.secs:.1f} | {pct(lat, 50):.2f} | "
                             f"{pct(lat, 99):.2f} | {json.dumps(st, sort_keys=True)} |")
                failed += any(k not in (200, 429, 503) for k in st)
        rep = get_json(f"{base}/report", TOKEN)
        lines.append("\nKnobs after the load: " + ", ".join(
            f"{t['name']} {(t.get('knobs') or {}).get('batchSize')}x{(t.get('knobs') or {}).get('instances')}"
            for t in rep["tenants"]) + ".\n")
        with urllib.request.urlopen(f"{base}/metrics", timeout=30) as r:
            gpu = [ln for ln in r.read().decode().splitlines() if ln.startswith("nv_gpu_")]
        lines.append("NVML series on /metrics:\n\n```\n" + "\n".join(gpu or ["(none)"]) + "\n```")
        failed += not gpu
        return 1 if failed else 0
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(timeout=20)
        except subprocess.TimeoutExpired:
            agent.kill()
        log.close()
        shutil.rmtree(work, ignore_errors=True)


def find_model_file(tenants, model):
    for name in os.listdir(tenants):
        if not name.endswith(".yaml"):
            continue
        text = open(os.path.join(tenants, name)).read()
        if f"name: {model}\n" in text:
            for line in text.splitlines():
                line = line.strip()
                if line.startswith("uri: file://"):
                    return os.path.join(tenants, line[len("uri: file://"):])
    return None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--agent", required=True)
    p.add_argument("--tenants", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda", help="cpu tries the check on a machine without a GPU")
    p.add_argument("--schedules", default="multi-stream,gacer")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--secs", type=float, default=10)
    p.add_argument("--ready-secs", type=float, default=150)
    args = p.parse_args()
    args.log_dir = os.path.dirname(os.path.abspath(args.out))
    # One copy of the tenants for every schedule: the agent writes the zoo models beside them once.
    copy = tempfile.mkdtemp(prefix="cotenant-tenants-")
    shutil.copytree(args.tenants, copy, dirs_exist_ok=True)
    args.tenants = copy
    lines = ["# The agent on the GPU (`standalone --device cuda`, the example tenants)"]
    worst = 0
    for schedule in args.schedules.split(","):
        worst = max(worst, run_schedule(args, schedule, lines))
    lines.append(f"\ngpu_agent_check exit status: {worst} (0 all passed, 1 a check failed, "
                 "2 the agent served nothing)")
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    sys.exit(worst)


if __name__ == "__main__":
    main()
