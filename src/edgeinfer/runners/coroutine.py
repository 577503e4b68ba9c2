"""Batches as coroutines on the event loop: ``async def predict`` models and pipelines.

The runner owns the concurrency limit: at most ``concurrency`` batches are inside the coroutine at once;
prefetched ones wait on the semaphore, as they would for a thread runner's compute slot.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from edgeinfer.runners.base import BatchResult, BatchTimes, Result, RunnerSettings, Work
from edgeinfer.runners.cost import CostModel

ExecuteAsync = Callable[[list[Work]], Awaitable[list[Result]]]


class AsyncRunner:
    def __init__(self, execute: ExecuteAsync, settings: RunnerSettings) -> None:
        self._execute = execute
        self.concurrency = settings.concurrency
        self.capacity = settings.concurrency + settings.prefetch
        self._slots = asyncio.Semaphore(settings.concurrency)
        self.cost = CostModel()

    def run(self, batch: list[Work]) -> asyncio.Future[BatchResult]:
        return asyncio.ensure_future(self._run(batch))

    async def _run(self, batch: list[Work]) -> BatchResult:
        async with self._slots:
            started = time.perf_counter_ns()
            results = await self._execute(batch)
            times = BatchTimes(infer_ns=max(1, time.perf_counter_ns() - started))
        self.cost.observe(sum(work.rows for work in batch), times.total_s)
        return BatchResult(results, times)

    async def close(self) -> None:
        return None
