"""Batches in worker threads, or inline on the event loop when the hop would cost more than the batch.

Handing a batch to a worker thread and back costs tens of microseconds of latency and CPU. For a model
whose batches take less than that (a small MLP, a tree ensemble) the hop is most of the request, so a
batch runs directly on the event loop when ``InlineChoice`` (``inline.py``: the measured hop against the
measured inline time) says so and no other batch of this runner is in a thread. Only runners whose code
never blocks allow it (ONNX Runtime on the CPU); Python models never run inline
(docs/design/inline-execution.md).

``concurrency`` worker threads compute one batch each; up to ``prefetch`` more batches wait in the
executor's queue, and a thread that finishes a batch takes the next one itself, at once, even if the
event loop is busy decoding a large request just then. The same thread, not a second one woken for it:
a thread that does not sleep between batches does not wait to be scheduled again (docs/design/batcher.md,
"Forming batches ahead"; a thread of its own per prefetched batch was slower than no prefetching).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from edgeinfer.afterwards import Afterwards
from edgeinfer.runners.base import BatchResult, BatchTimes, Execute, RunnerSettings, Work
from edgeinfer.runners.cost import CostModel
from edgeinfer.runners.inline import InlineChoice


class ThreadRunner:
    def __init__(self, execute: Execute, settings: RunnerSettings) -> None:
        self._execute = execute
        self.concurrency = settings.concurrency
        self.capacity = settings.concurrency + settings.prefetch
        self._inline_allowed = settings.inline_max_s != 0
        self.inline = InlineChoice(settings.inline_max_s)
        self._executor = ThreadPoolExecutor(
            max_workers=min(64, self.concurrency), thread_name_prefix=f"edgeinfer-{settings.name}"
        )
        self._in_threads = 0
        self.cost = CostModel()
        self._afterwards = Afterwards()

    def run(self, batch: list[Work]) -> asyncio.Future[BatchResult] | BatchResult:
        rows = batch[0].rows if len(batch) == 1 else sum(work.rows for work in batch)
        if self._in_threads == 0 and self._inline_allowed:
            cost = self.cost
            estimate = cost.recent_s(rows)
            if estimate is None:
                estimate = cost.estimate_s(rows)
            if self.inline.goes_inline(rows, estimate):
                return self._run_inline(batch, rows)
        loop = asyncio.get_running_loop()
        self._in_threads += 1
        alone = self._in_threads == 1  # the hop is measured on batches that wait for nothing else here
        done = loop.run_in_executor(self._executor, self._in_thread, batch, time.perf_counter_ns())
        done.add_done_callback(partial(self._finished, rows, alone))
        return done

    def _run_inline(self, batch: list[Work], rows: int) -> BatchResult:
        times = BatchTimes()
        results = self._execute(batch, times)
        self._afterwards.call(self._ran_inline, rows, times.total_s)  # the answers go out first
        return BatchResult(results, times)

    def _ran_inline(self, rows: int, seconds: float) -> None:
        self.cost.observe(rows, seconds)
        self.inline.ran_inline(rows, seconds)

    def _in_thread(self, batch: list[Work], handed_ns: int) -> BatchResult:
        started = time.perf_counter_ns()
        times = BatchTimes(handover_ns=started - handed_ns)
        results = self._execute(batch, times)
        if not (times.input_ns or times.infer_ns or times.output_ns):
            times.infer_ns = max(1, time.perf_counter_ns() - started)
        return BatchResult(results, times)

    def _finished(self, rows: int, alone: bool, done: asyncio.Future[BatchResult]) -> None:
        self._in_threads -= 1
        if not done.cancelled() and done.exception() is None:
            times = done.result().times
            self.cost.observe(rows, times.total_s)
            if alone:
                self.inline.hopped(2 * times.handover_ns / 1e9)

    async def close(self) -> None:
        self._executor.shutdown(wait=False)
