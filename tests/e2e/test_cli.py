"""The command line: version, help, configuration errors, load failures, and `make serve`."""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from edgeinfer import native
from tests.support import (
    ROOT,
    ServerProcess,
    access_lines,
    free_port,
    infer_body,
    matmul_model,
    request,
    slow_model,
    wait_for,
    wait_queue,
    wait_ready,
)

ONE_ROW = infer_body({"X": np.ones((1, 16), np.float32)})


def edgeinfer(
    *args: str, cwd: Path = ROOT, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgeinfer", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_version():
    result = edgeinfer("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("edgeinfer ")


def test_serve_help_lists_the_flags():
    result = edgeinfer("serve", "--help")
    assert result.returncode == 0
    for flag in (
        "--config",
        "--model-repository",
        "--host",
        "--http-port",
        "--grpc-port",
        "--metrics-port",
        "--log-level",
    ):
        assert flag in result.stdout


def test_console_script_is_installed():
    script = Path(sys.executable).parent / "edgeinfer"
    assert script.exists()
    assert subprocess.run([str(script), "--version"], capture_output=True, check=False).returncode == 0


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (
            "models:\n  m:\n    model_path: m.onnx\n    max_batchsize: 4\n",
            "models.m.max_batchsize: unknown key",
        ),
        ("models:\n  m:\n    model_path: m.onnx\n    max_batch_size: lots\n", "models.m.max_batch_size"),
        ("models:\n  m:\n    model_path: gone.onnx\n", "models.m.model_path: model file"),
        ("logging: {level: LOUD}\n", "logging.level"),
    ],
)
def test_config_errors_exit_2_with_a_message_and_no_traceback(tmp_path, config, words):
    matmul_model(tmp_path / "m.onnx")
    (tmp_path / "config.yaml").write_text(config)
    result = edgeinfer("serve", "--config", str(tmp_path / "config.yaml"))
    assert result.returncode == 2
    assert words in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_needs_a_config_or_a_repository():
    result = edgeinfer("serve")
    assert result.returncode == 2
    assert "--config" in result.stderr


def test_a_model_that_cannot_load_exits_1_naming_the_file(tmp_path):
    broken = tmp_path / "repo" / "broken" / "1" / "model.onnx"
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"this is not an onnx file")
    result = edgeinfer(
        "serve", "--model-repository", str(tmp_path / "repo"), "--http-port", str(free_port()),
        "--grpc-port", str(free_port()), "--metrics-port", str(free_port()),
    )  # fmt: skip
    assert result.returncode == 1
    assert "model 'broken' version 1" in result.stderr
    assert str(broken) in result.stderr
    assert "Traceback" not in result.stderr


def test_a_repository_version_without_model_file_is_a_config_error(tmp_path):
    (tmp_path / "repo" / "empty" / "1").mkdir(parents=True)
    result = edgeinfer("serve", "--model-repository", str(tmp_path / "repo"))
    assert result.returncode == 2
    assert "model.onnx is missing" in result.stderr


def test_repository_config_yaml_is_validated(tmp_path):
    matmul_model(tmp_path / "repo" / "m" / "1" / "model.onnx")
    (tmp_path / "repo" / "m" / "config.yaml").write_text("max_batch_size: 4\nbatch_timout_millis: 3\n")
    result = edgeinfer("serve", "--model-repository", str(tmp_path / "repo"))
    assert result.returncode == 2
    assert "config.yaml" in result.stderr
    assert "batch_timout_millis: unknown key" in result.stderr


def test_port_in_use_is_a_clear_error(tmp_path, example_server: ServerProcess):
    matmul_model(tmp_path / "repo" / "m" / "1" / "model.onnx")
    result = edgeinfer(
        "serve",
        "--model-repository",
        str(tmp_path / "repo"),
        "--http-port",
        str(example_server.port),
        "--grpc-port",
        str(free_port()),
        "--metrics-port",
        str(free_port()),
        "--host",
        "127.0.0.1",
    )
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{example_server.port}" in result.stderr


