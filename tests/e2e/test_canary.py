"""Canaries against the real server under continuous load: a candidate that errors is rolled back
within an interval (its share never above its step), one that disagrees with the stable version is
rolled back, a healthy one is promoted to 100 %, a quiet box holds its step, the decision survives a
restart, and the API pauses, resumes and aborts. No client request fails through any of it.

Intervals are 1 s so that the whole walk takes seconds; the verdicts depend on counts, not on speed.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.support import (
    ServerProcess,
    infer_body,
    matmul_model,
    request,
    rollout,
    save_model,
    scrape,
    slow_model,
    wait_for,
)

CANARY = "{version: 2, steps: [10, 50, 100], interval_s: 1, min_requests: 20, %s}"
LIMITS = {
    "errs": "max_error_rate: 0.01",
    "differs": "max_disagreement: 0.2",
    "healthy": "max_error_rate: 0.01, max_disagreement: 0.01",
    "quiet": "max_error_rate: 0.01",
    "slow": "max_p99_ms: 5",  # the candidate takes about 30 ms a row (one thread) on any machine, not < 1
}


def config_text(root: Path) -> str:
    canaries = "".join(f"  {name}: {CANARY % limits}\n" for name, limits in LIMITS.items())
    return (
        f"model_store_path: {root / 'repo'}\n"
        f"repository: {{cache_dir: {root / 'cache'}}}\n"
        f"canaries:\n{canaries}"
        "server: {host: 127.0.0.1}\n"
        "logging: {access_log: false}\n"
    )


def passthrough(path: Path) -> Path:
    """X FP32 [b,4], I INT64 [b] -> Y = X (I is not used): the stable version of ``errs``."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["X"], ["Y"])],
        "passthrough",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("I", TensorProto.INT64, ["batch"]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", None])],
    )
    return save_model(graph, path)


