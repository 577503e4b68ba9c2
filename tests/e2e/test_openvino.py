"""The OpenVINO backend (`backend: openvino`) on the CPU device: the same answers as ONNX Runtime, batching,
metadata, metrics and inspect, and a clear refusal for a device the box does not have."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tests.support import ServerProcess, infer_body, matmul_model, metric, request, scrape

pytest.importorskip("openvino", reason="the openvino extra (pip install 'edgeinfer[openvino]')")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    root = tmp_path_factory.mktemp("openvino")
    model = matmul_model(root / "repo" / "mm" / "1" / "model.onnx", seed=5)
    (root / "repo" / "mm" / "config.yaml").write_text(
        "backend: openvino\nmax_batch_size: 8\nbatch_timeout_ms: 5\n"
        f"backend_config: {{intra_op_num_threads: 1, cache_dir: {root / 'ov-cache'}}}\n"
    )
    server = ServerProcess(["--model-repository", str(root / "repo"), "--host", "127.0.0.1"])
    server.start(root / "log", timeout=60)
    yield server, model
    server.stop()


def test_answers_equal_onnx_runtime_and_requests_batch(served: tuple[ServerProcess, Path]):
    server, model = served
    reference = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    rows = [np.random.default_rng(i).standard_normal((1, 16)).astype(np.float32) for i in range(24)]

    def send(x: np.ndarray) -> np.ndarray:
        reply = request(server.port, "POST", "/v2/models/mm/infer", infer_body({"X": x}))
        assert reply.status == 200, reply.body
        return np.array(reply.json()["outputs"][0]["data"], np.float32).reshape(1, 16)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(send, rows))
    for x, answer in zip(rows, answers, strict=True):
        np.testing.assert_allclose(answer, reference.run(None, {"X": x})[0], rtol=1e-4, atol=1e-5)
    stats = request(server.port, "GET", "/v2/models/mm/stats").json()["model_stats"][0]
    assert stats["inference_count"] >= 24
    assert stats["execution_count"] < stats["inference_count"], "concurrent requests were batched"


def test_metadata_metrics_and_inspect_say_openvino(served: tuple[ServerProcess, Path], tmp_path: Path):
    server, _ = served
    metadata = request(server.port, "GET", "/v2/models/mm").json()
    assert metadata["platform"] == "openvino"
    assert metadata["inputs"] == [{"name": "X", "datatype": "FP32", "shape": [-1, 16]}]
    config = request(server.port, "GET", "/v2/models/mm/config").json()
    assert config["backend"] == "openvino"
    samples = scrape(server.port)
    labels = {"model": "mm", "version": "1", "backend": "openvino", "execution_provider": "OpenVINO CPU"}
    assert metric(samples, "edgeinfer_model_info", **labels) == 1.0
    report = request(server.port, "GET", "/v2/models/mm/inspect").json()
    assert (report["device"], report["properties"]["INFERENCE_NUM_THREADS"]) == ("CPU", "1")
    assert report["properties"]["PERFORMANCE_HINT"] == "LATENCY"


def test_a_device_the_box_lacks_is_refused_by_name(served: tuple[ServerProcess, Path]):
    server, _ = served
    override = {"backend": "openvino", "backend_config": {"device": "NPU"}}
    reply = request(
        server.port, "POST", "/v2/repository/models/mm/load", {"parameters": {"config": json.dumps(override)}}
    )
    assert reply.status == 400, reply.body
    assert "OpenVINO has no device 'NPU' here (it has CPU" in reply.error
    assert request(server.port, "GET", "/v2/models/mm/ready").status == 200, "the loaded version serves on"
