"""Overload of one tenant of a running agent with oha: `--factor` times the capacity the agent's
own DNNScaler profile reports, for `--duration` seconds, with a prebuilt binary request (oha's
rate limiter with latency correction, 512 connections, so that the rate and not the connections
bounds what is offered: with 64, a tenant serving 50/s under a 1.5 s SLO holds every request in
flight within the SLO and nothing is ever shed). Checks that every response is 200, 429 or 503
(never an error or a dropped connection), that accepted requests meet the SLO (at least
`--attainment` of them, and the p99 within a tolerance), and that the agent's RSS stays flat.
Prints one table.

Usage: load.py --url HOST:PORT --model NAME --pid PID --report-token TOKEN --oha PATH [--factor 2] [--duration 60]
"""

import argparse
import asyncio
import json
import random
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

import aiohttp


def report(url, token):
    req = urllib.request.Request(f"http://{url}/report", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def body_for(url, model):
    with urllib.request.urlopen(f"http://{url}/v2/models/{model}", timeout=30) as r:
        meta = json.load(r)
    inp = meta["inputs"][0]
    shape = [1 if d == -1 else d for d in inp["shape"]]
    n = 1
    for d in shape:
        n *= d
    blob = struct.pack(f"<{n}f", *[random.random() for _ in range(n)])
    header = json.dumps({
        "inputs": [{"name": inp["name"], "shape": shape, "datatype": "FP32", "parameters": {"binary_data_size": len(blob)}}],
        "outputs": [{"name": meta["outputs"][0]["name"], "parameters": {"binary_data": True}}],
    }).encode()
    return header + blob, {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"}


async def drive_poisson(url, model, rate, duration, body, headers, pid):
    """Open-loop Poisson arrivals at `rate` for `duration` seconds (the agent benchmark's load).
    Returns (responses by status, sorted latencies of the 200s in ms, RSS samples)."""
    statuses, latencies, rss = {}, [], []
    rng = random.Random(11)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        async def one():
            t0 = time.monotonic()
            try:
                async with session.post(f"http://{url}/v2/models/{model}/infer", data=body, headers=headers) as r:
                    await r.read()
                    status = r.status
            except Exception as e:  # noqa: BLE001 - any transport failure is a finding
                status = f"{type(e).__name__}"
            statuses[status] = statuses.get(status, 0) + 1
            if status == 200:
                latencies.append((time.monotonic() - t0) * 1e3)

        async def sample():
            while True:
                rss.append(rss_mib(pid))
                await asyncio.sleep(1)

        sampler = asyncio.create_task(sample())
        tasks = []
        start = time.monotonic()
        next_at = start
        while next_at - start < duration:
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one()))
            next_at += rng.expovariate(rate)
        await asyncio.gather(*tasks)
        sampler.cancel()
    return statuses, sorted(latencies), rss


