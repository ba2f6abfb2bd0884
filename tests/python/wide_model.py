"""Writes an ONNX model with one wide input, for tests of the agent's request path: `x` FP32
[n, WIDTH] reduced to `y` FP32 [n] (the mean of each row). Its rows are large and it computes
almost nothing, so a request's size is all that matters.

Usage: wide_model.py OUT.onnx WIDTH
"""

import sys

import onnx
from onnx import TensorProto, helper


def main():
    out, width = sys.argv[1], int(sys.argv[2])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", width])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])
    node = helper.make_node("ReduceMean", ["x"], ["y"], axes=[1], keepdims=0)
    graph = helper.make_graph([node], "wide", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    onnx.save(model, out)


if __name__ == "__main__":
    main()
