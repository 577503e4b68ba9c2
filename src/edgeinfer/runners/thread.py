"""Batches in worker threads, or inline on the event loop when the hop would cost more than the batch.

Handing a batch to a worker thread and back costs tens of microseconds of latency and CPU. For a model
whose batches take less than that (a small MLP, a tree ensemble) the hop is most of the request, so a
batch the cost model predicts at most ``inline_max_s`` runs directly on the event loop when no other batch
of this runner is in a thread: it blocks the loop for less time than the hop would. Only runners whose
code never blocks allow it (ONNX Runtime on the CPU); Python models never run inline.

``concurrency`` batches compute at once (a semaphore around the model call only); up to ``prefetch``
more wait in their own threads with their inputs already concatenated, so the next batch starts the
moment a slot frees, even if the event loop is busy decoding a large request just then.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from edgeinfer.runners.base import BatchResult, BatchTimes, Execute, RunnerSettings, Work
from edgeinfer.runners.cost import CostModel


class ThreadRunner:
    def __init__(self, execute: Execute, settings: RunnerSettings) -> None:
        self._execute = execute
        self.concurrency = settings.concurrency
        self.capacity = settings.concurrency + settings.prefetch
        self._slots = threading.BoundedSemaphore(settings.concurrency)
        self._inline_max_s = settings.inline_max_s
        self._executor = ThreadPoolExecutor(
            max_workers=min(64, self.capacity), thread_name_prefix=f"edgeinfer-{settings.name}"
        )
        self._in_threads = 0
        self.cost = CostModel()

    def run(self, batch: list[Work]) -> asyncio.Future[BatchResult]:
        loop = asyncio.get_running_loop()
        rows = batch[0].rows if len(batch) == 1 else sum(work.rows for work in batch)
        if self._in_threads == 0 and self._inline_max_s > 0:
            cost = self.cost
            predicted = cost.recent_s(rows)
            if predicted is None:
                predicted = cost.estimate_s(rows)
            if predicted is not None and predicted <= self._inline_max_s:
                return self._run_inline(loop, batch, rows)
        self._in_threads += 1
        done = loop.run_in_executor(self._executor, self._in_thread, batch)
        done.add_done_callback(partial(self._finished, rows))
        return done

    def _run_inline(
        self, loop: asyncio.AbstractEventLoop, batch: list[Work], rows: int
    ) -> asyncio.Future[BatchResult]:
        done: asyncio.Future[BatchResult] = loop.create_future()
        times = BatchTimes()
        try:
            results = self._execute(batch, times, None)  # alone: no slot to wait for
        except Exception as error:
            done.set_exception(error)
            return done
        self.cost.observe(rows, (times.input_ns + times.infer_ns + times.output_ns) / 1e9)
        done.set_result(BatchResult(results, times))
        return done

    def _in_thread(self, batch: list[Work]) -> BatchResult:
        times = BatchTimes()
        started = time.perf_counter_ns()
        results = self._execute(batch, times, self._slots)
        if not (times.input_ns or times.infer_ns or times.output_ns):
            times.infer_ns = max(1, time.perf_counter_ns() - started)
        return BatchResult(results, times)

    def _finished(self, rows: int, done: asyncio.Future[BatchResult]) -> None:
        self._in_threads -= 1
        if not done.cancelled() and done.exception() is None:
            self.cost.observe(rows, done.result().times.total_s)

    async def close(self) -> None:
        self._executor.shutdown(wait=False)
