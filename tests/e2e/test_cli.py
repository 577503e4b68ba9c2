"""The command line: version, help, configuration errors, load failures, and `make serve`."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT, ServerProcess, free_port, matmul_model, request, wait_ready


def edgeinfer(*args: str, cwd: Path = ROOT, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgeinfer", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
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
