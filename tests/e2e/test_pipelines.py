"""Pipelines: results equal running the steps by hand, errors name the step, shared batching."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tests.support import (
    ROOT,
    ServerProcess,
    free_port,
    infer_body,
    matmul_model,
    metric,
    request,
    scrape,
    wait_for,
)

PIPELINE = """
models:
  scale: {backend: python, model_class: "tests.python_models.models:Scale", max_batch_size: 16}
  negate: {backend: python, model_class: "tests.python_models.models:Negate", max_batch_size: 16}
  topk: {backend: python, model_class: "tests.python_models.models:TopK", max_batch_size: 16}
  mm: {model_path: mm.onnx, max_batch_size: 32}
  # sends a batch once it holds 8 rows (the timeout only stops a broken test from hanging)
  mm8: {model_path: mm.onnx, max_batch_size: 8, preferred_batch_sizes: [8], batch_timeout_ms: 20000}
  pipe8:
    backend: pipeline
    pipeline:
      inputs: [{name: INPUT, datatype: FP32, shape: [-1, 16]}]
      outputs: [{name: SCORES, datatype: FP32, shape: [-1, 16], from: model.Y}]
      steps:
        - {name: model, model: mm8, inputs: {X: INPUT}}
  pipe:
    backend: pipeline
    pipeline:
      inputs: [{name: INPUT, datatype: FP32, shape: [-1, 16]}]
      outputs:
        - {name: TOP, datatype: INT64, shape: [-1, 3], from: post.top}
        - {name: SCORES, datatype: FP32, shape: [-1, 16], from: model.Y}
        - {name: NEGATED, datatype: FP32, shape: [-1, 16], from: side.neg}
      steps:
        - {name: pre, model: scale, inputs: {x: INPUT}, budget_ms: 0.001}  # no step is that fast
        - {name: side, model: negate, inputs: {x: INPUT}}
        - {name: model, model: mm, inputs: {X: pre.y}, budget_ms: 60000}
        - {name: post, model: topk, inputs: {scores: model.Y}}
