"""`edgeinfer inspect`, the inspect endpoint, the coverage metric and log line, and `min_ep_coverage`."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ROOT, ServerProcess, matmul_model, metric, request, scrape

CPU = "CPUExecutionProvider"


def edgeinfer(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgeinfer", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_the_cli_reports_shapes_operators_and_coverage(tmp_path: Path):
    model = matmul_model(tmp_path / "m.onnx")
    text = edgeinfer("inspect", str(model))
    assert text.returncode == 0, text.stderr
    assert "input  X: tensor(float) [batch, 16]" in text.stdout
    assert "operators: MatMul x1" in text.stdout
    assert f"{CPU}: 100.0% of 1 nodes" in text.stdout
    report = json.loads(edgeinfer("inspect", str(model), "--json").stdout)
    cpu = report["by_provider"][CPU]
    assert (cpu["coverage"], cpu["nodes"], cpu["fallback_ops"]) == (1.0, 1, {})
    assert report["parameters"] == 256
    assert report["opsets"]["ai.onnx"] >= 13
    missing = json.loads(
        edgeinfer("inspect", str(model), "--json", "--providers", "OpenVINOExecutionProvider").stdout
    )
    assert missing["by_provider"]["OpenVINOExecutionProvider"]["error"].startswith(
        "not in this ONNX Runtime build (it has "
    )
    absent = edgeinfer("inspect", str(tmp_path / "absent.onnx"))
    assert (absent.returncode, absent.stderr.strip()) == (
        2,
        f"edgeinfer inspect: no such file: {tmp_path / 'absent.onnx'}",
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("inspect")
    matmul_model(root / "repo" / "m" / "1" / "model.onnx")
    server = ServerProcess(["--model-repository", str(root / "repo"), "--host", "127.0.0.1"])
    server.start(root / "log")
    yield server
    server.stop()


def test_the_endpoint_the_metric_and_the_log_line_show_coverage(server: ServerProcess):
    reply = request(server.port, "GET", "/v2/models/m/inspect")
    assert reply.status == 200, reply.body
    report = reply.json()
    assert (report["name"], report["version"], report["execution_provider"]) == ("m", "1", CPU)
    assert report["providers"] == [CPU]
    assert report["size_bytes"] > 0
    coverage = report["ep_coverage"]
    assert (coverage["wanted_provider"], coverage["coverage"], coverage["ops"]) == (CPU, 1.0, {"MatMul": 1})
    assert request(server.port, "GET", "/v2/models/m/versions/1/inspect").json() == report
    assert (
        metric(scrape(server.port), "edgeinfer_model_ep_coverage_ratio", model="m", version="1", provider=CPU)
        == 1.0
    )
    assert f"nodes by provider: {CPU} 100%" in server.log()
    unknown = request(server.port, "GET", "/v2/models/nothing/inspect")
    assert (unknown.status, unknown.error) == (404, "unknown model 'nothing'")


def test_min_ep_coverage_refuses_a_model_that_would_run_elsewhere(server: ServerProcess):
    override = {
        "backend_config": {"execution_providers": ["OpenVINOExecutionProvider", CPU]},
        "min_ep_coverage": 0.8,
    }
    reply = request(
        server.port, "POST", "/v2/repository/models/m/load", {"parameters": {"config": json.dumps(override)}}
    )
    assert reply.status == 400, reply.body
    assert "execution provider OpenVINOExecutionProvider is not in this ONNX Runtime build" in reply.error
    assert "min_ep_coverage is 0.8" in reply.error
    assert request(server.port, "GET", "/v2/models/m/ready").status == 200, "the loaded version still serves"
    # without the floor the same request loads, and the metric lists the wanted provider at 0
    del override["min_ep_coverage"]
    reply = request(
        server.port, "POST", "/v2/repository/models/m/load", {"parameters": {"config": json.dumps(override)}}
    )
    assert reply.status == 200, reply.body
    samples = scrape(server.port)
    labels = {"model": "m", "version": "1"}
    assert (
        metric(samples, "edgeinfer_model_ep_coverage_ratio", **labels, provider="OpenVINOExecutionProvider")
        == 0.0
    )
    assert metric(samples, "edgeinfer_model_ep_coverage_ratio", **labels, provider=CPU) == 1.0