def test_sigterm_stops_cleanly(tmp_path):
    matmul_model(tmp_path / "repo" / "m" / "1" / "model.onnx")
    server = ServerProcess(["--model-repository", str(tmp_path / "repo")]).start(tmp_path / "log")
    assert server.process is not None
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=15) == 0
    assert "shutting down" in server.log()


def test_the_log_says_whether_the_request_path_runs_compiled(tmp_path):
    """Built without a compiler or Python's headers the request path runs as Python (setup.py), slower,
    and only the log says so."""
    matmul_model(tmp_path / "repo" / "m" / "1" / "model.onnx")
    server = ServerProcess(["--model-repository", str(tmp_path / "repo")]).start(tmp_path / "log")
    try:
        compiled = native.compiled()
        expected = f"request path compiled ({len(compiled)} modules)" if compiled else "runs as Python"
        assert expected in server.log()
        assert "older than their sources" not in server.log()
    finally:
        server.stop()


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_serve_answers_ready(tmp_path):
    port = free_port()
    env = {**os.environ, "VENV": str(Path(sys.executable).parent.parent)}
    with (tmp_path / "make.log").open("wb") as log:
        process = subprocess.Popen(
            [
                "make",
                "--no-print-directory",
                "serve",
                f"HTTP_PORT={port}",
                f"GRPC_PORT={free_port()}",
                f"METRICS_PORT={free_port()}",
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        if not wait_ready(port, 60):
            pytest.fail("make serve did not become ready:\n" + (tmp_path / "make.log").read_text())
        assert request(port, "GET", "/v2/models/simple/ready").json()["ready"] is True
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=20)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_answers_what_is_in_flight_and_ready_turns_503(tmp_path, signum):
    """While a received request finishes, the server is not ready any more; then it exits 0. SIGINT
    (Ctrl-C) drains as SIGTERM does (README)."""
    slow_model(tmp_path / "slow.onnx")
    (tmp_path / "config.yaml").write_text(
        "models:\n  slow: {model_path: slow.onnx, max_batch_size: 0,"
        " backend_config: {intra_op_num_threads: 1}}\n"
    )
    server = ServerProcess(["--config", str(tmp_path / "config.yaml")]).start(tmp_path / "log")
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    tensor = grpcclient.InferInput("X", [8, 256], "FP32")
    tensor.set_data_from_numpy(np.full((8, 256), 0.01, np.float32))
    answers: queue.Queue = queue.Queue()
    seen: list[int | None] = []
    try:
        client.async_infer("slow", [tensor], lambda result, error: answers.put((result, error)))
        wait_queue(server.port, "slow", 0, 1)
        server.process.send_signal(signum)
        while answers.empty() and None not in seen:  # the gRPC call drains; HTTP answers meanwhile
            seen.append(_status(server.port, "/v2/health/ready"))
        result, error = answers.get(timeout=30)
        assert server.process.wait(timeout=30) == 0
    finally:
        client.close()
        server.stop()
    assert error is None, error
    assert result.as_numpy("Y").shape == (8, 256)
    assert 503 in seen, "not ready while stopping"
    after = seen[seen.index(503) :]  # probes that raced the signal may still say 200
    assert set(after) <= {503, None}, seen


def test_ready_is_503_and_live_200_while_models_load(tmp_path):
    (tmp_path / "config.yaml").write_text(
        "models:\n  slow: {backend: python, model_class: 'tests.python_models.models:SlowToLoad',"
        " warmup: {enabled: false}}\n"
    )
    port = free_port()
    command = [sys.executable, "-m", "edgeinfer", "serve", "--config", str(tmp_path / "config.yaml")]
    command += ["--http-port", str(port), "--no-grpc", "--metrics-port", str(free_port())]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: _status(port, "/v2/health/live") == 200, what="liveness")
        assert _status(port, "/v2/health/ready") == 503, "the model takes a second to load"
        assert _status(port, "/health") == 503
        wait_for(lambda: _status(port, "/v2/health/ready") == 200, what="readiness")
    finally:
        process.terminate()
        process.wait(timeout=20)


