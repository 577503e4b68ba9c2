"""What one inference request became: filled in along the request path, recorded once at the end.

A leaf module: the batcher fills the ``RequestTrace``, the inference call the rest, and the metrics and
the access log read it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from edgeinfer.metrics import ModelMetrics


class RequestSpan(Protocol):
    """A request's OpenTelemetry span while it is in flight (``tracing.py``; None when tracing is off)."""

    @property
    def trace_id(self) -> str:
        """The trace's id in hex, for the access log; empty when the request is not sampled."""
        ...


@dataclass(slots=True)
class RequestTrace:
    """Where one request's time went, filled in by the batcher (and a pipeline's steps: their seconds
    by step name, lent to the pipeline with the request), for access logs and traces."""

    queue_s: float = 0.0
    batch_rows: int = 0
    compute_s: float = 0.0
    steps: dict[str, float] = field(default_factory=dict)
    span: RequestSpan | None = None


@dataclass(slots=True)
class Outcome:
    """One inference request as it went: protocol, model, timings, rows and the error if it failed."""

    protocol: str
    model: str
    version: str | None
    request_id: str = ""
    started: float = field(default_factory=time.perf_counter)
    ended: float = 0.0  # time.perf_counter() when it was answered or failed (0 until then)
    received_at: float | None = None  # time.monotonic() when the transport began receiving it
    error: BaseException | None = None
    decode_s: float | None = None
    encode_s: float | None = None
    rows: int = 0
    trace: RequestTrace = field(default_factory=RequestTrace)
    metrics: ModelMetrics | None = None  # known once the request reached its model version
