"""The canary's decisions without a server: table-driven verdicts, windows from metrics snapshots, the
latency quantile, and the state that survives a restart."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from edgeinfer.canary import (
    Canaries,
    Window,
    _quantile,
    decide,
    disagreement,
    held_versions,
    stable_version,
    window,
)
from edgeinfer.errors import ModelNotFound
from edgeinfer.metrics import LATENCY_BUCKETS_S, Metrics
from edgeinfer.model_config import CanaryConfig

CONFIG = CanaryConfig(
    version="2", steps=(10, 50, 100), interval_s=60, min_requests=100, max_error_rate=0.01,
    max_p99_ms=80, max_disagreement=0.02,
)  # fmt: skip
HEALTHY = Window(requests=150, errors=0, p99_s=0.010)
STABLE = Window(requests=1000, errors=1, p99_s=0.012)


@pytest.mark.parametrize(
    ("step", "elapsed", "candidate", "rows", "disagreeing", "action", "words"),
    [
        (0, 61, HEALTHY, 0, 0, "advance", "healthy at 10%"),
        (1, 61, HEALTHY, 0, 0, "advance", "healthy at 50%"),
        (2, 61, HEALTHY, 0, 0, "promote", "healthy through every step"),
        (0, 30, HEALTHY, 0, 0, "hold", "interval has not passed"),
        # a quiet box holds however long it waits
        (0, 6000, Window(99, 0, 0.01), 0, 0, "hold", "99 of min_requests 100"),
        # breaches roll back at once, before the interval and before min_requests
        (0, 1, Window(50, 2, 0.01), 0, 0, "rollback", "error rate 4.00% (2/50) over max_error_rate 1.00%"),
        (0, 1, Window(150, 0, 0.2), 0, 0, "rollback", "p99 200.0 ms over max_p99_ms 80"),
        (0, 1, Window(50, 0, 0.2), 0, 0, "hold", "50 of min_requests"),  # p99 of too few requests
        (0, 1, HEALTHY, 200, 10, "rollback", "5.00% of 200 compared rows disagree"),
        (0, 61, HEALTHY, 200, 4, "advance", "healthy"),  # 2 % is not over 2 %
        (0, 61, HEALTHY, 50, 40, "advance", "healthy"),  # too few compared rows to judge
    ],
)
def test_decide(step, elapsed, candidate, rows, disagreeing, action, words):
    verdict = decide(CONFIG, step, elapsed, candidate, STABLE, rows, disagreeing)
    assert verdict.action == action
    assert words in verdict.reason


def test_no_p99_or_disagreement_limit_means_none_is_checked():
    config = CanaryConfig(version="2", min_requests=10, interval_s=1)
    assert decide(config, 0, 2, Window(20, 0, 9.0), STABLE, 100, 100).action == "advance"


def test_the_quantile_interpolates_within_a_bucket_as_prometheus_does():
    counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
    index = LATENCY_BUCKETS_S.index(0.1)  # (0.05, 0.1]
    counts[index] = 100
    assert _quantile(0.99, counts) == pytest.approx(0.05 + 0.05 * 0.99)
    assert _quantile(0.99, [0] * len(counts)) is None
    counts[-1] = 1000  # beyond the last bound: the last bound
    assert _quantile(0.99, counts) == LATENCY_BUCKETS_S[-1]


def snapshot_with(metrics: Metrics) -> dict[str, Any]:
    return metrics.snapshot([])


def test_windows_are_differences_of_two_snapshots():
    metrics = Metrics()
    model = metrics.model("m", "2")
    for _ in range(10):
        model.request_done("http", "success", 0.01, None, None)
    model.request_done("http", "client_error", 0.001, None, None)
    before = snapshot_with(metrics)
    for _ in range(8):
        model.request_done("grpc", "success", 0.02, None, None)
    model.request_done("http", "error", 0.02, None, None)
    model.request_done("http", "client_error", 0.001, None, None)
    stats = metrics.shadow("m", "m/2")
    stats.rows["y"] = [7, 10]
    now = snapshot_with(metrics)
    got = window(before, now, "m", "2")
    assert (got.requests, got.errors) == (9, 1)
    assert got.p99_s is not None
    assert 0.01 < got.p99_s <= 0.025
    assert window(before, now, "m", "1") == Window(0, 0, None)
    assert disagreement(before, now, "m", "m/2") == (10, 3)


def test_the_stable_version_is_the_highest_ready_other_one():
    index = [
        {"name": "m", "version": "1", "state": "READY"},
        {"name": "m", "version": "3", "state": "READY"},
        {"name": "m", "version": "10", "state": "UNAVAILABLE"},
        {"name": "m", "version": "4", "state": "READY"},
        {"name": "x", "version": "9", "state": "READY"},
    ]
    assert stable_version(index, "m", "4") == "3"
    with pytest.raises(ModelNotFound, match="no ready version besides the candidate"):
        stable_version(index, "x", "9")


def test_the_state_survives_a_restart_and_actions_route_traffic(tmp_path: Path):
    applied: list[tuple[str, Any, Any]] = []

    async def snapshot() -> dict[str, Any]:
        return Metrics().snapshot([])

    async def apply(name: str, route: Any, shadow: Any) -> None:
        applied.append((name, route, shadow))

    async def stable_of(name: str, candidate: str) -> str:
        return "1"

    reloaded: list[tuple[str, dict[str, str]]] = []

    async def reload(name: str) -> None:  # what the server's discovery would hold back at this point
        reloaded.append((name, held_versions({"m": CONFIG}, tmp_path)))

    async def scenario() -> None:
        assert held_versions({"m": CONFIG}, tmp_path) == {"m": "2"}, "before it starts: held"
        canaries = Canaries({"m": CONFIG}, tmp_path, snapshot, apply, stable_of, reload)
        await canaries.start()
        assert applied[-1] == (
            "m",
            [{"version": "1", "weight": 90.0}, {"version": "2", "weight": 10.0}],
            {"version": "2", "share": 1.0},
        )
        assert (await canaries.act("m", "pause"))["status"] == "paused"
        state = await canaries.act("m", "abort")
        assert (state["status"], state["share"]) == ("aborted", 0.0)
        assert applied[-1] == ("m", [{"version": "1", "weight": 100.0}], None)
        await canaries.stop()
        again = Canaries({"m": CONFIG}, tmp_path, snapshot, apply, stable_of, reload)
        await again.start()
        assert again.states()["m"]["status"] == "aborted", "a restart keeps the decision"
        assert applied[-1] == ("m", [{"version": "1", "weight": 100.0}], None)
        promoted = await again.act("m", "promote")
        assert promoted["share"] == 100.0
        assert applied[-1] == ("m", [{"version": "2", "weight": 100.0}], None)
        assert reloaded == [("m", {})], "reloaded once, after the promotion was saved: nothing held"
        assert held_versions({"m": CONFIG.model_copy(update={"version": "3"})}, tmp_path) == {"m": "3"}
        with pytest.raises(Exception, match="unknown canary action"):
            await again.act("m", "explode")
        await again.stop()

    asyncio.run(scenario())
    assert (tmp_path / "canary-m.json").is_file()
