"""The Prometheus text format of a metrics snapshot: every family edgeinfer exports, named once here.

Imported at the first scrape (prometheus-client costs about 4.7 MiB of RSS), not on the request path.
The families are built from a snapshot (``metrics.Snapshot``), the server's own or merged from every
worker's, so one code path renders both; ``process_*`` are
read by ``metrics.process_stats`` in each process and, with workers, summed (``sum_process_stats``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from edgeinfer.metrics import BATCH_BUCKETS, DIFF_BUCKETS, LATENCY_BUCKETS_S, PREFIX, Snapshot, WorkerGauges


def exposition(
    snapshot: Snapshot, process: dict[str, float], workers: list[WorkerGauges] | None = None
) -> bytes:
    """The body of ``GET /metrics``: ``snapshot``, the ``process_*`` values, and with workers their gauges."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector(snapshot, process, workers))
    return generate_latest(registry)


class _SnapshotCollector(Collector):
    def __init__(
        self, snapshot: Snapshot, process: dict[str, float], workers: list[WorkerGauges] | None
    ) -> None:
        self._models = sorted(
            snapshot["models"].values(), key=lambda entry: (entry["name"], entry["version"])
        )
        self._ladders = sorted(snapshot.get("ladders", {}).items())
        self._loop_lag_s = snapshot.get("loop_lag_s", 0.0)
        self._limits = sorted(snapshot.get("limits", {}).items())
        self._auth = sorted(snapshot.get("auth", {}).items())
        self._shadows = sorted(snapshot.get("shadows", {}).items())
        self._steps = sorted(snapshot.get("steps", {}).items())
        self._process = process
        self._workers = workers

    def collect(self) -> Iterator[Metric]:
        models = self._models
        requests = CounterMetricFamily(
            PREFIX + "inference_requests", "Inference requests answered, by outcome",
            labels=["model", "version", "protocol", "status"],
        )  # fmt: skip
        for model in models:
            for protocol, status, count in sorted(model.get("requests", [])):
                requests.add_metric([model["name"], model["version"], protocol, status], count)
        yield requests
        refused = CounterMetricFamily(
            PREFIX + "requests_refused",
            "Requests refused before queueing, by reason: queue_full (max_queue_size), slo (predicted to "
            "miss the model's SLO), deadline (predicted to miss the client's timeout)",
            labels=["model", "version", "reason"],
        )  # fmt: skip
        for model in models:
            for reason, count in sorted(model.get("refused", {}).items()):
                refused.add_metric([model["name"], model["version"], reason], count)
        yield refused
        yield _per_protocol(models, "duration", "inference_request_duration_seconds",
                            "Time from parsed request to response, inside the server")  # fmt: skip
        yield _per_protocol(models, "decode", "inference_decode_duration_seconds",
                            "Time to turn a request body into tensors")  # fmt: skip
        yield _per_protocol(models, "encode", "inference_encode_duration_seconds",
                            "Time to turn output tensors into a response body")  # fmt: skip
        yield _per_model(
            models, "queue", "inference_queue_duration_seconds", "Time a request waited for its batch",
            LATENCY_BUCKETS_S,
        )  # fmt: skip
        yield _per_model(
            models, "compute", "inference_compute_duration_seconds", "Time one batch spent in the model",
            LATENCY_BUCKETS_S,
        )  # fmt: skip
        yield _per_model(models, "batch_size", "batch_size", "Rows per executed batch", BATCH_BUCKETS)
        batches = CounterMetricFamily(PREFIX + "batches", "Batches executed", labels=["model", "version"])
        queue_length = GaugeMetricFamily(
            PREFIX + "queue_length", "Requests waiting", labels=["model", "version"]
        )
        inflight = GaugeMetricFamily(
            PREFIX + "inflight_requests",
            "Requests received and not yet answered",
            labels=["model", "version"],
        )
        load = GaugeMetricFamily(
            PREFIX + "model_load_duration_seconds", "Time to load and warm up", labels=["model", "version"]
        )
        warmup = GaugeMetricFamily(
            PREFIX + "model_warmup_duration_seconds", "Time spent warming up", labels=["model", "version"]
        )
        ready = GaugeMetricFamily(
            PREFIX + "model_ready", "1 when the version serves", labels=["model", "version"]
        )
        info = GaugeMetricFamily(
            PREFIX + "model_info", "Backend and execution provider of each version",
            labels=["model", "version", "backend", "execution_provider"],
        )  # fmt: skip
        coverage = GaugeMetricFamily(
            PREFIX + "model_ep_coverage_ratio",
            "Share of an ONNX model's nodes each execution provider runs (measured at load); the first "
            "provider asked for is always listed, 0 when it runs nothing",
            labels=["model", "version", "provider"],
        )
        cost = GaugeMetricFamily(
            PREFIX + "batch_cost_seconds",
            "Learned time of a batch: part=per_batch (fixed cost of a call) + part=per_row x rows; "
            "part=drain_per_row: how fast the queue drained per row while work waited (0: not measured)",
            labels=["model", "version", "part"],
        )
        margin = GaugeMetricFamily(
            PREFIX + "admission_margin_seconds",
            "What admission adds to every prediction of a model with an SLO: it grows while more "
            "requests miss the SLO than its quantile allows, and shrinks while fewer do",
            labels=["model", "version"],
        )
        for model in models:
            labels = [model["name"], model["version"]]
            batches.add_metric(labels, sum(model["batch_size"]["counts"]) if "batch_size" in model else 0)
            gauges = model.get("gauges")
            if gauges is None:
                continue
            queue_length.add_metric(labels, gauges["queue_length"])
            inflight.add_metric(labels, gauges["inflight"])
            if gauges["backend"]:
                load.add_metric(labels, gauges["load_s"])
                warmup.add_metric(labels, gauges["warmup_s"])
                ready.add_metric(labels, 1.0 if gauges["ready"] else 0.0)
                info.add_metric([*labels, gauges["backend"], gauges["execution_provider"]], 1.0)
                for provider, share in gauges.get("ep_coverage", {}).items():
                    coverage.add_metric([*labels, provider], share)
                per_row, per_batch, drain = gauges["cost"]
                cost.add_metric([*labels, "per_row"], per_row)
                cost.add_metric([*labels, "per_batch"], per_batch)
                cost.add_metric([*labels, "drain_per_row"], drain)
                margin.add_metric(labels, gauges["admission_margin_s"])
        yield from (batches, queue_length, inflight, load, warmup, ready, info, coverage, cost, margin)
        yield from _ladder_families(self._ladders)
        yield GaugeMetricFamily(
            PREFIX + "event_loop_lag_seconds",
            "How late the event loop runs a timer: the wait of a request not yet read (measured while "
            "requests come; with workers, the largest)",
            value=self._loop_lag_s,
        )
        limits = CounterMetricFamily(
            PREFIX + "limit_refusals",
            "Requests and connections refused for a hard limit (server.limits, body and decompressed size)",
            labels=["limit"],
        )
        for limit, count in self._limits:
            limits.add_metric([limit], count)
        auth = CounterMetricFamily(
            PREFIX + "auth_refusals",
            "Requests refused by API key auth: unauthenticated (401: no or unknown key), forbidden (403)",
            labels=["protocol", "reason"],
        )
        for key, count in self._auth:
            auth.add_metric(key.split(" ", 1), count)
        yield from (limits, auth)
        yield from _shadow_families(self._shadows)
        yield from _step_families(self._steps)
        yield from _process_families(self._process)
        if self._workers is not None:
            yield from _worker_families(self._workers)


