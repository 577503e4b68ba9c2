"""``workers: N``: one supervisor and N worker processes on the same ports, against the real server.

Marked ``workers`` (multi-process, slow-ish): run in CI, skip locally with ``-m "not workers"``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support import (
    ROOT,
    ServerProcess,
    access_lines,
    children,
    free_port,
    infer_body,
    matmul_model,
    metric,
    request,
    save_model,
    scrape,
    slow_model,
    wait_for,
    wait_ready,
)

pytestmark = pytest.mark.workers

ONE_ROW = infer_body({"X": np.ones((1, 16), np.float32)})


def image_model(path: Path) -> Path:
    """input FP32 [N,3,224,224] -> mean per channel -> Gemm 3x1000 -> logits [N,1000] (a ResNet's I/O)."""
    from onnx import TensorProto, helper, numpy_helper

    weights = np.random.default_rng(0).standard_normal((3, 1000)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["input"], ["pooled"], axes=[2, 3], keepdims=0),
            helper.make_node("MatMul", ["pooled", "W"], ["logits"]),
        ],
        "resnet_like",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 224, 224])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 1000])],
        [numpy_helper.from_array(weights, "W")],
    )
    return save_model(graph, path)


SEED_000_CONFIG = ROOT / "tests" / "data" / "seed_000_config.yaml"


def test_seed_000_config_as_written_starts_and_serves(tmp_path: Path):
    shutil.copy(SEED_000_CONFIG, tmp_path / "config.yaml")
    (tmp_path / "model_store").mkdir()
    model = image_model(tmp_path / "resnet50_dynamic.onnx")
    server = ServerProcess(["--config", "config.yaml"], cwd=tmp_path).start(tmp_path / "log")
    try:
        assert len(children(server.process.pid)) == 2, "two workers"
        images = np.random.default_rng(1).standard_normal((2, 3, 224, 224)).astype(np.float32)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
        tensor = httpclient.InferInput("input", list(images.shape), "FP32")
        tensor.set_data_from_numpy(images)
        logits = client.infer("resnet50", [tensor]).as_numpy("logits")
        client.close()
        expected = ort.InferenceSession(str(model)).run(None, {"input": images})[0]
        np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4)
        samples = scrape(server.metrics_port)
        assert metric(samples, "edgeinfer_workers") == 2
        assert metric(samples, "edgeinfer_worker_ready", worker="0") == 1
        assert metric(samples, "edgeinfer_worker_ready", worker="1") == 1
        info = [labels for labels in samples["edgeinfer_model_info"] if ("model", "resnet50") in labels]
        assert ("execution_provider", "CPUExecutionProvider") in info[0], "no CUDA here: CPU, as configured"
    finally:
        server.stop()


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("workers")
    matmul_model(root / "repo" / "alpha" / "1" / "model.onnx", seed=1)
    matmul_model(root / "repo" / "beta" / "1" / "model.onnx", seed=2)
    (root / "config.yaml").write_text(
        f"model_store_path: {root / 'repo'}\nlogging: {{format: json}}\nserver: {{workers: 2}}\n"
    )
    server = ServerProcess(["--config", str(root / "config.yaml")]).start(root / "log")
    yield server, root / "repo"
    server.stop()


def test_connections_reach_both_workers_and_every_count_adds_up(two_workers):
    server, _ = two_workers
    before = scrape(server.metrics_port)
    requests_total = "edgeinfer_inference_requests_total"
    labels = {"model": "beta", "version": "1", "protocol": "http", "status": "success"}
    start = before.get(requests_total, {}).get(tuple(sorted(labels.items())), 0.0)
    with ThreadPoolExecutor(max_workers=8) as pool:  # a new connection per request, 8 at a time
        statuses = list(
            pool.map(
                lambda _: request(server.port, "POST", "/v2/models/beta/infer", ONE_ROW).status, range(80)
            )
        )
    assert statuses == [200] * 80
    workers = {line["worker"] for line in access_lines(server) if line["model"] == "beta"}
    assert workers == {0, 1}, "both workers answered"
    for port in (server.metrics_port, server.port):  # the metrics port and /metrics of any worker
        assert metric(scrape(port), requests_total, **labels) - start == 80
    http = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        over_http = http.get_inference_statistics("beta")["model_stats"][0]
        over_grpc = grpc.get_inference_statistics("beta", as_json=True)["model_stats"][0]
    finally:
        http.close()
        grpc.close()
    assert over_http["inference_count"] >= 80
    assert int(over_grpc["inference_count"]) == over_http["inference_count"]
    assert (
        int(over_grpc["inference_stats"]["success"]["count"])
        == over_http["inference_stats"]["success"]["count"]
    )


