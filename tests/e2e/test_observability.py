"""Metrics, statistics and access logs against a fresh server, after a known mix of requests."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml
from tritonclient.utils import InferenceServerException

from tests.support import (
    ROOT,
    ServerProcess,
    access_lines,
    infer_body,
    json_log_lines,
    matmul_model,
    metric,
    request,
    scrape,
    slow_model,
    wait_for,
)


@pytest.fixture(scope="module", params=[1, 2], ids=["1 worker", "2 workers"])
def observed(request, tmp_path_factory: pytest.TempPathFactory):
    """A server (one process, or two workers) with two models, then a known mix: on `matmul` over HTTP,
    5 successes with V2 ids, 3 bad requests and one with an X-Request-ID header; on `slow` over gRPC
    (one channel, so one worker), a full queue that rejects 3 requests and one request that times out in
    the queue. Each step waits for the state it needs (the queue gauges), never for a fixed time."""
    root = tmp_path_factory.mktemp("observed")
    matmul_model(root / "matmul.onnx")
    slow_model(root / "slow.onnx")
    (root / "config.yaml").write_text(
        """
models:
  matmul: {model_path: matmul.onnx, max_batch_size: 8}
  slow:
    model_path: slow.onnx
    max_batch_size: 0
    max_queue_size: 2
    backend_config: {intra_op_num_threads: 1}
