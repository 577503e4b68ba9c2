"""A missing optional extra (pyproject's optional-dependencies) at the point of use: one line naming the
feature and the install command, no traceback; the CLI exits 2, and a server exits 2 for a feature of
its configuration and fails the one model's load (exit 1 at start-up) for a model's.

The packages are installed here (the dev extras); each test hides them from the process it starts,
which then fails to import them exactly as where they are not installed (tests/data/hidden_packages).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import EXAMPLES, ROOT, matmul_model

HIDDEN = ROOT / "tests" / "data" / "hidden_packages"


def run_hiding(hidden: str, *arguments: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HIDDEN), str(ROOT)]),
        "EDGEINFER_TEST_HIDDEN": hidden,
    }
    return subprocess.run(
        [sys.executable, "-m", "edgeinfer", *arguments],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=cwd,
    )


def serve_hiding(hidden: str, config: Path) -> subprocess.CompletedProcess[str]:
    return run_hiding(
        hidden, "serve", "--config", str(config), "--no-grpc", "--http-port", "0", "--metrics-port", "0"
    )


def one_line_naming(result: subprocess.CompletedProcess[str], *parts: str) -> None:
    """The last line of stderr (the one the command ends with) says it all, and nothing is a traceback."""
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert all(part in last for part in parts), result.stderr


def test_the_hidden_package_fails_to_import_as_a_missing_one():
    """What the other tests stand on: a hidden package raises ModuleNotFoundError naming it."""
    env = {**os.environ, "PYTHONPATH": str(HIDDEN), "EDGEINFER_TEST_HIDDEN": "onnx"}
    script = "try:\n import onnx.helper\nexcept ModuleNotFoundError as e:\n print(e.name)"
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    )
    assert result.stdout.strip() == "onnx"


@pytest.mark.parametrize(
    ("flags", "feature"),
    [(["--int8", "dynamic"], "edgeinfer optimize --int8"), (["--fp16"], "edgeinfer optimize --fp16")],
)
def test_optimize_without_onnx(tmp_path: Path, flags: list[str], feature: str):
    model = matmul_model(tmp_path / "model.onnx")
    result = run_hiding("onnx", "optimize", str(model), *flags, "-o", str(tmp_path / "out.onnx"))
    assert result.returncode == 2, result.stderr
    one_line_naming(
        result,
        f"edgeinfer optimize: {feature} needs the optional package onnx, which is not installed: "
        "pip install 'edgeinfer[tools]'",
    )
    assert not (tmp_path / "out.onnx").exists()


def test_inspect_without_onnx_says_what_it_leaves_out(tmp_path: Path):
    model = matmul_model(tmp_path / "model.onnx")
    result = run_hiding("onnx", "inspect", str(model), "--json")
    assert result.returncode == 0, result.stderr
    assert "opsets, operators and parameters need onnx: pip install 'edgeinfer[tools]'" in result.stdout


def test_an_s3_repository_without_s3fs(tmp_path: Path):
    (tmp_path / "config.yaml").write_text("model_store_path: s3://models/repository\n")
    result = serve_hiding("s3fs", tmp_path / "config.yaml")
    assert result.returncode == 2, result.stderr
    one_line_naming(
        result,
        "edgeinfer: configuration error: the s3:// model repository s3://models/repository needs the "
        "optional package s3fs, which is not installed: pip install 'edgeinfer[s3]'",
    )


def test_tracing_without_the_opentelemetry_sdk(tmp_path: Path):
    matmul_model(tmp_path / "repo" / "m" / "1" / "model.onnx")
    (tmp_path / "config.yaml").write_text(
        f"model_store_path: {tmp_path / 'repo'}\ntracing: {{enabled: true}}\n"
    )
    result = serve_hiding("opentelemetry", tmp_path / "config.yaml")
    assert result.returncode == 2, result.stderr
    one_line_naming(
        result,
        "edgeinfer: configuration error: tracing.enabled needs the optional package opentelemetry-sdk, "
        "which is not installed: pip install 'edgeinfer[otel]'",
    )


def test_an_openvino_model_without_openvino_fails_its_load(tmp_path: Path):
    matmul_model(tmp_path / "repo" / "ov" / "1" / "model.onnx")
    (tmp_path / "repo" / "ov" / "config.yaml").write_text("backend: openvino\n")
    (tmp_path / "config.yaml").write_text(f"model_store_path: {tmp_path / 'repo'}\n")
    result = serve_hiding("openvino", tmp_path / "config.yaml")
    assert result.returncode == 1, result.stderr
    one_line_naming(
        result,
        "model 'ov' version 1 (",
        "): the openvino backend needs the optional package openvino, which is not installed: "
        "pip install 'edgeinfer[openvino]'",
    )


def test_a_python_model_that_needs_pillow_without_it_fails_its_load(tmp_path: Path):
    """The bundled image pipeline's steps decode images with Pillow (the examples extra)."""
    (tmp_path / "config.yaml").write_text(
        "models:\n  decode: {backend: python, model_class: 'examples.image_pipeline.steps:DecodeImage'}\n"
    )
    result = serve_hiding("PIL", tmp_path / "config.yaml")
    assert result.returncode == 1, result.stderr
    one_line_naming(
        result,
        "model 'decode' version 1",
        "model_class 'examples.image_pipeline.steps:DecodeImage' needs the optional package pillow, which "
        "is not installed: pip install 'edgeinfer[examples]'",
    )
    assert (EXAMPLES / "image_pipeline" / "steps.py").exists()
