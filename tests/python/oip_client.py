"""Drives a running standalone agent with real clients: tritonclient (the Triton/KServe client)
for metadata and inference on every tenant, compared with onnxruntime on the same model files;
raw HTTP for a table of bad requests, readiness of failed tenants, metrics and the report.

Usage: oip_client.py --url HOST:PORT --models DIR --good a,b,c --failed x,y --report-token TOKEN
Exits non-zero on the first failed check; prints a table of what it checked.
"""

import argparse
import http.client
import json
import re
import select
import struct
import sys
import urllib.error
import urllib.request

import numpy as np
import onnxruntime as ort
import tritonclient.http as httpclient

TO_NP = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32, "UINT8": np.uint8, "BOOL": np.bool_}


def request(url, path, body=None, headers=None, method=None):
    req = urllib.request.Request(f"http://{url}{path}", data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def oversized(url, path, size):
    """Sends only the headers of a POST declaring a body of `size` bytes and waits: the agent must
    refuse a declared oversize before reading any of it (a server that reads first would leave
    this client waiting, and one that answers mid-upload races the client with a reset)."""
    host, port = url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    conn.putrequest("POST", path)
    conn.putheader("Content-Length", str(size))
    conn.endheaders()
    answered, _, _ = select.select([conn.sock], [], [], 10)
    if not answered:
        conn.close()
        return None, json.dumps({"error": "no answer to the headers within 10 s"}).encode()
    r = conn.getresponse()
    status, body = r.status, r.read()
    conn.close()
    return status, body


def random_inputs(meta, batch, rng):
    feeds = {}
    for i in meta["inputs"]:
        shape = [batch if d == -1 else d for d in i["shape"]]
        if i["datatype"] == "FP32":
            feeds[i["name"]] = rng.standard_normal(shape).astype(np.float32)
        else:
            feeds[i["name"]] = rng.integers(0, 100, size=shape).astype(TO_NP[i["datatype"]])
    return feeds


def max_rel_err(ours, ref):
    scale = max(float(np.max(np.abs(ref))), 1e-6)
    return float(np.max(np.abs(ours.astype(np.float64) - ref.astype(np.float64)))) / scale


def check_tenant(client, name, models, rng, rows):
    meta = client.get_model_metadata(name)
    assert meta["name"] == name, meta
    session = ort.InferenceSession(f"{models}/{name}.onnx", providers=["CPUExecutionProvider"])
    for batch, binary in [(1, True), (3, False)]:
        feeds = random_inputs(meta, batch, rng)
        inputs = []
        for i in meta["inputs"]:
            t = httpclient.InferInput(i["name"], list(feeds[i["name"]].shape), i["datatype"])
            t.set_data_from_numpy(feeds[i["name"]], binary_data=binary)
            inputs.append(t)
        outputs = [httpclient.InferRequestedOutput(o["name"], binary_data=binary) for o in meta["outputs"]]
        result = client.infer(name, inputs, outputs=outputs)
        reference = session.run(None, feeds)
        for o, ref in zip(meta["outputs"], reference):
            ours = result.as_numpy(o["name"])
            assert ours.shape == ref.shape, (name, o["name"], ours.shape, ref.shape)
            err = max_rel_err(ours, ref)
            rows.append((name, f"batch {batch}, {'binary' if binary else 'JSON'}", f"max rel err {err:.2e}"))
            assert err <= 1e-4, (name, o["name"], err)


def bad_requests(url, name, meta, rows):
    inp = meta["inputs"][0]
    shape = [1 if d == -1 else d for d in inp["shape"]]
    n = int(np.prod(shape))
    good = {"name": inp["name"], "shape": shape, "datatype": inp["datatype"], "data": [0] * n}
    blob = b"\0" * (n * 4)
    cases = [
        ("wrong shape", {"inputs": [dict(good, shape=[1, 7], data=[0] * 7)]}, 400),
        ("wrong dtype", {"inputs": [dict(good, datatype="INT64")]}, 400),
        ("missing input", {"inputs": []}, 400),
        ("unknown input", {"inputs": [good, dict(good, name="nope")]}, 400),
        ("negative dimension", {"inputs": [dict(good, shape=[-1] + shape[1:])]}, 400),
        ("huge dimensions", {"inputs": [dict(good, shape=[1 << 20, 1 << 20, 1 << 20], data=[])]}, 413),
        ("data shorter than shape", {"inputs": [dict(good, data=[0] * (n - 1))]}, 400),
        ("non-numeric data", {"inputs": [dict(good, data=["x"] * n)]}, 400),
        ("unsupported datatype", {"inputs": [dict(good, datatype="BYTES")]}, 400),
        ("unknown output", {"inputs": [good], "outputs": [{"name": "nope"}]}, 400),
        ("zero batch", {"inputs": [dict(good, shape=[0] + shape[1:], data=[])]}, 400),
    ]
    for label, body, want in cases:
        status, text = request(url, f"/v2/models/{name}/infer", json.dumps(body).encode(), method="POST")
        error = json.loads(text).get("error", "")
        rows.append((name, label, f"{status} {error[:90]}"))
        assert status == want and error, (label, status, text[:300])
    raw = [
        ("malformed JSON", b'{"inputs": [', {}, 400),
        ("truncated binary payload",
         json.dumps({"inputs": [dict(good, data=None, parameters={"binary_data_size": len(blob)})]}).encode() + blob[:-4],
         "json-len", 400),
        ("header length past the body", b"{}", {"Inference-Header-Content-Length": "999"}, 400),
        ("oversized body", 65 << 20, "oversized", 413),
    ]
    for label, body, headers, want in raw:
        if headers == "json-len":
            header_len = body.index(b"}]}") + 3
            headers = {"Inference-Header-Content-Length": str(header_len)}
        if headers == "oversized":
            status, text = oversized(url, f"/v2/models/{name}/infer", body)
        else:
            status, text = request(url, f"/v2/models/{name}/infer", body, headers, method="POST")
        error = json.loads(text).get("error", "")
        rows.append((name, label, f"{status} {error[:90]}"))
        assert status == want and error, (label, status, text[:300])
    status, text = request(url, "/v2/models/no-such-model/infer", b"{}", method="POST")
    rows.append(("-", "unknown model", f"{status} {json.loads(text)['error']}"))
    assert status == 404
    status, text = request(url, f"/v2/models/{name}/versions/7/infer", b"{}", method="POST")
    assert status == 404, status
    # Still serving after all of that.
    status, _ = request(url, f"/v2/models/{name}/infer", json.dumps({"inputs": [good]}).encode(), method="POST")
    assert status == 200, status
    rows.append((name, "good request after the bad ones", str(status)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--models", required=True)
    p.add_argument("--good", required=True)
    p.add_argument("--failed", default="")
    p.add_argument("--report-token", required=True)
    a = p.parse_args()
    rows = []
    rng = np.random.default_rng(7)
    client = httpclient.InferenceServerClient(url=a.url, network_timeout=300.0, connection_timeout=60.0)
    assert client.is_server_live() and client.is_server_ready()
    good = [g for g in a.good.split(",") if g]
    for name in good:
        assert client.is_model_ready(name), name
        check_tenant(client, name, a.models, rng, rows)
    for name in [f for f in a.failed.split(",") if f]:
        assert not client.is_model_ready(name), name
        status, text = request(a.url, f"/v2/models/{name}/infer", b"{}", method="POST")
        rows.append((name, "infer on a failed tenant", f"{status} {json.loads(text)['error'][:90]}"))
        assert status == 503, (name, status)
    bad_requests(a.url, good[0], client.get_model_metadata(good[0]), rows)

    status, text = request(a.url, "/metrics")
    metrics = text.decode()
    assert status == 200 and metrics.rstrip().endswith("# EOF"), metrics[-200:]
    labels = f'model="{good[0]}",namespace=""'
    assert f"cotenant_agent_completions_total{{{labels}}}" in metrics, metrics[:500]
    assert f'cotenant_agent_request_duration_seconds_bucket{{le="+Inf",{labels},stage="end_to_end"}}' in metrics
    # Triton's names, so queries written for Triton work unchanged.
    served = re.search(rf'^nv_inference_request_success{{{labels},version="1"}} (\d+)$', metrics, re.M)
    assert served and int(served.group(1)) > 0, metrics[:800]
    for series in [f'nv_inference_request_failure{{{labels},version="1",reason="REJECTED"}}',
                   f'nv_inference_exec_count{{{labels},version="1"}}', f'nv_inference_queue_duration_us{{{labels},version="1"}}']:
        assert series in metrics, series
    # The GPU families are described on every agent; without a GPU they have no samples.
    assert "# TYPE nv_gpu_utilization gauge" in metrics and "nv_gpu_utilization{" not in metrics
    rows.append(("-", "metrics", f"{served.group(0)}"))
    for label, headers, want in [("report without a token", {}, 401), ("report with a wrong token", {"Authorization": "Bearer wrong"}, 401),
                                 ("report with the token", {"Authorization": f"Bearer {a.report_token}"}, 200)]:
        status, text = request(a.url, "/report", headers=headers)
        rows.append(("-", label, str(status)))
        assert status == want, (label, status)
    report = json.loads(text)
    states = {t["name"]: t["state"] for t in report["tenants"]}
    assert all(states[g] == "Ready" for g in good), states
    for row in rows:
        print(" | ".join(row))
    print(f"{len(rows)} passed, 0 failed")


if __name__ == "__main__":
    sys.exit(main())