def _status(port: int, path: str) -> int | None:
    try:
        return request(port, "GET", path, timeout=2).status
    except OSError:
        return None


@pytest.mark.parametrize(
    ("model", "code", "words"),
    [  # README: 2 for a configuration error (naming the key and file), 1 for a model that cannot load
        (
            "'no_such_module:Model'",
            1,
            "cannot import 'no_such_module' for model_class 'no_such_module:Model'",
        ),
        ("'tests.python_models.models:NotAModel'", 1, "is not a subclass of edgeinfer.Model"),
        (
            "'tests.python_models.models:FailsToLoad'",
            1,
            "FailsToLoad.load failed: FileNotFoundError: weights.bin",
        ),
        (
            "'tests.python_models.models'",
            2,
            "config.yaml: models.m.model_class: 'tests.python_models.models' must look like "
            "'package.module:ClassName'",
        ),
    ],
)
def test_a_python_model_that_cannot_be_built_is_named(tmp_path, model, code, words):
    (tmp_path / "config.yaml").write_text(f"models:\n  m: {{backend: python, model_class: {model}}}\n")
    result = edgeinfer(
        "serve", "--config", str(tmp_path / "config.yaml"), "--no-grpc",
        "--http-port", str(free_port()), "--metrics-port", str(free_port()),
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert result.returncode == code, result.stderr
    assert words in result.stderr
    assert "Traceback" not in result.stderr


def test_a_fixed_first_dimension_with_batching_is_a_load_error(tmp_path):
    matmul_model(tmp_path / "fixed.onnx", fixed_batch=2)
    (tmp_path / "config.yaml").write_text("models:\n  fixed: {model_path: fixed.onnx, max_batch_size: 4}\n")
    result = edgeinfer(
        "serve", "--config", str(tmp_path / "config.yaml"), "--no-grpc",
        "--http-port", str(free_port()), "--metrics-port", str(free_port()),
    )  # fmt: skip
    assert result.returncode == 1
    assert "max_batch_size 4 needs a dynamic first dimension on every input and output" in result.stderr
    assert "X [2, 16], Y [2, 16]; set max_batch_size: 0" in result.stderr


def test_access_log_sampling_keeps_every_failure(tmp_path):
    matmul_model(tmp_path / "m.onnx")
    (tmp_path / "config.yaml").write_text(
        "models:\n  m: {model_path: m.onnx}\nlogging: {format: json, access_log_sample_rate: 0}\n"
    )
    server = ServerProcess(["--config", str(tmp_path / "config.yaml")]).start(tmp_path / "log")
    try:
        for _ in range(20):
            assert request(server.port, "POST", "/v2/models/m/infer", ONE_ROW).status == 200
        bad = infer_body({"X": np.ones((1, 3), np.float32)})
        for _ in range(3):
            assert request(server.port, "POST", "/v2/models/m/infer", bad).status == 400
    finally:
        server.stop()
    access = access_lines(server)
    assert [line["status"] for line in access] == ["client_error"] * 3, "no success sampled at rate 0"


def test_shutdown_delay_keeps_serving_while_not_ready(tmp_path):
    """``shutdown_delay_s``: after SIGTERM, readiness is 503 at once, inference goes on for the delay."""
    matmul_model(tmp_path / "m" / "1" / "model.onnx")
    (tmp_path / "config.yaml").write_text("model_store_path: .\nserver: {shutdown_delay_s: 1.5}\n")
    server = ServerProcess(["--config", str(tmp_path / "config.yaml")]).start(tmp_path / "log")
    assert server.process is not None
    try:
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        wait_for(lambda: _status(server.port, "/v2/health/ready") == 503, what="readiness 503")
        assert request(server.port, "POST", "/v2/models/m/infer", ONE_ROW).status == 200
        assert request(server.port, "GET", "/v2/health/live").status == 200
        assert server.process.wait(timeout=20) == 0
        assert time.monotonic() - signalled >= 1.5
    finally:
        server.stop()
    assert "not ready; serving 1.5 s more before draining" in server.log()
