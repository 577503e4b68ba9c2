"""Prometheus metrics: every family edgeinfer exports is defined here.

The hot path never touches prometheus-client. Requests and batches are recorded into plain counters
and fixed-bucket histograms (a bisect and three additions, on the event loop only, so no locks). At
scrape time the counters and the live gauges (queue lengths, readiness: the registry's state, passed in)
become a *snapshot*, a plain JSON-able dict. A snapshot is what travels between worker processes: with
``workers: N`` the supervisor merges the workers' snapshots exactly (counters and histogram buckets
summed) and renders the one exposition, so a scrape on any port sees the whole server.

Exported, all prefixed ``edgeinfer_`` with units in the names:

    inference_requests_total{model,version,protocol,status}     status: success, client_error,
                                                                rejected, timeout, error
    inference_request_duration_seconds{model,version,protocol}  end to end inside the server
    inference_queue_duration_seconds{model,version}              waiting for a batch to start
    inference_compute_duration_seconds{model,version}            one batch in the model
    inference_decode_duration_seconds{model,version,protocol}    request body to tensors
    inference_encode_duration_seconds{model,version,protocol}    tensors to response body
    batch_size{model,version}                                    rows per executed batch (histogram)
    batches_total{model,version}
    queue_length{model,version}, inflight_requests{model,version}        summed over workers
    model_load_duration_seconds{model,version}, model_warmup_duration_seconds{model,version},
    model_ready{model,version}                                           1 when every worker serves it
    model_info{model,version,backend,execution_provider}
    model_ep_coverage_ratio{model,version,provider}          share of an ONNX model's nodes each provider runs
    pipeline_step_duration_seconds{pipeline,step,model}      histogram: each pipeline step's own request
    pipeline_step_over_budget_total{pipeline,step,model}     step runs longer than the step's budget_ms
    requests_refused_total{model,version,reason}                 reason: queue_full, slo, deadline
    batch_cost_seconds{model,version,part}                       the learned per_batch / per_row cost,
                                                                 and the queue's drain_per_row
    admission_margin_seconds{model,version}                      what admission adds to its predictions
    model_degraded{model,fallback}                               workers routing to the fallback
    fallback_switches_total{model,fallback,direction}            direction: enter, exit
    fallback_window_p95_seconds{model}                           the p95 the ladder decides on
    event_loop_lag_seconds                                       how late the loop runs (0 when idle)
    shadow_requests_total{model,candidate,result}                mirrored requests: compared, dropped,
                                                                 failed, primary_failed, unavailable
    shadow_max_abs_diff{model,candidate,output}                  per request (histogram)
    shadow_rows_total{model,candidate,output,agree}              rows compared: top-1 / row equality
    limit_refusals_total{limit}                                  requests over a server.limits limit
    auth_refusals_total{protocol,reason}                         reason: unauthenticated, forbidden
    workers, worker_ready{worker}, worker_restarts_total{worker},        with workers: N only
    worker_resident_memory_bytes{worker}, worker_cpu_seconds_total{worker}

``process_*`` (RSS, CPU seconds, open files) describe the whole server: with workers, the sums over
the supervisor and every worker.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

from edgeinfer.errors import (
    InvalidInput,
    ModelNotFound,
    RequestCancelled,
    RequestTimeout,
    ServerBusy,
    Superseded,
)

PREFIX = "edgeinfer_"
# 50 us to 10 s: a small model answers in well under a millisecond, a big one in seconds.
LATENCY_BUCKETS_S = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
STATUSES = ("success", "client_error", "rejected", "timeout", "superseded", "error")
UNKNOWN_MODEL = "_unknown"  # requests for models that do not exist are counted here, not by name


class Snapshot(TypedDict):
    """One process's (or, merged, the whole server's) metrics as plain data: JSON-able, so that it
    crosses the supervisor link as it is. ``models`` and ``shadows`` are keyed ``name\x00version``
    (``name\x00candidate``), ``steps`` ``pipeline\x00step\x00model``, ``ladders`` by model."""

    models: dict[str, dict[str, Any]]
    loop_lag_s: float
    limits: dict[str, int]
    auth: dict[str, int]
    shadows: dict[str, dict[str, Any]]
    steps: dict[str, dict[str, Any]]
    ladders: dict[str, dict[str, Any]]


def status_label(error: BaseException | None) -> str:
    """The ``status`` label of a finished request."""
    if error is None:
        return "success"
    if isinstance(error, ServerBusy):
        return "rejected"
    if isinstance(error, RequestTimeout):
        return "timeout"
    if isinstance(error, Superseded):
        return "superseded"
    if isinstance(error, (InvalidInput, ModelNotFound, RequestCancelled)):
        return "client_error"
    return "error"


class Histogram:
    """Counts in fixed buckets (not cumulative until exported); ``observe`` costs a bisect and three
    additions."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += times
        self.sum += value * times
        self.count += times

    def snapshot(self) -> dict[str, Any]:
        return {"counts": list(self.counts), "sum": self.sum}


