"""Drives a running standalone agent over the Open Inference Protocol's gRPC service with real
clients: tritonclient.grpc for health, metadata, model configuration, statistics and inference
(raw tensors) on every tenant, compared with onnxruntime on the same model files; the generated
stub for typed `contents`, malformed messages and calls the agent does not serve; and the REST
configuration, which must say what gRPC says.

Usage: grpc_client.py --url HOST:PORT --rest HOST:PORT --models DIR --good a,b --failed x,y
Exits non-zero on the first failed check; prints a table of what it checked.
"""

import argparse
import json
import sys
import urllib.request

import grpc
import numpy as np
import onnxruntime as ort
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from oip_client import max_rel_err, random_inputs

MAX_MESSAGE = 80 << 20


def check_tenant(client, stub, name, models, rng, rows):
    meta = client.get_model_metadata(name, as_json=True)
    assert meta["name"] == name and meta["platform"], meta
    for t in meta["inputs"] + meta["outputs"]:
        t["shape"] = [int(d) for d in t["shape"]]
    config = client.get_model_config(name, as_json=True)["config"]
    batching = int(config.get("max_batch_size", 0)) > 0
    for declared, tensor in zip(config["input"], meta["inputs"]):
        dims = [int(d) for d in declared["dims"]]
        assert declared["data_type"] == "TYPE_" + tensor["datatype"], (declared, tensor)
        assert dims == (tensor["shape"][1:] if batching else tensor["shape"]), (declared, tensor)
    rows.append((name, "model config", f"max_batch_size {config.get('max_batch_size', 0)}, "
                 f"{len(config['input'])} inputs, instances {config['instance_group'][0]['count']}"))

    session = ort.InferenceSession(f"{models}/{name}.onnx", providers=["CPUExecutionProvider"])
    for batch in [1, 3]:
        feeds = random_inputs(meta, batch, rng)
        inputs = []
        for i in meta["inputs"]:
            t = grpcclient.InferInput(i["name"], list(feeds[i["name"]].shape), i["datatype"])
            t.set_data_from_numpy(feeds[i["name"]])
            inputs.append(t)
        outputs = [grpcclient.InferRequestedOutput(o["name"]) for o in meta["outputs"]]
        result = client.infer(name, inputs, outputs=outputs, request_id=f"req-{batch}")
        assert result.get_response().id == f"req-{batch}", result.get_response().id
        reference = session.run(None, feeds)
        for o, ref in zip(meta["outputs"], reference):
            ours = result.as_numpy(o["name"])
            assert ours.shape == ref.shape, (name, o["name"], ours.shape, ref.shape)
            err = max_rel_err(ours, ref)
            rows.append((name, f"batch {batch}, raw tensors", f"max rel err {err:.2e}"))
            assert err <= 1e-4, (name, o["name"], err)

    # The same request with typed contents instead of raw bytes, through the generated stub.
    feeds = random_inputs(meta, 1, rng)
    request = service_pb2.ModelInferRequest(model_name=name)
    for i in meta["inputs"]:
        tensor = request.inputs.add(name=i["name"], datatype=i["datatype"], shape=list(feeds[i["name"]].shape))
        values = feeds[i["name"]].ravel()
        if i["datatype"] == "FP32":
            tensor.contents.fp32_contents.extend(values.tolist())
        elif i["datatype"] == "INT64":
            tensor.contents.int64_contents.extend(values.tolist())
        else:
            tensor.contents.int_contents.extend(values.tolist())
    response = stub.ModelInfer(request, timeout=120)
    reference = session.run(None, feeds)
    for k, (o, ref) in enumerate(zip(response.outputs, reference)):
        ours = np.frombuffer(response.raw_output_contents[k], dtype=ref.dtype).reshape(list(o.shape))
        err = max_rel_err(ours, ref)
        rows.append((name, "batch 1, typed contents", f"max rel err {err:.2e}"))
        assert err <= 1e-4, (name, o.name, err)

    stats = client.get_inference_statistics(name, as_json=True)["model_stats"][0]
    success = int(stats["inference_stats"]["success"].get("count", 0))
    assert success >= 3 and int(stats.get("inference_count", 0)) >= 5, stats
    assert int(stats.get("last_inference", 0)) > 0, stats
    rows.append((name, "statistics", f"{success} successes, {stats['inference_count']} inferences, "
                 f"{stats.get('execution_count', 0)} executions"))


def essentials(config):
    """What a client acts on in a model configuration, in one spelling: protobuf's JSON writes
    64-bit integers as strings and leaves out default values."""
    tensors = lambda ts: [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in ts]
    return (config["name"], int(config.get("max_batch_size", 0)), tensors(config["input"]), tensors(config["output"]),
            [(g["kind"], int(g["count"])) for g in config["instance_group"]])


def expect(rows, name, label, call, code):
    try:
        call()
    except grpc.RpcError as e:
        rows.append((name, label, f"{e.code().name} {e.details()[:90]}"))
        assert e.code() == code, (label, e.code(), e.details())
        # Every refusal says why; tonic answers a method it does not know without words.
        assert e.details() or code == grpc.StatusCode.UNIMPLEMENTED, label
        return
    raise AssertionError(f"{label}: accepted")


