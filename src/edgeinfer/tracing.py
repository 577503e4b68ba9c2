"""OpenTelemetry traces of inference requests: ``tracing: {enabled: true}`` and the ``edgeinfer[otel]`` extra.

One request's trace (docs/observability.md)::

    infer <model>        SERVER; a child of the client's ``traceparent`` (HTTP header, gRPC metadata)
      decode             the call's start to its decoded, checked request
      queue              waiting in the model's queue until its batch started
      compute            the batch's model run (the runner's measured time), linked to the batch
      step <name>        a pipeline's steps: each an ordinary request with these same children
      encode             encoding the response
    batch <model>        a trace of its own per batch, linked to every sampled request in it

Why spans are written as finished records. The spans are made from the times the request path measures
anyway (``outcome.py``: decode, queue wait, batch, compute, encode), so every span is complete when it is
made: it goes to the SDK's span processors as a finished ``ReadableSpan``, as the SDK's own spans do when
they end. The SDK's live spans (``Tracer.start_span``: a sampler call, locks, bounded attributes) cost
28 us each on a 2-core VM, six of them a request, and the sampling decision alone 20 us for a request
that is then dropped; here a request that is not sampled costs one random draw, and a sampled one its
records. The request path is unchanged whether tracing is on or off: a request's span context is made
when the call begins (its batch and a pipeline's steps name it while they run), and the batcher hands
each finished batch over before it answers the batch's requests. With tracing off this module is never
imported: the request path pays an ``is None`` test in the service, the batcher and the HTTP transport.

Sampling: a request that continues a client's trace is recorded when the client's ``traceparent`` says
sampled; a new trace with probability ``tracing.sampling_ratio``; a pipeline's steps and a batch follow
their requests. ``OTEL_TRACES_SAMPLER`` (and ``_ARG``), when set, replaces this with one of the
specification's six samplers. Where spans go is the SDK's standard environment: ``OTEL_TRACES_EXPORTER``
(``otlp``, ``console``, ``none``), ``OTEL_EXPORTER_OTLP_*`` (endpoint, protocol, headers, certificates),
``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_BSP_*`` (the batch span processor).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from edgeinfer import __version__
from edgeinfer.config import TracingConfig
from edgeinfer.errors import ConfigError, describe
from edgeinfer.extras import missing
from edgeinfer.outcome import Outcome, RequestTrace
from edgeinfer.runners import BatchTimes

_W3C = TraceContextTextMapPropagator()
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_SCOPE = InstrumentationScope("edgeinfer", __version__)
_OK = Status(StatusCode.UNSET)
OTLP_PROTOCOLS = ("http/protobuf", "grpc")

# (traceparent, tracestate): the W3C trace context headers a transport received
TraceHeaders = tuple[str, "str | None"]


@dataclass(frozen=True, slots=True)
class Sampling:
    """Which requests are recorded: ``ratio`` of new traces; with ``follow_parent``, a continued trace
    when its ``traceparent`` says sampled (else it is drawn like a new one)."""

    ratio: float
    follow_parent: bool = True

    def draw(self) -> bool:
        return self.ratio >= 1.0 or random.random() < self.ratio


# OTEL_TRACES_SAMPLER -> (ratio, follow_parent); None: the ratio is OTEL_TRACES_SAMPLER_ARG (default 1)
SAMPLERS: Mapping[str, tuple[float | None, bool]] = {
    "always_on": (1.0, False),
    "always_off": (0.0, False),
    "traceidratio": (None, False),
    "parentbased_always_on": (1.0, True),
    "parentbased_always_off": (0.0, True),
    "parentbased_traceidratio": (None, True),
}


def sampling_from_environment(config: TracingConfig) -> Sampling:
    """The config's ``sampling_ratio`` (parent-based), unless ``OTEL_TRACES_SAMPLER`` names a sampler."""
    name = os.environ.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if not name:
        return Sampling(config.sampling_ratio)
    if name not in SAMPLERS:
        raise ConfigError(
            f"OTEL_TRACES_SAMPLER names {name!r}; edgeinfer samples traces with {', '.join(SAMPLERS)}"
        )
    ratio, follow_parent = SAMPLERS[name]
    if ratio is None:
        text = os.environ.get("OTEL_TRACES_SAMPLER_ARG", "1.0")
        try:
            ratio = float(text)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise ConfigError(f"OTEL_TRACES_SAMPLER_ARG must be a ratio from 0 to 1, not {text!r}")
    return Sampling(ratio, follow_parent)