@dataclass
class ModelMetrics:
    """Every counter and histogram of one model version (the live gauges come from the registry)."""

    name: str
    version: str
    requests: dict[tuple[str, str], int] = field(default_factory=dict)
    duration: dict[str, Histogram] = field(default_factory=dict)
    decode: dict[str, Histogram] = field(default_factory=dict)
    encode: dict[str, Histogram] = field(default_factory=dict)
    queue: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS_S))
    compute: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS_S))
    batch_size: Histogram = field(default_factory=lambda: Histogram(BATCH_BUCKETS))
    refused: dict[str, int] = field(default_factory=dict)  # by reason: queue_full, slo, deadline

    def request_done(
        self,
        protocol: str,
        status: str,
        total_s: float,
        decode_s: float | None,
        encode_s: float | None,
        times: int = 1,
    ) -> None:
        """``times``: that many requests that went alike (refused together: ``Outcome.repeats``)."""
        key = (protocol, status)
        self.requests[key] = self.requests.get(key, 0) + times
        (self.duration.get(protocol) or _histogram(self.duration, protocol)).observe(total_s, times)
        if decode_s is not None:
            (self.decode.get(protocol) or _histogram(self.decode, protocol)).observe(decode_s, times)
        if encode_s is not None:
            (self.encode.get(protocol) or _histogram(self.encode, protocol)).observe(encode_s, times)

    def batch_done(self, rows: int, compute_s: float) -> None:
        self.batch_size.observe(rows)
        self.compute.observe(compute_s)

    def refused_one(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        return {
            "requests": [[protocol, status, count] for (protocol, status), count in self.requests.items()],
            "duration": {protocol: h.snapshot() for protocol, h in self.duration.items()},
            "decode": {protocol: h.snapshot() for protocol, h in self.decode.items()},
            "encode": {protocol: h.snapshot() for protocol, h in self.encode.items()},
            "queue": self.queue.snapshot(),
            "compute": self.compute.snapshot(),
            "batch_size": self.batch_size.snapshot(),
            "refused": dict(self.refused),
        }


def _histogram(table: dict[str, Histogram], protocol: str) -> Histogram:
    histogram = table.get(protocol)
    if histogram is None:
        histogram = table[protocol] = Histogram(LATENCY_BUCKETS_S)
    return histogram


DIFF_BUCKETS = (1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0)


@dataclass
class ShadowStats:
    """What the shadow comparisons of one (model, candidate) pair found (``shadow.py``)."""

    results: dict[str, int] = field(default_factory=dict)
    diffs: dict[str, Histogram] = field(default_factory=dict)  # per output
    rows: dict[str, list[int]] = field(default_factory=dict)  # per output: [agreeing, compared]

    def result(self, result: str) -> None:
        self.results[result] = self.results.get(result, 0) + 1

    def compared(self, outputs: Mapping[str, Any]) -> None:
        """``outputs``: ``shadow.Comparison`` per output name."""
        self.result("compared")
        for name, comparison in outputs.items():
            if comparison.max_abs_diff is not None:
                histogram = self.diffs.get(name)
                if histogram is None:
                    histogram = self.diffs[name] = Histogram(DIFF_BUCKETS)
                histogram.observe(comparison.max_abs_diff)
            counts = self.rows.setdefault(name, [0, 0])
            counts[0] += comparison.rows_agreeing
            counts[1] += comparison.rows

    def snapshot(self) -> dict[str, Any]:
        return {
            "results": dict(self.results),
            "diffs": {name: histogram.snapshot() for name, histogram in self.diffs.items()},
            "rows": {name: list(counts) for name, counts in self.rows.items()},
        }


@dataclass(frozen=True, slots=True)
class VersionGauges:
    """The live state of one loaded (or once loaded) model version, read at scrape time."""

    name: str
    version: str
    ready: bool
    queue_length: int = 0
    inflight: int = 0
    load_s: float = 0.0
    warmup_s: float = 0.0
    backend: str = ""
    execution_provider: str = ""
    cost_per_row_s: float = 0.0  # the runner's learned batch time: per_batch + per_row * rows
    cost_per_batch_s: float = 0.0
    drain_per_row_s: float = 0.0  # the queue's measured drain while work waited (admission reads it)
    admission_margin_s: float = 0.0  # what admission adds to its predictions (margin.py)
    ep_coverage: tuple[tuple[str, float], ...] = ()  # (provider, share of nodes), ONNX models
    file_bytes: int = 0  # the model file: residency estimates a version's memory from it


@dataclass(frozen=True, slots=True)
class LadderGauges:
    """A model's degradation ladder (``fallback``), read at scrape time."""

    name: str
    fallback: str
    degraded: bool
    entered: int
    exited: int
    p95_s: float | None


@dataclass
class StepStats:
    """One pipeline step's times, and how many were over its ``budget_ms``."""

    duration: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS_S))
    over_budget: int = 0

    def snapshot(self) -> dict[str, Any]:
        return {"duration": self.duration.snapshot(), "over_budget": self.over_budget}