def bad_messages(channel, stub, name, meta, rows):
    inp = meta["inputs"][0]
    shape = [1 if int(d) == -1 else int(d) for d in inp["shape"]]
    n = int(np.prod(shape))
    blob = b"\0" * (n * 4)

    def infer(**fields):
        request = service_pb2.ModelInferRequest(model_name=fields.pop("model", name), model_version=fields.pop("version", ""))
        raw = fields.pop("raw", [blob])
        for i in fields.pop("inputs", [dict(name=inp["name"], datatype=inp["datatype"], shape=shape)]):
            request.inputs.add(**i)
        request.raw_input_contents.extend(raw)
        for o in fields.pop("outputs", []):
            request.outputs.add(name=o)
        return lambda: stub.ModelInfer(request, timeout=60)

    good = dict(name=inp["name"], datatype=inp["datatype"], shape=shape)
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    cases = [
        ("unknown model", infer(model="no-such-model"), grpc.StatusCode.NOT_FOUND),
        ("unknown version", infer(version="7"), grpc.StatusCode.NOT_FOUND),
        ("wrong shape", infer(inputs=[dict(good, shape=[1, 7])], raw=[b"\0" * 28]), invalid),
        ("wrong datatype", infer(inputs=[dict(good, datatype="INT64")], raw=[b"\0" * (n * 8)]), invalid),
        ("unsupported datatype", infer(inputs=[dict(good, datatype="BYTES")]), invalid),
        ("missing input", infer(inputs=[], raw=[]), invalid),
        ("unknown input", infer(inputs=[good, dict(good, name="nope")], raw=[blob, blob]), invalid),
        ("input given twice", infer(inputs=[good, good], raw=[blob, blob]), invalid),
        ("negative dimension", infer(inputs=[dict(good, shape=[-1] + shape[1:])]), invalid),
        ("huge dimensions", infer(inputs=[dict(good, shape=[1 << 20, 1 << 20, 1 << 20])]), grpc.StatusCode.RESOURCE_EXHAUSTED),
        ("raw tensor too short", infer(raw=[blob[:-4]]), invalid),
        ("raw tensor too long", infer(raw=[blob + b"\0\0\0\0"]), invalid),
        ("more raw tensors than inputs", infer(raw=[blob, blob]), invalid),
        ("neither contents nor raw", infer(raw=[]), invalid),
        ("unknown output", infer(outputs=["nope"]), invalid),
        ("zero batch", infer(inputs=[dict(good, shape=[0] + shape[1:])], raw=[b""]), invalid),
    ]
    for label, call, code in cases:
        expect(rows, name, label, call, code)

    garbage = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                  request_serializer=lambda b: b, response_deserializer=lambda b: b)
    try:
        garbage(b"\xff\xff\xff\xff not a protobuf message", timeout=60)
        raise AssertionError("a garbage message was accepted")
    except grpc.RpcError as e:
        rows.append((name, "garbage bytes as the message", f"{e.code().name} {e.details()[:90]}"))
        assert e.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT), e.code()
    expect(rows, name, "message over 64 MiB", infer(raw=[b"\0" * (65 << 20)]), grpc.StatusCode.RESOURCE_EXHAUSTED)
    stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer",
                                   request_serializer=lambda b: b, response_deserializer=lambda b: b)
    expect(rows, "-", "a call this agent does not serve", lambda: list(stream(iter([b""]), timeout=60)),
           grpc.StatusCode.UNIMPLEMENTED)
    other = channel.unary_unary("/some.Other/Call", request_serializer=lambda b: b, response_deserializer=lambda b: b)
    expect(rows, "-", "an unknown service", lambda: other(b"", timeout=60), grpc.StatusCode.UNIMPLEMENTED)

    # Still serving after all of that.
    infer()()
    rows.append((name, "good request after the bad ones", "OK"))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True, help="the agent's gRPC address")
    p.add_argument("--rest", required=True, help="the agent's REST address")
    p.add_argument("--models", required=True)
    p.add_argument("--good", required=True)
    p.add_argument("--failed", default="")
    a = p.parse_args()
    rows = []
    rng = np.random.default_rng(11)
    options = [("grpc.max_send_message_length", MAX_MESSAGE), ("grpc.max_receive_message_length", MAX_MESSAGE)]
    channel = grpc.insecure_channel(a.url, options=options)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    client = grpcclient.InferenceServerClient(url=a.url, channel_args=options)
    assert client.is_server_live() and client.is_server_ready()
    server = client.get_server_metadata(as_json=True)
    assert set(server["extensions"]) == {"binary_tensor_data", "model_configuration", "statistics"}, server
    with urllib.request.urlopen(f"http://{a.rest}/v2", timeout=60) as r:
        assert json.load(r)["extensions"] == server["extensions"]
    rows.append(("-", "server metadata", ", ".join(server["extensions"])))

    good = [g for g in a.good.split(",") if g]
    for name in good:
        assert client.is_model_ready(name), name
        check_tenant(client, stub, name, a.models, rng, rows)
        grpc_config = client.get_model_config(name, as_json=True)["config"]
        with urllib.request.urlopen(f"http://{a.rest}/v2/models/{name}/config", timeout=60) as r:
            rest_config = json.load(r)
        assert essentials(grpc_config) == essentials(rest_config), (grpc_config, rest_config)
        rows.append((name, "REST config equals gRPC config", "yes"))
    for name in [f for f in a.failed.split(",") if f]:
        assert not client.is_model_ready(name), name
        try:
            client.infer(name, [grpcclient.InferInput("x", [1], "FP32").set_data_from_numpy(np.zeros(1, np.float32))])
            raise AssertionError(f"{name}: a failed tenant answered")
        except InferenceServerException as e:
            rows.append((name, "infer on a failed tenant", f"{e.status()} {e.message()[:90]}"))
            assert e.status() == "StatusCode.UNAVAILABLE", e.status()
    bad_messages(channel, stub, good[0], client.get_model_metadata(good[0], as_json=True), rows)
    for row in rows:
        print(" | ".join(row))
    print(f"{len(rows)} passed, 0 failed")


if __name__ == "__main__":
    sys.exit(main())
