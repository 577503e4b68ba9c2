"""The queue of one model version: it owns the pending requests, their futures and the timer.

Requests are submitted from the event loop and get a future. Batches run in a thread pool, so the loop
keeps decoding the next requests while the model computes. Nothing here polls: a batch starts when a
request arrives or a batch finishes (if a slot is free and the policy says so), or when the timer for the
policy's ``wake_at`` or the next deadline fires.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from edgeinfer.backends import RunRequests
from edgeinfer.backends.python import Request
from edgeinfer.batching.policy import BatchPolicy, Pending, next_batch, next_deadline, split_expired
from edgeinfer.batching.stats import BatchTimes, ModelStatistics
from edgeinfer.errors import EdgeInferError, InferenceFailed, ModelNotReady, RequestTimeout, ServerBusy
from edgeinfer.metrics import ModelMetrics

Tensors = dict[str, np.ndarray]
RunBatch = Callable[[Tensors, Sequence[str] | None], Tensors]


@dataclass(slots=True)
class RequestTrace:
    """Where one request's time went, filled in by the batcher (for access logs)."""

    queue_s: float = 0.0
    batch_rows: int = 0
    compute_s: float = 0.0


@dataclass(slots=True, eq=False)
class _Job:
    inputs: Tensors
    output_names: frozenset[str] | None
    future: asyncio.Future[Tensors]
    trace: RequestTrace | None
    parameters: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """How much may wait and run. ``inline_max_s``: see ``Batcher``; 0 always uses the thread pool.

    ``max_concurrent_batches`` batches compute at once; ``prefetch_batches`` more may be formed and handed
    to worker threads ahead of time, where they wait for a compute slot (see ``Batcher``).
    """

    max_queue_size: int = 512
    max_concurrent_batches: int = 1
    prefetch_batches: int = 0
    queue_timeout_s: float | None = None
    inline_max_s: float = 0.0


