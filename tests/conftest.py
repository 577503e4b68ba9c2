from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeinfer import native
from tests.support import (
    EXAMPLES,
    ServerProcess,
    failing_model,
    matmul_model,
    row_changing_model,
    slow_model,
)


def pytest_configure(config: pytest.Config) -> None:
    """Python imports a compiled module before its source (``edgeinfer/native.py``): tests run against
    one built before its source last changed would test the old code."""
    stale = native.stale()
    if stale:
        pytest.exit(
            f"compiled modules older than their sources: {', '.join(stale)}; rebuild them (make install) "
            "or run pytest through make test, which does",
            returncode=4,
        )


@pytest.fixture(scope="session")
def example_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The bundled example configuration, served once for the whole session."""
    server = ServerProcess(["--config", str(EXAMPLES / "config.yaml")])
    server.start(tmp_path_factory.mktemp("example") / "server.log")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def special_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Models for queueing and failure tests, and a config that serves them."""
    root = tmp_path_factory.mktemp("special")
    matmul_model(root / "matmul.onnx")
    slow_model(root / "slow.onnx", row_s=0.1)  # 8 rows: 0.8 s on any machine
    failing_model(root / "failing.onnx")
    row_changing_model(root / "row_changing.onnx")
    matmul_model(root / "fixed.onnx", fixed_batch=2)
    (root / "config.yaml").write_text(
        """
models:
  matmul: {model_path: matmul.onnx, max_batch_size: 16, batch_timeout_ms: 2}
  slow:  # queue limits: requests queue behind the running batch, none is formed ahead of a free slot
    model_path: slow.onnx
    backend_config: {intra_op_num_threads: 1}
    max_batch_size: 8
    max_queue_size: 4
    prefetch_batches: 0
  slow_shared:  # fixed batching: queued requests merge (adaptive would run this per-row model one by one)
    model_path: slow.onnx
    backend_config: {intra_op_num_threads: 1}
    max_batch_size: 8
    batch_timeout_ms: 0
  slow_unbatched:  # the queue's own behaviour: nothing is formed ahead of a free slot
    model_path: slow.onnx
    backend_config: {intra_op_num_threads: 1}
    max_batch_size: 0
    prefetch_batches: 0
  slow_slo:  # any queue behind a running batch of this model misses 1 ms, on any machine
    model_path: slow.onnx
    backend_config: {intra_op_num_threads: 1}
    max_batch_size: 8
    slo: {p99_ms: 1}
  failing: {model_path: failing.onnx, max_batch_size: 0}
  row_changing: {model_path: row_changing.onnx}
  fixed: {model_path: fixed.onnx}
server: {max_request_size_mb: 0.05}
"""
    )
    return root


# In CI every test runs: a skip there means a machine without what the suite needs (make system-packages
# installs it all), so it fails instead. Only tests marked gpu may skip (no machine of CI's has one): a
# whole module skipped at import (importorskip) always fails, as its markers are not known then, so a
# module of GPU tests checks for the GPU in its tests, not at import.
IN_CI = os.environ.get("CI", "").lower() in ("true", "1")


def _skip_is_a_failure(report: pytest.TestReport | pytest.CollectReport, gpu: bool) -> None:
    if IN_CI and report.skipped and not gpu and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, which runs every test (make system-packages): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    _skip_is_a_failure(outcome.get_result(), item.get_closest_marker("gpu") is not None)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield
    _skip_is_a_failure(outcome.get_result(), False)  # a module skipped whole (importorskip)


@pytest.fixture(scope="session")
def special_server(special_models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(["--config", str(special_models / "config.yaml")])
    server.start(tmp_path_factory.mktemp("special-log") / "server.log")
    yield server
    server.stop()
