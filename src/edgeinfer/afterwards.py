"""Bookkeeping that waits until the answers of the loop iteration are written.

What a request leaves behind to be counted (Prometheus histograms, Triton's statistics, the access
log, the router's latency window, the cost model's new point) is no part of its answer, yet done in
line it comes before the write, on the one thread that writes: at concurrency 1 that is latency
(docs/design/batching-experiments.md, "Records after the answers"). So whoever keeps such records
queues them here, and they are made together once the callbacks of this loop iteration have run: after
the writes, and while the client reads its answer and sends its next request.

A client that gets its answer and then asks for the metrics or the statistics must find its request
in them, and the loop may read that question before the queued calls run: an answer written from a
callback (a batch that ran in a worker thread) leaves its records for the next iteration, after the
loop has polled its sockets again. So whoever reads the records first makes every queued call
(``flush``). A log file read directly can lag its answer: the access log line is written just after it
(over gRPC, whose answers leave from grpcio's own threads, the answer may come before the line is in
the file). Without a running loop (a synchronous caller, a unit test) the call is made at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_waiting: list[Afterwards] = []  # those with calls queued, for ``flush``


def flush() -> None:
    """Make every queued call now, before reading what they record (the statistics, the metrics)."""
    while _waiting:
        _waiting[0].run_queued()


class Afterwards:
    """Calls queued during one loop iteration, made in order in one callback after it (one
    ``call_soon`` per iteration, however many requests the iteration answered)."""

    __slots__ = ("_calls",)

    def __init__(self) -> None:
        self._calls: list[tuple[Callable[..., object], tuple[Any, ...]]] = []

    def call(self, function: Callable[..., object], *args: Any) -> None:
        calls = self._calls
        if not calls:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop: nothing is waiting to be written
                function(*args)
                return
            loop.call_soon(self.run_queued)
            _waiting.append(self)
        calls.append((function, args))

    def run_queued(self) -> None:
        calls, self._calls = self._calls, []
        if not calls:  # made already (``flush``)
            return
        _waiting.remove(self)
        for function, args in calls:
            try:
                function(*args)
            except Exception:  # noqa: PERF203 (one failed record must not lose the others; try is free in 3.11)
                log.exception("bookkeeping after an answer failed: %r", function)
