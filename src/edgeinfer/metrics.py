"""Prometheus metrics: every collector edgeinfer exports is defined here.

The hot path never touches prometheus-client. Requests and batches are recorded into plain counters
and fixed-bucket histograms (a bisect and three additions, on the event loop only, so no locks); the
collector below turns them into metric families when ``/metrics`` is scraped. prometheus-client's
process collector adds RSS, CPU seconds and open file descriptors.

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
    queue_length{model,version}, inflight_requests{model,version}
    model_load_duration_seconds{model,version}, model_warmup_duration_seconds{model,version},
    model_ready{model,version},
    model_info{model,version,backend,execution_provider}
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from edgeinfer.errors import (
    InvalidInput,
    ModelNotFound,
    RequestCancelled,
    RequestTimeout,
    ServerBusy,
)

PREFIX = "edgeinfer_"
# 50 us to 10 s: a tiny model answers in well under a millisecond, a big one in seconds.
LATENCY_BUCKETS_S = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
STATUSES = ("success", "client_error", "rejected", "timeout", "error")
UNKNOWN_MODEL = "_unknown"  # requests for models that do not exist are counted here, not by name


def status_label(error: BaseException | None) -> str:
    """The ``status`` label of a finished request."""
    if error is None:
        return "success"
    if isinstance(error, ServerBusy):
        return "rejected"
    if isinstance(error, RequestTimeout):
        return "timeout"
    if isinstance(error, (InvalidInput, ModelNotFound, RequestCancelled)):
        return "client_error"
    return "error"


class Histogram:
    """Cumulative counts in fixed buckets; ``observe`` costs a bisect and three additions."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def buckets(self) -> list[tuple[str, float]]:
        total = 0
        out: list[tuple[str, float]] = []
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += count
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), total))
        return out


@dataclass
class ModelMetrics:
    """Everything measured about one model version."""

    name: str
    version: str
    requests: dict[tuple[str, str], int] = field(default_factory=dict)
    duration: dict[str, Histogram] = field(default_factory=dict)
    decode: dict[str, Histogram] = field(default_factory=dict)
    encode: dict[str, Histogram] = field(default_factory=dict)
    queue: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS_S))
    compute: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS_S))
    batch_size: Histogram = field(default_factory=lambda: Histogram(BATCH_BUCKETS))
    inflight: Callable[[], int] = lambda: 0
    queue_length: Callable[[], int] = lambda: 0
    ready: bool = False
    load_s: float = 0.0
    warmup_s: float = 0.0
    backend: str = ""
    execution_provider: str = ""

    def request_done(
        self, protocol: str, status: str, total_s: float, decode_s: float | None, encode_s: float | None
    ) -> None:
        key = (protocol, status)
        self.requests[key] = self.requests.get(key, 0) + 1
        _histogram(self.duration, protocol).observe(total_s)
        if decode_s is not None:
            _histogram(self.decode, protocol).observe(decode_s)
        if encode_s is not None:
            _histogram(self.encode, protocol).observe(encode_s)

    def batch_done(self, rows: int, compute_s: float) -> None:
        self.batch_size.observe(rows)
        self.compute.observe(compute_s)


def _histogram(table: dict[str, Histogram], protocol: str) -> Histogram:
    histogram = table.get(protocol)
    if histogram is None:
        histogram = table[protocol] = Histogram(LATENCY_BUCKETS_S)
    return histogram


class Metrics(Collector):
    """The server's metrics registry; ``exposition()`` is the body of ``GET /metrics``."""

    def __init__(self) -> None:
        self.models: dict[tuple[str, str], ModelMetrics] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.registry)
        self.registry.register(self)

    def model(self, name: str, version: str) -> ModelMetrics:
        metrics = self.models.get((name, version))
        if metrics is None:
            metrics = self.models[name, version] = ModelMetrics(name, version)
        return metrics

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        models = list(self.models.values())
        requests = CounterMetricFamily(
            PREFIX + "inference_requests", "Inference requests answered, by outcome",
            labels=["model", "version", "protocol", "status"],
        )  # fmt: skip
        for model in models:
            for (protocol, status), count in sorted(model.requests.items()):
                requests.add_metric([model.name, model.version, protocol, status], count)
        yield requests
        yield from _per_protocol(models, "duration", "inference_request_duration_seconds",
                                 "Time from parsed request to response, inside the server")  # fmt: skip
        yield from _per_protocol(models, "decode", "inference_decode_duration_seconds",
                                 "Time to turn a request body into tensors")  # fmt: skip
        yield from _per_protocol(models, "encode", "inference_encode_duration_seconds",
                                 "Time to turn output tensors into a response body")  # fmt: skip
        yield _per_model(
            models, "queue", "inference_queue_duration_seconds", "Time a request waited for its batch"
        )
        yield _per_model(
            models, "compute", "inference_compute_duration_seconds", "Time one batch spent in the model"
        )
        yield _per_model(models, "batch_size", "batch_size", "Rows per executed batch")
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
        for model in models:
            labels = [model.name, model.version]
            batches.add_metric(labels, model.batch_size.count)
            queue_length.add_metric(labels, model.queue_length())
            inflight.add_metric(labels, model.inflight())
            if model.backend:
                load.add_metric(labels, model.load_s)
                warmup.add_metric(labels, model.warmup_s)
                ready.add_metric(labels, 1.0 if model.ready else 0.0)
                info.add_metric([*labels, model.backend, model.execution_provider], 1.0)
        yield from (batches, queue_length, inflight, load, warmup, ready, info)


def _per_model(models: list[ModelMetrics], attribute: str, name: str, documentation: str) -> Metric:
    family = HistogramMetricFamily(PREFIX + name, documentation, labels=["model", "version"])
    for model in models:
        histogram: Histogram = getattr(model, attribute)
        family.add_metric([model.name, model.version], histogram.buckets(), histogram.sum)
    return family


def _per_protocol(
    models: list[ModelMetrics], attribute: str, name: str, documentation: str
) -> Iterator[Metric]:
    family = HistogramMetricFamily(PREFIX + name, documentation, labels=["model", "version", "protocol"])
    for model in models:
        table: dict[str, Histogram] = getattr(model, attribute)
        for protocol, histogram in sorted(table.items()):
            family.add_metric([model.name, model.version, protocol], histogram.buckets(), histogram.sum)
    yield family
