"""The exceptions the core raises; transports map them to status codes.

    EdgeInferError
    ├── ConfigError                      bad configuration (startup only)
    ├── ModelLoadError                   a model file cannot be loaded or warmed up
    ├── InvalidInput (ValueError)        the request is wrong: shape, dtype, name, JSON, size
    │   ├── PayloadTooLarge              the body is over the configured limit
    │   └── LimitExceeded                over one of ``server.limits`` (``limit`` names it)
    │       └── TooLarge                 ... a limit on size: elements, rows, a BYTES element
    ├── Unauthenticated                  no API key, or one the server does not know
    ├── PermissionDenied                 a known key without the role the route needs
    ├── ModelNotFound (LookupError)      no such model or version
    ├── ModelNotReady                    known, but not servable right now
    │   └── ModelEvicted                 unloaded to save memory; a request loads it again
    ├── ServerBusy                       refused for load (queue, SLO, limits); retry after a hint
    ├── RequestTimeout (TimeoutError)    the deadline passed before the request ran
    ├── RequestCancelled                 the client went away before the request ran
    ├── Superseded                       a newer frame of the same stream replaced it (drop_stale)
    └── InferenceFailed (RuntimeError)   the model raised while running a batch
        ├── RowsMismatch                 its outputs have other row counts than its inputs
        └── RuntimeRejected              ONNX Runtime (or OpenVINO) refused to run it on these values

The core never mentions HTTP or gRPC. Each transport keeps one table from these classes to its own
status codes and looks a raised error up along its MRO, so a new subclass inherits a sensible code.
"""

from __future__ import annotations

import math


class EdgeInferError(Exception):
    """Base of every error edgeinfer raises on purpose."""

    @property
    def message(self) -> str:
        return str(self)


class ConfigError(EdgeInferError):
    """The configuration cannot be used; raised before anything is served."""


class ModelLoadError(EdgeInferError):
    """A model could not be loaded or warmed up; the message says which file and why."""


class InvalidInput(EdgeInferError, ValueError):
    """The request does not fit the model or the protocol."""


class PayloadTooLarge(InvalidInput):
    """The request body is larger than ``server.max_request_size_mb``."""


class LimitExceeded(InvalidInput):
    """The request is over one of the hard limits (``server.limits``); ``limit`` is its name in the
    ``edgeinfer_limit_refusals_total{limit}`` counter."""

    def __init__(self, message: str, limit: str = "") -> None:
        super().__init__(message)
        self.limit = limit


class TooLarge(LimitExceeded):
    """Over a size limit (tensor elements, rows, a BYTES element): 413 like an oversized body."""


class Unauthenticated(EdgeInferError):
    """The request carries no API key, or one that matches no configured key (HTTP 401)."""


class PermissionDenied(EdgeInferError):
    """The API key is valid but lacks the role the route needs (HTTP 403)."""


class ModelNotFound(EdgeInferError, LookupError):
    """No model (or no such version of it) is known to the server."""


class ModelNotReady(EdgeInferError):
    """The model is known but cannot serve now (loading, unloading, failed)."""


class ModelEvicted(ModelNotReady):
    """The model was unloaded to stay within the residency limits (or was never loaded, on demand).

    Transports catch this, wait for ``InferenceService.load_evicted`` and submit again.
    """


class ServerBusy(EdgeInferError):
    """Refused for load: the model's queue is full, the request would miss its SLO, or a connection or
    call limit is reached. ``retry_after_s`` is a hint for the client: when the work ahead should be done."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    @classmethod
    def retry_in(cls, message: str, retry_after_s: float) -> ServerBusy:
        """A refusal whose message ends with the hint too ("; retry in 5 ms"): all that a refused message
        of a stream carries, where no header or trailer goes."""
        return cls(f"{message}; retry in {whole_ms(retry_after_s)} ms", retry_after_s)

    @property
    def retry_after_ms(self) -> int:
        return whole_ms(self.retry_after_s)


def whole_ms(seconds: float) -> int:
    """A retry hint in whole milliseconds, rounded up (a client should not come back sooner), at least 1:
    the headers and trailers a refusal carries, and the "retry in" its message ends with. (Rounded to the
    nanosecond first: a sum of measured times such as 0.02 + 0.01 is 30.000000000000004 ms.)"""
    return max(1, math.ceil(round(seconds * 1000, 6)))


class RequestTimeout(EdgeInferError, TimeoutError):
    """The request's deadline passed while it waited in the queue; it was not run."""


class RequestCancelled(EdgeInferError):
    """The client disconnected before the request ran; it was not run."""


class Superseded(EdgeInferError):
    """A queued request of a stream (``stream_id``, ``drop_stale``) was replaced by a newer one of the
    same stream before it ran; it was not run."""


class InferenceFailed(EdgeInferError, RuntimeError):
    """The model raised, or produced outputs that cannot be split back into requests."""


class RuntimeRejected(InferenceFailed):
    """The inference runtime (ONNX Runtime, OpenVINO) raised running the model on the values it was
    given: a graph that casts strings to numbers meets one that is not. Warmup tells it from the rest
    of InferenceFailed: synthetic values it refuses are the server's guess at an input, not a fault."""


class RowsMismatch(InferenceFailed):
    """With batching on, an output's first dimension differs from the batch's rows: it cannot be split."""


def startup_failure(error: ConfigError | ModelLoadError) -> tuple[int, str]:
    """How ``edgeinfer serve`` ends when it cannot start: the exit code (2: configuration, 1: a model
    could not load) and the message it prints."""
    if isinstance(error, ConfigError):
        return 2, f"configuration error: {error}"
    return 1, str(error)


def describe(error: BaseException) -> str:
    """The message a client gets for ``error``: ours as written, anything else as an internal error."""
    if isinstance(error, EdgeInferError):
        return error.message
    return f"internal server error: {type(error).__name__}: {error}"


# The errors that may cross from one worker process to another (by class name).
BY_NAME: dict[str, type[EdgeInferError]] = {
    cls.__name__: cls
    for cls in (
        EdgeInferError,
        ConfigError,
        ModelLoadError,
        InvalidInput,
        PayloadTooLarge,
        LimitExceeded,
        TooLarge,
        Unauthenticated,
        PermissionDenied,
        ModelNotFound,
        ModelNotReady,
        ModelEvicted,
        ServerBusy,
        RequestTimeout,
        RequestCancelled,
        Superseded,
        InferenceFailed,
        RowsMismatch,
        RuntimeRejected,
    )
}
