"""What one inference request became: filled in along the request path, recorded once at the end.

A leaf module: the batcher fills the ``RequestTrace``, the inference call the rest, and the metrics and
the access log read it.
"""

from __future__ import annotations

import time
from typing import Protocol

from edgeinfer.metrics import ModelMetrics


class RequestSpan(Protocol):
    """A request's OpenTelemetry span while it is in flight (``tracing.py``; None when tracing is off)."""

    @property
    def trace_id(self) -> str:
        """The trace's id in hex, for the access log; empty when the request is not sampled."""
        ...


class RequestTrace:
    """Where one request's time went, filled in by the batcher (and a pipeline's steps: their seconds
    by step name, lent to the pipeline with the request), for access logs and traces. (A plain class,
    not a dataclass, like every object made per request: ``setup.py``.)"""

    __slots__ = ("batch_rows", "compute_s", "queue_s", "span", "steps")

    def __init__(self) -> None:
        self.queue_s = 0.0
        self.batch_rows = 0
        self.compute_s = 0.0
        self.steps: dict[str, float] = {}
        self.span: RequestSpan | None = None


class Outcome:
    """One inference request as it went: protocol, model, timings, rows and the error if it failed."""

    __slots__ = (
        "decode_from",
        "decode_s",
        "encode_s",
        "ended",
        "error",
        "metrics",
        "model",
        "protocol",
        "received_at",
        "repeats",
        "request_id",
        "rows",
        "started",
        "trace",
        "version",
    )

    def __init__(
        self,
        protocol: str,
        model: str,
        version: str | None,
        request_id: str = "",
        received_at: float | None = None,  # time.monotonic() when the transport began receiving it
    ) -> None:
        self.protocol = protocol
        self.model = model
        self.version = version
        self.request_id = request_id
        self.started = time.perf_counter()
        self.decode_from = self.started  # where its decode time counts from: its body was there
        self.ended = 0.0  # time.perf_counter() when it was answered or failed (0 until then)
        self.received_at = received_at
        self.error: BaseException | None = None
        self.decode_s: float | None = None
        self.encode_s: float | None = None
        self.rows = 0
        self.trace = RequestTrace()
        self.metrics: ModelMetrics | None = None  # known once the request reached its model version
        self.repeats = 0  # more requests refused with this one's error in its loop iteration, counted with it