def gather(path: Path) -> Path:
    """Y = X[:, I]: fails when I is out of range (the candidate of ``errs``)."""
    graph = helper.make_graph(
        [helper.make_node("Gather", ["X", "I"], ["Y"], axis=1)],
        "gather",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("I", TensorProto.INT64, ["batch"]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", None])],
    )
    return save_model(graph, path)


def make_repository(root: Path) -> Path:
    repo = root / "repo"
    passthrough(repo / "errs" / "1" / "model.onnx")
    gather(repo / "errs" / "2" / "model.onnx")
    for name, seeds in (("differs", (1, 2)), ("healthy", (1, 1)), ("quiet", (1, 1))):
        for version, seed in enumerate(seeds, start=1):
            matmul_model(repo / name / str(version) / "model.onnx", seed=seed)
    matmul_model(repo / "slow" / "1" / "model.onnx", size=128)
    # calibrated here: a fixed 200 x 128^3 multiply-adds took 4.3 ms a row on a fast CPU, under the limit
    slow_model(repo / "slow" / "2" / "model.onnx", size=128, row_s=0.03)
    for name in ("errs", "differs", "quiet", "slow"):
        (repo / name / "config.yaml").write_text("version_policy: {kind: all}\nmax_batch_size: 0\n")
    # the policy serves only the newest version: the candidate is held besides it until promoted
    (repo / "healthy" / "config.yaml").write_text("version_policy: {latest: 1}\nmax_batch_size: 0\n")
    return repo


def start(root: Path) -> ServerProcess:
    (root / "config.yaml").write_text(config_text(root))
    server = ServerProcess(["--config", str(root / "config.yaml")])
    server.start(root / f"log-{time.monotonic_ns()}")
    return server


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("canary")
    make_repository(root)
    return root


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[ServerProcess]:
    server = start(root)
    yield server
    server.stop()


def state(server: ServerProcess, name: str) -> dict:
    reply = request(server.port, "GET", "/v2/canaries")
    assert reply.status == 200, reply.body
    return reply.json()["canaries"][name]


def requests_by_version(server: ServerProcess, model: str) -> Counter:
    samples = scrape(server.port).get("edgeinfer_inference_requests_total", {})
    counts: Counter = Counter()
    for labels, value in samples.items():
        labels_dict = dict(labels)
        if labels_dict["model"] == model:
            counts[labels_dict["version"]] += value
    return counts


def drive(server: ServerProcess, model: str, until: object, seconds: float, body_of: object) -> Counter:
    """Requests back to back until ``until()`` or ``seconds``; the statuses seen."""
    statuses: Counter = Counter()
    deadline = time.monotonic() + seconds
    index = 0
    while time.monotonic() < deadline and not until():  # type: ignore[operator]
        for _ in range(20):
            reply = request(server.port, "POST", f"/v2/models/{model}/infer", body_of(index))  # type: ignore[operator]
            statuses[reply.status] += 1
            index += 1
    return statuses


def matmul_body(index: int) -> dict:
    return infer_body({"X": np.random.default_rng(index).standard_normal((1, 16)).astype(np.float32)})


def test_a_candidate_that_errors_is_rolled_back_within_an_interval(server: ServerProcess):
    """Which requests reach the candidate is chance (no routing key), so a step may pass before the
    candidate meets a bad input; then it advances, as it should. Checked per step: the candidate's share
    of each step's requests is within that step's share, and the rollback comes within one interval of
    the step it happens in."""

    body = errs_body
    statuses: Counter = Counter()
    steps: list[tuple[float, Counter, Counter, float]] = []  # share, counts before, after, seconds
    share, before, since = (
        state(server, "errs")["share"],
        requests_by_version(server, "errs"),
        time.monotonic(),
    )
    deadline, index = time.monotonic() + 30, 0
    while time.monotonic() < deadline:
        for _ in range(20):
            statuses[request(server.port, "POST", "/v2/models/errs/infer", body(index)).status] += 1
            index += 1
        now = state(server, "errs")
        if now["share"] != share or now["status"] != "running":
            after = requests_by_version(server, "errs")
            steps.append((share, before, after, time.monotonic() - since))
            share, before, since = now["share"], after, time.monotonic()
        if now["status"] != "running":
            break
    final = state(server, "errs")
    assert final["status"] == "rolled_back", final
    assert "error rate" in final["reason"]
    for step_share, was, now_counts, _ in steps:
        n = (now_counts["1"] - was["1"]) + (now_counts["2"] - was["2"])
        candidate = now_counts["2"] - was["2"]
        p = step_share / 100
        # 20 requests may be sent after the step changed and before the test noticed
        assert candidate <= p * n + 5 * math.sqrt(p * (1 - p) * n) + 20, (step_share, candidate, n)
    assert steps[-1][3] < 1.0 + 2.5, "rolled back within one interval of its step (and a tick or two)"
    assert set(statuses) <= {200, 500}  # only the candidate's own failures (on its bad inputs) fail
    # rolled back: all traffic to the stable version, no failures
    counts = requests_by_version(server, "errs")
    after = drive(server, "errs", lambda: False, 0.5, body)
    assert set(after) == {200}
    assert requests_by_version(server, "errs")["2"] == counts["2"]


def test_a_candidate_that_disagrees_is_rolled_back(server: ServerProcess):
    statuses = drive(
        server, "differs", lambda: state(server, "differs")["status"] != "running", 20, matmul_body
    )
    assert set(statuses) == {200}
    assert state(server, "differs")["status"] == "rolled_back"
    assert "compared rows disagree" in state(server, "differs")["reason"]


def test_a_slow_candidate_is_rolled_back(server: ServerProcess):
    def body(index: int) -> dict:
        return infer_body({"X": np.ones((1, 128), np.float32)})

    statuses = drive(server, "slow", lambda: state(server, "slow")["status"] != "running", 20, body)
    assert set(statuses) == {200}
    assert state(server, "slow")["status"] == "rolled_back"
    assert "over max_p99_ms 5" in state(server, "slow")["reason"]


def ready_versions(server: ServerProcess, model: str) -> set[str]:
    index = request(server.port, "POST", "/v2/repository/index").json()
    return {entry["version"] for entry in index if entry["name"] == model and entry["state"] == "READY"}


def test_a_healthy_candidate_is_promoted_step_by_step_and_the_stable_retired(server: ServerProcess):
    assert ready_versions(server, "healthy") == {"1", "2"}, "latest: 1, but the candidate is held"
    seen_steps = set()

    def promoted() -> bool:
        current = state(server, "healthy")
        seen_steps.add(current["share"])
        return current["status"] != "running"

    statuses = drive(server, "healthy", promoted, 30, matmul_body)
    assert set(statuses) == {200}, "no request failed through the steps"
    final = state(server, "healthy")
    assert final["status"] == "promoted", final
    assert {10.0, 50.0} <= seen_steps
    versions = {
        request(server.port, "POST", "/v2/models/healthy/infer", matmul_body(i)).json()["model_version"]
        for i in range(30)
    }
    assert versions == {"2"}
    # promoted: the version policy (latest: 1) applies to every version again and retires the stable
    wait_for(lambda: ready_versions(server, "healthy") == {"2"}, what="version 1 retired")
    assert any("reloaded: version 1 stays only if" in line for line in state(server, "healthy")["history"])


def test_a_quiet_box_holds_its_step_and_the_api_steers(server: ServerProcess):
    time.sleep(2.5)  # more than two intervals without a request
    quiet = state(server, "quiet")
    assert (quiet["status"], quiet["share"]) == ("running", 10.0)
    post = lambda action: request(server.port, "POST", f"/v2/canaries/quiet/{action}")  # noqa: E731
    assert post("pause").json()["status"] == "paused"
    twice = post("pause")
    assert (twice.status, twice.error) == (400, "the canary of 'quiet' is paused: pause does not apply")
    assert post("resume").json()["status"] == "running"
    assert post("abort").json()["share"] == 0.0
    assert {
        request(server.port, "POST", "/v2/models/quiet/infer", matmul_body(i)).json()["model_version"]
        for i in range(30)
    } == {"1"}
    assert post("start").json()["status"] == "running"
    # over gRPC, the same actions and documents
    port = server.grpc_port
    assert rollout(port, "CanaryAction", model_name="quiet", action="pause")["status"] == "paused"
    assert rollout(port, "ListCanaries")["canaries"]["quiet"]["status"] == "paused"
    with pytest.raises(grpc.RpcError) as refused:
        rollout(port, "CanaryAction", model_name="quiet", action="pause")
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == "the canary of 'quiet' is paused: pause does not apply"
    with pytest.raises(grpc.RpcError) as unknown_over_grpc:
        rollout(port, "CanaryAction", model_name="nothing", action="pause")
    assert unknown_over_grpc.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as no_action:
        rollout(port, "CanaryAction", model_name="quiet")
    assert no_action.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        no_action.value.details() == "CanaryAction needs an 'action': start, pause, resume, promote or abort"
    )
    assert post("abort").status == 200
    unknown = request(server.port, "POST", "/v2/canaries/nothing/pause")
    assert (unknown.status, unknown.error) == (
        404,
        "model 'nothing' has no canary (canaries.nothing in the config)",
    )
    wrong = post("explode")
    assert (wrong.status, wrong.error) == (
        400,
        "unknown canary action 'explode'; use one of start, pause, resume, promote, abort",
    )


