"""Writes one-node models of onnxruntime's own operators (com.microsoft, and those it registers in
the default domain), random inputs for each, and onnxruntime's outputs on them.

Usage: ort_contrib_cases.py DIR
For each case NAME: DIR/NAME.onnx, DIR/NAME_in_<input>.npy, DIR/NAME_out_<output>.npy, and a
line `NAME<TAB>inputs,...<TAB>outputs,...<TAB>tolerance` in DIR/cases.tsv (of float outputs,
relative to their largest magnitude).

Besides the one-node cases, a small BERT laid out as PyTorch exports it goes through
onnxruntime's transformer optimizer (EmbedLayerNormalization, Attention or MultiHeadAttention,
SkipLayerNormalization, BiasGelu) and then quantize_dynamic (QEmbedLayerNormalization,
QAttention, MatMulInteger): whole models those tools write; and a small decoder as
onnxruntime-genai's builder writes one, on a prompt and then on one token with its cache.
"""

import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from hf_bert import bert
from onnx import helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic
from onnxruntime.transformers.fusion_options import FusionOptions
from onnxruntime.transformers.optimizer import optimize_model

rng = np.random.default_rng(5)
MS = "com.microsoft"


def normal(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def u8(*shape):
    return rng.integers(0, 256, shape, dtype=np.uint8)


def i8(*shape):
    return rng.integers(-128, 128, shape, dtype=np.int8)


def scalar(v, dtype=np.float32):
    return np.array(v, dtype=dtype)


CASES = []


def case(name, op, feeds, consts, order, outputs, domain=MS, **attrs):
    """`order`: the node's inputs by name ("" for an omitted one); `outputs`: its outputs
    ("" for one it does not name)."""
    CASES.append((name, op, feeds, consts, order, outputs, domain, attrs))


def add_cases():
    x, b8 = normal(2, 3, 8), normal(8)
    case("gelu", "Gelu", {"x": x}, {}, ["x"], ["y"])
    case("fast_gelu", "FastGelu", {"x": x}, {}, ["x"], ["y"])
    case("fast_gelu_bias", "FastGelu", {"x": x}, {"b": b8}, ["x", "b"], ["y"])
    case("bias_gelu", "BiasGelu", {"x": x}, {"b": b8}, ["x", "b"], ["y"])
    case("quick_gelu", "QuickGelu", {"x": x}, {}, ["x"], ["y"])
    case("quick_gelu_alpha_1", "QuickGelu", {"x": x}, {}, ["x"], ["y"], alpha=1.0)

    a, bt = normal(2, 4, 5), normal(2, 6, 5)
    case("fused_matmul_trans_b", "FusedMatMul", {"a": a, "b": bt}, {}, ["a", "b"], ["y"],
         transB=1, alpha=0.5)
    case("fused_matmul_trans_a_const", "FusedMatMul", {"a": normal(2, 5, 4)}, {"b": normal(5, 3)},
         ["a", "b"], ["y"], transA=1)
    # The rows on the first axis ([M, batch..., K]), as onnxruntime's transpose fusion writes.
    case("fused_matmul_trans_batch_a", "FusedMatMul", {"a": normal(4, 2, 5), "b": normal(2, 5, 3)},
         {}, ["a", "b"], ["y"], transBatchA=1)
    case("fused_matmul_trans_batch_both_rank4", "FusedMatMul",
         {"a": normal(5, 2, 2, 3), "b": normal(4, 2, 2, 5)}, {}, ["a", "b"], ["y"],
         transBatchA=1, transA=1, transBatchB=1, transB=1, alpha=2.0)
    case("transpose_matmul", "TransposeMatMul", {"a": a}, {"b": normal(6, 5)}, ["a", "b"], ["y"],
         transB=1)

    img, w, bias = normal(1, 3, 8, 8), normal(4, 3, 3, 3, scale=0.5), normal(4)
    conv = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    case("fused_conv_relu", "FusedConv", {"x": img}, {"w": w, "b": bias}, ["x", "w", "b"], ["y"],
         activation="Relu", **conv)
    case("fused_conv_sum_clip", "FusedConv", {"x": img, "z": normal(1, 4, 8, 8)},
         {"w": w, "b": bias}, ["x", "w", "b", "z"], ["y"], activation="Clip",
         activation_params=[0.0, 2.0], **conv)
    case("fused_conv_leaky_strided", "FusedConv", {"x": img}, {"w": w}, ["x", "w"], ["y"],
         activation="LeakyRelu", activation_params=[0.1], strides=[2, 2], **conv)
    case("fused_conv_hard_sigmoid", "FusedConv", {"x": img}, {"w": w, "b": bias},
         ["x", "w", "b"], ["y"], activation="HardSigmoid", activation_params=[0.2, 0.5], **conv)
    case("fused_gemm_leaky", "FusedGemm", {"a": normal(3, 5)}, {"b": normal(4, 5), "c": normal(4)},
         ["a", "b", "c"], ["y"], transB=1, activation="LeakyRelu", activation_alpha=0.1)

    h = normal(2, 3, 8)
    ln = {"gamma": normal(8), "beta": normal(8), "bias": normal(8)}
    case("skip_layer_norm", "SkipLayerNormalization", {"x": h, "skip": normal(2, 3, 8)}, ln,
         ["x", "skip", "gamma", "beta", "bias"], ["y", "", "", "sum"], epsilon=1e-5)
    case("skip_layer_norm_plain", "SkipLayerNormalization", {"x": h, "skip": normal(2, 3, 8)},
         {"gamma": ln["gamma"]}, ["x", "skip", "gamma"], ["y"])
    case("skip_simplified_layer_norm", "SkipSimplifiedLayerNormalization",
         {"x": h, "skip": normal(2, 3, 8)}, {"gamma": ln["gamma"], "bias": ln["bias"]},
         ["x", "skip", "gamma", "bias"], ["y", "", "", "sum"], epsilon=1e-6)
    case("simplified_layer_norm", "SimplifiedLayerNormalization", {"x": h},
         {"scale": ln["gamma"]}, ["x", "scale"], ["y"], domain="", epsilon=1e-6)

    ids = rng.integers(0, 30, (2, 5)).astype(np.int32)
    segments = rng.integers(0, 2, (2, 5)).astype(np.int32)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=np.int32)
    emb = {"word": normal(30, 8), "pos": normal(16, 8), "seg": normal(2, 8),
           "gamma": normal(8), "beta": normal(8)}
    case("embed_layer_norm", "EmbedLayerNormalization",
         {"ids": ids, "segments": segments, "mask": mask}, emb,
         ["ids", "segments", "word", "pos", "seg", "gamma", "beta", "mask"],
         ["y", "mask_index", "sum"])
    case("embed_layer_norm_no_segments", "EmbedLayerNormalization", {"ids": ids},
         {k: v for k, v in emb.items() if k != "seg"},
         ["ids", "", "word", "pos", "", "gamma", "beta"], ["y", "mask_index"])

    seq = normal(2, 5, 8)
    qkv = {"w": normal(8, 24, scale=0.5), "b": normal(24)}
    lengths = np.array([5, 3], dtype=np.int32)
    case("attention_raw_mask", "Attention", {"x": seq, "mask": mask}, qkv,
         ["x", "w", "b", "mask"], ["y"], num_heads=2)
    case("attention_lengths", "Attention", {"x": seq, "mask": lengths}, qkv,
         ["x", "w", "b", "mask"], ["y"], num_heads=4)
    case("attention_ends_starts", "Attention", {"x": seq, "mask": np.array([5, 4, 0, 2], np.int32)},
         qkv, ["x", "w", "b", "mask"], ["y"], num_heads=2)
    case("attention_3d_mask", "Attention",
         {"x": seq, "mask": rng.integers(0, 2, (2, 5, 5)).astype(np.int32)},
         qkv, ["x", "w", "b", "mask"], ["y"], num_heads=2)
    case("attention_bias", "Attention", {"x": seq, "mask": mask, "bias": normal(1, 2, 5, 5)}, qkv,
         ["x", "w", "b", "mask", "", "bias"], ["y"], num_heads=2)
    case("attention_causal", "Attention", {"x": seq}, qkv, ["x", "w", "b"], ["y"], num_heads=2,
         unidirectional=1)
    case("attention_sizes_scale", "Attention", {"x": seq, "mask": mask},
         {"w": normal(8, 20, scale=0.5), "b": normal(20)}, ["x", "w", "b", "mask"], ["y"],
         num_heads=2, qkv_hidden_sizes=[8, 8, 4], scale=0.3)
    case("qattention", "QAttention", {"x": u8(2, 5, 8), "mask": lengths},
         {"w": i8(8, 24), "b": normal(24), "xs": scalar(0.02), "ws": scalar(0.01),
          "xz": scalar(128, np.uint8), "wz": scalar(3, np.int8)},
         ["x", "w", "b", "xs", "ws", "mask", "xz", "wz"], ["y"], num_heads=2)

    qa, qb = u8(2, 3, 4, 4), u8(2, 3, 4, 4)
    s = {"as": scalar(0.05), "az": scalar(120, np.uint8), "bs": scalar(0.03),
         "bz": scalar(130, np.uint8), "cs": scalar(0.07), "cz": scalar(125, np.uint8)}
    binary = ["a", "as", "az", "b", "bs", "bz", "cs", "cz"]
    case("qlinear_add", "QLinearAdd", {"a": qa, "b": qb}, s, binary, ["y"])
    case("qlinear_add_broadcast", "QLinearAdd", {"a": qa}, {**s, "b": u8(4)}, binary, ["y"])
    case("qlinear_mul", "QLinearMul", {"a": qa, "b": qb}, s, binary, ["y"])
    si8 = {"as": scalar(0.05), "az": scalar(-3, np.int8), "bs": scalar(0.03),
           "bz": scalar(5, np.int8), "cs": scalar(0.07), "cz": scalar(1, np.int8)}
    case("qlinear_add_int8", "QLinearAdd", {"a": i8(2, 3, 4), "b": i8(2, 3, 4)}, si8, binary, ["y"])
    unary = ["a", "as", "az", "cs", "cz"]
    case("qlinear_sigmoid", "QLinearSigmoid", {"a": qa}, s, unary, ["y"])
    case("qlinear_leaky_relu", "QLinearLeakyRelu", {"a": qa}, s, unary, ["y"], alpha=0.2)
    case("qlinear_global_average_pool", "QLinearGlobalAveragePool", {"a": u8(1, 4, 5, 5)}, s,
         unary, ["y"])
    case("qlinear_average_pool", "QLinearAveragePool", {"a": u8(1, 4, 7, 7)}, s, unary, ["y"],
         kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    case("qlinear_softmax", "QLinearSoftmax", {"a": u8(2, 3, 10)},
         {"as": scalar(0.1), "az": scalar(128, np.uint8), "cs": scalar(1 / 256),
          "cz": scalar(0, np.uint8)}, unary, ["y"], opset=13, axis=-1)
    case("qlinear_concat", "QLinearConcat", {"a": qa, "b": u8(2, 5, 4, 4)}, s,
         ["cs", "cz", "a", "as", "az", "b", "bs", "bz"], ["y"], axis=1)
    case("qlinear_where", "QLinearWhere", {"c": rng.integers(0, 2, (2, 3, 4, 4)).astype(bool),
                                           "a": qa, "b": qb}, s,
         ["c", "a", "as", "az", "b", "bs", "bz", "cs", "cz"], ["y"])

    per_column = {"as": scalar(0.02), "az": scalar(128, np.uint8), "b": i8(5, 4),
                  "bs": (rng.random(4) * 0.02 + 0.005).astype(np.float32),
                  "bz": np.zeros(4, np.int8), "c": rng.integers(-500, 500, 4).astype(np.int32),
                  "ys": scalar(0.05), "yz": scalar(100, np.uint8)}
    case("qgemm_quantized", "QGemm", {"a": u8(3, 5)}, per_column,
         ["a", "as", "az", "b", "bs", "bz", "c", "ys", "yz"], ["y"])
    case("qgemm_float_trans_b", "QGemm", {"a": u8(3, 5)},
         {**per_column, "b": i8(4, 5)}, ["a", "as", "az", "b", "bs", "bz", "c"], ["y"],
         transB=1, alpha=0.5)
    case("matmul_integer_to_float", "MatMulIntegerToFloat", {"a": u8(2, 3, 5)},
         {"b": i8(5, 4), "as": scalar(0.02), "bs": per_column["bs"], "az": scalar(128, np.uint8),
          "bias": normal(4)}, ["a", "b", "as", "bs", "az", "", "bias"], ["y"])
    case("dynamic_quantize_matmul", "DynamicQuantizeMatMul", {"a": normal(2, 3, 5)},
         {"b": i8(5, 4), "bs": per_column["bs"], "bias": normal(4)},
         ["a", "b", "bs", "", "bias"], ["y"])


def nbits_weights(k, n, block, bits, zero_points):
    """MatMulNBits's B, scales and zero points for random weights, packed as its schema says:
    per column along K, `bits` at a time from the low bits of each byte up."""
    blocks = -(-k // block)
    levels = (1 << bits) - 1
    w = rng.standard_normal((n, blocks * block)).astype(np.float32)
    w = w.reshape(n, blocks, block)
    lo, hi = np.minimum(w.min(-1), 0), np.maximum(w.max(-1), 0)
    scales = ((hi - lo) / levels).astype(np.float32)
    zeros = np.clip(np.round(-lo / scales), 0, levels).astype(np.uint8)
    q = np.clip(np.round(w / scales[..., None]) + zeros[..., None], 0, levels).astype(np.uint8)

    def pack(values):  # [n, count] of `bits` each -> [n, ceil(count * bits / 8)] bytes
        per = 8 // bits
        count = values.shape[1]
        padded = np.zeros((values.shape[0], -(-count // per) * per), np.uint8)
        padded[:, :count] = values
        grouped = padded.reshape(values.shape[0], -1, per).astype(np.uint16)
        return sum(grouped[..., i] << (i * bits) for i in range(per)).astype(np.uint8)

    b = pack(q.reshape(n, -1)).reshape(n, blocks, block * bits // 8)
    consts = {"b": b, "scales": scales.reshape(-1)}
    if zero_points == "packed":
        consts["zeros"] = pack(zeros).reshape(-1)
    elif zero_points == "float":
        consts["zeros"] = zeros.astype(np.float32).reshape(-1)
    return consts


def add_multi_head_cases():
    b, s, l, n, h = 2, 3, 4, 2, 4
    d = n * h
    q, k, v = normal(b, s, d), normal(b, l, d), normal(b, l, d)
    qkv = {"q": q, "k": k, "v": v}
    past = {"pk": normal(b, n, 5, h), "pv": normal(b, n, 5, h)}
    heads = normal(b, n, l, h)
    mha = "MultiHeadAttention"
    case("mha", mha, qkv, {}, ["q", "k", "v"], ["y"], num_heads=n)
    case("mha_bias_scale", mha, qkv, {"bias": normal(3 * d)}, ["q", "k", "v", "bias"], ["y"],
         num_heads=n, scale=0.3)
    case("mha_value_wider", mha, {"q": q, "k": k, "v": normal(b, l, 12)}, {"bias": normal(2 * d + 12)},
         ["q", "k", "v", "bias"], ["y"], num_heads=n)
    for name, mask in [("lengths", np.array([2, 4], np.int32)),
                       ("lengths_offsets", np.array([3, 4, 0, 3, 6, 0, 4, 8], np.int32)),
                       ("raw", np.array([[1, 1, 0, 0], [0, 1, 1, 1]], np.int32)),
                       ("raw_3d", rng.integers(0, 2, (b, s, l)).astype(np.int32))]:
        case(f"mha_mask_{name}", mha, {**qkv, "m": mask}, {}, ["q", "k", "v", "", "m"], ["y"],
             num_heads=n, mask_filter_value=-5000.0)
    case("mha_attention_bias", mha, {**qkv, "ab": normal(1, n, s, l)}, {},
         ["q", "k", "v", "", "", "ab"], ["y"], num_heads=n)
    # A cross-attention cache: key and value already in heads; onnxruntime ignores their bias.
    case("mha_heads_kv_bias", mha, {"q": q, "k": heads, "v": normal(b, n, l, h)},
         {"bias": normal(3 * d)}, ["q", "k", "v", "bias"], ["y"], num_heads=n)
    case("mha_present", mha, qkv, {}, ["q", "k", "v"], ["y", "present_k", "present_v"],
         num_heads=n)
    case("mha_past_mask", mha, {**qkv, **past, "m": np.array([[1] * 9, [1] * 7 + [0] * 2], np.int32)},
         {}, ["q", "k", "v", "", "m", "", "pk", "pv"], ["y", "present_k", "present_v"],
         num_heads=n)
    case("mha_self_past_causal", mha, {"q": q, **past}, {}, ["q", "q", "q", "", "", "", "pk", "pv"],
         ["y", "present_k", "present_v"], num_heads=n, unidirectional=1)
    case("mha_causal", mha, {"q": q}, {}, ["q", "q", "q"], ["y"], num_heads=n, unidirectional=1)

    rot = "RotaryEmbedding"
    x3, x4 = normal(2, 3, 16), normal(2, 2, 3, 8)
    cos, sin = normal(10, 4), normal(10, 4)
    positions = np.array([[0, 1, 2], [3, 4, 5]], np.int64)
    caches = {"cos": cos, "sin": sin}
    case("rotary_3d", rot, {"x": x3, "p": positions}, caches, ["x", "p", "cos", "sin"], ["y"],
         num_heads=2)
    case("rotary_start", rot, {"x": x3, "p": np.array([4], np.int64)}, caches,
         ["x", "p", "cos", "sin"], ["y"], num_heads=2)
    case("rotary_4d_interleaved", rot, {"x": x4, "p": positions}, caches, ["x", "p", "cos", "sin"],
         ["y"], interleaved=1)
    case("rotary_heads_from_cache", rot, {"x": x3, "p": positions},
         {"cos": normal(10, 2), "sin": normal(10, 2)}, ["x", "p", "cos", "sin"], ["y"])
    case("rotary_partial", rot, {"x": x3, "p": positions},
         {"cos": normal(10, 2), "sin": normal(10, 2)}, ["x", "p", "cos", "sin"], ["y"],
         num_heads=2, rotary_embedding_dim=4)

    x = normal(2, 3, 4, scale=3.0)
    case("quantize_int16", "QuantizeLinear", {"x": x},
         {"s": scalar(0.001), "z": scalar(-7, np.int16)}, ["x", "s", "z"], ["y"])
    case("quantize_uint16_per_channel", "QuantizeLinear", {"x": x},
         {"s": np.array([0.001, 0.002, 0.0005], np.float32), "z": np.array([30000, 2, 60000], np.uint16)},
         ["x", "s", "z"], ["y"], axis=1)
    case("quantize_default_uint8", "QuantizeLinear", {"x": x}, {"s": scalar(0.05)}, ["x", "s"], ["y"])
    case("dequantize_int16", "DequantizeLinear",
         {"q": rng.integers(-32768, 32768, (2, 3, 4)).astype(np.int16)},
         {"s": np.array([0.001, 0.5, 0.02, 3.0], np.float32), "z": np.array([5, -9, 0, 7], np.int16)},
         ["q", "s", "z"], ["y"], axis=-1)
    case("dequantize_int32", "DequantizeLinear",
         {"q": rng.integers(-2**20, 2**20, (2, 5)).astype(np.int32)}, {"s": scalar(1e-4)},
         ["q", "s"], ["y"])


def add_group_query_cases():
    b, s, n, kv, h = 2, 4, 4, 2, 8
    q, k, v = normal(b, s, n * h), normal(b, s, kv * h), normal(b, s, kv * h)
    past = {"pk": normal(b, kv, 5, h), "pv": normal(b, kv, 5, h)}
    gqa = "GroupQueryAttention"
    heads = dict(num_heads=n, kv_num_heads=kv)
    prompt = {"q": q, "k": k, "v": v}
    full = {"sl": np.array([3, 3], np.int32), "tot": scalar(4, np.int32)}
    order = ["q", "k", "v", "", "", "sl", "tot"]
    outputs = ["y", "present_k", "present_v"]
    case("gqa_prompt", gqa, {**prompt, **full}, {}, order, outputs, **heads)
    # Right padding: the second sequence holds two positions.
    case("gqa_prompt_padded", gqa, {**prompt, "sl": np.array([3, 1], np.int32),
                                    "tot": scalar(4, np.int32)}, {}, order, outputs, **heads)
    case("gqa_packed", gqa, {"q": np.concatenate([q, k, v], -1), **full}, {},
         ["q", "", "", "", "", "sl", "tot"], outputs, **heads)
    for name, attrs in [("window", dict(local_window_size=2)), ("softcap", dict(softcap=2.0)),
                        ("smooth", dict(smooth_softmax=1)), ("scale", dict(scale=0.2))]:
        case(f"gqa_{name}", gqa, {**prompt, **full}, {}, order, outputs, **heads, **attrs)
    step = {"q": q[:, :1], "k": k[:, :1], "v": v[:, :1], **past}
    decode = ["q", "k", "v", "pk", "pv", "sl", "tot"]
    # Sequences of different lengths, one token each.
    case("gqa_decode_ragged", gqa, {**step, "sl": np.array([5, 3], np.int32),
                                    "tot": scalar(6, np.int32)}, {}, decode, outputs, **heads)
    # A past buffer longer than the sequences.
    case("gqa_decode_long_buffer", gqa, {**step, "sl": np.array([2, 4], np.int32),
                                         "tot": scalar(5, np.int32)}, {}, decode, outputs, **heads)
    chunk = {"q": q[:1, :2], "k": k[:1, :2], "v": v[:1, :2], "pk": past["pk"][:1],
             "pv": past["pv"][:1], "sl": np.array([6], np.int32), "tot": scalar(7, np.int32)}
    case("gqa_second_prompt", gqa, chunk, {}, decode, outputs, **heads)
    # onnxruntime rotates heads of a multiple of 16 only.
    h = 16
    prompt = {"q": normal(b, s, n * h), "k": normal(b, s, kv * h), "v": normal(b, s, kv * h)}
    step = {"q": normal(b, 1, n * h), "k": normal(b, 1, kv * h), "v": normal(b, 1, kv * h),
            "pk": normal(b, kv, 5, h), "pv": normal(b, kv, 5, h)}
    caches = {"cos": normal(16, 8), "sin": normal(16, 8)}
    rotary = decode + ["cos", "sin"]
    case("gqa_rotary_prompt", gqa, {**prompt, **full}, caches, order + ["cos", "sin"], outputs,
         do_rotary=1, **heads)
    case("gqa_rotary_decode_interleaved", gqa, {**step, "sl": np.array([5, 3], np.int32),
                                                "tot": scalar(6, np.int32)}, caches, rotary,
         outputs, do_rotary=1, rotary_interleaved=1, **heads)
    # Half of each head of 32 rotates.
    wide = {"q": normal(b, s, n * 32), "k": normal(b, s, kv * 32), "v": normal(b, s, kv * 32)}
    case("gqa_rotary_partial", gqa, {**wide, **full}, caches, order + ["cos", "sin"], outputs,
         do_rotary=1, **heads)


def add_nbits_cases():
    for name, bits, zero_points, bias in [("4bit", 4, "packed", False), ("4bit_default_zero", 4, None, True),
                                          ("8bit", 8, "packed", False), ("2bit", 2, "packed", True),
                                          ("4bit_float_zero", 4, "float", False)]:
        consts = nbits_weights(80, 12, 32, bits, zero_points)
        order = ["a", "b", "scales", "zeros" if zero_points else "", "", "bias" if bias else ""]
        if bias:
            consts["bias"] = normal(12)
        while order[-1] == "":
            order.pop()
        case(f"matmul_nbits_{name}", "MatMulNBits", {"a": normal(2, 3, 80)}, consts, order, ["y"],
             K=80, N=12, bits=bits, block_size=32)


def build(name, op, feeds, consts, order, outputs, domain, attrs):
    node = helper.make_node(op, order, outputs, name=name, domain=domain, **attrs)
    graph = helper.make_graph(
        [node], name,
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for k, v in feeds.items()],
        [helper.make_empty_tensor_value_info(o) for o in outputs if o],
        [numpy_helper.from_array(v, k) for k, v in consts.items() if k in order])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def optimized_berts(out):
    """The optimizer's BERT, and it quantized; yields (name, path, feeds, tolerance)."""
    source = os.path.join(out, "bert_source.onnx")
    onnx.save(bert(rng, heads=4, hidden=32), source)
    fused = optimize_model(source, model_type="bert", num_heads=4, hidden_size=32, opt_level=0)
    counts = fused.get_fused_operator_statistics()
    for op in ["EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "BiasGelu"]:
        assert counts[op] > 0, f"the optimizer fused no {op}: {counts}"
    optimized = os.path.join(out, "bert_optimized.onnx")
    fused.save_model_to_file(optimized)
    options = FusionOptions("bert")
    options.use_multi_head_attention = True
    fused = optimize_model(source, model_type="bert", num_heads=4, hidden_size=32, opt_level=0,
                           optimization_options=options)
    counts = fused.get_fused_operator_statistics()
    assert counts["MultiHeadAttention"] > 0, f"the optimizer fused no MultiHeadAttention: {counts}"
    multi_head = os.path.join(out, "bert_optimized_mha.onnx")
    fused.save_model_to_file(multi_head)
    quantized = os.path.join(out, "bert_optimized_int8.onnx")
    quantize_dynamic(optimized, quantized, weight_type=QuantType.QInt8, reduce_range=True,
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    ops = {n.op_type for n in onnx.load(quantized).graph.node}
    for op in ["QEmbedLayerNormalization", "QAttention", "MatMulInteger"]:
        assert op in ops, f"quantize_dynamic wrote no {op}: {ops}"
    feeds = {"input_ids": rng.integers(0, 50, (2, 7)),
             "attention_mask": np.array([[1] * 7, [1] * 4 + [0] * 3]),
             "token_type_ids": rng.integers(0, 2, (2, 7))}
    yield "bert_optimized", optimized, feeds, 1e-4
    yield "bert_optimized_mha", multi_head, feeds, 1e-4
    yield "bert_optimized_int8", quantized, feeds, 1e-2


def decoder(out):
    """A two-layer decoder laid out as onnxruntime-genai's model builder writes one for the CPU
    (int4 MatMulNBits, SimplifiedLayerNormalization and SkipSimplifiedLayerNormalization,
    GroupQueryAttention with rotary embeddings over a key/value cache), run on a prompt and then
    on one more token with the prompt's cache; yields (name, path, feeds, tolerance)."""
    layers, d, n, kv, h, vocab, inner = 2, 64, 4, 2, 16, 50, 96
    nodes, consts = [], {"embed": normal(vocab, d), "cos": normal(32, h // 2),
                         "sin": normal(32, h // 2), "one": np.array(1, np.int64),
                         "axis1": np.array([1], np.int64), "second": np.array(1, np.int64)}

    def node(op, inputs, outputs, domain="", **attrs):
        nodes.append(helper.make_node(op, inputs, outputs, name=f"n{len(nodes)}", domain=domain,
                                      **attrs))
        return outputs[0]

    def matmul(x, k, n_out, name):
        w = nbits_weights(k, n_out, 32, 4, "packed")
        for key in w:
            consts[f"{name}_{key}"] = w[key]
        return node("MatMulNBits", [x, f"{name}_b", f"{name}_scales", f"{name}_zeros"],
                    [f"{name}_out"], MS, K=k, N=n_out, bits=4, block_size=32)

    # The mask's valid lengths less one, and its length, as GroupQueryAttention takes them.
    node("ReduceSum", ["attention_mask", "axis1"], ["mask_sum"], keepdims=0)
    node("Sub", ["mask_sum", "one"], ["lengths64"])
    node("Cast", ["lengths64"], ["seqlens_k"], to=onnx.TensorProto.INT32)
    node("Shape", ["attention_mask"], ["mask_shape"])
    node("Gather", ["mask_shape", "second"], ["total64"], axis=0)
    node("Cast", ["total64"], ["total"], to=onnx.TensorProto.INT32)
    x = node("Gather", ["embed", "input_ids"], ["embedded"])
    residual = None
    outputs = ["logits"]
    for i in range(layers):
        consts[f"attn_norm{i}"] = (1 + 0.1 * normal(d)).astype(np.float32)
        consts[f"mlp_norm{i}"] = (1 + 0.1 * normal(d)).astype(np.float32)
        if residual is None:
            normed = node("SimplifiedLayerNormalization", [x, f"attn_norm{i}"], [f"normed{i}"],
                          epsilon=1e-5, axis=-1)
            residual = x
        else:
            normed = node("SkipSimplifiedLayerNormalization", [x, residual, f"attn_norm{i}"],
                          [f"normed{i}", "", "", f"residual{i}a"], MS, epsilon=1e-5)
            residual = f"residual{i}a"
        qkv = matmul(normed, d, (n + 2 * kv) * h, f"qkv{i}")
        past = [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
        present = [f"present.{i}.key", f"present.{i}.value"]
        outputs += present
        attn = node("GroupQueryAttention", [qkv, "", "", *past, "seqlens_k", "total", "cos", "sin"],
                    [f"attn{i}", *present], MS, num_heads=n, kv_num_heads=kv, do_rotary=1)
        projected = matmul(attn, d, d, f"o{i}")
        normed = node("SkipSimplifiedLayerNormalization", [projected, residual, f"mlp_norm{i}"],
                      [f"mlp_in{i}", "", "", f"residual{i}b"], MS, epsilon=1e-5)
        residual = f"residual{i}b"
        gate, up = matmul(normed, d, inner, f"gate{i}"), matmul(normed, d, inner, f"up{i}")
        node("Sigmoid", [gate], [f"sig{i}"])
        node("Mul", [gate, f"sig{i}"], [f"silu{i}"])
        node("Mul", [f"silu{i}", up], [f"act{i}"])
        x = matmul(f"act{i}", inner, d, f"down{i}")
    consts["final_norm"] = (1 + 0.1 * normal(d)).astype(np.float32)
    node("SkipSimplifiedLayerNormalization", [x, residual, "final_norm"], ["final"], MS,
         epsilon=1e-5)
    matmul("final", d, vocab, "lm_head")
    node("Identity", ["lm_head_out"], ["logits"])
    f32, batch = onnx.TensorProto.FLOAT, "batch"
    inputs = [helper.make_tensor_value_info("input_ids", onnx.TensorProto.INT64, [batch, "seq"]),
              helper.make_tensor_value_info("attention_mask", onnx.TensorProto.INT64,
                                            [batch, "total"])]
    for i in range(layers):
        for kind in ["key", "value"]:
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", f32,
                                                        [batch, kv, "past", h]))
    graph = helper.make_graph(nodes, "decoder", inputs,
                              [helper.make_empty_tensor_value_info(o) for o in outputs],
                              [numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(MS, 1)], ir_version=8)
    # One file a case: the test reads the model of case NAME from NAME.onnx.
    path, step_path = os.path.join(out, "decoder_prompt.onnx"), os.path.join(out, "decoder_step.onnx")
    onnx.save(model, path)
    onnx.save(model, step_path)
    b, s = 2, 5
    empty = np.zeros((b, kv, 0, h), np.float32)
    prompt = {"input_ids": rng.integers(0, vocab, (b, s)), "attention_mask": np.ones((b, s), np.int64)}
    for i in range(layers):
        prompt[f"past_key_values.{i}.key"] = prompt[f"past_key_values.{i}.value"] = empty
    yield "decoder_prompt", path, prompt, 1e-4
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    cache = dict(zip([o.name for o in session.get_outputs()], session.run(None, prompt)))
    step = {"input_ids": rng.integers(0, vocab, (b, 1)),
            "attention_mask": np.ones((b, s + 1), np.int64)}
    for i in range(layers):
        for kind in ["key", "value"]:
            step[f"past_key_values.{i}.{kind}"] = cache[f"present.{i}.{kind}"]
    yield "decoder_step", step_path, step, 1e-4


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    add_cases()
    add_multi_head_cases()
    add_group_query_cases()
    add_nbits_cases()
    models = []
    for name, op, feeds, consts, order, outputs, domain, attrs in CASES:
        path = os.path.join(out, name + ".onnx")
        onnx.save(build(name, op, feeds, consts, order, outputs, domain, attrs), path)
        models.append((name, path, feeds, 1e-4))
    models += optimized_berts(out)
    models += decoder(out)
    lines = []
    for name, path, feeds, tolerance in models:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        # The node as written: no fusion or constant folding of onnxruntime's own.
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        results = session.run(None, feeds)
        for k, v in feeds.items():
            np.save(os.path.join(out, f"{name}_in_{k}.npy"), v)
        named = [o.name for o in session.get_outputs()]
        for k, v in zip(named, results):
            np.save(os.path.join(out, f"{name}_out_{k}.npy"), v)
        lines.append(f"{name}\t{','.join(feeds)}\t{','.join(named)}\t{tolerance}\n")
    with open(os.path.join(out, "cases.tsv"), "w") as f:
        f.writelines(lines)


if __name__ == "__main__":
    main()
