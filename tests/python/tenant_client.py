"""Sends inference to a tenant the way a client in the cluster would: tritonclient (the real
Triton/KServe client) against the address its EndpointSlice lists, compared with onnxruntime
on the same model file.

Usage: tenant_client.py --url HOST:PORT [--grpc-url HOST:PORT] --model SERVED_NAME
                        --file MODEL.onnx [--token TOKEN]
(`--grpc-url`: the same inference again with tritonclient.grpc; `--token`: the bearer token a
guarded tenant requires, sent on every call.)
"""

import argparse

import numpy as np
import onnxruntime as ort
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--file", required=True)
    ap.add_argument("--grpc-url")
    ap.add_argument("--token")
    args = ap.parse_args()
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else None
    client = httpclient.InferenceServerClient(url=args.url, network_timeout=120.0)
    assert client.is_model_ready(args.model, headers=headers), f"{args.model} not ready at {args.url}"
    meta = client.get_model_metadata(args.model, headers=headers)
    rng = np.random.default_rng(7)
    feeds, inputs = {}, []
    for i in meta["inputs"]:
        shape = [2 if d == -1 else d for d in i["shape"]]
        feeds[i["name"]] = rng.standard_normal(shape).astype(np.float32)
        t = httpclient.InferInput(i["name"], shape, i["datatype"])
        t.set_data_from_numpy(feeds[i["name"]], binary_data=True)
        inputs.append(t)
    results = [(args.url, client.infer(args.model, inputs, headers=headers))]
    if args.grpc_url:
        grpc = grpcclient.InferenceServerClient(url=args.grpc_url)
        # gRPC metadata keys are lowercase (and the HTTP client has added its own to `headers`).
        grpc_headers = {"authorization": f"Bearer {args.token}"} if args.token else None
        assert grpc.is_model_ready(args.model, headers=grpc_headers), f"{args.model} not ready at {args.grpc_url}"
        grpc_inputs = []
        for i in meta["inputs"]:
            t = grpcclient.InferInput(i["name"], list(feeds[i["name"]].shape), i["datatype"])
            t.set_data_from_numpy(feeds[i["name"]])
            grpc_inputs.append(t)
        results.append((f"grpc {args.grpc_url}", grpc.infer(args.model, grpc_inputs, headers=grpc_headers, client_timeout=120.0)))
    session = ort.InferenceSession(args.file, providers=["CPUExecutionProvider"])
    refs = session.run(None, feeds)
    for via, result in results:
        for o, ref in zip(meta["outputs"], refs):
            ours = result.as_numpy(o["name"])
            assert ours.shape == ref.shape, (o["name"], ours.shape, ref.shape)
            scale = max(float(np.max(np.abs(ref))), 1e-6)
            err = float(np.max(np.abs(ours.astype(np.float64) - ref))) / scale
            assert err <= 1e-4, (o["name"], err)
            print(f"{args.model} via {via}: {o['name']} {list(ours.shape)} max rel err {err:.1e}")


if __name__ == "__main__":
    main()
