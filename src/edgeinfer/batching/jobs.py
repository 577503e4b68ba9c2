"""What a batcher keeps of each queued request (``Job``), where its batches become trace spans
(``BatchSpans``), and how a request's outputs or error reach its future."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Protocol

from edgeinfer.errors import EdgeInferError, InferenceFailed
from edgeinfer.outcome import RequestTrace
from edgeinfer.runners import BatchResult, BatchTimes, Result, Tensors, Work


class BatchSpans(Protocol):
    """Where a model version's batches become trace spans (``tracing.py``), when tracing is on."""

    def batch_done(
        self,
        started: float,
        traces: Sequence[RequestTrace | None],
        rows: int,
        times: BatchTimes | None,
        error: BaseException | None,
    ) -> None:
        """A batch handed to the runner at ``started`` (``time.monotonic``) finished now: with ``times``,
        or failed with ``error``. Called before its requests are answered."""
        ...


class Job:
    """A queued request: its work, its future, its trace, and the transport's ``on_done``."""

    __slots__ = ("future", "on_done", "trace", "work")

    def __init__(
        self,
        work: Work,
        future: asyncio.Future[Tensors],
        trace: RequestTrace | None,
        on_done: Callable[[], None] | None = None,
    ) -> None:
        self.work = work
        self.future = future
        self.trace = trace
        self.on_done = on_done


def as_error(model: str, error: BaseException) -> EdgeInferError:
    """``error`` as the request's: ours as it is, anything else the model raised as ``InferenceFailed``."""
    if isinstance(error, EdgeInferError):
        return error
    return InferenceFailed(f"model {model} failed: {type(error).__name__}: {error}")


def settle(future: asyncio.Future[Tensors], outputs: Result, model: str) -> bool:
    """Give a request its outputs, or its own error (a Python model may fail one request of a batch);
    whether it succeeded."""
    if isinstance(outputs, BaseException):
        future.set_exception(as_error(model, outputs))
        return False
    future.set_result(outputs)
    return True


def report(
    spans: BatchSpans, started: float, jobs: list[Job], rows: int, done: BatchResult | BaseException
) -> None:
    """A finished batch to the trace spans of its requests, before they are answered."""
    traces = [job.trace for job in jobs]
    if isinstance(done, BaseException):
        spans.batch_done(started, traces, rows, None, done)
    else:
        spans.batch_done(started, traces, rows, done.times, None)
