"""The status data (dashboard.py) from real metrics objects: windowed rates and percentiles, the window's
bookkeeping, versions that never loaded, and the document's schema."""

from __future__ import annotations

import jsonschema
import pytest

from edgeinfer.dashboard import RATE_S, WINDOW_S, Window, overview, percentile
from edgeinfer.metrics import LATENCY_BUCKETS_S, Metrics, VersionGauges

NUMBER_OR_NULL = {"type": ["number", "null"]}
SCHEMA = {
    "type": "object",
    "required": ["server", "models", "recent_errors", "rollouts"],
    "properties": {
        "server": {
            "type": "object",
            "required": ["uptime_s", "workers", "rss_bytes", "cpu_percent", "loop_lag_ms", "version"],
            "properties": {
                "uptime_s": {"type": "number"},
                "workers": {"type": "integer", "minimum": 1},
                "rss_bytes": NUMBER_OR_NULL,
                "cpu_percent": NUMBER_OR_NULL,
                "loop_lag_ms": {"type": "number"},
            },
        },
        "models": {
            "type": "array",
            "items": {
                "type": "object",
                "required": [
                    "name", "version", "state", "reason", "requests_per_s", "latency", "queue_length",
                    "inflight", "batch_sizes", "errors_last_minute", "requests_total", "backend",
                    "execution_provider", "ep_coverage", "memory_estimate_bytes", "window_s", "degraded",
                ],
                "properties": {
                    "name": {"type": "string"},
                    "version": {"type": "string"},
                    "state": {"type": "string"},
                    "requests_per_s": NUMBER_OR_NULL,
                    "latency": {
                        "type": ["object", "null"],
                        "required": ["p50_ms", "p90_ms", "p99_ms"],
                        "additionalProperties": NUMBER_OR_NULL,
                    },
                    "queue_length": {"type": "integer"},
                    "batch_sizes": {
                        "type": ["array", "null"],
                        "items": {
                            "type": "object",
                            "required": ["le", "count"],
                            "properties": {"le": NUMBER_OR_NULL, "count": {"type": "integer"}},
                        },
                    },
                    "errors_last_minute": {
                        "type": ["object", "null"], "additionalProperties": {"type": "integer"}
                    },
                    "requests_total": {"type": "object", "additionalProperties": {"type": "integer"}},
                    "ep_coverage": {"type": "object", "additionalProperties": {"type": "number"}},
                    "memory_estimate_bytes": {"type": "number"},
                },
            },
        },
        "recent_errors": {
            "type": "array",
            "maxItems": 50,
            "items": {
                "type": "object",
                "required": ["time", "request_id", "model", "version", "protocol", "status", "message"],
            },
        },
        "rollouts": {"type": "object"},
    },
}  # fmt: skip


@pytest.mark.parametrize(
    ("counts", "q", "expected"),
    [
        ([0] * 18, 0.5, None),  # nothing observed
        ([0, 4] + [0] * 16, 0.5, 0.000075),  # all in (50 us, 100 us]: the middle of it
        ([4] + [0] * 17, 0.99, 0.0000495),  # all in [0, 50 us]
        ([0] * 17 + [3], 0.5, 10.0),  # above the last bound: the last bound is all that is known
        ([0, 1, 0, 0, 0, 0, 0, 0, 0, 1] + [0] * 8, 0.5, 0.0001),  # the median is the first bucket's top
    ],
)
def test_percentiles_from_buckets(counts, q, expected):
    found = percentile(counts, LATENCY_BUCKETS_S, q)
    assert found == (None if expected is None else pytest.approx(expected))


def test_the_window_keeps_a_minute_and_one_more_and_skips_close_snapshots():
    window = Window()
    for second in range(0, 100, 2):
        window.add(float(second), {"at": second}, {})
    window.add(98.5, {"at": 98.5}, {})  # under a second after the last: not kept
    baseline = window.baseline(100.0, WINDOW_S)
    assert baseline is not None
    assert baseline[1] == {"at": 40}  # the oldest at most a minute old
    rate = window.baseline(100.0, RATE_S)
    assert rate is not None
    assert rate[1] == {"at": 90}
    assert window.baseline(0.0, WINDOW_S) is None