def test_a_load_or_unload_sent_to_one_worker_applies_to_all(two_workers):
    server, _ = two_workers
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        client.unload_model("alpha")
        replies = [request(server.port, "POST", "/v2/models/alpha/infer", ONE_ROW) for _ in range(30)]
        assert {reply.status for reply in replies} == {503}, "no worker serves it any more"
        assert all("no version ready" in reply.error for reply in replies)
        indexes = [request(server.port, "POST", "/v2/repository/index").json() for _ in range(10)]
        assert all(index == indexes[0] for index in indexes), "the same index whichever worker answers"
        assert {"name": "alpha", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"} in indexes[0]
        client.load_model("alpha", config='{"max_batch_size": 4}')
        configs = [request(server.port, "GET", "/v2/models/alpha/config").json() for _ in range(20)]
        assert {config["max_batch_size"] for config in configs} == {4}, "every worker reloaded it"
        replies = [request(server.port, "POST", "/v2/models/alpha/infer", ONE_ROW) for _ in range(30)]
        assert {reply.status for reply in replies} == {200}
        missing = request(server.port, "POST", "/v2/repository/models/nope/load")
        assert missing.status == 404
        assert "no model named 'nope'" in missing.error
    finally:
        client.close()


def test_polling_reloads_every_worker_without_a_failed_request(tmp_path: Path):
    repo = tmp_path / "repo"
    matmul_model(repo / "m" / "1" / "model.onnx", seed=1)
    config = tmp_path / "config.yaml"
    config.write_text(
        f"model_store_path: {repo}\nrepository: {{poll_interval_s: 0.2}}\nserver: {{workers: 2}}\n"
    )
    server = ServerProcess(["--config", str(config)]).start(tmp_path / "log")
    seen: list[tuple[int, str]] = []
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            reply = request(server.port, "POST", "/v2/models/m/infer", ONE_ROW)
            seen.append((reply.status, reply.json().get("model_version", "")))

    threads = [threading.Thread(target=traffic) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: len(seen) >= 20, what="traffic flowing")
        staged = tmp_path / "staged"
        matmul_model(staged / "2" / "model.onnx", seed=2)
        shutil.move(staged / "2", repo / "m" / "2")
        # every worker serves version 2: 40 answers in a row from it, over new connections
        wait_for(
            lambda: len(seen) > 40 and {version for _, version in seen[-40:]} == {"2"},
            30,
            "version 2 everywhere",
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        server.stop()
    assert {status for status, _ in seen} == {200}, "no request failed during the reload"


def test_sigterm_drains_every_worker_and_exits_0(tmp_path: Path):
    slow_model(tmp_path / "slow.onnx")
    (tmp_path / "config.yaml").write_text(
        "models:\n  slow: {model_path: slow.onnx, max_batch_size: 0,"
        " backend_config: {intra_op_num_threads: 1}}\nserver: {workers: 2}\n"
    )
    server = ServerProcess(["--config", str(tmp_path / "config.yaml")]).start(tmp_path / "log")
    body = infer_body({"X": np.full((3, 256), 0.01, np.float32)})
    with ThreadPoolExecutor(max_workers=6) as pool:
        replies = [pool.submit(request, server.port, "POST", "/v2/models/slow/infer", body) for _ in range(6)]

        def received() -> bool:
            samples = scrape(server.metrics_port)
            return metric(samples, "edgeinfer_inflight_requests", model="slow", version="1") == 6

        wait_for(received, what="six requests received")
        server.process.send_signal(signal.SIGTERM)
        statuses = [reply.result().status for reply in replies]
    assert server.process.wait(timeout=60) == 0
    assert statuses == [200] * 6, "requests already received were answered"
    assert server.log().count("shutting down") == 2, "both workers drained"


def test_a_killed_worker_is_restarted_while_the_other_keeps_serving(tmp_path: Path):
    repo = tmp_path / "repo"
    matmul_model(repo / "m" / "1" / "model.onnx")
    server = ServerProcess(["--model-repository", str(repo), "--workers", "2"]).start(tmp_path / "log")
    results: list[int | str] = []
    stop = threading.Event()

    def call() -> int | str:
        try:
            return request(server.port, "POST", "/v2/models/m/infer", ONE_ROW, timeout=10).status
        except OSError as error:  # the connection the killed worker had
            return type(error).__name__

    def traffic() -> None:
        while not stop.is_set():
            results.append(call())

    threads = [threading.Thread(target=traffic) for _ in range(4)]
    try:
        for thread in threads:
            thread.start()
        wait_for(lambda: len(results) > 50, what="traffic flowing")
        victim = children(server.process.pid)[1]
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)

        def restarted() -> bool:
            samples = scrape(server.metrics_port)
            restarts = sum(samples.get("edgeinfer_worker_restarts_total", {}).values())
            ready = sum(samples.get("edgeinfer_worker_ready", {}).values())
            return restarts == 1 and ready == 2 and victim not in children(server.process.pid)

        wait_for(restarted, 30, "the worker restarted")
        took = time.monotonic() - killed_at
        during = len(results)
        wait_for(lambda: len(results) > during + 50, what="traffic after the restart")
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        server.stop()
    load_ms = max(float(ms) for ms in re.findall(r"worker \d ready in (\d+) ms", server.log()))
    assert took <= 2.0 + load_ms / 1000, f"ready again in {took:.2f} s (its start-up took {load_ms:.0f} ms)"
    failed = [result for result in results if result != 200]
    assert len(failed) <= len(threads), f"only requests in flight on the killed worker may fail: {failed}"
    assert results[-50:] == [200] * 50


def test_a_worker_that_keeps_dying_is_restarted_with_a_growing_delay(tmp_path: Path):
    marker = tmp_path / "crash"
    (tmp_path / "config.yaml").write_text(
        "models:\n  m: {backend: python, model_class: 'tests.python_models.models:DiesWhileLoading',"
        f" parameters: {{marker: '{marker}'}}}}\nserver: {{workers: 2}}\n"
    )
    server = ServerProcess(["--config", str(tmp_path / "config.yaml")], env={"PYTHONPATH": str(ROOT)})
    server.start(tmp_path / "log")
    body = infer_body({"x": np.ones((1, 4), np.float32)})
    try:
        marker.write_text("die while loading")
        os.kill(children(server.process.pid)[0], signal.SIGKILL)
        wait_for(lambda: "in 1.0 s" in server.log(), 30, "a backed-off restart")
        delays = [float(d) for d in re.findall(r"restarting it in (\d+\.\d) s", server.log())]
        assert delays[:2] == [0.5, 1.0], "each quick failure doubles the delay"
        assert "quick failures in a row" in server.log()
        samples = scrape(server.metrics_port)
        assert sum(samples["edgeinfer_worker_restarts_total"].values()) >= 3
        assert sum(samples["edgeinfer_worker_ready"].values()) == 1
        assert {request(server.port, "POST", "/v2/models/m/infer", body).status for _ in range(10)} == {200}
        marker.unlink()  # the cause goes away: the next restart succeeds
        wait_for(
            lambda: sum(scrape(server.metrics_port)["edgeinfer_worker_ready"].values()) == 2, 30, "recovery"
        )
    finally:
        server.stop()


def test_a_model_that_cannot_load_stops_the_server_with_exit_1(tmp_path: Path):
    (tmp_path / "broken.onnx").write_bytes(b"not a model")
    (tmp_path / "config.yaml").write_text("models:\n  m: {model_path: broken.onnx}\nserver: {workers: 2}\n")
    command = [sys.executable, "-m", "edgeinfer", "serve", "--config", str(tmp_path / "config.yaml")]
    command += ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "broken.onnx" in result.stderr


PROGRAMMATIC = """
import numpy as np
import edgeinfer


class Pid(edgeinfer.Model):  # defined in the script itself: forked workers need no pickling
    outputs = [edgeinfer.TensorSpec("pid", "INT64", (-1,))]

    def predict(self, requests):
        import os
        return [{"pid": np.array([os.getpid()])} for _ in requests]


server = edgeinfer.Server()
server.register(Pid(), name="pid")
server.run(http_port=PORT, grpc_port=None, metrics_port=None, workers=2)
"""


def test_the_programmatic_api_runs_python_models_in_every_worker(tmp_path: Path):
    port = free_port()
    script = tmp_path / "serve.py"
    script.write_text(PROGRAMMATIC.replace("PORT", str(port)))
    process = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path)
    try:
        assert wait_ready(port, 30, process)
        with ThreadPoolExecutor(max_workers=8) as pool:
            replies = list(
                pool.map(lambda _: request(port, "POST", "/v2/models/pid/infer", {"inputs": []}), range(60))
            )
        pids = {reply.json()["outputs"][0]["data"][0] for reply in replies}
        assert pids == set(children(process.pid)), "each worker built and serves its own model"
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
