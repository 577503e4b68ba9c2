"""Python models: batching, per-request errors, async predict, failures, and the programmatic API."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import edgeinfer
from edgeinfer.config import Config
from tests.python_models.models import Doubler
from tests.support import ROOT, ServerProcess, free_port, infer_body, request, wait_ready

CONFIG = """
models:
  doubler: {backend: python, model_class: "tests.python_models.models:Doubler", parameters: {factor: 3},
            max_batch_size: 64, max_batch_time: 0.02}
  upper: {backend: python, model_class: "tests.python_models.models:AsyncUpper", max_batch_size: 8}
  wrong: {backend: python, model_class: "tests.python_models.models:WrongCount", max_batch_size: 0}
  summed: {backend: python, model_class: "tests.python_models.models:BatchSum", max_batch_size: 16}
"""


@pytest.fixture(scope="module")
def python_server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("python")
    (root / "config.yaml").write_text(CONFIG)
    env = {"PYTHONPATH": str(ROOT)}
    server = ServerProcess(["--config", str(root / "config.yaml")], env=env).start(root / "log")
    yield server
    server.stop()


def x_rows(value: float, rows: int = 1) -> dict:
    return infer_body({"x": np.full((rows, 4), value, np.float32)})


def test_concurrent_requests_arrive_in_fewer_larger_predict_calls(python_server):
    with ThreadPoolExecutor(max_workers=20) as pool:
        replies = list(pool.map(lambda i: request(python_server.port, "POST", "/v2/models/doubler/infer",
                                                  x_rows(100 + i, 1 + i % 3)), range(100)))  # fmt: skip
    for index, reply in enumerate(replies):
        assert reply.status == 200, reply.body
        output = reply.json()["outputs"][0]
        assert output["shape"] == [1 + index % 3, 4]
        assert output["data"] == [(100 + index) * 3.0] * (4 * (1 + index % 3))
    stats = request(python_server.port, "GET", "/v2/models/doubler/stats").json()["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == 100
    assert stats["execution_count"] < 100, "requests were batched into fewer predict calls"


def test_one_bad_request_in_a_batch_fails_alone(python_server):
    bodies = [x_rows(1.0), {**x_rows(2.0), "parameters": {"fail": True}}, x_rows(3.0)]
    with ThreadPoolExecutor(max_workers=3) as pool:
        replies = list(
            pool.map(lambda b: request(python_server.port, "POST", "/v2/models/doubler/infer", b), bodies)
        )
    assert [reply.status for reply in replies] == [200, 400, 200]
    assert replies[1].error == "this request asked to fail"


def test_a_predict_that_raises_fails_its_batch_and_the_next_works(python_server):
    reply = request(python_server.port, "POST", "/v2/models/doubler/infer", x_rows(13.0))
    assert reply.status == 500
    assert "ValueError: thirteen is unlucky" in reply.error
    assert request(python_server.port, "POST", "/v2/models/doubler/infer", x_rows(1.0)).status == 200


def test_async_predict_and_bytes(python_server):
    body = {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["ab", "Cd"]}]}
    reply = request(python_server.port, "POST", "/v2/models/upper/infer", body)
    assert reply.status == 200, reply.body
    assert reply.json()["outputs"][0]["data"] == ["AB", "CD"]


def test_wrong_number_of_responses_is_a_clear_error(python_server):
    reply = request(python_server.port, "POST", "/v2/models/wrong/infer", x_rows(1.0))
    assert reply.status == 500
    assert "WrongCount.predict returned 0 responses for a batch of 1 requests" in reply.error


def test_predict_batch_gets_one_concatenated_batch(python_server):
    reply = request(python_server.port, "POST", "/v2/models/summed/infer", x_rows(1.5, 3))
    assert reply.json()["outputs"][0] == {
        "name": "total",
        "datatype": "FP32",
        "shape": [3, 1],
        "data": [6.0] * 3,
    }


def test_metadata_comes_from_the_class(python_server):
    metadata = request(python_server.port, "GET", "/v2/models/doubler").json()
    assert metadata["platform"] == "python"
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    bad = request(
        python_server.port, "POST", "/v2/models/doubler/infer", infer_body({"x": np.ones((1, 3), np.float32)})
    )
    assert bad.status == 400
    assert "expects [-1, 4]" in bad.error


def test_the_programmatic_api_in_process():
    settings = {"server": {"http_port": 0, "grpc_port": None, "metrics_port": None, "host": "127.0.0.1"}}

    async def main():
        server = edgeinfer.Server(Config.model_validate(settings))
        server.register(Doubler(factor=5), name="five", version="2", max_batch_size=8, max_batch_time=0.001)
        await server.start()
        try:
            loop = asyncio.get_running_loop()
            body = x_rows(2.0)
            return await loop.run_in_executor(
                None, request, server.http_port, "POST", "/v2/models/five/infer", body
            )
        finally:
            await server.stop()

    reply = asyncio.run(main())
    assert reply.status == 200
    assert reply.json()["model_version"] == "2"
    assert reply.json()["outputs"][0]["data"] == [10.0] * 4


def test_the_readme_example_runs_as_written(tmp_path: Path):
    readme = (ROOT / "README.md").read_text()
    start = readme.index("```python\nimport edgeinfer")
    code = readme[start + len("```python\n") : readme.index("```", start + 10)]
    script = tmp_path / "example.py"
    port = free_port()
    script.write_text(code.replace("http_port=8080", f"http_port={port}, grpc_port=None, metrics_port=None"))
    process = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path)
    try:
        assert wait_ready(port, 30), "the README example did not start"
        reply = request(port, "POST", "/v2/models/doubler/infer", x_rows(1.0))
        assert reply.status == 200
        assert reply.json()["outputs"][0]["data"] == [2.0] * 4
    finally:
        process.terminate()
        process.wait(timeout=20)