class Metrics:
    """The counters of every model version of this process."""

    def __init__(self) -> None:
        self.steps: dict[tuple[str, str, str], StepStats] = {}  # by (pipeline, step, model)
        self.models: dict[tuple[str, str], ModelMetrics] = {}
        self.shadows: dict[tuple[str, str], ShadowStats] = {}  # by (model, candidate)
        self.limits: dict[str, int] = {}  # refusals by limit: body_size, rows, header_timeout, ...
        self.auth: dict[str, int] = {}  # refusals by "protocol reason"

    def shadow(self, model: str, candidate: str) -> ShadowStats:
        stats = self.shadows.get((model, candidate))
        if stats is None:
            stats = self.shadows[model, candidate] = ShadowStats()
        return stats

    def observe_step(self, pipeline: str, step: str, model: str, seconds: float, over_budget: bool) -> None:
        stats = self.steps.get((pipeline, step, model))
        if stats is None:
            stats = self.steps[pipeline, step, model] = StepStats()
        stats.duration.observe(seconds)
        stats.over_budget += over_budget

    def limit_refused(self, limit: str) -> None:
        self.limits[limit] = self.limits.get(limit, 0) + 1

    def auth_refused(self, protocol: str, reason: str) -> None:
        key = f"{protocol} {reason}"
        self.auth[key] = self.auth.get(key, 0) + 1

    def model(self, name: str, version: str) -> ModelMetrics:
        metrics = self.models.get((name, version))
        if metrics is None:
            metrics = self.models[name, version] = ModelMetrics(name, version)
        return metrics

    def snapshot(
        self,
        gauges: Iterable[VersionGauges],
        ladders: Iterable[LadderGauges] = (),
        loop_lag_s: float = 0.0,
    ) -> Snapshot:
        """This process's metrics as plain data: counters, histograms, ``gauges``, ``ladders`` and how
        far behind its event loop runs."""
        models: dict[str, dict[str, Any]] = {}
        for (name, version), metrics in self.models.items():
            models[_key(name, version)] = {"name": name, "version": version, **metrics.snapshot()}
        for gauge in gauges:
            entry = models.setdefault(
                _key(gauge.name, gauge.version), {"name": gauge.name, "version": gauge.version}
            )
            entry["gauges"] = {
                "ready": gauge.ready,
                "queue_length": gauge.queue_length,
                "inflight": gauge.inflight,
                "load_s": gauge.load_s,
                "warmup_s": gauge.warmup_s,
                "backend": gauge.backend,
                "execution_provider": gauge.execution_provider,
                "cost": [gauge.cost_per_row_s, gauge.cost_per_batch_s, gauge.drain_per_row_s],
                "admission_margin_s": gauge.admission_margin_s,
                "ep_coverage": dict(gauge.ep_coverage),
                "file_bytes": gauge.file_bytes,
            }
        return {
            "models": models,
            "loop_lag_s": loop_lag_s,
            "limits": dict(self.limits),
            "auth": dict(self.auth),
            "shadows": {
                _key(model, candidate): stats.snapshot() for (model, candidate), stats in self.shadows.items()
            },
            "steps": {"\x00".join(key): stats.snapshot() for key, stats in self.steps.items()},
            "ladders": {
                ladder.name: {
                    "fallback": ladder.fallback,
                    "degraded": int(ladder.degraded),
                    "entered": ladder.entered,
                    "exited": ladder.exited,
                    "p95_s": ladder.p95_s,
                }
                for ladder in ladders
            },
        }


def _key(name: str, version: str) -> str:
    return f"{name}\x00{version}"


