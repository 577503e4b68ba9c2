"""``RequestHead``: what a transport knows of an inference request before its body is decoded."""

from __future__ import annotations

TraceHeaders = tuple[str, str | None]  # the W3C ``traceparent`` and ``tracestate`` a client sent


class RequestHead:
    """Built by a transport from the URL or RPC and the headers or metadata, given to
    ``InferenceService.call``; the request's body never overrides what only the transport knows (its
    deadline, its own stream), and the transport never writes into the decoded body.

    ``request_id``: the client's (``x-request-id``); ``routing_key``: the client's
    (``x-routing-key``), used when the body names none; ``stream_id``: the stream a ``drop_stale``
    request belongs to when its body names none (a gRPC stream is one); ``deadline``: when the
    transport's own deadline passes (``time.monotonic``; a gRPC client's); ``trace_headers``: the W3C
    trace context received (read only while tracing is on); ``received_at``: when the transport began
    receiving the request (``time.monotonic``), where the model's SLO counts from."""

    __slots__ = (
        "deadline",
        "model",
        "protocol",
        "received_at",
        "request_id",
        "routing_key",
        "stream_id",
        "trace_headers",
        "version",
    )

    def __init__(
        self,
        protocol: str,
        model: str,
        version: str | None,
        request_id: str | None = None,
        trace_headers: TraceHeaders | None = None,
        routing_key: str | None = None,
        stream_id: str | None = None,
        deadline: float | None = None,
        received_at: float | None = None,
    ) -> None:
        self.protocol = protocol
        self.model = model
        self.version = version
        self.request_id = request_id
        self.trace_headers = trace_headers
        self.routing_key = routing_key
        self.stream_id = stream_id
        self.deadline = deadline
        self.received_at = received_at