"""


@pytest.fixture(scope="module")
def pipeline_server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("pipeline")
    matmul_model(root / "mm.onnx", seed=4)
    (root / "config.yaml").write_text(PIPELINE)
    server = ServerProcess(["--config", str(root / "config.yaml")], env={"PYTHONPATH": str(ROOT)})
    server.start(root / "log")
    yield server, root
    server.stop()


def test_results_equal_running_the_steps_by_hand(pipeline_server):
    server, root = pipeline_server
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    reply = request(server.port, "POST", "/v2/models/pipe/infer", infer_body({"INPUT": x}))
    assert reply.status == 200, reply.body
    outputs = {output["name"]: output for output in reply.json()["outputs"]}
    scores = ort.InferenceSession(str(root / "mm.onnx")).run(None, {"X": x * 2})[0]
    np.testing.assert_allclose(
        np.array(outputs["SCORES"]["data"], np.float32).reshape(3, 16), scores, rtol=1e-5
    )
    assert (
        np.array(outputs["TOP"]["data"]).reshape(3, 3).tolist() == np.argsort(-scores, axis=1)[:, :3].tolist()
    )
    np.testing.assert_array_equal(np.array(outputs["NEGATED"]["data"], np.float32).reshape(3, 16), -x)


def test_each_step_is_timed_and_runs_over_its_budget_are_counted(pipeline_server):
    server, _ = pipeline_server

    def counts() -> dict[str, tuple[float, float]]:
        samples = scrape(server.port)
        found = {}
        for step, model in (("pre", "scale"), ("model", "mm"), ("post", "topk")):
            labels = {"pipeline": "pipe", "step": step, "model": model}
            found[step] = (
                metric(samples, "edgeinfer_pipeline_step_duration_seconds_count", **labels),
                metric(samples, "edgeinfer_pipeline_step_over_budget_total", **labels),
            )
        return found

    before = counts()
    for _ in range(5):
        body = infer_body({"INPUT": np.ones((1, 16), np.float32)})
        assert request(server.port, "POST", "/v2/models/pipe/infer", body).status == 200
    after = counts()
    assert after["pre"] == (before["pre"][0] + 5, before["pre"][1] + 5), "every run over 0.001 ms"
    assert after["model"] == (before["model"][0] + 5, before["model"][1]), "none over a minute"
    assert after["post"] == (before["post"][0] + 5, 0), "no budget: never over"
    # the pipeline request's access-log line lists each step's time; each step has a line of its own
    body = infer_body({"INPUT": np.ones((1, 16), np.float32)}, id="steps-1")
    assert request(server.port, "POST", "/v2/models/pipe/infer", body).status == 200
    wait_for(lambda: '"request_id":"steps-1"' in server.log(), what="the access-log line")
    lines = [json.loads(line) for line in server.log().splitlines() if '"request_id":"steps-1' in line]
    [pipeline_line] = [line for line in lines if line["request_id"] == "steps-1"]
    assert set(pipeline_line["steps_ms"]) == {"pre", "side", "model", "post"}
    assert all(ms > 0 for ms in pipeline_line["steps_ms"].values())
    assert " steps=pre:" in pipeline_line["message"] or " steps=side:" in pipeline_line["message"]
    assert {line["request_id"] for line in lines} >= {"steps-1/pre", "steps-1/model", "steps-1/post"}


def test_pipeline_metadata_and_validation(pipeline_server):
    server, _ = pipeline_server
    metadata = request(server.port, "GET", "/v2/models/pipe").json()
    assert metadata["platform"] == "ensemble"
    assert [tensor["name"] for tensor in metadata["outputs"]] == ["TOP", "SCORES", "NEGATED"]
    bad = request(
        server.port, "POST", "/v2/models/pipe/infer", infer_body({"INPUT": np.ones((1, 8), np.float32)})
    )
    assert bad.status == 400
    assert "expects [-1, 16]" in bad.error


def test_a_failing_step_is_named(pipeline_server):
    server, _ = pipeline_server
    reply = request(
        server.port, "POST", "/v2/models/pipe/infer", infer_body({"INPUT": np.full((1, 16), 13, np.float32)})
    )
    assert reply.status == 500
    assert "pipeline 'pipe' step 'pre' (model 'scale')" in reply.error
    assert "thirteen is unlucky" in reply.error
    ok = request(
        server.port, "POST", "/v2/models/pipe/infer", infer_body({"INPUT": np.ones((1, 16), np.float32)})
    )
    assert ok.status == 200


def test_pipeline_and_direct_traffic_batch_together(pipeline_server):
    """mm8 runs a batch when 8 rows are queued: 4 direct requests and 4 through pipe8 make exactly one."""
    server, root = pipeline_server

    def sizes() -> dict[int, int]:
        [entry] = request(server.port, "GET", "/v2/models/mm8/stats").json()["model_stats"]
        return {b["batch_size"]: b["compute_infer"]["count"] for b in entry["batch_stats"]}

    before = sizes()
    rows = np.random.default_rng(5).standard_normal((8, 16)).astype(np.float32)
    with ThreadPoolExecutor(max_workers=8) as pool:
        direct = [
            pool.submit(request, server.port, "POST", "/v2/models/mm8/infer", infer_body({"X": row[None]}))
            for row in rows[:4]
        ]
        piped = [
            pool.submit(
                request, server.port, "POST", "/v2/models/pipe8/infer", infer_body({"INPUT": row[None]})
            )
            for row in rows[4:]
        ]
        replies = [call.result() for call in direct + piped]
    expected = ort.InferenceSession(str(root / "mm.onnx")).run(None, {"X": rows})[0]
    for index, reply in enumerate(replies):
        assert reply.status == 200, reply.body
        np.testing.assert_allclose(
            np.array(reply.json()["outputs"][0]["data"], np.float32), expected[index], rtol=1e-5
        )
    grown = {
        size: count - before.get(size, 0) for size, count in sizes().items() if count > before.get(size, 0)
    }
    assert grown == {8: 1}, "one batch of mm8 held the direct and the pipeline requests together"
    stats = request(server.port, "GET", "/v2/models/pipe8/stats").json()["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == 4


def test_a_pipeline_wired_to_nothing_is_refused_at_load(tmp_path: Path):
    (tmp_path / "config.yaml").write_text(
        """
models:
  pipe:
    backend: pipeline
    pipeline:
      inputs: [{name: INPUT, datatype: FP32, shape: [-1, 16]}]
      outputs: [{name: OUT, datatype: FP32, shape: [-1, 16], from: a.y}]
      steps:
        - {name: a, model: scale, inputs: {x: NOT_AN_INPUT}}
"""
    )
    command = [
        sys.executable,
        "-m",
        "edgeinfer",
        "serve",
        "--config",
        str(tmp_path / "config.yaml"),
        "--no-grpc",
    ]
    command += ["--http-port", str(free_port()), "--metrics-port", str(free_port())]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "step 'a': input 'x' comes from 'NOT_AN_INPUT'" in result.stderr
