"""The benchmark's models, built with the onnx helper API from a fixed seed.

tiny  INPUT0 FP32 [N,16] -> MatMul 16x16 -> Relu -> OUTPUT0 [N,16]   (pure serving overhead)
cnn   input FP32 [N,3,224,224] -> 4 strided convs -> pool -> Gemm -> logits [N,1000]
      (about 9 ms per image on one core of the reference machine)
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = [helper.make_opsetid("", 17)]


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=OPSET, producer_name="edgeinfer-bench")
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def tiny(path: Path) -> Path:
    weights = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["INPUT0", "W"], ["mm"]), helper.make_node("Relu", ["mm"], ["OUTPUT0"])],
        "tiny",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["N", 16])],
        [numpy_helper.from_array(weights, "W")],
    )
    return _save(graph, path)


CNN_CHANNELS = (3, 52, 104, 208, 416)


def cnn(path: Path) -> Path:
    rng = np.random.default_rng(1)
    nodes, initializers = [], []
    last = "input"
    for index, (cin, cout) in enumerate(itertools.pairwise(CNN_CHANNELS)):
        weight = (rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2 / (cin * 9))).astype(np.float32)
        bias = np.zeros(cout, dtype=np.float32)
        initializers += [
            numpy_helper.from_array(weight, f"w{index}"),
            numpy_helper.from_array(bias, f"b{index}"),
        ]
        nodes.append(
            helper.make_node(
                "Conv",
                [last, f"w{index}", f"b{index}"],
                [f"c{index}"],
                kernel_shape=[3, 3],
                strides=[2, 2],
                pads=[1, 1, 1, 1],
            )
        )
        nodes.append(helper.make_node("Relu", [f"c{index}"], [f"r{index}"]))
        last = f"r{index}"
    nodes.append(helper.make_node("GlobalAveragePool", [last], ["pooled"]))
    nodes.append(helper.make_node("Flatten", ["pooled"], ["flat"]))
    fc = (rng.standard_normal((CNN_CHANNELS[-1], 1000)) / np.sqrt(CNN_CHANNELS[-1])).astype(np.float32)
    initializers += [
        numpy_helper.from_array(fc, "fc"),
        numpy_helper.from_array(np.zeros(1000, np.float32), "fcb"),
    ]
    nodes.append(helper.make_node("Gemm", ["flat", "fc", "fcb"], ["logits"]))
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 224, 224])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 1000])],
        initializers,
    )
    return _save(graph, path)