class Batcher:
    """Merges compatible requests into batches and runs them with ``run`` in ``executor``.

    Handing a batch to a worker thread and back costs about 60 us of latency and 40 us of CPU. For a
    model whose batches take less than that (a small MLP, a tree ensemble) the hop is most of the
    request, so a batch predicted to take at most ``limits.inline_max_s`` (from the measured time per row
    of earlier batches) runs directly on the event loop instead: it blocks the loop for less time than
    the hop would. Slow models, and every model until its first batch has been timed, use the pool.

    Prefetching: when a batch finishes, its worker thread needs the GIL to hand back the results and the
    event loop to start the next batch; if the loop is busy decoding a large JSON request (milliseconds,
    holding the GIL), the model sits idle meanwhile. With ``prefetch_batches`` the next batch is formed
    while the current one computes and waits in its own worker thread for the compute slot, so it starts
    the moment the slot frees up. Batches formed early are smaller, so this suits models whose
    throughput does not grow with batch size (most CPU models).
    """

    def __init__(
        self,
        name: str,
        run: RunBatch,
        policy: BatchPolicy,
        limits: QueueLimits,
        executor: Executor,
        metrics: ModelMetrics | None = None,
        run_requests: RunRequests | None = None,
        async_requests: bool = False,
    ) -> None:
        """``run_requests`` (Python models) replaces concatenation: it gets a list of
        ``backends.python.Request`` and returns one output dict or exception per request; with
        ``async_requests`` it is a coroutine function run on the event loop."""
        self.name = name
        self._run_requests = run_requests
        self._async_requests = async_requests
        self.metrics = metrics or ModelMetrics(name, "")
        self.metrics.queue_length = lambda: len(self._pending)
        self.metrics.inflight = lambda: self._outstanding
        self.policy = policy
        self.limits = limits
        self._run = run
        self._executor = executor
        self._pending: list[Pending] = []
        self._running = 0
        self._slots = limits.max_concurrent_batches + limits.prefetch_batches
        self._compute_slots = threading.BoundedSemaphore(limits.max_concurrent_batches)
        self._sequence = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.stats = ModelStatistics()
        self._s_per_row: float | None = None  # moving average of measured batch time per row
        self._flush_soon = False
        self._outstanding = 0  # submitted and not yet answered

    @property
    def queue_length(self) -> int:
        return len(self._pending)

    @property
    def outstanding(self) -> int:
        """Requests submitted and not yet answered (queued or in a running batch)."""
        return self._outstanding

    def submit(
        self,
        inputs: Tensors,
        rows: int,
        group: Hashable,
        *,
        output_names: frozenset[str] | None = None,
        priority: int = 1,
        timeout_s: float | None = None,
        trace: RequestTrace | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> asyncio.Future[Tensors]:
        """Queue one request; the future resolves to its outputs or raises the batch's error.

        Cancelling the future (the client went away) takes the request out of the queue if it has not
        started yet.
        """
        if self._closed:
            raise ModelNotReady(f"model {self.name} is unloading and takes no new requests")
        if len(self._pending) >= self.limits.max_queue_size:
            raise ServerBusy(
                f"model {self.name} has {len(self._pending)} requests queued, its limit "
                f"(max_queue_size); retry later"
            )
        loop = self._loop or asyncio.get_running_loop()
        self._loop = loop
        now = time.monotonic()
        deadline = _deadline(now, timeout_s, self.limits.queue_timeout_s)
        future: asyncio.Future[Tensors] = loop.create_future()
        item = Pending(
            rows=rows,
            group=group,
            enqueued_at=now,
            priority=priority,
            deadline=deadline,
            sequence=next(self._sequence),
            payload=_Job(inputs, output_names, future, trace, parameters),
        )
        self._idle.clear()
        future.add_done_callback(partial(self._on_answered, item))
        self._outstanding += 1
        if self._outstanding == 1 and self._running < self._slots and self._goes_alone(rows):
            # Nothing else in flight: no other request can join, so start now; a fast model runs inline
            # and the caller finds the future already done.
            self._start([item])
            self._update_idle()
            return future
        self._pending.append(item)
        if not self._flush_soon:
            # Under load, decide after this loop iteration: requests that arrived on other connections
            # in the same iteration are parsed by then and can join the batch (the hop costs < 1 us).
            self._flush_soon = True
            loop.call_soon(self._flush)
        return future

    def _goes_alone(self, rows: int) -> bool:
        policy = self.policy
        return policy.max_queue_delay_s <= 0 or policy.max_batch_size <= 1 or rows >= policy.max_batch_size

    def _flush(self) -> None:
        self._flush_soon = False
        self._schedule(None)

    async def drain(self) -> None:
        """Refuse new requests and wait until every queued and running one is answered."""
        self._closed = True
        await self._idle.wait()

    def _on_answered(self, item: Pending, future: asyncio.Future[Tensors]) -> None:
        """Count the request; if it was cancelled while queued, take it out of the queue."""
        self._outstanding -= 1
        assert self._loop is not None
        elapsed_ns = int((time.monotonic() - item.enqueued_at) * 1e9)
        if future.cancelled():
            self.stats.fail.add(elapsed_ns)
            if item in self._pending:
                self._pending.remove(item)
                self._schedule(None)
        elif future.exception() is not None:
            self.stats.fail.add(elapsed_ns)
        else:
            self.stats.success.add(elapsed_ns)
            self.stats.last_inference_ms = int(time.time() * 1000)

    def _on_timer(self, when: float) -> None:
        self._timer = None
        # Timers may fire a hair early; treating now as the wake time avoids re-arming in a tight loop.
        self._schedule(max(time.monotonic(), when))

    def _schedule(self, now: float | None) -> None:
        loop = self._loop
        assert loop is not None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if now is None:
            now = time.monotonic()
        wake_at: float | None = None
        while self._pending:
            if self._running >= self._slots:
                self._pending, expired = split_expired(self._pending, now)
                self._expire(expired, now)
                wake_at = next_deadline(self._pending)
                break
            decision = next_batch(self._pending, self.policy, now)
            self._expire(decision.expired, now)
            self._remove(decision.expired + decision.batch)
            if not decision.batch:
                wake_at = decision.wake_at
                break
            self._start(decision.batch)
        if wake_at is not None:
            self._timer = loop.call_later(max(0.0, wake_at - now), self._on_timer, wake_at)
        self._update_idle()

    def _remove(self, items: list[Pending]) -> None:
        if items:
            gone = {id(item) for item in items}
            self._pending = [item for item in self._pending if id(item) not in gone]

    def _expire(self, expired: list[Pending], now: float) -> None:
        for item in expired:
            job: _Job = item.payload  # type: ignore[assignment]
            if not job.future.done():
                waited_ms = (now - item.enqueued_at) * 1000
                job.future.set_exception(
                    RequestTimeout(
                        f"request to model {self.name} timed out after {waited_ms:.1f} ms in the queue; "
                        "it was not run"
                    )
                )

    def _start(self, batch: list[Pending]) -> None:
        assert self._loop is not None
        self._running += 1
        now = time.monotonic()
        rows = [item.rows for item in batch]
        total_rows = sum(rows)
        queue_histogram = self.metrics.queue
        for item in batch:
            waited = now - item.enqueued_at
            self.stats.queue.add(int(waited * 1e9))
            queue_histogram.observe(waited)
            trace = item.payload.trace  # type: ignore[attr-defined]
            if trace is not None:
                trace.queue_s, trace.batch_rows = waited, total_rows
        jobs: list[_Job] = [item.payload for item in batch]  # type: ignore[misc]
        output_names = _union_outputs(jobs)
        times = BatchTimes()
        if self._run_requests is not None:
            self._start_requests(jobs, total_rows, times)
            return
        if self._running == 1 and self._predicted_s(sum(rows)) <= self.limits.inline_max_s:
            try:
                results: list[Tensors] | None = self._execute(jobs, rows, output_names, times, alone=True)
                error: BaseException | None = None
            except Exception as failure:
                results, error = None, failure
            self._running -= 1
            self._complete(jobs, sum(rows), times, results, error)
            return
        done = self._loop.run_in_executor(self._executor, self._execute, jobs, rows, output_names, times)
        done.add_done_callback(partial(self._finish, jobs, sum(rows), times))

    def _start_requests(self, jobs: list[_Job], rows: int, times: BatchTimes) -> None:
        """The per-request path: the model gets the requests themselves, not concatenated arrays."""
        assert self._loop is not None
        assert self._run_requests is not None
        requests = [_python_request(job) for job in jobs]
        if self._async_requests:
            done: asyncio.Future[list[Any]] = asyncio.ensure_future(self._timed_async(requests, times))
        else:
            done = self._loop.run_in_executor(self._executor, self._timed_sync, requests, times)
        done.add_done_callback(partial(self._finish, jobs, rows, times))

    def _timed_sync(self, requests: list[Any], times: BatchTimes) -> list[Any]:
        assert self._run_requests is not None
        started = time.perf_counter_ns()
        with self._compute_slots:
            results: list[Any] = self._run_requests(requests)
        times.infer_ns = max(1, time.perf_counter_ns() - started)
        return results

    async def _timed_async(self, requests: list[Any], times: BatchTimes) -> list[Any]:
        assert self._run_requests is not None
        started = time.perf_counter_ns()
        results: list[Any] = await self._run_requests(requests)
        times.infer_ns = max(1, time.perf_counter_ns() - started)
        return results

    def _predicted_s(self, rows: int) -> float:
        return float("inf") if self._s_per_row is None else self._s_per_row * rows

    def _execute(
        self,
        jobs: list[_Job],
        rows: list[int],
        output_names: list[str] | None,
        times: BatchTimes,
        alone: bool = False,
    ) -> list[Tensors]:
        """Runs in a worker thread (or inline, ``alone``): concatenate, run, split back by row counts."""
        started = time.perf_counter_ns()
        if len(jobs) == 1:
            inputs = jobs[0].inputs
        else:
            inputs = {name: np.concatenate([job.inputs[name] for job in jobs]) for name in jobs[0].inputs}
        computing = time.perf_counter_ns()
        times.input_ns = computing - started
        if alone:  # no other batch exists, so no compute slot to wait for
            outputs = self._run(inputs, output_names)
        else:
            with self._compute_slots:  # a prefetched batch waits here, ready to go
                computing = time.perf_counter_ns()
                outputs = self._run(inputs, output_names)
        computed = time.perf_counter_ns()
        times.infer_ns = computed - computing
        results = self._split(outputs, rows)
        times.output_ns = time.perf_counter_ns() - computed
        return results

    def _split(self, outputs: Tensors, rows: list[int]) -> list[Tensors]:
        if self.policy.max_batch_size == 0:
            return [outputs]
        total = sum(rows)
        for name, array in outputs.items():
            if array.ndim == 0 or array.shape[0] != total:
                raise InferenceFailed(
                    f"model {self.name} returned output {name!r} with shape {list(array.shape)} for "
                    f"{total} input rows; with batching on, an output's first dimension must equal the "
                    "input rows (set max_batch_size: 0 if the first dimension is not a batch dimension)"
                )
        if len(rows) == 1:
            return [outputs]
        bounds = list(itertools.accumulate(rows))[:-1]
        split = {name: np.split(array, bounds) for name, array in outputs.items()}
        return [{name: parts[index] for name, parts in split.items()} for index in range(len(rows))]

    def _finish(
        self, jobs: list[_Job], rows: int, times: BatchTimes, done: asyncio.Future[list[Tensors]]
    ) -> None:
        """Executor callback: deliver the batch's results, then see what can run next."""
        self._running -= 1
        if done.cancelled():
            self._complete(
                jobs, rows, times, None, ModelNotReady(f"model {self.name} stopped before the batch ran")
            )
        else:
            error = done.exception()
            self._complete(jobs, rows, times, None if error else done.result(), error)
        self._schedule(None)

    def _complete(
        self,
        jobs: list[_Job],
        rows: int,
        times: BatchTimes,
        results: list[Tensors] | None,
        error: BaseException | None,
    ) -> None:
        if times.infer_ns:
            self.stats.record_batch(rows, len(jobs), times)
            compute_s = times.infer_ns / 1e9
            self.metrics.batch_done(rows, compute_s)
            for job in jobs:
                if job.trace is not None:
                    job.trace.compute_s = compute_s
            per_row = (times.input_ns + times.infer_ns + times.output_ns) / 1e9 / rows
            average = self._s_per_row
            self._s_per_row = per_row if average is None else 0.8 * average + 0.2 * per_row
        if error is not None or results is None:
            if not isinstance(error, EdgeInferError):
                error = InferenceFailed(f"model {self.name} failed: {type(error).__name__}: {error}")
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(error)
            return
        for job, outputs in zip(jobs, results, strict=True):
            if job.future.done():
                continue
            if isinstance(outputs, BaseException):  # a per-request error from a Python model
                job.future.set_exception(
                    outputs if isinstance(outputs, EdgeInferError) else _wrap(self.name, outputs)
                )
            else:
                job.future.set_result(outputs)

    def _update_idle(self) -> None:
        if not self._pending and self._running == 0:
            self._idle.set()


def _wrap(name: str, error: BaseException) -> InferenceFailed:
    return InferenceFailed(f"model {name} failed: {type(error).__name__}: {error}")


def _python_request(job: _Job) -> Request:
    return Request(job.inputs, dict(job.parameters or {}))


def _deadline(now: float, *timeouts_s: float | None) -> float | None:
    given = [timeout for timeout in timeouts_s if timeout is not None]
    return now + min(given) if given else None


def _union_outputs(jobs: list[_Job]) -> list[str] | None:
    names: set[str] = set()
    for job in jobs:
        if job.output_names is None:
            return None
        names |= job.output_names
    return sorted(names)
