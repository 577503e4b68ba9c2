"""Version policies, repository polling and configured warmup, against the real server."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.support import (
    ServerProcess,
    dynamic_model,
    infer_body,
    matmul_model,
    request,
    save_model,
    wait_for,
)


def index(port: int) -> dict[tuple[str, str], dict]:
    entries = request(port, "POST", "/v2/repository/index").json()
    return {(entry["name"], entry["version"]): entry for entry in entries}


ONE_ROW = infer_body({"X": np.ones((1, 16), np.float32)})


@pytest.mark.parametrize(
    ("policy", "served"),
    [("", {"3"}), ("version_policy: {latest: 2}\n", {"2", "3"}), ("version_policy: all\n", {"1", "2", "3"}),
     ("version_policy: {specific: [1, 3]}\n", {"1", "3"})],
)  # fmt: skip
def test_version_policies(tmp_path: Path, policy: str, served: set[str]):
    for version in (1, 2, 3):
        matmul_model(tmp_path / "repo" / "m" / str(version) / "model.onnx", seed=version)
    (tmp_path / "repo" / "m" / "config.yaml").write_text(policy)
    server = ServerProcess(["--model-repository", str(tmp_path / "repo")]).start(tmp_path / "log")
    try:
        metadata = request(server.port, "GET", "/v2/models/m").json()
        assert set(metadata["versions"]) == served
        reply = request(
            server.port, "POST", "/v2/models/m/infer", infer_body({"X": np.ones((1, 16), np.float32)})
        )
        assert reply.json()["model_version"] == max(served, key=int)
    finally:
        server.stop()


def test_polling_picks_up_new_changed_and_removed_models(tmp_path: Path):
    repo = tmp_path / "repo"
    matmul_model(repo / "m" / "1" / "model.onnx", seed=1)
    config = tmp_path / "config.yaml"
    config.write_text(f"model_store_path: {repo}\nrepository: {{poll_interval_s: 0.2}}\n")
    server = ServerProcess(["--config", str(config)]).start(tmp_path / "log")
    port = server.port
    x = ONE_ROW
    try:
        staged = tmp_path / "staged"
        matmul_model(staged / "2" / "model.onnx", seed=2)
        shutil.move(staged / "2", repo / "m" / "2")  # a new version appears whole
        wait_for(lambda: request(port, "POST", "/v2/models/m/infer", x).json().get("model_version") == "2")
        assert index(port)["m", "1"]["state"] == "UNAVAILABLE", "latest: 1 retires the old version"

        matmul_model(staged / "n" / "1" / "model.onnx", seed=3)
        shutil.move(staged / "n", repo / "n")  # a new model
        wait_for(lambda: request(port, "GET", "/v2/models/n/ready").status == 200)

        (repo / "n" / "config.yaml").write_text("max_batch_size: 3\n")  # a changed config
        wait_for(lambda: request(port, "GET", "/v2/models/n/config").json().get("max_batch_size") == 3)

        shutil.rmtree(repo / "n")  # a removed model
        wait_for(lambda: request(port, "GET", "/v2/models/n/ready").status == 503)
        assert index(port)["n", "1"]["reason"] == "unloaded"
        assert request(port, "POST", "/v2/models/m/infer", x).status == 200
    finally:
        server.stop()


def test_warmup_with_configured_shapes_and_a_sample(tmp_path: Path):
    model_dir = tmp_path / "repo" / "d"
    dynamic_model(model_dir / "1" / "model.onnx")
    sample = {"inputs": [{"name": "X", "shape": [2, 5], "datatype": "FP32", "data": [1.0] * 10}]}
    (model_dir / "sample.json").write_text(json.dumps(sample))
    (model_dir / "config.yaml").write_text(
        "warmup: {batch_sizes: [1, 4], shapes: {X: [7]}, samples: [sample.json]}\n"
    )
    server = ServerProcess(["--model-repository", str(tmp_path / "repo")]).start(tmp_path / "log")
    try:
        assert "warmup" in server.log()
        assert "2 synthetic runs, 1 samples" in server.log()
        metrics = request(server.port, "GET", "/metrics").body.decode()
        assert 'edgeinfer_model_warmup_duration_seconds{model="d",version="1"}' in metrics
        stats = request(server.port, "GET", "/v2/models/d/stats").json()["model_stats"][0]
        assert stats["execution_count"] == 0, "warmup runs are not counted as requests"
    finally:
        server.stop()


def test_a_model_whose_warmup_fails_is_not_served(tmp_path: Path):
    model_dir = tmp_path / "repo" / "m"
    matmul_model(model_dir / "1" / "model.onnx")
    (model_dir / "bad.json").write_text(
        '{"inputs": [{"name": "X", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}'
    )
    (model_dir / "config.yaml").write_text("warmup: {samples: [bad.json]}\n")
    command = [sys.executable, "-m", "edgeinfer", "serve", "--model-repository", str(tmp_path / "repo")]
    command += ["--no-grpc", "--http-port", "0", "--metrics-port", "0"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "warmup sample" in result.stderr
    assert "does not fit the model" in result.stderr


def numbers_as_strings_model(path: Path) -> Path:
    """TEXT BYTES [batch, 4] -> Cast to INT32 -> Add 1 -> Y INT32: as Triton's example simple_string, a
    graph whose strings must be numbers (the synthetic warmup's empty strings are not)."""
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["TEXT"], ["N"], to=TensorProto.INT32),
            helper.make_node("Add", ["N", "ONE"], ["Y"]),
        ],
        "numbers_as_strings",
        [helper.make_tensor_value_info("TEXT", TensorProto.STRING, ["batch", 4])],
        [helper.make_tensor_value_info("Y", TensorProto.INT32, ["batch", 4])],
        [numpy_helper.from_array(np.ones(1, np.int32), "ONE")],
    )
    return save_model(graph, path)