def gauges(ready: bool = True) -> list[VersionGauges]:
    return [
        VersionGauges(
            "m", "1", ready, queue_length=2, inflight=3, backend="onnxruntime",
            execution_provider="CPUExecutionProvider", ep_coverage=(("CPUExecutionProvider", 1.0),),
            file_bytes=1000,
        )
    ]  # fmt: skip


def test_rates_percentiles_batches_and_errors_come_from_the_difference_of_two_snapshots():
    metrics = Metrics()
    model = metrics.model("m", "1")
    for _ in range(10):  # before the first look: only in the totals
        model.request_done("http", "success", 0.5, None, None)
    window = Window()
    index = [
        {"name": "m", "version": "1", "state": "READY", "reason": ""},
        {"name": "big", "version": "2", "state": "UNAVAILABLE", "reason": "cannot load: out of memory"},
    ]
    server = {"uptime_s": 12.0, "workers": 1, "version": "0.1.0"}
    process = {"process_resident_memory_bytes": 8e7, "process_cpu_seconds_total": 3.0}
    first = overview(100.0, metrics.snapshot(gauges()), process, window, index, server, [], {}, 2.0)
    assert first["models"][0]["latency"] is None  # one snapshot: nothing to compare with yet
    assert first["models"][0]["requests_per_s"] is None
    for _ in range(20):
        model.request_done("http", "success", 0.0002, None, None)
    model.request_done("grpc", "client_error", 0.0001, None, None)
    model.batch_done(4, 0.001)
    model.batch_done(16, 0.002)
    errors = [{"time": 1.0, "request_id": "a", "model": "m", "version": "1", "protocol": "http",
               "status": "client_error", "message": "bad"},
              {"time": 2.0, "request_id": "b", "model": "m", "version": "1", "protocol": "grpc",
               "status": "timeout", "message": "late"}]  # fmt: skip
    process = {"process_resident_memory_bytes": 8e7, "process_cpu_seconds_total": 3.5}
    state = overview(105.0, metrics.snapshot(gauges()), process, window, index, server, errors, {}, 2.0)
    jsonschema.validate(state, SCHEMA)
    m, big = state["models"]
    assert m["requests_per_s"] == pytest.approx(21 / 5)
    # rank 10.5 of 21: 1 below 100 us, then 9.5 of the 20 in (100 us, 250 us]; not the earlier 0.5 s ones
    assert m["latency"]["p50_ms"] == pytest.approx(0.1 + 0.15 * 9.5 / 20)
    assert m["latency"]["p99_ms"] < 0.25
    assert [entry["count"] for entry in m["batch_sizes"] if entry["count"]] == [1, 1]
    assert [entry["le"] for entry in m["batch_sizes"] if entry["count"]] == [4, 16]
    assert m["errors_last_minute"]["client_error"] == 1
    assert m["requests_total"]["success"] == 30
    assert (m["queue_length"], m["inflight"], m["memory_estimate_bytes"]) == (2, 3, 2000)
    assert m["ep_coverage"] == {"CPUExecutionProvider": 1.0}
    assert m["window_s"] == 5.0
    assert (big["state"], big["reason"], big["latency"]) == (
        "UNAVAILABLE",
        "cannot load: out of memory",
        None,
    )
    assert state["server"]["cpu_percent"] == pytest.approx(10.0)  # 0.5 s of CPU in 5 s
    assert [error["request_id"] for error in state["recent_errors"]] == ["b", "a"]  # newest first


def test_a_full_error_ring_shows_the_newest_fifty():
    errors = [{"time": float(i), "request_id": str(i), "model": "m", "version": "1", "protocol": "http",
               "status": "error", "message": ""} for i in range(80)]  # fmt: skip
    state = overview(1.0, Metrics().snapshot([]), {}, Window(), [], {"workers": 1}, errors, {})
    assert [error["request_id"] for error in state["recent_errors"]][:2] == ["79", "78"]
    assert len(state["recent_errors"]) == 50