def _ladder_families(ladders: list[tuple[str, dict[str, Any]]]) -> Iterator[Metric]:
    degraded = GaugeMetricFamily(
        PREFIX + "model_degraded",
        "Worker processes whose degradation ladder routes the model's requests to its fallback",
        labels=["model", "fallback"],
    )
    switches = CounterMetricFamily(
        PREFIX + "fallback_switches", "Degradation ladder switches: enter (to the fallback) and exit",
        labels=["model", "fallback", "direction"],
    )  # fmt: skip
    p95 = GaugeMetricFamily(
        PREFIX + "fallback_window_p95_seconds",
        "The sliding-window p95 latency the ladder decides on (refusals count as infinite)",
        labels=["model"],
    )
    for name, ladder in ladders:
        degraded.add_metric([name, ladder["fallback"]], ladder["degraded"])
        switches.add_metric([name, ladder["fallback"], "enter"], ladder["entered"])
        switches.add_metric([name, ladder["fallback"], "exit"], ladder["exited"])
        if ladder["p95_s"] is not None:
            p95.add_metric([name], ladder["p95_s"])
    yield from (degraded, switches, p95)


def _shadow_families(shadows: list[tuple[str, dict[str, Any]]]) -> Iterator[Metric]:
    requests = CounterMetricFamily(
        PREFIX + "shadow_requests",
        "Requests mirrored to a shadow candidate, by result: compared, dropped (the server was busy), "
        "failed (the candidate raised), primary_failed, unavailable",
        labels=["model", "candidate", "result"],
    )
    diffs = HistogramMetricFamily(
        PREFIX + "shadow_max_abs_diff",
        "Largest absolute difference between the primary's and the candidate's output, per request",
        labels=["model", "candidate", "output"],
    )
    rows = CounterMetricFamily(
        PREFIX + "shadow_rows",
        "Rows compared between primary and candidate: agree=true when the top-1 class (float outputs "
        "with classes) or the whole row (others) is the same",
        labels=["model", "candidate", "output", "agree"],
    )
    for key, stats in shadows:
        model, candidate = key.split("\x00", 1)
        for result, count in sorted(stats["results"].items()):
            requests.add_metric([model, candidate, result], count)
        for output, histogram in sorted(stats["diffs"].items()):
            diffs.add_metric([model, candidate, output], _buckets(histogram, DIFF_BUCKETS), histogram["sum"])
        for output, (agreeing, compared) in sorted(stats["rows"].items()):
            rows.add_metric([model, candidate, output, "true"], agreeing)
            rows.add_metric([model, candidate, output, "false"], compared - agreeing)
    yield from (requests, diffs, rows)


