"""Build the example model repository with the onnx helper API (fixed seeds, a few KB each).

    python scripts/make_example_models.py [OUT_DIR]   (default: examples/model_repository)

Models:
  simple/1, simple/2   INPUT0 FP32 [-1,16] -> MatMul 16x16 -> Relu -> OUTPUT0 FP32 [-1,16]
                       (version 2 has other weights and adds a bias)
  all_dtypes/1         one input per V2 numeric datatype, each echoed (Identity) and a few computed
  text_lower/1         TEXT BYTES [-1] -> StringNormalizer(lower) -> LOWER BYTES [-1]
  color_classifier/1   PIXELS FP32 [-1,3,32,32] in [0,1] -> mean colour -> SCORES FP32 [-1,6] for
                       red, green, blue, yellow, white, black (the image pipeline example's model)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = [helper.make_opsetid("", 17)]
IR_VERSION = 8  # readable by every ONNX Runtime since 1.10

NUMERIC_TYPES = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
}


def _save(model: onnx.ModelProto, path: Path) -> None:
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def simple_model(seed: int, with_bias: bool) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal((16, 16)).astype(np.float32)
    initializers = [numpy_helper.from_array(weights, "W")]
    nodes = [helper.make_node("MatMul", ["INPUT0", "W"], ["mm"])]
    last = "mm"
    if with_bias:
        bias = rng.standard_normal(16).astype(np.float32)
        initializers.append(numpy_helper.from_array(bias, "B"))
        nodes.append(helper.make_node("Add", ["mm", "B"], ["biased"]))
        last = "biased"
    nodes.append(helper.make_node("Relu", [last], ["OUTPUT0"]))
    graph = helper.make_graph(
        nodes,
        f"simple_seed{seed}",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 16])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=OPSET, producer_name="edgeinfer-examples")


def all_dtypes_model() -> onnx.ModelProto:
    inputs, outputs, nodes = [], [], []
    for name, onnx_type in NUMERIC_TYPES.items():
        inputs.append(helper.make_tensor_value_info(f"IN_{name}", onnx_type, ["batch", 4]))
        outputs.append(helper.make_tensor_value_info(f"OUT_{name}", onnx_type, ["batch", 4]))
        nodes.append(helper.make_node("Identity", [f"IN_{name}"], [f"OUT_{name}"]))
    # A few outputs that compute, so the model is more than a mirror.
    nodes.append(helper.make_node("Not", ["IN_BOOL"], ["NOT_BOOL"]))
    outputs.append(helper.make_tensor_value_info("NOT_BOOL", TensorProto.BOOL, ["batch", 4]))
    nodes.append(helper.make_node("Add", ["IN_INT64", "IN_INT64"], ["DOUBLE_INT64"]))
    outputs.append(helper.make_tensor_value_info("DOUBLE_INT64", TensorProto.INT64, ["batch", 4]))
    nodes.append(helper.make_node("Cast", ["IN_FP64"], ["FP64_AS_FP16"], to=TensorProto.FLOAT16))
    outputs.append(helper.make_tensor_value_info("FP64_AS_FP16", TensorProto.FLOAT16, ["batch", 4]))
    graph = helper.make_graph(nodes, "all_dtypes", inputs, outputs)
    return helper.make_model(graph, opset_imports=OPSET, producer_name="edgeinfer-examples")


def text_lower_model() -> onnx.ModelProto:
    node = helper.make_node("StringNormalizer", ["TEXT"], ["LOWER"], case_change_action="LOWER", locale="C")
    graph = helper.make_graph(
        [node],
        "text_lower",
        [helper.make_tensor_value_info("TEXT", TensorProto.STRING, ["n"])],
        [helper.make_tensor_value_info("LOWER", TensorProto.STRING, ["n"])],
    )
    return helper.make_model(graph, opset_imports=OPSET, producer_name="edgeinfer-examples")


# Each class is a reference colour; the score is minus the squared distance of the image's mean colour,
# so the nearest reference wins: -|m|^2 + 2 m.c - |c|^2, a Gemm on the mean colour (|m|^2 is the same
# for every class and is left out).
COLORS = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0], [1, 1, 1], [0, 0, 0]], dtype=np.float32)


def color_classifier_model() -> onnx.ModelProto:
    weights = (2 * COLORS.T).astype(np.float32)  # [3, 6]
    bias = -(COLORS**2).sum(axis=1).astype(np.float32)  # [6]
    scale = np.array(8.0, dtype=np.float32)  # sharper softmax downstream
    nodes = [
        helper.make_node("GlobalAveragePool", ["PIXELS"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["mean_rgb"]),
        helper.make_node("Gemm", ["mean_rgb", "W", "B"], ["raw"]),
        helper.make_node("Mul", ["raw", "scale"], ["SCORES"]),
    ]
    graph = helper.make_graph(
        nodes,
        "color_classifier",
        [helper.make_tensor_value_info("PIXELS", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("SCORES", TensorProto.FLOAT, ["batch", 6])],
        [
            numpy_helper.from_array(weights, "W"),
            numpy_helper.from_array(bias, "B"),
            numpy_helper.from_array(scale, "scale"),
        ],
    )
    return helper.make_model(graph, opset_imports=OPSET, producer_name="edgeinfer-examples")


def build(out: Path) -> None:
    _save(simple_model(seed=1, with_bias=False), out / "simple" / "1" / "model.onnx")
    _save(simple_model(seed=2, with_bias=True), out / "simple" / "2" / "model.onnx")
    _save(all_dtypes_model(), out / "all_dtypes" / "1" / "model.onnx")
    _save(text_lower_model(), out / "text_lower" / "1" / "model.onnx")
    _save(color_classifier_model(), out / "color_classifier" / "1" / "model.onnx")


if __name__ == "__main__":
    build(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("examples/model_repository"))