def errs_body(index: int) -> dict:
    """A request for ``errs``: 5 % of the inputs are out of range for its candidate, which fails on them."""
    bad = index % 20 == 0
    return infer_body({"X": np.ones((1, 4), np.float32), "I": np.array([9 if bad else 1], np.int64)})


def decided(server: ServerProcess, model: str, body_of: object) -> str:
    """Drive ``model`` until its canary has decided (at once if it already has: the tests before this one
    in the module did it), and say how."""
    drive(server, model, lambda: state(server, model)["status"] != "running", 30, body_of)
    return state(server, model)["status"]


def test_decisions_survive_a_restart(server: ServerProcess, root: Path):
    """Run alone too: it makes the two decisions it checks when no test before it has."""
    assert decided(server, "errs", errs_body) == "rolled_back"
    assert decided(server, "healthy", matmul_body) == "promoted"
    wait_for(lambda: ready_versions(server, "healthy") == {"2"}, what="version 1 retired")
    server.stop()
    again = start(root)
    try:
        assert state(again, "errs")["status"] == "rolled_back"
        assert state(again, "healthy")["status"] == "promoted"
        assert ready_versions(again, "healthy") == {"2"}, "promoted: only what the policy keeps loads"
        assert any("resumed after a restart" in line for line in state(again, "errs")["history"])
        body = infer_body({"X": np.ones((1, 4), np.float32), "I": np.array([9], np.int64)})
        assert {request(again.port, "POST", "/v2/models/errs/infer", body).status for _ in range(30)} == {200}
    finally:
        again.stop()


@pytest.mark.workers
def test_with_workers_one_decision_is_followed_by_every_worker(tmp_path: Path):
    make_repository(tmp_path)
    (tmp_path / "config.yaml").write_text(
        config_text(tmp_path).replace("{host: 127.0.0.1}", "{host: 127.0.0.1, workers: 2}")
    )
    server = ServerProcess(["--config", str(tmp_path / "config.yaml")])
    server.start(tmp_path / "log", timeout=60)
    try:
        statuses = drive(
            server, "healthy", lambda: state(server, "healthy")["status"] != "running", 30, matmul_body
        )
        assert set(statuses) == {200}
        final = state(server, "healthy")
        assert final["status"] == "promoted"
        assert sum("promote:" in line for line in final["history"]) == 1, "decided once, by the supervisor"
        # new connections reach both workers: every one routes to the candidate now
        versions = {
            request(server.port, "POST", "/v2/models/healthy/infer", matmul_body(i)).json()["model_version"]
            for i in range(60)
        }
        assert versions == {"2"}
        wait_for(lambda: ready_versions(server, "healthy") == {"2"}, what="version 1 retired on every worker")
    finally:
        assert server.stop() == 0