def _step_families(steps: list[tuple[str, dict[str, Any]]]) -> Iterator[Metric]:
    durations = HistogramMetricFamily(
        PREFIX + "pipeline_step_duration_seconds",
        "Time of each pipeline step's own request (from sending it to its model to the answer)",
        labels=["pipeline", "step", "model"],
    )
    over = CounterMetricFamily(
        PREFIX + "pipeline_step_over_budget",
        "Pipeline step runs that took longer than the step's budget_ms",
        labels=["pipeline", "step", "model"],
    )
    for key, stats in steps:
        labels = key.split("\x00")
        durations.add_metric(labels, _buckets(stats["duration"], LATENCY_BUCKETS_S), stats["duration"]["sum"])
        over.add_metric(labels, stats["over_budget"])
    yield from (durations, over)


def _per_model(
    models: list[dict[str, Any]], key: str, name: str, documentation: str, bounds: tuple[float, ...]
) -> Metric:
    family = HistogramMetricFamily(PREFIX + name, documentation, labels=["model", "version"])
    for model in models:
        histogram = model.get(key)
        if histogram is not None:
            family.add_metric(
                [model["name"], model["version"]], _buckets(histogram, bounds), histogram["sum"]
            )
    return family


def _per_protocol(models: list[dict[str, Any]], key: str, name: str, documentation: str) -> Metric:
    family = HistogramMetricFamily(PREFIX + name, documentation, labels=["model", "version", "protocol"])
    for model in models:
        for protocol, histogram in sorted(model.get(key, {}).items()):
            family.add_metric(
                [model["name"], model["version"], protocol],
                _buckets(histogram, LATENCY_BUCKETS_S),
                histogram["sum"],
            )
    return family


def _buckets(histogram: dict[str, Any], bounds: tuple[float, ...]) -> list[tuple[str, float]]:
    total = 0
    out: list[tuple[str, float]] = []
    for bound, count in zip((*bounds, float("inf")), histogram["counts"], strict=True):
        total += count
        out.append(("+Inf" if bound == float("inf") else repr(float(bound)), total))
    return out


_PROCESS_FAMILIES = {
    # name: (kind, help); summed over the server's processes unless named in _PROCESS_FIRST
    "process_resident_memory_bytes": ("gauge", "Resident memory size in bytes."),
    "process_virtual_memory_bytes": ("gauge", "Virtual memory size in bytes."),
    "process_cpu_seconds_total": ("counter", "Total user and system CPU time spent in seconds."),
    "process_open_fds": ("gauge", "Number of open file descriptors."),
    "process_max_fds": ("gauge", "Maximum number of open file descriptors."),
    "process_start_time_seconds": ("gauge", "Start time of the process since unix epoch in seconds."),
}


def _process_families(values: dict[str, float]) -> Iterator[Metric]:
    for name, (kind, documentation) in _PROCESS_FAMILIES.items():
        if name not in values:
            continue
        if kind == "counter":
            yield CounterMetricFamily(name.removesuffix("_total"), documentation, value=values[name])
        else:
            yield GaugeMetricFamily(name, documentation, value=values[name])


def sum_process_stats(stats: list[dict[str, float]]) -> dict[str, float]:
    """The server's ``process_*`` values from its processes': sums, except the supervisor's (first) start
    time and file-descriptor limit."""
    if not stats:
        return {}
    total: dict[str, float] = {}
    for name in _PROCESS_FAMILIES:
        present = [values[name] for values in stats if name in values]
        if present:
            first_only = name in ("process_start_time_seconds", "process_max_fds")
            total[name] = present[0] if first_only else sum(present)
    return total


def _worker_families(workers: list[WorkerGauges]) -> Iterator[Metric]:
    count = GaugeMetricFamily(PREFIX + "workers", "Worker processes configured", value=len(workers))
    ready = GaugeMetricFamily(PREFIX + "worker_ready", "1 when the worker serves", labels=["worker"])
    restarts = CounterMetricFamily(
        PREFIX + "worker_restarts", "Times the worker was restarted after it died", labels=["worker"]
    )
    memory = GaugeMetricFamily(
        PREFIX + "worker_resident_memory_bytes", "Resident memory of the worker", labels=["worker"]
    )
    cpu = CounterMetricFamily(PREFIX + "worker_cpu_seconds", "CPU time of the worker", labels=["worker"])
    for worker in workers:
        label = [str(worker.worker)]
        ready.add_metric(label, 1.0 if worker.ready else 0.0)
        restarts.add_metric(label, worker.restarts)
        memory.add_metric(label, worker.resident_memory_bytes)
        cpu.add_metric(label, worker.cpu_seconds)
    yield from (count, ready, restarts, memory, cpu)