class _EpochClock:
    """Epoch nanoseconds (what spans carry) of the request path's ``time.perf_counter`` and
    ``time.monotonic`` readings, through one offset per clock read once a second: the spans of one
    request line up to the nanosecond, and follow the wall clock when it is adjusted."""

    def __init__(self) -> None:
        self._refreshed = -1.0
        self._perf_offset_ns = self._monotonic_offset_ns = 0

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._refreshed >= 1.0:
            self._refreshed = now
            wall = time.time_ns()
            self._perf_offset_ns = wall - time.perf_counter_ns()
            self._monotonic_offset_ns = wall - time.monotonic_ns()

    def from_perf(self, seconds: float) -> int:
        self._refresh()
        return int(seconds * 1e9) + self._perf_offset_ns

    def from_monotonic(self, seconds: float) -> int:
        self._refresh()
        return int(seconds * 1e9) + self._monotonic_offset_ns


_CLOCK = _EpochClock()


def _new_context(parent: SpanContext | None = None) -> SpanContext:
    """A sampled span context: in ``parent``'s trace, or in a new trace."""
    if parent is None:
        return SpanContext(random.getrandbits(128) or 1, random.getrandbits(64) or 1, False, _SAMPLED)
    return SpanContext(parent.trace_id, random.getrandbits(64) or 1, False, _SAMPLED, parent.trace_state)


@dataclass(slots=True)
class _InBatch:
    """What a request's span needs from its batch: the batch span to link to, and where it ran."""

    link: SpanContext
    started_ns: int
    compute_ns: tuple[int, int]


@dataclass(slots=True, eq=False)
class _RequestSpan:
    """A sampled request's span while it is in flight (``RequestTrace.span``): written when it ends."""

    name: str
    kind: SpanKind
    context: SpanContext
    parent: SpanContext | None
    started_ns: int
    step: str | None = None
    batch: _InBatch | None = None

    @property
    def trace_id(self) -> str:
        return format(self.context.trace_id, "032x")


