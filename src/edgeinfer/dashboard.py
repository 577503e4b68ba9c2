"""What the server is doing now, as one JSON document (``GET /v2/ui/state``): per model version and for
the whole server, computed from the metrics the server keeps anyway (``metrics.py``).

Those are cumulative counters and histograms, so "requests per second" and "p99 over the last minute"
are differences: between the snapshot now and one taken earlier. The earlier ones are kept by
``Window``, filled by the requests for this document themselves (a page polls every second or two), so
nothing runs in the background and a server nobody looks at pays nothing. Until a second snapshot
exists, rates and percentiles are null. Everything here is arithmetic on plain data: no clock, no I/O.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from edgeinfer.metrics import BATCH_BUCKETS, LATENCY_BUCKETS_S, STATUSES, Snapshot

WINDOW_S = 60.0  # latency percentiles, batch sizes and errors: over the last minute
RATE_S = 10.0  # requests/s and CPU: over the last ten seconds (a minute would smooth a ramp away)
SPACING_S = 1.0  # snapshots closer than this to the previous one are not kept
RECENT_ERRORS = 50
# a failed request as the service records it (time, request id, protocol, model, version, status,
# message): a tuple, made into a mapping only when read (under overload thousands pass a second), and
# the message, not the error, whose traceback would keep the request's frames alive
RECENT_ERROR_FIELDS = ("time", "request_id", "protocol", "model", "version", "status", "message")
ErrorEntry = tuple[float, str, str, str, str, str, str]


def recent_errors() -> deque[ErrorEntry]:
    """The ring the service appends failed requests to and a scope's ``overview`` reads."""
    return deque(maxlen=RECENT_ERRORS)


def listed(errors: deque[ErrorEntry]) -> list[dict[str, Any]]:
    """The recent errors as mappings, oldest first."""
    return [dict(zip(RECENT_ERROR_FIELDS, error, strict=True)) for error in errors]


class Window:
    """Recent snapshots ``(time, metrics snapshot, process stats)``, oldest first, a minute and one more."""

    def __init__(self) -> None:
        self._kept: deque[tuple[float, Snapshot, dict[str, float]]] = deque()

    def add(self, now_s: float, snapshot: Snapshot, process: dict[str, float]) -> None:
        if self._kept and now_s - self._kept[-1][0] < SPACING_S:
            return
        self._kept.append((now_s, snapshot, process))
        # keep the newest snapshot older than the window: the baseline of a full minute
        while len(self._kept) > 1 and now_s - self._kept[1][0] >= WINDOW_S:
            self._kept.popleft()

    def baseline(self, now_s: float, seconds: float) -> tuple[float, Snapshot, dict[str, float]] | None:
        """The oldest kept snapshot at most ``seconds`` old (but not ``now_s``'s own), else None."""
        for kept in self._kept:
            if now_s - kept[0] <= seconds and kept[0] < now_s:
                return kept
        return None


