"""`edgeinfer optimize` on real models: graph optimization, FP16 and INT8 (dynamic and static) with the
accuracy gate; a variant over --max-drop is refused and not written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tests.support import ROOT, save_model


def edgeinfer(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgeinfer", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def classifier(path: Path, spread: float = 0.1) -> Path:
    """X[b,64] -> hidden 100 (Relu) -> logits[b,100], and a regression head score[b,1] from X too.
    ``spread``: how far apart the classes' weight columns are (tiny: INT8 cannot tell them apart)."""
    rng = np.random.default_rng(1)
    base = rng.standard_normal((100, 1)).astype(np.float32) * 0.1
    w2 = base + spread * rng.standard_normal((100, 100)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["X", "W"], ["H"]),
            helper.make_node("Relu", ["H"], ["R"]),
            helper.make_node("MatMul", ["R", "W2"], ["logits"]),
            helper.make_node("MatMul", ["X", "V"], ["score"]),
        ],
        "classifier",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 64])],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 100]),
            helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch", 1]),
        ],
        [
            numpy_helper.from_array(rng.standard_normal((64, 100)).astype(np.float32) * 0.1, "W"),
            numpy_helper.from_array(w2, "W2"),
            numpy_helper.from_array(rng.standard_normal((64, 1)).astype(np.float32), "V"),
        ],
    )
    return save_model(graph, path)


def samples(folder: Path, count: int = 25) -> Path:
    folder.mkdir()
    rng = np.random.default_rng(7)
    for index in range(count - 1):
        np.savez(folder / f"s{index:02d}.npz", X=rng.standard_normal((4, 64)).astype(np.float32))
    request = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 64], "data": [0.5] * 64}]}
    (folder / "request.json").write_text(json.dumps(request))  # what a client sends works too
    return folder


def test_graph_optimization_and_fp16_keep_the_answers_and_fp16_halves_the_size(tmp_path: Path):
    model = classifier(tmp_path / "m.onnx")
    data = samples(tmp_path / "samples")
    plain = edgeinfer("optimize", str(model), "-o", str(tmp_path / "opt.onnx"), "--samples", str(data))
    assert plain.returncode == 0, plain.stderr
    assert "| logits | 100.00% | top-1 | 97 |" in plain.stdout
    assert (tmp_path / "opt.onnx").is_file()
    half = edgeinfer(
        "optimize", str(model), "-o", str(tmp_path / "fp16.onnx"), "--fp16", "--samples", str(data),
        "--max-drop", "0.005",
    )  # fmt: skip
    assert half.returncode == 0, half.stderr
    assert "variant: fp16;" in half.stdout
    assert 0.45 < (tmp_path / "fp16.onnx").stat().st_size / model.stat().st_size < 0.6
    assert "converting to FP16" in half.stderr, "progress goes to stderr"


def test_int8_dynamic_and_static_with_calibration(tmp_path: Path):
    model = classifier(tmp_path / "m.onnx")
    data = samples(tmp_path / "calibration")
    for mode in ("dynamic", "static"):
        out = tmp_path / f"int8-{mode}.onnx"
        args = ["optimize", str(model), "-o", str(out), "--int8", mode, "--max-drop", "0.1"]
        result = edgeinfer(*args, "--calibration", str(data))
        assert result.returncode == 0, result.stderr
        assert f"variant: int8 {mode}; samples: the calibration samples (25)" in result.stdout
        assert out.stat().st_size < 0.4 * model.stat().st_size
    assert "calibrating: 25 in" in result.stderr
    static_alone = edgeinfer("optimize", str(model), "-o", str(tmp_path / "x.onnx"), "--int8", "static")
    assert static_alone.returncode == 1
    assert "--int8 static needs --calibration DIR" in static_alone.stderr