class Tracing:
    """Writes the spans of one server process (see the module docstring for the tree)."""

    def __init__(self, processors: Sequence[SpanProcessor], sampling: Sampling, resource: Resource) -> None:
        self._processors = tuple(processors)
        self._sampling = sampling
        self._resource = resource

    def begin(self, outcome: Outcome, headers: TraceHeaders | None) -> None:
        """A request a transport received: recorded (in the client's trace if it sent one) or not."""
        parent = _remote_parent(headers) if headers is not None else None
        if parent is not None and self._sampling.follow_parent:
            if not parent.trace_flags.sampled:
                return
        elif not self._sampling.draw():
            return
        context = _new_context(parent=parent)
        started_ns = _CLOCK.from_perf(outcome.started)
        outcome.trace.span = _RequestSpan(
            f"infer {outcome.model}", SpanKind.SERVER, context, parent, started_ns
        )

    def begin_step(self, outcome: Outcome, step: str, pipeline_span: object | None) -> None:
        """A pipeline step's request: recorded when the pipeline's request is, as a child of it."""
        if not isinstance(pipeline_span, _RequestSpan):
            return
        parent = pipeline_span.context
        started_ns = _CLOCK.from_perf(outcome.started)
        outcome.trace.span = _RequestSpan(
            f"step {step}", SpanKind.INTERNAL, _new_context(parent=parent), parent, started_ns, step
        )

    def end(self, outcome: Outcome, model: str, version: str, status: str) -> None:
        """The request is over (answered or failed): write its span and its children."""
        held = outcome.trace.span
        if not isinstance(held, _RequestSpan):
            return
        now_ns = _CLOCK.from_perf(outcome.ended)
        started_ns = held.started_ns
        children: list[tuple[str, int, int, Sequence[Link]]] = []
        if outcome.decode_s is not None:
            children.append(("decode", started_ns, started_ns + _ns(outcome.decode_s), ()))
        batch = held.batch
        if batch is not None:
            children.append(("queue", batch.started_ns - _ns(outcome.trace.queue_s), batch.started_ns, ()))
            children.append(("compute", *batch.compute_ns, (Link(batch.link),)))
        if outcome.encode_s is not None:
            children.append(("encode", now_ns - _ns(outcome.encode_s), now_ns, ()))
        for name, start, end, links in children:
            self.write(
                name, _new_context(parent=held.context), held.context, start, max(start, end), links=links
            )
        attributes = _request_attributes(outcome, model, version, status)
        status_ = _OK
        if outcome.error is not None:
            attributes["error.type"] = status
            status_ = Status(StatusCode.ERROR, describe(outcome.error))
        if held.step is not None:
            attributes["edgeinfer.pipeline.step"] = held.step
        self.write(
            held.name, held.context, held.parent, started_ns, now_ns, held.kind, attributes, status=status_
        )

    def write(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        start_ns: int,
        end_ns: int,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: dict[str, str | int] | None = None,
        links: Sequence[Link] = (),
        status: Status = _OK,
    ) -> None:
        """One finished span, to every processor (the exporters' queues)."""
        span = ReadableSpan(
            name=name,
            context=context,
            parent=parent,
            resource=self._resource,
            attributes=attributes,
            links=links,
            kind=kind,
            status=status,
            start_time=start_ns,
            end_time=end_ns,
            instrumentation_scope=_SCOPE,
        )
        for processor in self._processors:
            processor.on_end(span)

    def batches(self, model: str, version: str) -> BatchSpans:
        """Where one model version's batcher reports its batches (``batcher.BatchSpans``)."""
        return BatchSpans(self, model, version)

    def close(self) -> None:
        """Export what is still buffered and stop (blocks up to the exporters' timeout)."""
        for processor in self._processors:
            processor.shutdown()


class BatchSpans:
    """The ``batch <model>`` spans of one model version; each tells its requests where it ran."""

    def __init__(self, tracing: Tracing, model: str, version: str) -> None:
        self._tracing = tracing
        self._name = f"batch {model}"
        self._attributes = {"edgeinfer.model.name": model, "edgeinfer.model.version": version}

    def batch_done(
        self,
        started: float,
        traces: Sequence[RequestTrace | None],
        rows: int,
        times: BatchTimes | None,
        error: BaseException | None,
    ) -> None:
        held = [
            span
            for request in traces
            if request is not None and isinstance(span := request.span, _RequestSpan)
        ]
        if not held:
            return  # no request in it is sampled
        now_ns = _CLOCK.from_monotonic(time.monotonic())
        started_ns = _CLOCK.from_monotonic(started)
        attributes: dict[str, str | int] = {
            **self._attributes,
            "edgeinfer.batch.rows": rows,
            "edgeinfer.batch.requests": len(traces),
        }
        compute_ns = (started_ns, now_ns)
        if times is not None:
            attributes["edgeinfer.batch.handover_ns"] = times.handover_ns
            attributes["edgeinfer.batch.compute_input_ns"] = times.input_ns
            attributes["edgeinfer.batch.compute_infer_ns"] = times.infer_ns
            attributes["edgeinfer.batch.compute_output_ns"] = times.output_ns
            compute_start = min(now_ns, started_ns + times.handover_ns + times.input_ns)
            compute_ns = (compute_start, min(now_ns, compute_start + times.infer_ns))
        context = _new_context()
        status = _OK if error is None else Status(StatusCode.ERROR, describe(error))
        links = [Link(span.context) for span in held]
        self._tracing.write(
            self._name, context, None, started_ns, now_ns, attributes=attributes, links=links, status=status
        )
        where = _InBatch(context, started_ns, compute_ns)
        for span in held:
            span.batch = where