def drive_oha(oha, url, model, rate, duration, body, headers, pid):
    """Runs oha at `rate` requests per second for `duration` seconds, sampling the agent's RSS
    every second meanwhile. Returns (responses by status or error, client p99 ms, RSS samples)."""
    with tempfile.NamedTemporaryFile(suffix=".bin") as f:
        f.write(body)
        f.flush()
        cmd = [oha, "--no-tui", "--output-format", "json", "-z", f"{duration:.0f}s",
               "-q", f"{rate:.2f}", "-c", "512", "--latency-correction",
               # Requests still running at the deadline finish and count, instead of being
               # reported as aborted.
               "-w", "-m", "POST", "-D", f.name]
        for k, v in headers.items():
            cmd += ["-H", f"{k}: {v}"]
        cmd.append(f"http://{url}/v2/models/{model}/infer")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        rss = []
        while proc.poll() is None:
            rss.append(rss_mib(pid))
            time.sleep(1)
        out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"oha failed ({proc.returncode}): {err}")
    result = json.loads(out)
    statuses = {int(k): v for k, v in result.get("statusCodeDistribution", {}).items()}
    for what, n in result.get("errorDistribution", {}).items():
        statuses[what] = statuses.get(what, 0) + n
    p99 = (result.get("latencyPercentiles", {}).get("p99") or float("nan")) * 1e3
    return statuses, p99, rss


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--report-token", required=True)
    p.add_argument("--oha", required=True, help="the oha binary")
    p.add_argument("--factor", type=float, default=2.0)
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--tolerance", type=float, default=0.5, help="accepted p99 may exceed the SLO by this fraction")
    # Admission plans for the SLO's percentile (99), but a stall of this two-core host (oha runs on
    # it too) delays a queue's worth of admitted requests at once. Without admission, every request
    # accepted at this overload waits behind the whole queue and misses the SLO, so 0.8 tells
    # working admission from broken with room for such stalls; the attainment figure itself is what
    # `cargo xtask bench agent` reports. The agent test measured 1.000 run alone, 0.899-0.938 run
    # with the other agent tests of its binary.
    p.add_argument("--attainment", type=float, default=0.8, help="fraction of accepted requests within the SLO, at least")
    a = p.parse_args()
    tenant = next(t for t in report(a.url, a.report_token)["tenants"] if t["name"] == a.model)
    slo = tenant["sloMillis"]
    capacity = max(pt["throughput"] for pt in tenant["profile"]["points"])
    body, headers = body_for(a.url, a.model)
    rate = a.factor * capacity
    statuses, client_p99, rss = drive_oha(a.oha, a.url, a.model, rate, a.duration, body, headers, a.pid)
    # The SLO is defined at the agent (arrival to response, queueing included); the client's view
    # adds its own scheduling on this shared machine and is printed beside it.
    after = next(t for t in report(a.url, a.report_token)["tenants"] if t["name"] == a.model)
    agent_p99 = after["window"]["latencyP99Millis"]
    # What the scaler uses to tell queueing from a batch that is itself too slow.
    at_slo, compute_at_slo = after["latencyAtPercentileMillis"], after["computeAtPercentileMillis"]
    total = sum(statuses.values())
    half = max(len(rss) // 2, 1)
    first, second = max(rss[:half]), max(rss[half:] or rss)
    rows = [
        ("offered rate (req/s)", f"{rate:.1f} = {a.factor} x profiled capacity {capacity:.1f}"),
        ("requests", str(total)),
        ("responses by status", json.dumps({str(k): v for k, v in sorted(statuses.items(), key=str)})),
        ("accepted p99 at the agent, last 30 s (ms)", f"{agent_p99:.0f} (SLO {slo:.0f}, tolerance {a.tolerance:.0%})"),
        ("p99 at the client, all responses (ms)", f"{client_p99:.0f}"),
        ("agent SLO attainment, last 30 s", f"{after['window']['sloAttainment']:.3f}"),
        ("latency / compute at the SLO percentile (ms)", f"{at_slo:.0f} / {compute_at_slo:.0f}"),
        ("admission's overrun factor", f"{after['admissionOverrun']:.3f}"),
        ("agent RSS MiB, max first half / second half", f"{first:.0f} / {second:.0f}"),
    ]
    for k, v in rows:
        print(f"{k} | {v}")
    bad = {k: v for k, v in statuses.items() if k not in (200, 429, 503)}
    assert not bad, f"responses other than 200/429/503: {bad}"
    assert statuses.get(200, 0) > 0, "nothing was served"
    assert statuses.get(429, 0) + statuses.get(503, 0) > 0, f"{a.factor} x the capacity was never shed"
    assert agent_p99 <= slo * (1 + a.tolerance), f"accepted p99 {agent_p99:.0f} ms exceeds the SLO {slo} ms by more than {a.tolerance:.0%}"
    attainment = after["window"]["sloAttainment"]
    assert attainment >= a.attainment, f"{attainment:.3f} of accepted requests within the SLO, less than {a.attainment}"
    assert 0 < compute_at_slo <= at_slo * 1.01, f"compute {compute_at_slo} ms against latency {at_slo} ms"
    assert 1.0 <= after["admissionOverrun"] <= 8.0, after["admissionOverrun"]
    assert second <= first * 1.25 + 32, f"RSS grew from {first:.0f} to {second:.0f} MiB"
    print("1 passed, 0 failed")


if __name__ == "__main__":
    sys.exit(main())
