"""The degradation ladder against the real server: a model over its p95 level hands its traffic to the
fallback after the enter dwell, takes it back after the exit dwell, and a load that hovers at either
level does not make it switch.

The latency is the client's choice (the ``Sleeper`` model answers after the request's ``sleep_ms``),
so the phases do not depend on this machine's speed: 80 ms is far above the 40 ms enter level, 25 ms
sits between the levels and 0 ms is far below the 15 ms exit level.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.support import ROOT, ServerProcess, infer_body, metric, request, scrape

DWELL_S = 2.0
CONFIG = f"""
models:
  big:
    backend: python
    model_class: "tests.python_models.models:Sleeper"
    max_batch_size: 0
    fallback: {{model: small, enter_p95_ms: 40, exit_p95_ms: 15, enter_after_s: {DWELL_S},
                exit_after_s: {DWELL_S}, window_s: 0.3}}
  small: {{backend: python, model_class: "tests.python_models.models:Sleeper", max_batch_size: 0}}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("fallback")
    (root / "config.yaml").write_text(CONFIG)
    server = ServerProcess(["--config", str(root / "config.yaml")], env={"PYTHONPATH": str(ROOT)})
    server.start(root / "log")
    yield server
    server.stop()


def call(server: ServerProcess, sleep_ms: float) -> dict:
    body = infer_body({"x": np.ones((1, 4), np.float32)}, parameters={"sleep_ms": sleep_ms})
    reply = request(server.port, "POST", "/v2/models/big/infer", body)
    assert reply.status == 200, reply.body
    return reply.json()


def load(server: ServerProcess, pattern: list[tuple[float, float]], seconds: float) -> list[str]:
    """Requests back to back for ``seconds``, cycling through (sleep_ms, for how long); which model
    answered each."""
    answered = []
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < seconds:
        cycle = sum(duration for _, duration in pattern)
        answered.append(call(server, phase_value(pattern, elapsed % cycle))["model_name"])
    return answered


def phase_value(pattern: list[tuple[float, float]], at: float) -> float:
    for value, duration in pattern:
        if at < duration:
            return value
        at -= duration
    return pattern[-1][0]


def until_answered_by(
    server: ServerProcess, model: str, sleep_ms: float, timeout_s: float
) -> tuple[float, dict]:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        answer = call(server, sleep_ms)
        if answer["model_name"] == model:
            return time.monotonic() - started, answer
    raise AssertionError(f"no answer from {model} within {timeout_s} s")


def switches(server: ServerProcess) -> tuple[float, float, float]:
    samples = scrape(server.metrics_port)
    return (
        metric(
            samples, "edgeinfer_fallback_switches_total", model="big", fallback="small", direction="enter"
        ),
        metric(samples, "edgeinfer_fallback_switches_total", model="big", fallback="small", direction="exit"),
        metric(samples, "edgeinfer_model_degraded", model="big", fallback="small"),
    )


def test_the_ladder_steps_down_and_back_with_hysteresis_and_does_not_flap(server):
    # hovering at the enter level: above it for 0.8 s, below for 0.8 s: never DWELL_S in a row (each
    # hovering phase ends on the side away from the next switch, so the next dwell starts with it)
    assert set(load(server, [(80, 0.8), (0, 0.8)], 2 * 1.6)) == {"big"}
    assert switches(server) == (0, 0, 0)

    # above it for good: the fallback answers after the dwell, and says so
    took_s, answer = until_answered_by(server, "small", 80, timeout_s=DWELL_S + 8)
    assert took_s >= DWELL_S - 0.3  # the window (0.3 s) may already hold slow requests from before
    assert answer["model_version"] == "1"
    assert answer["parameters"] == {"fallback_from": "big"}
    assert switches(server) == (1, 0, 1)

    # gRPC clients see which model answered too
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    x = grpcclient.InferInput("x", [1, 4], "FP32")
    x.set_data_from_numpy(np.ones((1, 4), np.float32))
    response = client.infer("big", [x], parameters={"sleep_ms": 25}).get_response()
    assert response.model_name == "small"
    assert response.parameters["fallback_from"].string_param == "big"
    client.close()

    # between the levels, and hovering at the exit level: it stays down
    assert set(load(server, [(0, 0.8), (25, 0.8)], 2 * 1.6)) == {"small"}
    assert switches(server) == (1, 0, 1)

    # below the exit level for good: the model itself answers again after the dwell
    took_s, answer = until_answered_by(server, "big", 0, timeout_s=DWELL_S + 8)
    assert took_s >= DWELL_S - 0.3
    assert "parameters" not in answer
    assert switches(server) == (1, 1, 0)
    log = server.log()
    assert "model big: p95 " in log
    assert "stayed above 40 ms for 2 s; requests go to small" in log
    assert "stayed below 15 ms for 2 s; requests come back from small" in log


def test_a_model_without_its_fallback_loaded_answers_itself(server, tmp_path):
    """Unloading the fallback while the ladder is down: the model answers (nothing is refused)."""
    until_answered_by(server, "small", 80, timeout_s=DWELL_S + 8)
    assert request(server.port, "POST", "/v2/repository/models/small/unload").status == 200
    answer = call(server, 80)
    assert answer["model_name"] == "big"
    assert switches(server)[2] == 1  # still down: it is the fallback that is missing
    assert request(server.port, "POST", "/v2/repository/models/small/load").status == 200
    assert call(server, 80)["model_name"] == "small"
