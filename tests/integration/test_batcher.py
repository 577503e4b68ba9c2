"""The batcher on a real event loop with a fake backend: merging, splitting, limits, deadlines, errors."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from edgeinfer.batching.batcher import Batcher, QueueLimits
from edgeinfer.batching.policy import BatchPolicy
from edgeinfer.errors import InferenceFailed, RequestTimeout, ServerBusy
from tests.fakes import FakeBackend


def make(backend: FakeBackend, policy=None, limits=None) -> tuple[Batcher, ThreadPoolExecutor]:
    limits = limits or QueueLimits()
    executor = ThreadPoolExecutor(max_workers=limits.max_concurrent_batches + limits.prefetch_batches)
    batcher = Batcher(
        "fake",
        backend.infer,
        policy or BatchPolicy(max_batch_size=16, max_queue_delay_s=0.005),
        limits,
        executor,
    )
    return batcher, executor


def rows(tag: float, count: int) -> np.ndarray:
    return np.full((count, 2), tag, dtype=np.float32)


def submit(batcher: Batcher, tag: float, count: int = 1, **kwargs):
    return batcher.submit({"x": rows(tag, count)}, count, ("x", (2,)), **kwargs)


def test_concurrent_requests_get_exactly_their_own_rows():
    async def main():
        backend = FakeBackend(delay_s=0.002)
        batcher, executor = make(backend)
        futures = [submit(batcher, float(i), 1 + i % 4) for i in range(200)]
        results = await asyncio.gather(*futures)
        executor.shutdown()
        return backend, results

    backend, results = asyncio.run(main())
    for index, result in enumerate(results):
        np.testing.assert_array_equal(result["y"], rows(index * 2.0, 1 + index % 4))
    assert len(backend.batches) < 200, "requests were merged"
    assert max(len(batch) for batch in backend.batches) <= 16


def test_full_queue_is_refused_at_once():
    async def main():
        backend = FakeBackend(delay_s=0.05)
        batcher, executor = make(
            backend, policy=BatchPolicy(max_batch_size=1), limits=QueueLimits(max_queue_size=3)
        )
        running = submit(batcher, 0)  # nothing else in flight: starts at once, leaves the queue
        queued = [submit(batcher, 1.0 + i) for i in range(3)]
        with pytest.raises(ServerBusy, match="3 requests queued"):
            submit(batcher, 9)
        await asyncio.gather(running, *queued)
        executor.shutdown()

    asyncio.run(main())


def test_expired_request_is_answered_with_a_timeout_and_never_run():
    async def main():
        backend = FakeBackend(delay_s=0.1)
        batcher, executor = make(backend, policy=BatchPolicy(max_batch_size=1))
        first = submit(batcher, 1.0)
        doomed = submit(batcher, 2.0, timeout_s=0.02)
        with pytest.raises(RequestTimeout, match=r"timed out after .* ms in the queue; it was not run"):
            await doomed
        await first
        await asyncio.sleep(0.01)
        executor.shutdown()
        return backend

    backend = asyncio.run(main())
    assert 2.0 not in backend.rows_run()


def test_queue_timeout_from_config():
    async def main():
        backend = FakeBackend(delay_s=0.1)
        batcher, executor = make(
            backend, policy=BatchPolicy(max_batch_size=1), limits=QueueLimits(queue_timeout_s=0.02)
        )
        first = submit(batcher, 1.0)
        with pytest.raises(RequestTimeout):
            await submit(batcher, 2.0)
        await first
        executor.shutdown()

    asyncio.run(main())


def test_an_exception_reaches_every_request_of_its_batch_and_no_other():
    async def main():
        backend = FakeBackend(fail_when=lambda inputs: bool((inputs["x"] == 13).any()))
        batcher, executor = make(backend, policy=BatchPolicy(max_batch_size=4, max_queue_delay_s=0.05))
        bad_batch = [submit(batcher, value) for value in (1.0, 13.0, 2.0, 3.0)]  # full: runs together
        outcomes = await asyncio.gather(*bad_batch, return_exceptions=True)
        next_batch = await asyncio.gather(*(submit(batcher, value) for value in (4.0, 5.0, 6.0, 7.0)))
        executor.shutdown()
        return outcomes, next_batch

    outcomes, next_batch = asyncio.run(main())
    assert all(isinstance(outcome, InferenceFailed) for outcome in outcomes)
    assert "ValueError: the fake model was told to fail" in str(outcomes[0])
    assert [result["y"][0, 0] for result in next_batch] == [8.0, 10.0, 12.0, 14.0]


def test_outputs_that_cannot_be_split_fail_the_batch_clearly():
    async def main():
        batcher, executor = make(FakeBackend(drop_a_row=True), policy=BatchPolicy(max_batch_size=4))
        outcomes = await asyncio.gather(submit(batcher, 1.0, 2), return_exceptions=True)
        executor.shutdown()
        return outcomes

    [outcome] = asyncio.run(main())
    assert isinstance(outcome, InferenceFailed)
    assert "output 'y' with shape [1, 2] for 2 input rows" in str(outcome)


def test_a_cancelled_request_is_not_run():
    async def main():
        backend = FakeBackend(delay_s=0.05)
        batcher, executor = make(backend, policy=BatchPolicy(max_batch_size=1))
        first = submit(batcher, 1.0)
        gone = submit(batcher, 2.0)
        await asyncio.sleep(0.01)
        gone.cancel()
        await asyncio.sleep(0)  # done callbacks run on the next loop iteration
        assert batcher.queue_length == 0
        await first
        await asyncio.sleep(0.1)
        executor.shutdown()
        return backend

    assert 2.0 not in asyncio.run(main()).rows_run()


def test_priority_runs_first():
    async def main():
        backend = FakeBackend(delay_s=0.03)
        batcher, executor = make(backend, policy=BatchPolicy(max_batch_size=1))
        first = submit(batcher, 0.0)
        late = [submit(batcher, 5.0, priority=5), submit(batcher, 1.0, priority=1)]
        await asyncio.gather(first, *late)
        executor.shutdown()
        return backend

    assert asyncio.run(main()).rows_run() == [0.0, 1.0, 5.0]


def test_concurrent_batches_overlap_when_allowed():
    async def main():
        backend = FakeBackend(delay_s=0.05)
        batcher, executor = make(
            backend, policy=BatchPolicy(max_batch_size=1), limits=QueueLimits(max_concurrent_batches=2)
        )
        await asyncio.gather(*(submit(batcher, float(i)) for i in range(4)))
        executor.shutdown()
        return backend

    assert asyncio.run(main()).max_concurrent == 2


def test_one_batch_at_a_time_by_default_and_the_next_forms_meanwhile():
    async def main():
        backend = FakeBackend(delay_s=0.03)
        batcher, executor = make(backend, policy=BatchPolicy(max_batch_size=8))
        first = submit(batcher, 0.0)
        await asyncio.sleep(0.005)
        rest = [submit(batcher, float(i)) for i in range(1, 6)]
        await asyncio.gather(first, *rest)
        executor.shutdown()
        return backend

    backend = asyncio.run(main())
    assert backend.max_concurrent == 1
    assert [len(batch) for batch in backend.batches] == [1, 5]


def test_drain_waits_for_queued_work_and_refuses_new():
    async def main():
        backend = FakeBackend(delay_s=0.02)
        batcher, executor = make(backend, policy=BatchPolicy(max_batch_size=1))
        futures = [submit(batcher, float(i)) for i in range(3)]
        await batcher.drain()
        assert all(future.done() for future in futures)
        with pytest.raises(Exception, match="unloading"):
            submit(batcher, 9.0)
        executor.shutdown()

    asyncio.run(main())


def test_prefetched_batches_wait_for_the_compute_slot():
    async def main():
        backend = FakeBackend(delay_s=0.02)
        batcher, executor = make(
            backend,
            policy=BatchPolicy(max_batch_size=1),
            limits=QueueLimits(max_concurrent_batches=1, prefetch_batches=1),
        )
        results = await asyncio.gather(*(submit(batcher, float(i)) for i in range(6)))
        executor.shutdown()
        return backend, results

    backend, results = asyncio.run(main())
    assert backend.max_concurrent == 1, "prefetched batches never compute at the same time"
    assert [result["y"][0, 0] for result in results] == [2.0 * i for i in range(6)]