logging: {level: INFO, format: json}
"""
    )
    server = ServerProcess(["--config", str(root / "config.yaml"), "--workers", str(request.param)])
    server.start(root / "server.log")
    try:
        ids = _known_mix(server)
    except BaseException:
        server.stop()
        raise
    yield server, ids
    server.stop()


def _known_mix(server: ServerProcess) -> list[str]:
    port = server.port
    x = np.ones((2, 16), np.float32)
    ids = []
    for index in range(5):
        reply = request(port, "POST", "/v2/models/matmul/infer", infer_body({"X": x}, id=f"mix-{index}"))
        assert reply.status == 200
        ids.append(reply.headers["x-request-id"])
    for _ in range(3):
        assert request(port, "POST", "/v2/models/matmul/infer", infer_body({"X": x[:, :8]})).status == 400
    header_id = request(
        port, "POST", "/v2/models/matmul/infer", infer_body({"X": x}), {"X-Request-ID": "from-header"}
    )
    ids.append(header_id.headers["x-request-id"])

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    results: list[object] = []
    done = threading.Semaphore(0)

    def slow(rows: int, **parameters) -> list:
        tensor = grpcclient.InferInput("X", [rows, 256], "FP32")
        tensor.set_data_from_numpy(np.full((rows, 256), 0.01, np.float32))
        return [tensor]

    def answered(result, error) -> None:
        results.append(error.status() if error is not None else "OK")
        done.release()

    def queue(length: int, inflight: int) -> bool:
        samples = scrape(server.metrics_port)
        return (
            metric(samples, "edgeinfer_queue_length", model="slow", version="1") == length
            and metric(samples, "edgeinfer_inflight_requests", model="slow", version="1") == inflight
        )

    client.async_infer("slow", slow(8), answered)  # the blocker: runs for a while
    wait_for(lambda: queue(0, 1), what="the blocker running")
    for _ in range(2):
        client.async_infer("slow", slow(1), answered)
    wait_for(lambda: queue(2, 3), what="two requests queued behind the blocker")
    rejected = []
    for _ in range(3):
        with pytest.raises(InferenceServerException) as caught:
            client.infer("slow", slow(1))
        rejected.append(caught.value.status())
    for _ in range(3):
        assert done.acquire(timeout=60)
    client.async_infer("slow", slow(8), answered)
    wait_for(lambda: queue(0, 1), what="the second blocker running")
    with pytest.raises(InferenceServerException) as caught:
        client.infer("slow", slow(1), timeout=10_000)  # microseconds, as Triton clients send it
    timeout = caught.value
    assert done.acquire(timeout=60)
    client.close()
    assert rejected == ["StatusCode.RESOURCE_EXHAUSTED"] * 3
    assert timeout.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert "not run" in timeout.message()
    assert results == ["OK"] * 4
    return ids


def value(samples, name: str, **labels) -> float:
    return metric(samples, name, **labels)


def test_request_counters_match_exactly(observed):
    server, _ = observed
    samples = scrape(server.port)
    requests = "edgeinfer_inference_requests_total"
    assert value(samples, requests, model="matmul", version="1", protocol="http", status="success") == 6
    assert value(samples, requests, model="matmul", version="1", protocol="http", status="client_error") == 3
    assert value(samples, requests, model="slow", version="1", protocol="grpc", status="success") == 4
    assert value(samples, requests, model="slow", version="1", protocol="grpc", status="rejected") == 3
    assert value(samples, requests, model="slow", version="1", protocol="grpc", status="timeout") == 1
    duration = "edgeinfer_inference_request_duration_seconds_count"
    assert value(samples, duration, model="matmul", version="1", protocol="http") == 9
    assert value(samples, duration, model="slow", version="1", protocol="grpc") == 8
    decode = "edgeinfer_inference_decode_duration_seconds_count"
    assert value(samples, decode, model="slow", version="1", protocol="grpc") == 8


def test_batch_and_queue_histograms_match_the_batches_run(observed):
    server, _ = observed
    samples = scrape(server.port)
    assert value(samples, "edgeinfer_batch_size_count", model="matmul", version="1") == 6
    assert value(samples, "edgeinfer_batch_size_sum", model="matmul", version="1") == 12  # 2 rows each
    assert value(samples, "edgeinfer_batch_size_bucket", model="matmul", version="1", le="1.0") == 0
    assert value(samples, "edgeinfer_batch_size_bucket", model="matmul", version="1", le="2.0") == 6
    assert value(samples, "edgeinfer_batches_total", model="matmul", version="1") == 6
    assert (
        value(samples, "edgeinfer_batches_total", model="slow", version="1") == 4
    )  # never the timed-out one
    assert (
        value(samples, "edgeinfer_inference_compute_duration_seconds_count", model="slow", version="1") == 4
    )
    assert value(samples, "edgeinfer_inference_queue_duration_seconds_count", model="slow", version="1") == 4
    assert value(samples, "edgeinfer_queue_length", model="slow", version="1") == 0
    assert value(samples, "edgeinfer_inflight_requests", model="slow", version="1") == 0


def test_model_gauges_and_process_metrics(observed):
    server, _ = observed
    samples = scrape(server.port)
    assert value(samples, "edgeinfer_model_ready", model="matmul", version="1") == 1
    info = value(
        samples, "edgeinfer_model_info", model="slow", version="1", backend="onnxruntime",
        execution_provider="CPUExecutionProvider",
    )  # fmt: skip
    assert info == 1
    assert value(samples, "edgeinfer_model_load_duration_seconds", model="slow", version="1") > 0
    assert value(samples, "process_resident_memory_bytes") > 10 * 2**20
    assert "process_open_fds" in samples


def test_the_status_data_has_every_version_and_each_error_with_its_request_id(observed):
    """GET /v2/ui/state (the status page's data): the same counts as the metrics, whichever worker
    answers, and the errors of the known mix from every worker, newest first."""
    server, _ = observed
    state = request(server.port, "GET", "/v2/ui/state").json()
    models = {(entry["name"], entry["version"]): entry for entry in state["models"]}
    matmul, slow = models["matmul", "1"], models["slow", "1"]
    assert (matmul["requests_total"]["success"], matmul["requests_total"]["client_error"]) == (6, 3)
    assert {status: slow["requests_total"][status] for status in ("success", "rejected", "timeout")} == {
        "success": 4,
        "rejected": 3,
        "timeout": 1,
    }
    assert (matmul["state"], matmul["execution_provider"]) == ("READY", "CPUExecutionProvider")
    assert matmul["ep_coverage"] == {"CPUExecutionProvider": 1.0}
    workers = state["server"]["workers"]
    size = (Path(server.args[1]).parent / "matmul.onnx").stat().st_size
    assert matmul["memory_estimate_bytes"] == size * 2.0 * workers  # memory_factor 2, a copy per worker
    assert (matmul["queue_length"], slow["inflight"]) == (0, 0)
    assert state["server"]["rss_bytes"] > 10 * 2**20
    assert state["server"]["uptime_s"] > 0
    errors = state["recent_errors"]
    assert sorted(error["status"] for error in errors) == ["client_error"] * 3 + ["rejected"] * 3 + [
        "timeout"
    ]
    assert [error["time"] for error in errors] == sorted((error["time"] for error in errors), reverse=True)
    assert all(error["request_id"] and error["message"] for error in errors)
    assert {error["model"] for error in errors if error["status"] == "client_error"} == {"matmul"}


def test_the_metrics_port_serves_the_same(observed):
    server, _ = observed
    samples = scrape(server.metrics_port)
    assert value(samples, "edgeinfer_batches_total", model="matmul", version="1") == 6
    assert request(server.metrics_port, "GET", "/v2/health/ready").status == 404


def test_statistics_via_tritonclient_http_and_grpc(observed):
    server, _ = observed
    http = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        over_http = http.get_inference_statistics("matmul")["model_stats"][0]
        over_grpc = grpc.get_inference_statistics("matmul", as_json=True)["model_stats"][0]
    finally:
        http.close()
        grpc.close()
    assert over_http["inference_stats"]["success"]["count"] == 6
    assert over_http["execution_count"] == 6
    assert over_http["inference_count"] == 12
    assert over_http["batch_stats"][0]["batch_size"] == 2
    assert int(over_grpc["inference_stats"]["success"]["count"]) == 6
    assert int(over_grpc["execution_count"]) == 6
    assert int(over_grpc["batch_stats"][0]["compute_infer"]["count"]) == 6


def test_one_json_access_line_per_request(observed):
    server, ids = observed
    # a line is written just after its answer (afterwards.py): the last gRPC answer may come first
    wait_for(lambda: len(access_lines(server)) >= 9 + 8, what="an access line for each request")
    lines, access = json_log_lines(server), access_lines(server)
    assert len(access) == 9 + 8
    first = next(line for line in access if line["request_id"] == "mix-0")
    assert (first["model"], first["version"], first["protocol"]) == ("matmul", "1", "http")
    assert (first["status"], first["rows"], first["batch_size"]) == ("success", 2, 2)
    for key in ("queue_ms", "compute_ms", "total_ms"):
        assert isinstance(first[key], float)
    assert ids[:5] == [f"mix-{index}" for index in range(5)], "the V2 id is the request id"
    assert ids[5] == "from-header"
    assert any(line["request_id"] == "from-header" for line in access)
    timeout = [line for line in access if line["status"] == "timeout"]
    assert len(timeout) == 1
    assert "not run" in timeout[0]["error"]
    assert [line["level"] for line in access if line["status"] == "rejected"] == ["INFO"] * 3
    assert {line["protocol"] for line in access if line["model"] == "slow"} == {"grpc"}
    startup = [line for line in lines if "loaded model slow" in line["message"]]
    assert "CPUExecutionProvider" in startup[0]["message"]


def metric_names(text: str) -> set[str]:
    return set(re.findall(r"\b(edgeinfer_[a-z_]+|process_[a-z_]+)", text))


def exported_names(samples: dict) -> set[str]:
    return set(samples)


@pytest.mark.parametrize("path", ["deploy/grafana/edgeinfer.json", "deploy/prometheus/alerts.yml"])
def test_dashboard_and_alerts_use_only_metrics_that_exist(observed, path: str):
    server, _ = observed
    samples = scrape(server.port)
    text = (ROOT / path).read_text()
    if path.endswith(".yml"):
        rules = yaml.safe_load(text)["groups"][0]["rules"]
        assert all({"alert", "expr"} <= set(rule) for rule in rules)
        text = "\n".join(rule["expr"] for rule in rules)
    else:
        text = "\n".join(
            target["expr"] for panel in json.loads(text)["panels"] for target in panel["targets"]
        )
    used = metric_names(text)
    assert used, "the file uses edgeinfer metrics"
    missing = sorted(name for name in used if name not in exported_names(samples))
    assert not missing, f"{path} uses metrics the server does not export: {missing}"


def test_alert_file_is_valid_yaml_with_a_group():
    document = yaml.safe_load(Path(ROOT / "deploy/prometheus/alerts.yml").read_text())
    assert document["groups"][0]["name"] == "edgeinfer"