def test_a_variant_over_max_drop_is_refused_and_not_written(tmp_path: Path):
    # classes whose weights differ by less than an INT8 step: quantized, their logits tie
    model = classifier(tmp_path / "m.onnx", spread=1e-4)
    out = tmp_path / "int8.onnx"
    result = edgeinfer("optimize", str(model), "-o", str(out), "--int8", "dynamic", "--max-drop", "0.01")
    assert result.returncode == 1
    assert f"refused, {out} not written: top-1 agreement on output 'logits' is" in result.stderr
    assert "over --max-drop 0.01 by" in result.stderr
    assert "synthetic (random normal inputs: give --samples for a real check)" in result.stdout
    assert not out.exists()
    both = edgeinfer("optimize", str(model), "-o", str(out), "--fp16", "--int8", "dynamic")
    assert both.returncode == 2
    assert "not allowed with argument" in both.stderr
    absent = edgeinfer("optimize", str(tmp_path / "absent.onnx"), "-o", str(out))
    assert (absent.returncode, absent.stderr.strip()) == (
        2,
        f"edgeinfer optimize: no such file: {tmp_path / 'absent.onnx'}",
    )


def test_fp16_can_keep_the_models_head_in_fp32_weights_included(tmp_path: Path):
    """Weights in Constant nodes (as Paddle2ONNX writes them) and unnamed operators: the last two
    operators and their weights stay FP32, the rest is FP16."""
    import onnx

    rng = np.random.default_rng(3)
    weights = rng.standard_normal((8, 4)).astype(np.float32)
    bias = rng.standard_normal(4).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["W"], value=numpy_helper.from_array(weights)),
            helper.make_node("Constant", [], ["B"], value=numpy_helper.from_array(bias)),
            helper.make_node("MatMul", ["X", "W"], ["H"]),
            helper.make_node("Add", ["H", "B"], ["S"]),
            helper.make_node("Sigmoid", ["S"], ["Y"]),
        ],
        "head",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 4])],
    )
    model = save_model(graph, tmp_path / "head.onnx")
    for tail, bias_type in ((0, TensorProto.FLOAT16), (2, TensorProto.FLOAT)):
        out = tmp_path / f"tail{tail}.onnx"
        result = edgeinfer("optimize", str(model), "-o", str(out), "--fp16", "--fp16-keep-tail", str(tail))
        assert result.returncode == 0, result.stderr
        converted = onnx.load(str(out))
        stored = {tensor.name: tensor.data_type for tensor in converted.graph.initializer}
        stored |= {
            node.output[0]: node.attribute[0].t.data_type
            for node in converted.graph.node
            if node.op_type == "Constant"
        }
        assert stored["W"] == TensorProto.FLOAT16
        assert stored["B"] == bias_type, tail
    assert "variant: fp16 (the last 2 operators FP32)" in result.stdout
    alone = edgeinfer("optimize", str(model), "-o", str(tmp_path / "x.onnx"), "--fp16-keep-tail", "2")
    assert (alone.returncode, alone.stderr.strip()) == (
        1,
        "edgeinfer optimize: --fp16-keep-tail goes with --fp16",
    )
    negative = edgeinfer(
        "optimize", str(model), "-o", str(tmp_path / "x.onnx"), "--fp16", "--fp16-keep-tail", "-2"
    )
    assert negative.returncode == 2
    assert "argument --fp16-keep-tail: must be a whole number >= 0, not '-2'" in negative.stderr


def test_int8_leaves_nothing_in_the_folder_it_runs_in_when_shape_inference_gives_up(tmp_path: Path):
    """Two inputs broadcast over different dynamic dimensions: ONNX Runtime's symbolic shape inference
    cannot complete the sum and drops a debugging copy of the graph (and its weights) into the current
    directory; the command still quantizes, and the user's folder holds only what was asked for."""
    rng = np.random.default_rng(3)
    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "Y"], ["S"]), helper.make_node("MatMul", ["S", "W"], ["Z"])],
        "broadcast",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, ["a", 64]),
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["b", 64]),
        ],
        [helper.make_tensor_value_info("Z", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(rng.standard_normal((64, 4)).astype(np.float32), "W")],
    )
    model = save_model(graph, tmp_path / "broadcast.onnx")
    here = tmp_path / "here"
    here.mkdir()
    result = edgeinfer(
        "optimize", str(model), "-o", "int8.onnx", "--int8", "dynamic", "--max-drop", "1", cwd=here
    )
    assert result.returncode == 0, result.stderr
    assert sorted(path.name for path in here.iterdir()) == ["int8.onnx"]