def percentile(counts: list[int], bounds: tuple[float, ...], q: float) -> float | None:
    """The ``q`` quantile of a bucketed distribution (``counts[i]``: values up to ``bounds[i]``, the last
    one above every bound), interpolated linearly inside its bucket, as Prometheus' histogram_quantile."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for index, count in enumerate(counts):
        if count and seen + count >= rank:
            if index >= len(bounds):  # above the last bound: the last bound is all that is known
                return bounds[-1]
            low = bounds[index - 1] if index > 0 else 0.0
            return low + (bounds[index] - low) * (rank - seen) / count
        seen += count
    return bounds[-1]


def _diff(now: list[int], before: list[int] | None) -> list[int]:
    if before is None or len(before) != len(now):
        return list(now)
    return [max(0, a - b) for a, b in zip(now, before, strict=True)]


def _counts(entry: dict[str, Any] | None, key: str) -> list[int] | None:
    """Bucket counts of one histogram of a model entry, summed over protocols where there are several."""
    if entry is None or key not in entry:
        return None
    value = entry[key]
    if "counts" in value:
        return list(value["counts"])
    summed: list[int] | None = None
    for histogram in value.values():
        counts = histogram["counts"]
        summed = list(counts) if summed is None else [a + b for a, b in zip(summed, counts, strict=True)]
    return summed


def _statuses(entry: dict[str, Any] | None) -> dict[str, int]:
    totals = dict.fromkeys(STATUSES, 0)
    for _, status, count in (entry or {}).get("requests", []):
        totals[status] = totals.get(status, 0) + count
    return totals


def _model(
    key: str,
    entry: dict[str, Any],
    index_entry: dict[str, Any] | None,
    minute: Snapshot | None,
    minute_s: float,
    rate: Snapshot | None,
    rate_s: float,
    ladder: dict[str, Any] | None,
    memory_per_file_byte: float,
) -> dict[str, Any]:
    gauges = entry.get("gauges", {})
    statuses = _statuses(entry)
    before_rate = _statuses(rate["models"].get(key)) if rate is not None else None
    before_minute = minute["models"].get(key) if minute is not None else None
    latency = None
    batches = None
    errors = None
    if minute is not None:
        durations = _counts(entry, "duration")
        if durations is not None:
            window = _diff(durations, _counts(before_minute, "duration"))
            latency = {
                name: None if (value := percentile(window, LATENCY_BUCKETS_S, q)) is None else value * 1000
                for name, q in (("p50_ms", 0.5), ("p90_ms", 0.9), ("p99_ms", 0.99))
            }
        sizes = _counts(entry, "batch_size")
        if sizes is not None:
            window = _diff(sizes, _counts(before_minute, "batch_size"))
            upper: list[float | None] = [*BATCH_BUCKETS, None]
            batches = [{"le": bound, "count": count} for bound, count in zip(upper, window, strict=True)]
        before = _statuses(before_minute)
        errors = {status: statuses[status] - before.get(status, 0) for status in STATUSES[1:]}
    requests_per_s = None
    if before_rate is not None and rate_s > 0:
        requests_per_s = (sum(statuses.values()) - sum(before_rate.values())) / rate_s
    return {
        "name": entry["name"],
        "version": entry["version"],
        "state": (index_entry or {}).get("state", "READY" if gauges.get("ready") else "UNKNOWN"),
        "reason": (index_entry or {}).get("reason", ""),
        "requests_per_s": requests_per_s,
        "latency": latency,
        "queue_length": gauges.get("queue_length", 0),
        "inflight": gauges.get("inflight", 0),
        "batch_sizes": batches,
        "errors_last_minute": errors,
        "requests_total": statuses,
        "backend": gauges.get("backend", ""),
        "execution_provider": gauges.get("execution_provider", ""),
        "ep_coverage": gauges.get("ep_coverage", {}),
        "memory_estimate_bytes": gauges.get("file_bytes", 0) * memory_per_file_byte,
        "window_s": minute_s if minute is not None else None,
        "degraded": None if ladder is None else {**ladder, "degraded": bool(ladder["degraded"])},
    }


def overview(
    now_s: float,
    snapshot: Snapshot,
    process: dict[str, float],
    window: Window,
    index: list[dict[str, Any]],
    server: dict[str, Any],
    recent_errors: list[dict[str, Any]],
    rollouts: dict[str, Any],
    memory_per_file_byte: float = 0.0,
) -> dict[str, Any]:
    """The document: ``snapshot``/``process`` now (also added to ``window``), the repository ``index``
    (state and reason of every version), ``server`` facts (uptime, workers), the ``recent_errors``
    (oldest first) and the ``rollouts`` (routes, shadows, canaries) as their own endpoints show them.
    A version's memory estimate is its model file's size times ``memory_per_file_byte`` (residency's
    ``memory_factor``, times the workers: each holds every model)."""
    minute = window.baseline(now_s, WINDOW_S)
    rate = window.baseline(now_s, RATE_S)
    window.add(now_s, snapshot, process)
    by_version = {(entry["name"], entry["version"]): entry for entry in index}
    models = []
    seen = set()
    for key, entry in sorted(snapshot["models"].items()):
        if entry["name"] == "_unknown":
            continue
        seen.add((entry["name"], entry["version"]))
        models.append(
            _model(
                key,
                entry,
                by_version.get((entry["name"], entry["version"])),
                minute[1] if minute else None,
                now_s - minute[0] if minute else 0.0,
                rate[1] if rate else None,
                now_s - rate[0] if rate else 0.0,
                snapshot.get("ladders", {}).get(entry["name"]),
                memory_per_file_byte,
            )
        )
    for entry in index:  # known to the repository but never loaded (deferred, failed, unavailable)
        if (entry["name"], entry["version"]) not in seen:
            unloaded = {"name": entry["name"], "version": entry["version"]}
            models.append(_model("", unloaded, entry, None, 0.0, None, 0.0, None, memory_per_file_byte))
    cpu_percent = None
    cpu = "process_cpu_seconds_total"
    if rate is not None and cpu in process and cpu in rate[2]:
        cpu_percent = 100 * (process[cpu] - rate[2][cpu]) / (now_s - rate[0])
    return {
        "server": {
            **server,
            "rss_bytes": process.get("process_resident_memory_bytes"),
            "cpu_seconds": process.get("process_cpu_seconds_total"),
            "cpu_percent": cpu_percent,
            "loop_lag_ms": snapshot.get("loop_lag_s", 0.0) * 1000,
        },
        "models": models,
        "recent_errors": recent_errors[-RECENT_ERRORS:][::-1],
        "rollouts": rollouts,
    }