def _remote_parent(headers: TraceHeaders) -> SpanContext | None:
    """The client's span context from W3C headers; None when absent or malformed (a new trace)."""
    carrier = {"traceparent": headers[0]}
    if headers[1]:
        carrier["tracestate"] = headers[1]
    parent = get_current_span(_W3C.extract(carrier)).get_span_context()
    return parent if parent.is_valid else None


def _request_attributes(outcome: Outcome, model: str, version: str, status: str) -> dict[str, str | int]:
    """The V2 request id, the model and version that answered (a route or fallback's, and then the one
    asked for too), rows and the batch's rows."""
    attributes: dict[str, str | int] = {
        "edgeinfer.request.id": outcome.request_id,
        "edgeinfer.protocol": outcome.protocol,
        "edgeinfer.model.name": model,
        "edgeinfer.model.version": version,
        "edgeinfer.status": status,
        "edgeinfer.rows": outcome.rows,
    }
    if outcome.trace.batch_rows:
        attributes["edgeinfer.batch.rows"] = outcome.trace.batch_rows
    if model != outcome.model:
        attributes["edgeinfer.model.requested"] = outcome.model
    return attributes


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def setup(config: TracingConfig, exporter: SpanExporter | None = None) -> Tracing:
    """This process's tracing: exporters from the ``OTEL_*`` environment, batched in the background;
    or ``exporter`` (tests), given each span as it is written."""
    processors: list[SpanProcessor]
    if exporter is not None:
        processors = [SimpleSpanProcessor(exporter)]
    else:
        processors = [BatchSpanProcessor(configured) for configured in exporters_from_environment()]
    return Tracing(processors, sampling_from_environment(config), _resource())


class _Resource(Resource):
    """A resource that hashes once: the OTLP encoder groups spans by resource, hashing it per span
    (``Resource.__hash__`` serializes every attribute to JSON: 10 us a span, of 60 to encode one)."""

    def __init__(self, resource: Resource) -> None:
        super().__init__(resource.attributes, resource.schema_url)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash


def _resource() -> Resource:
    """``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` as given; the service is edgeinfer else.
    Each worker process has its own tracer, told apart by its pid."""
    resource = Resource.create({SERVICE_VERSION: __version__, "process.pid": os.getpid()})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "edgeinfer"}))
    return _Resource(resource)


def exporters_from_environment() -> list[SpanExporter]:
    """``OTEL_TRACES_EXPORTER`` (comma-separated; ``otlp`` when unset), as the OpenTelemetry spec says.
    OTLP goes over ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` or ``OTEL_EXPORTER_OTLP_PROTOCOL``
    (``http/protobuf`` when unset, or ``grpc``); each exporter reads its endpoint, headers and
    certificates from the environment itself."""
    exporters: list[SpanExporter] = []
    for name in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(","):
        name = name.strip().lower()
        if name in ("", "none"):
            continue
        if name == "console":
            exporters.append(ConsoleSpanExporter())
        elif name == "otlp":
            exporters.append(_otlp_exporter())
        else:
            raise ConfigError(
                f"OTEL_TRACES_EXPORTER names {name!r}; edgeinfer exports traces to otlp, console or none"
            )
    return exporters


def _otlp_exporter() -> SpanExporter:
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol not in OTLP_PROTOCOLS:
        raise ConfigError(
            f"OTLP protocol {protocol!r} (OTEL_EXPORTER_OTLP_PROTOCOL): edgeinfer exports traces over "
            f"{' or '.join(OTLP_PROTOCOLS)}"
        )
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[assignment]
                OTLPSpanExporter,
            )
    except ImportError as exc:
        raise missing(exc, "exporting traces over OTLP") or ConfigError(
            "exporting traces over OTLP needs the OTLP exporter: pip install 'edgeinfer[otel]'"
        ) from None
    return OTLPSpanExporter()
