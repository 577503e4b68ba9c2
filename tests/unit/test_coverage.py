"""Execution-provider coverage from ONNX Runtime profile events: shares of nodes and time, fallbacks."""

from __future__ import annotations

import pytest

from edgeinfer.backends.coverage import coverage
from edgeinfer.backends.onnxruntime import _check_coverage
from edgeinfer.errors import ModelLoadError

GPU, CPU = "CUDAExecutionProvider", "CPUExecutionProvider"


def node(name: str, op: str, provider: str, dur: int, params: int = 0) -> dict:
    return {
        "cat": "Node",
        "name": f"{name}_kernel_time",
        "dur": dur,
        "args": {"op_name": op, "provider": provider, "parameter_size": str(params)},
    }


EVENTS = [
    {"cat": "Session", "name": "session_initialization", "dur": 5000},  # not a node: ignored
    {"cat": "Node", "name": "conv1_fence_before", "dur": 1, "args": {}},  # not a kernel: ignored
    node("conv1", "Conv", GPU, 300, 6272),
    node("relu1", "Relu", GPU, 20),
    node("conv2", "Conv", GPU, 500, 1000),
    node("nms", "NonMaxSuppression", CPU, 150),
    node("topk", "TopK", CPU, 30),
    node("topk", "TopK", CPU, 30),  # the same node again (a loop): one node, twice the time
]


def test_shares_of_nodes_and_of_time_by_provider():
    measured = coverage(EVENTS, GPU)
    assert measured.nodes == 5
    assert measured.ratio == pytest.approx(3 / 5)
    shares = {share.provider: share for share in measured.providers}
    assert (shares[GPU].nodes, shares[CPU].nodes) == (3, 2)
    assert (shares[GPU].time_us, shares[CPU].time_us) == (820, 210)
    assert shares[GPU].time_share == pytest.approx(820 / 1030)
    assert measured.providers[0].provider == GPU, "the provider with the most nodes first"
    assert measured.ops == {"Conv": 2, "Relu": 1, "NonMaxSuppression": 1, "TopK": 1}
    assert measured.fallback_ops == {CPU: {"NonMaxSuppression": 1, "TopK": 1}}
    assert measured.parameter_bytes == 7272
    assert measured.ratios() == {GPU: pytest.approx(0.6), CPU: pytest.approx(0.4)}


def test_a_wanted_provider_that_ran_nothing_has_zero_and_is_listed():
    measured = coverage(EVENTS, "OpenVINOExecutionProvider")
    assert measured.ratio == 0.0
    assert measured.ratios()["OpenVINOExecutionProvider"] == 0.0
    assert set(measured.fallback_ops) == {GPU, CPU}


def test_no_nodes_counts_as_fully_covered():
    assert coverage([], CPU).ratio == 1.0
    assert coverage([], CPU).as_dict()["nodes"] == 0


def test_a_load_below_min_ep_coverage_names_what_falls_back():
    measured = coverage(EVENTS, GPU)
    _check_coverage("m.onnx", measured, "", 0.5)  # 60 % >= 50 %: loads
    with pytest.raises(ModelLoadError) as refused:
        _check_coverage("m.onnx", measured, "", 0.9)
    assert str(refused.value) == (
        "m.onnx: 60% of the nodes (3 of 5) run on CUDAExecutionProvider, less than min_ep_coverage 0.9; "
        "these fall back: NonMaxSuppression x1, TopK x1 on CPUExecutionProvider"
    )
    with pytest.raises(ModelLoadError, match="coverage cannot be measured: the probe run on zeros failed"):
        _check_coverage("m.onnx", None, "the probe run on zeros failed: bad index", 0.5)
