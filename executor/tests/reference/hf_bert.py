"""A small BERT encoder laid out node for node as PyTorch exports Hugging Face's BertModel
(opset 17): word, position and token-type embeddings, the extended attention mask
`(1 - mask) * -10000`, per-head Q/K/V through Reshape and Transpose, the erf GELU. This is the
form onnxruntime's transformer optimizer recognises, so it fuses EmbedLayerNormalization,
Attention, SkipLayerNormalization and BiasGelu from it."""

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def bert(rng, layers=2, hidden=32, heads=4, vocab=50, max_positions=16, types=2):
    nodes, inits = [], []
    counter = [0]

    def name(tag):
        counter[0] += 1
        return f"{tag}_{counter[0]}"

    def const(value, tag="c"):
        n = name(tag)
        inits.append(numpy_helper.from_array(np.asarray(value), n))
        return n

    def weight(*shape, scale=None):
        scale = scale if scale is not None else 1.0 / np.sqrt(shape[0])
        return const((rng.standard_normal(shape) * scale).astype(np.float32), "w")

    def node(op, inputs, **attrs):
        out = name(op.lower())
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def linear(x, cin, cout):
        y = node("MatMul", [x, weight(cin, cout)])
        return node("Add", [y, weight(cout, scale=0.1)])

    def layer_norm(x):
        return node("LayerNormalization", [x, weight(hidden, scale=0.1), weight(hidden, scale=0.1)],
                    axis=-1, epsilon=1e-12)

    head = hidden // heads
    # Embeddings: the positions are the first S of a constant [1, max_positions] table.
    seq = node("Gather", [node("Shape", ["input_ids"]), const(np.array(1, np.int64))])
    seq = node("Unsqueeze", [seq, const(np.array([0], np.int64))])
    table = const(np.arange(max_positions, dtype=np.int64)[None, :])
    positions = node("Slice", [table, const(np.array([0], np.int64)), seq,
                               const(np.array([1], np.int64)), const(np.array([1], np.int64))])
    words = node("Gather", [weight(vocab, hidden, scale=1.0), "input_ids"])
    kinds = node("Gather", [weight(types, hidden, scale=1.0), "token_type_ids"])
    embedded = node("Add", [node("Add", [words, kinds]),
                            node("Gather", [weight(max_positions, hidden, scale=1.0), positions])])
    x = layer_norm(embedded)
    # The extended mask [B, 1, 1, S]: 0 where attended, -10000 where not.
    mask = node("Unsqueeze", ["attention_mask", const(np.array([1], np.int64))])
    mask = node("Unsqueeze", [mask, const(np.array([2], np.int64))])
    mask = node("Cast", [mask], to=TensorProto.FLOAT)
    mask = node("Mul", [node("Sub", [const(np.array(1.0, np.float32)), mask]),
                        const(np.array(-10000.0, np.float32))])
    heads_shape = const(np.array([0, 0, heads, head], np.int64))
    merged_shape = const(np.array([0, 0, hidden], np.int64))
    for _ in range(layers):
        def split(t, perm):
            return node("Transpose", [node("Reshape", [t, heads_shape])], perm=perm)
        q = split(linear(x, hidden, hidden), [0, 2, 1, 3])
        k = split(linear(x, hidden, hidden), [0, 2, 3, 1])
        v = split(linear(x, hidden, hidden), [0, 2, 1, 3])
        scores = node("Div", [node("MatMul", [q, k]), const(np.array(np.sqrt(head), np.float32))])
        probs = node("Softmax", [node("Add", [scores, mask])], axis=-1)
        context = node("Transpose", [node("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        context = node("Reshape", [context, merged_shape])
        x = layer_norm(node("Add", [linear(context, hidden, hidden), x]))
        inner = linear(x, hidden, 4 * hidden)
        erf = node("Erf", [node("Div", [inner, const(np.array(np.sqrt(2.0), np.float32))])])
        gelu = node("Mul", [node("Mul", [inner, node("Add", [erf, const(np.array(1.0, np.float32))])]),
                            const(np.array(0.5, np.float32))])
        x = layer_norm(node("Add", [linear(gelu, 4 * hidden, hidden), x]))
    nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"]))
    ints = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
            for n in ["input_ids", "attention_mask", "token_type_ids"]]
    out = helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT,
                                        ["batch", "sequence", hidden])
    graph = helper.make_graph(nodes, "bert", ints, [out], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    model.producer_name = "pytorch"
    return model