def test_a_model_that_fails_the_synthetic_warmup_serves_unwarmed_and_another_loads(tmp_path: Path):
    """The zeros are our guess at an input: ONNX Runtime failing on them is a WARNING naming the model
    and the reason, not a server that stops; the model then answers inputs that fit it."""
    numbers_as_strings_model(tmp_path / "repo" / "strings" / "1" / "model.onnx")
    matmul_model(tmp_path / "repo" / "m" / "1" / "model.onnx")
    server = ServerProcess(["--model-repository", str(tmp_path / "repo")]).start(tmp_path / "log")
    try:
        warning = [line for line in server.log().splitlines() if "serves unwarmed" in line]
        assert len(warning) == 2, server.log()  # batch sizes 1 and 8
        assert "WARNING" in warning[0]
        assert "model 'strings': the synthetic warmup at batch size 1 failed" in warning[0]
        assert "Cast" in warning[0], "the reason is ONNX Runtime's own"
        assert "2 synthetic runs of which 2 failed" in server.log()
        body = {
            "inputs": [{"name": "TEXT", "shape": [1, 4], "datatype": "BYTES", "data": ["1", "2", "3", "-4"]}]
        }
        reply = request(server.port, "POST", "/v2/models/strings/infer", body)
        assert reply.status == 200, reply.body
        assert reply.json()["outputs"][0]["data"] == [2, 3, 4, -3]
        assert request(server.port, "GET", "/v2/models/m/ready").status == 200
    finally:
        server.stop()


def test_a_broken_version_found_by_polling_leaves_the_old_one_serving(tmp_path: Path):
    repo = tmp_path / "repo"
    matmul_model(repo / "m" / "1" / "model.onnx", seed=1)
    config = tmp_path / "config.yaml"
    config.write_text(
        f"model_store_path: {repo}\nrepository: {{poll_interval_s: 0.2}}\nlogging: {{format: json}}\n"
    )
    server = ServerProcess(["--config", str(config)]).start(tmp_path / "log")
    port = server.port
    try:
        broken = repo / "m" / "2" / "model.onnx"
        broken.parent.mkdir()
        broken.write_bytes(b"half a model")
        wait_for(lambda: index(port).get(("m", "2"), {}).get("state") == "UNAVAILABLE")
        failed = index(port)["m", "2"]
        assert "cannot load" in failed["reason"]
        assert str(broken) in failed["reason"]
        assert index(port)["m", "1"]["state"] == "READY"
        reply = request(port, "POST", "/v2/models/m/infer", ONE_ROW)
        assert (reply.status, reply.json()["model_version"]) == (200, "1"), "the old version serves on"
        assert "repository: cannot load model 'm'" in server.log()
        matmul_model(broken, seed=2)  # fixed: the next poll loads it
        wait_for(lambda: request(port, "POST", "/v2/models/m/infer", ONE_ROW).json()["model_version"] == "2")
    finally:
        server.stop()