def merge(snapshots: list[Snapshot]) -> Snapshot:
    """One snapshot for the whole server: counters and histogram buckets summed; queue and in-flight
    gauges summed; a version is ready only when every snapshot that has it says so. A ladder's
    ``degraded`` becomes the number of workers whose ladder stepped down (each worker has its own), its
    switches are summed and its p95 is the highest; the loop lag is the largest worker's."""
    models: dict[str, dict[str, Any]] = {}
    ladders: dict[str, dict[str, Any]] = {}
    for snapshot in snapshots:
        for key, entry in snapshot["models"].items():
            into = models.setdefault(key, {"name": entry["name"], "version": entry["version"]})
            _add_model(into, entry)
        for name, ladder in snapshot.get("ladders", {}).items():
            mine = ladders.get(name)
            if mine is None:
                ladders[name] = dict(ladder)
                continue
            for key in ("degraded", "entered", "exited"):
                mine[key] += ladder[key]
            known = [p95 for p95 in (mine["p95_s"], ladder["p95_s"]) if p95 is not None]
            mine["p95_s"] = max(known) if known else None
    lag = max((snapshot.get("loop_lag_s", 0.0) for snapshot in snapshots), default=0.0)
    limits = _sum_counts(snapshot.get("limits", {}) for snapshot in snapshots)
    auth = _sum_counts(snapshot.get("auth", {}) for snapshot in snapshots)
    shadows: dict[str, dict[str, Any]] = {}
    for snapshot in snapshots:
        for key, stats in snapshot.get("shadows", {}).items():
            _add_shadow(shadows.setdefault(key, {"results": {}, "diffs": {}, "rows": {}}), stats)
    steps: dict[str, dict[str, Any]] = {}
    for snapshot in snapshots:
        for key, stats in snapshot.get("steps", {}).items():
            mine = steps.setdefault(key, {"duration": None, "over_budget": 0})
            if mine["duration"] is None:
                mine["duration"] = _copy_histogram(stats["duration"])
            else:
                _add_histogram(mine["duration"], stats["duration"])
            mine["over_budget"] += stats["over_budget"]
    return {
        "models": models, "ladders": ladders, "loop_lag_s": lag, "shadows": shadows, "steps": steps,
        "limits": limits, "auth": auth,
    }  # fmt: skip


def _add_shadow(into: dict[str, Any], stats: dict[str, Any]) -> None:
    into["results"] = _sum_counts((into["results"], stats["results"]))
    for name, histogram in stats["diffs"].items():
        if name in into["diffs"]:
            _add_histogram(into["diffs"][name], histogram)
        else:
            into["diffs"][name] = _copy_histogram(histogram)
    for name, (agreeing, compared) in stats["rows"].items():
        mine = into["rows"].setdefault(name, [0, 0])
        mine[0] += agreeing
        mine[1] += compared


def _sum_counts(tables: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for table in tables:
        for key, count in table.items():
            total[key] = total.get(key, 0) + count
    return total


def _copy_histogram(histogram: dict[str, Any]) -> dict[str, Any]:
    return {"counts": list(histogram["counts"]), "sum": histogram["sum"]}


def _add_histogram(into: dict[str, Any], other: dict[str, Any]) -> None:
    into["counts"] = [a + b for a, b in zip(into["counts"], other["counts"], strict=True)]
    into["sum"] += other["sum"]


def _add_model(into: dict[str, Any], entry: dict[str, Any]) -> None:
    if "requests" in entry:
        counts = {(protocol, status): count for protocol, status, count in into.get("requests", [])}
        for protocol, status, count in entry["requests"]:
            counts[protocol, status] = counts.get((protocol, status), 0) + count
        into["requests"] = [[protocol, status, count] for (protocol, status), count in counts.items()]
    for key in ("duration", "decode", "encode"):
        for protocol, histogram in entry.get(key, {}).items():
            table = into.setdefault(key, {})
            if protocol in table:
                _add_histogram(table[protocol], histogram)
            else:
                table[protocol] = _copy_histogram(histogram)
    if "refused" in entry:
        refused = into.setdefault("refused", {})
        for reason, count in entry["refused"].items():
            refused[reason] = refused.get(reason, 0) + count
    for key in ("queue", "compute", "batch_size"):
        if key in entry:
            if key in into:
                _add_histogram(into[key], entry[key])
            else:
                into[key] = _copy_histogram(entry[key])
    if "gauges" in entry:
        gauges = entry["gauges"]
        mine = into.get("gauges")
        if mine is None:
            into["gauges"] = dict(gauges)
        else:
            mine["ready"] = mine["ready"] and gauges["ready"]
            mine["queue_length"] += gauges["queue_length"]
            mine["inflight"] += gauges["inflight"]
            mine["load_s"] = max(mine["load_s"], gauges["load_s"])
            mine["warmup_s"] = max(mine["warmup_s"], gauges["warmup_s"])
            mine["cost"] = [max(a, b) for a, b in zip(mine["cost"], gauges["cost"], strict=True)]
            mine["admission_margin_s"] = max(mine["admission_margin_s"], gauges["admission_margin_s"])


@dataclass(frozen=True, slots=True)
class WorkerGauges:
    """One worker process as the supervisor sees it."""

    worker: int
    ready: bool
    restarts: int
    resident_memory_bytes: float = 0.0
    cpu_seconds: float = 0.0
