"""The batcher and the runners on a real event loop with a fake backend: merging, splitting, limits,
deadlines, errors, cancellation, concurrency. Ordering is driven by events (the fake model holds its
calls until released), not by sleeping."""

from __future__ import annotations

import asyncio
import math
import re
import time

import numpy as np
import pytest

from edgeinfer.admission import margin
from edgeinfer.admission.admission import QueueLimits
from edgeinfer.batching import batcher as batcher_module
from edgeinfer.batching.batcher import Batcher
from edgeinfer.batching.policy import MERGE_TRIAL_ROWS, BatchPolicy
from edgeinfer.batching.recorder import BatchRecorder
from edgeinfer.errors import InferenceFailed, RequestTimeout, ServerBusy, Superseded
from edgeinfer.metrics import ModelMetrics
from edgeinfer.runners import RunnerSettings, Work
from edgeinfer.runners.coroutine import AsyncRunner
from tests.fakes import FakeBackend


def make(
    backend: FakeBackend, policy=None, limits=None, concurrency=1, prefetch=0, inline_max_s=0.0, lag=None
):
    runner = backend.runner(RunnerSettings("fake", concurrency, prefetch, inline_max_s))
    recorder = BatchRecorder(ModelMetrics("fake", "1"))
    policy = policy or BatchPolicy(max_batch_size=16, max_queue_delay_s=0.005)
    return Batcher("fake", runner, policy, limits or QueueLimits(), recorder, lag)


def rows(tag: float, count: int) -> np.ndarray:
    return np.full((count, 2), tag, dtype=np.float32)


def submit(batcher: Batcher, tag: float, count: int = 1, **kwargs):
    return batcher.submit(Work({"x": rows(tag, count)}, count), ("x", (2,)), **kwargs)


async def entered(backend: FakeBackend, count: int) -> None:
    await asyncio.get_running_loop().run_in_executor(None, backend.wait_entered, count)


def test_concurrent_requests_get_exactly_their_own_rows():
    async def main():
        backend = FakeBackend(delay_s=0.002)
        batcher = make(backend)
        futures = [submit(batcher, float(i), 1 + i % 4) for i in range(200)]
        results = await asyncio.gather(*futures)
        return backend, results, batcher

    backend, results, batcher = asyncio.run(main())
    for index, result in enumerate(results):
        np.testing.assert_array_equal(result["y"], rows(index * 2.0, 1 + index % 4))
    assert len(backend.batches) < 200, "requests were merged"
    assert max(len(batch) for batch in backend.batches) <= 16
    stats = batcher.recorder.stats
    assert stats.inference_count == sum(1 + i % 4 for i in range(200))
    assert stats.execution_count == len(backend.batches)
    assert stats.success.count == 200


@pytest.mark.parametrize(("measured", "retry_after_s"), [(False, 1.0), (True, 0.040)])
def test_full_queue_is_refused_at_once_with_when_to_retry(measured, retry_after_s):
    """The hint (Retry-After, retry-after-ms, gRPC's pushback) is the queue ahead at the measured cost: 10
    ms a row, 1 running and 3 queued. Before any batch was measured it is 1 s."""

    async def main():
        backend = FakeBackend(hold=True)
        one, three = BatchPolicy(max_batch_size=1), QueueLimits(max_queue_size=3)
        batcher = _seeded(backend, one, three) if measured else make(backend, policy=one, limits=three)
        running = submit(batcher, 0)  # nothing else in flight: starts at once, leaves the queue
        await entered(backend, 1)
        queued = [submit(batcher, 1.0 + i) for i in range(3)]
        with pytest.raises(ServerBusy, match="3 requests queued") as refused:
            submit(batcher, 9)
        backend.release()
        await asyncio.gather(running, *queued)
        return refused.value

    refused = asyncio.run(main())
    assert refused.retry_after_s == pytest.approx(retry_after_s)
    assert refused.message.endswith(f"; retry in {round(retry_after_s * 1000)} ms")


def test_expired_request_is_answered_with_a_timeout_and_never_run():
    async def main():
        backend = FakeBackend(hold=True)
        batcher = make(backend, policy=BatchPolicy(max_batch_size=1))
        first = submit(batcher, 1.0)
        await entered(backend, 1)
        doomed = submit(batcher, 2.0, timeout_s=0.02)
        with pytest.raises(RequestTimeout, match=r"timed out after .* ms in the queue; it was not run"):
            await doomed
        backend.release()
        await first
        await batcher.drain()
        return backend, batcher

    backend, batcher = asyncio.run(main())
    assert 2.0 not in backend.rows_run()
    assert batcher.recorder.stats.fail.count == 1


def test_queue_timeout_from_config():
    async def main():
        backend = FakeBackend(hold=True)
        batcher = make(
            backend, policy=BatchPolicy(max_batch_size=1), limits=QueueLimits(queue_timeout_s=0.02)
        )
        first = submit(batcher, 1.0)
        await entered(backend, 1)
        with pytest.raises(RequestTimeout):
            await submit(batcher, 2.0)
        backend.release()
        await first

    asyncio.run(main())


def test_an_exception_reaches_every_request_of_its_batch_and_no_other():
    async def main():
        backend = FakeBackend(fail_when=lambda inputs: bool((inputs["x"] == 13).any()))
        batcher = make(backend, policy=BatchPolicy(max_batch_size=4, max_queue_delay_s=0.05))
        bad_batch = [submit(batcher, value) for value in (1.0, 13.0, 2.0, 3.0)]  # full: runs together
        outcomes = await asyncio.gather(*bad_batch, return_exceptions=True)
        next_batch = await asyncio.gather(*(submit(batcher, value) for value in (4.0, 5.0, 6.0, 7.0)))
        return outcomes, next_batch

    outcomes, next_batch = asyncio.run(main())
    assert all(isinstance(outcome, InferenceFailed) for outcome in outcomes)
    assert "ValueError: the fake model was told to fail" in str(outcomes[0])
    assert [result["y"][0, 0] for result in next_batch] == [8.0, 10.0, 12.0, 14.0]


def test_outputs_that_cannot_be_split_fail_the_batch_clearly():
    async def main():
        batcher = make(FakeBackend(drop_a_row=True), policy=BatchPolicy(max_batch_size=4))
        return await asyncio.gather(submit(batcher, 1.0, 2), return_exceptions=True)

    [outcome] = asyncio.run(main())
    assert isinstance(outcome, InferenceFailed)
    assert "output 'y' with shape [1, 2] for 2 input rows" in str(outcome)


def test_a_cancelled_request_is_not_run():
    async def main():
        backend = FakeBackend(hold=True)
        batcher = make(backend, policy=BatchPolicy(max_batch_size=1))
        first = submit(batcher, 1.0)
        await entered(backend, 1)
        gone = submit(batcher, 2.0)
        assert batcher.queue_length == 1
        gone.cancel()
        await asyncio.sleep(0)  # done callbacks run on the next loop iteration
        assert batcher.queue_length == 0
        backend.release()
        await first
        await batcher.drain()
        return backend

    assert 2.0 not in asyncio.run(main()).rows_run()


def test_priority_runs_first():
    async def main():
        backend = FakeBackend(hold=True)
        batcher = make(backend, policy=BatchPolicy(max_batch_size=1))
        first = submit(batcher, 0.0)
        await entered(backend, 1)
        late = [submit(batcher, 5.0, priority=5), submit(batcher, 1.0, priority=1)]
        backend.release()
        await asyncio.gather(first, *late)
        return backend

    assert asyncio.run(main()).rows_run() == [0.0, 1.0, 5.0]


def test_concurrent_batches_overlap_when_allowed():
    async def main():
        backend = FakeBackend(hold=True)
        batcher = make(backend, policy=BatchPolicy(max_batch_size=1), concurrency=2)
        futures = [submit(batcher, float(i)) for i in range(4)]
        await entered(backend, 2)
        backend.release()
        await asyncio.gather(*futures)
        return backend

    assert asyncio.run(main()).max_concurrent == 2


def test_one_batch_at_a_time_by_default_and_the_next_forms_meanwhile():
    async def main():
        backend = FakeBackend(hold=True)
        batcher = make(backend, policy=BatchPolicy(max_batch_size=8))
        first = submit(batcher, 0.0)
        await entered(backend, 1)
        rest = [submit(batcher, float(i)) for i in range(1, 6)]
        backend.release()
        await asyncio.gather(first, *rest)
        return backend

    backend = asyncio.run(main())
    assert backend.max_concurrent == 1
    assert [len(batch) for batch in backend.batches] == [1, 5]


def test_drain_waits_for_queued_work_and_refuses_new():
    async def main():
        backend = FakeBackend(delay_s=0.01)
        batcher = make(backend, policy=BatchPolicy(max_batch_size=1))
        futures = [submit(batcher, float(i)) for i in range(3)]
        await batcher.drain()
        assert all(future.done() for future in futures)
        with pytest.raises(Exception, match="unloading"):
            submit(batcher, 9.0)

    asyncio.run(main())


def test_prefetched_batches_wait_for_the_compute_slot():
    async def main():
        backend = FakeBackend(delay_s=0.01)
        batcher = make(backend, policy=BatchPolicy(max_batch_size=1), concurrency=1, prefetch=1)
        results = await asyncio.gather(*(submit(batcher, float(i)) for i in range(6)))
        return backend, results

    backend, results = asyncio.run(main())
    assert backend.max_concurrent == 1, "prefetched batches never compute at the same time"
    assert [result["y"][0, 0] for result in results] == [2.0 * i for i in range(6)]
    # the thread that finishes a batch takes the prefetched one itself: no second thread is woken
    assert len(set(backend.threads)) == 1


def _adaptive_with_prefetch(backend: FakeBackend, per_row_s: float, per_batch_s: float) -> Batcher:
    batcher = make(backend, policy=BatchPolicy(max_batch_size=4, adaptive=True), prefetch=1)
    for size in (1, 4, 1, 4):  # each twice: a first batch of a size is provisional (runners/cost.py)
        batcher.runner.cost.observe(size, per_batch_s + per_row_s * size)
    return batcher


@pytest.mark.parametrize(
    ("per_row_s", "per_batch_s", "queued_while_running", "batches"),
    [
        (0.010, 0.0, 2, [1, 1, 1, 1]),  # merging does not pay: the next request is handed over at once
        (0.001, 0.010, 3, [1, 3]),  # it pays: the next batch forms when the slot frees, with all three
    ],
    ids=["cost-per-row", "cost-per-call"],
)
def test_adaptive_batching_forms_the_next_batch_ahead_only_when_merging_does_not_pay(
    per_row_s, per_batch_s, queued_while_running, batches
):
    async def main():
        backend = FakeBackend(hold=True)
        batcher = _adaptive_with_prefetch(backend, per_row_s, per_batch_s)
        first = submit(batcher, 0.0)
        await entered(backend, 1)
        rest = [submit(batcher, float(i)) for i in range(1, 4)]
        await asyncio.sleep(0)  # the queue is looked at after the loop iteration
        assert batcher.queue_length == queued_while_running
        backend.release()
        await asyncio.gather(first, *rest)
        return backend

    backend = asyncio.run(main())
    assert [len(batch) for batch in backend.batches] == batches
    assert backend.max_concurrent == 1


@pytest.mark.parametrize(("every", "trial"), [(3, True), (1000, False)], ids=["trials", "none-due"])
def test_while_merging_does_not_pay_a_merge_trial_runs_now_and_then(monkeypatch, every, trial):
    """Batches of one measure only batches of one: a trial merge keeps the larger sizes measured, so a
    cost line bent by a few slow batches is corrected (``policy.MERGE_TRIAL_ROWS``)."""
    monkeypatch.setattr(batcher_module, "MERGE_TRIAL_EVERY", every)

    async def main():
        backend = FakeBackend(hold=True)
        batcher = make(backend, policy=BatchPolicy(max_batch_size=16, adaptive=True), prefetch=1)
        for size in (1, 16):
            batcher.runner.cost.observe(size, 0.010 * size)  # merging does not pay
        first = submit(batcher, 0.0)
        await entered(backend, 1)
        rest = [submit(batcher, float(i)) for i in range(1, 13)]
        await asyncio.sleep(0)
        backend.release()
        await asyncio.gather(first, *rest)
        return backend

    sizes = [len(batch) for batch in asyncio.run(main()).batches]
    assert sizes[:3] == [1, 1, 1]  # the line says merging does not pay, and no trial is due yet
    merged = [size for size in sizes if size > 1]
    if trial:
        assert merged
        assert merged[0] <= MERGE_TRIAL_ROWS
    else:
        assert not merged


@pytest.mark.parametrize("fail", [False, True], ids=["answered", "failed"])
def test_on_done_is_called_in_the_pass_that_completes_the_future_before_its_callbacks(fail):
    """A transport answering from ``on_done`` writes in the loop iteration the batch finished in; the
    future's own callbacks run an iteration later (``Batcher.submit``)."""

    async def main():
        backend = FakeBackend(hold=True, fail_when=(lambda _: True) if fail else None)
        batcher = make(backend, policy=BatchPolicy(max_batch_size=8, max_queue_delay_s=0.0))
        seen: list[tuple[str, bool]] = []
        first = submit(batcher, 0.0, on_done=lambda: seen.append(("alone", True)))  # ran alone
        await entered(backend, 1)
        futures = []
        for value in (1.0, 2.0):
            future = submit(
                batcher, value, on_done=lambda v=value: seen.append((f"on_done {v}", futures[0].done()))
            )
            future.add_done_callback(lambda _, v=value: seen.append((f"callback {v}", True)))
            futures.append(future)
        backend.release()
        await asyncio.gather(first, *futures, return_exceptions=True)
        await asyncio.sleep(0)
        return seen

    seen = asyncio.run(main())
    assert seen == [
        ("on_done 1.0", True),
        ("on_done 2.0", True),
        ("callback 1.0", True),
        ("callback 2.0", True),
    ]


def test_on_done_is_not_called_for_an_expired_request():
    async def main():
        backend = FakeBackend(hold=True)
        batcher = make(backend, policy=BatchPolicy(max_batch_size=1))
        called: list[str] = []
        running = submit(batcher, 0.0)
        await entered(backend, 1)
        late = submit(batcher, 1.0, timeout_s=0.001, on_done=lambda: called.append("late"))
        with pytest.raises(RequestTimeout):
            await late
        backend.release()
        await running
        return called

    assert asyncio.run(main()) == []


def test_a_batch_predicted_cheaper_than_the_thread_hop_runs_inline():
    async def main():
        backend = FakeBackend()
        batcher = make(backend, policy=BatchPolicy(max_batch_size=8), inline_max_s=1.0)
        first = submit(batcher, 1.0)  # nothing measured yet: a worker thread
        assert not first.done()
        await first
        second = submit(batcher, 2.0)  # measured far below 1 s: runs on the loop, done at once
        assert second.done()
        return second.result()

    np.testing.assert_array_equal(asyncio.run(main())["y"], rows(4.0, 1))


def test_a_request_that_starts_alone_is_counted_once_inline_in_a_thread_or_cancelled():
    """With nothing else in flight a request skips the queue: inline it is answered before submit returns
    and counted once that loop iteration is over (after the answers are written); in a thread, when it
    is answered; cancelled while running, as a failure."""

    async def main():
        backend = FakeBackend()
        batcher = make(backend, policy=BatchPolicy(max_batch_size=8), inline_max_s=1.0)
        stats = batcher.recorder.stats
        first = submit(batcher, 1.0)  # nothing measured yet: a worker thread
        assert not first.done()
        assert batcher.outstanding == 1
        assert batcher.queue_length == 0
        await first
        await asyncio.sleep(0)  # the count comes with the future's callbacks
        assert (batcher.outstanding, stats.success.count) == (0, 1)
        second = submit(batcher, 2.0)  # inline: done and idle before submit returned
        assert second.done()
        assert (batcher.outstanding, stats.success.count, stats.queue.count) == (0, 1, 1)
        await asyncio.sleep(0)  # counted after this iteration
        assert (batcher.outstanding, stats.success.count, stats.queue.count) == (0, 2, 2)
        await batcher.drain()  # returns at once: nothing is in flight

        held = FakeBackend(hold=True)
        batcher = make(held, policy=BatchPolicy(max_batch_size=8))
        gone = submit(batcher, 3.0)
        await entered(held, 1)
        gone.cancel()
        await asyncio.sleep(0)  # the cancellation's callback
        assert batcher.outstanding == 0
        await asyncio.sleep(0)  # and its record, after that iteration
        assert batcher.recorder.stats.fail.count == 1
        held.release()
        await batcher.drain()
        return batcher.recorder.stats

    stats = asyncio.run(main())
    assert (stats.success.count, stats.fail.count, stats.execution_count) == (0, 1, 1)


def test_a_batch_that_fails_inline_fails_its_requests_alone_or_merged_and_each_is_counted_once():
    """On the loop a batch's failure is raised by the runner itself (there is no future): the request
    that ran alone and those merged after it in the same iteration get the model's error, each is
    counted once as a failure, and the next request runs."""

    async def main():
        backend = FakeBackend(fail_when=lambda inputs: bool((inputs["x"] == 13).any()))
        batcher = make(backend, policy=BatchPolicy(max_batch_size=8), inline_max_s=1.0)
        await submit(batcher, 0.0)  # measured: from now on batches run inline
        await asyncio.sleep(0)
        alone, *merged = [submit(batcher, 13.0) for _ in range(3)]
        assert alone.done()  # failed before submit returned
        outcomes = await asyncio.gather(alone, *merged, return_exceptions=True)
        await asyncio.sleep(0)
        after = submit(batcher, 2.0)
        assert after.done()
        await asyncio.sleep(0)  # the records come after the iteration
        return outcomes, after.result(), batcher.recorder.stats, batcher.outstanding, backend

    outcomes, after, stats, outstanding, backend = asyncio.run(main())
    assert all(isinstance(outcome, InferenceFailed) for outcome in outcomes)
    assert all("ValueError: the fake model was told to fail" in str(outcome) for outcome in outcomes)
    np.testing.assert_array_equal(after["y"], rows(4.0, 1))
    assert (stats.success.count, stats.fail.count, outstanding) == (2, 3, 0)
    assert [len(batch) for batch in backend.batches] == [1, 1, 2, 1]  # the two after the lone one merged


def test_requests_read_in_the_iteration_of_one_that_ran_alone_merge_after_it():
    """Under load the loop reads many requests per iteration: the first runs alone inline, the others
    queue and run as one batch once the iteration is over (not each alone: `tiny` at concurrency 64
    lost a third of its throughput that way)."""

    async def main():
        backend = FakeBackend()
        batcher = make(backend, policy=BatchPolicy(max_batch_size=8), inline_max_s=1.0)
        await submit(batcher, 0.0)  # measured: from now on batches run inline
        await asyncio.sleep(0)
        first, *others = [submit(batcher, float(i)) for i in range(1, 4)]
        assert first.done()
        assert not any(other.done() for other in others)
        await asyncio.gather(*others)
        await asyncio.sleep(0)
        alone = submit(batcher, 9.0)  # a later iteration: alone again
        assert alone.done()
        return backend

    backend = asyncio.run(main())
    assert [len(batch) for batch in backend.batches] == [1, 1, 2, 1]


def test_an_async_runner_keeps_to_its_concurrency_with_prefetch():
    """max_concurrent_batches 1 and prefetch_batches 2: three batches handed over, one predict at a time."""
    inside = 0
    most = 0

    async def predict(batch):
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        await asyncio.sleep(0.005)
        inside -= 1
        return [{"y": work.inputs["x"]} for work in batch]

    async def main():
        runner = AsyncRunner(predict, RunnerSettings("async", concurrency=1, prefetch=2))
        batcher = Batcher(
            "async",
            runner,
            BatchPolicy(max_batch_size=1),
            QueueLimits(),
            BatchRecorder(ModelMetrics("async", "1")),
        )
        await asyncio.gather(*(submit(batcher, float(i)) for i in range(6)))
        return runner

    runner = asyncio.run(main())
    assert runner.capacity == 3
    assert most == 1


# Admission control: what is predicted to miss its SLO or its timeout is refused at once, by reason.
def _seeded(backend: FakeBackend, policy: BatchPolicy, limits: QueueLimits, lag=None) -> Batcher:
    batcher = make(backend, policy=policy, limits=limits, lag=lag)
    for size in (1, 4):
        batcher.runner.cost.observe(size, 0.010 * size)  # 10 ms per row: merging does not pay
    return batcher


def test_a_request_predicted_to_miss_the_slo_is_refused_at_once_and_counted():
    async def main():
        backend = FakeBackend(hold=True)
        adaptive = BatchPolicy(max_batch_size=4, adaptive=True)
        batcher = _seeded(backend, adaptive, QueueLimits(slo_s=0.035))
        running = submit(batcher, 1.0, 2)  # nothing ahead: admitted whatever it costs
        await entered(backend, 1)
        queued = submit(batcher, 2.0)  # 20 ms running + 10 ms: within 35 ms
        with pytest.raises(ServerBusy, match="over its latency objective") as refused:
            submit(batcher, 3.0)  # 20 + 10 queued + 10 ms
        backend.release()
        await asyncio.gather(running, queued)
        return batcher, refused.value

    batcher, refused = asyncio.run(main())
    assert refused.retry_after_s == pytest.approx(0.030)  # the measured backlog it met
    assert refused.message.endswith("; retry in 30 ms")
    assert batcher.recorder.metrics.refused == {"slo": 1}
    assert batcher.recorder.stats.fail.count == 1


def test_the_queue_ahead_counts_at_the_rate_it_drains():
    """The model takes 1 ms a request, but the event loop is busy 15 ms (decoding, say) before it gets
    to each answer and starts the next: the queue drains at one request per 16 ms or so, not 1 ms. With
    four requests still ahead and an SLO of 30 ms, the next one is refused; by the cost model alone
    (4 x 1 ms ahead) it would have been admitted."""

    async def main():
        backend = FakeBackend(delay_s=0.001)
        batcher = make(backend, policy=BatchPolicy(max_batch_size=1), limits=QueueLimits(slo_s=0.030))
        batcher.runner.cost.observe(1, 0.001)
        futures = [submit(batcher, float(i)) for i in range(8)]
        for future in futures[:4]:
            await future
            time.sleep(0.015)  # the loop busy elsewhere before it gets to the next answer
        with pytest.raises(ServerBusy) as refused:
            submit(batcher, 9.0)
        await asyncio.gather(*futures)
        return batcher, refused.value

    batcher, refused = asyncio.run(main())
    ahead_ms = float(re.search(r"queue ahead ([\d.]+) ms", str(refused)).group(1))
    assert ahead_ms >= 4 * 15, str(refused)
    assert batcher.runner.cost.estimate_s(1) < 0.015, "the model itself stayed fast"


def test_the_slo_counts_from_when_the_request_began_to_arrive():
    """10 ms per request, SLO 35 ms, one running and one queued: the next would finish 30 ms from now.
    Read just now, it would be admitted (the queued one was); one whose body took 20 ms to arrive would
    finish 50 ms after it began: refused."""

    async def main():
        backend = FakeBackend(hold=True)
        batcher = _seeded(backend, BatchPolicy(max_batch_size=4, adaptive=True), QueueLimits(slo_s=0.035))
        running = submit(batcher, 1.0)
        await entered(backend, 1)
        in_time = submit(batcher, 2.0, received_at=time.monotonic())
        with pytest.raises(ServerBusy) as refused:
            submit(batcher, 3.0, received_at=time.monotonic() - 0.020)
        backend.release()
        await asyncio.gather(running, in_time)
        return refused.value

    message = str(asyncio.run(main()))
    expected = r"would finish in 50\.\d ms \(receiving it 20\.\d ms, queue ahead 20\.0 ms"
    assert re.search(expected, message), message


@pytest.mark.parametrize(
    ("adaptive", "refused"),
    [(True, True), (False, False)],
    ids=["adaptive-one-by-one", "fixed-merged"],
)
def test_the_queue_ahead_counts_as_the_batches_it_will_run_in(adaptive, refused):
    """6 ms per row and 4 ms per call: merging does not pay, so the adaptive policy runs queued requests
    one by one. Running 10 ms, two queued: 10 + 2 x 10 + 10 ms = 40 ms, over an SLO of 38 ms. A fixed
    policy merges the two: 10 + (12 + 4) + 10 ms = 36 ms, within it."""

    async def main():
        backend = FakeBackend(hold=True)
        policy = BatchPolicy(max_batch_size=4, adaptive=adaptive, max_queue_delay_s=0.0)
        batcher = make(backend, policy=policy, limits=QueueLimits(slo_s=0.038))
        for size in (1, 4):
            batcher.runner.cost.observe(size, 0.004 + 0.006 * size)
        running = submit(batcher, 1.0)
        await entered(backend, 1)
        queued = [submit(batcher, 2.0), submit(batcher, 3.0)]
        try:
            submit(batcher, 4.0)
        except ServerBusy as error:
            outcome = error
        else:
            outcome = None
        backend.release()
        await asyncio.gather(running, *queued, return_exceptions=True)
        return outcome

    outcome = asyncio.run(main())
    assert (outcome is not None) is refused
    if refused:
        assert "would finish in 40.0 ms" in str(outcome)


def test_a_request_is_refused_unread_only_when_no_body_could_make_it_in_time():
    """Before decoding, a request is judged at its most favourable (one row, the highest priority):
    refused when even that misses the SLO, and never when its body could still make it in time."""

    async def main():
        backend = FakeBackend(hold=True)
        adaptive = BatchPolicy(max_batch_size=4, adaptive=True)
        batcher = _seeded(backend, adaptive, QueueLimits(slo_s=0.035))
        assert batcher.refuse_unread() is None  # nothing running or queued: nothing to judge
        running = submit(batcher, 1.0, 2)  # 20 ms
        await entered(backend, 1)
        assert batcher.refuse_unread() is None  # 20 ms running + 10 ms: within 35 ms
        low = submit(batcher, 2.0, priority=5)  # 10 ms more, but a priority-1 request goes first
        assert batcher.refuse_unread() is None
        high = submit(batcher, 3.0, priority=1)
        assert batcher.refuse_unread(queue_known=False) is None  # a route may send it elsewhere: wait only
        refusal = batcher.refuse_unread()  # 20 ms running + 10 ms at priority 1 + 10 ms
        assert refusal is not None
        assert re.search(
            r"would finish in 40\.0 ms \(receiving and decoding one 0\.0 ms, queue ahead 30\.0 ms, "
            r"server busy 0\.0 ms\) against an SLO of 35 ms; "
            r"it was refused before its body was read",
            refusal.message,
        )
        backend.release()
        await asyncio.gather(running, low, high)
        return batcher

    batcher = asyncio.run(main())
    assert batcher.recorder.metrics.refused == {"slo": 1}
    assert batcher.recorder.stats.fail.count == 1


async def _one_running(slo_s: float, rows: int) -> tuple[FakeBackend, Batcher, asyncio.Future]:
    """An adaptive batcher with an SLO of ``slo_s`` (10 ms a row, merging does not pay), running a batch
    of ``rows`` that holds until the backend is released."""
    backend = FakeBackend(hold=True)
    batcher = _seeded(backend, BatchPolicy(max_batch_size=4, adaptive=True), QueueLimits(slo_s=slo_s))
    running = submit(batcher, 1.0, rows)
    await entered(backend, 1)
    return backend, batcher, running


def test_requests_still_being_decoded_count_ahead_of_those_judged_before_decoding():
    """SLO 35 ms, 10 ms a request, a 20 ms batch running: a request judged before decoding fits (20 +
    10 ms) until one let in before it is still being decoded off the loop (``expect``): that one will
    join the queue first (20 + 10 + 10 ms), so the next is refused. Once it arrives (``expected``, then
    its own admission counts it as queued) the count goes, and a request still would fit again while
    nothing else is queued."""

    async def main():
        backend, batcher, running = await _one_running(0.035, 2)  # 20 ms
        assert batcher.refuse_unread() is None
        batcher.expect()
        assert batcher.refuse_unread(queue_known=False) is None  # it may go elsewhere: the wait only
        refusal = batcher.refuse_unread()
        assert refusal is not None
        assert "queue ahead 30.0 ms" in refusal.message
        batcher.expected()  # it failed to decode: it will not come
        assert batcher.refuse_unread() is None
        backend.release()
        await running

    asyncio.run(main())


def test_a_request_that_goes_ahead_of_a_queue_that_stands_is_not_held_to_half_the_slo():
    """SLO 60 ms, 10 ms a request, a 30 ms batch running and two priority-2 requests queued in a queue
    that stands (``standing.py``: 30 ms of the SLO held back). Another priority-2 request would join it:
    refused (30 + 20 + 10 ms, plus the 30 held back). A priority-1 request goes ahead of that queue and
    does not join it: once decoded, nothing is held back from it (30 + 10 ms), and it runs first. Before
    decoding its priority is not known, and a request is judged as one that would join the queue."""

    async def main():
        backend, batcher, running = await _one_running(0.060, 3)  # 30 ms
        queued = [submit(batcher, 2.0, priority=2) for _ in range(2)]
        standing = batcher.admission.standing
        assert standing is not None
        standing.standing, standing.cut_s = True, 0.030
        with pytest.raises(
            ServerBusy, match=r"queue ahead 50\.0 ms.*plus 30\.0 ms held back while its queue"
        ):
            submit(batcher, 3.0, priority=2)
        unread = batcher.refuse_unread()
        high = submit(batcher, 4.0, priority=1)
        order = []
        for future, name in ((high, "high"), *((future, "low") for future in queued)):
            future.add_done_callback(lambda _, name=name: order.append(name))
        backend.release()
        await asyncio.gather(running, high, *queued)
        return unread, order

    unread, order = asyncio.run(main())
    assert unread is not None
    assert "30.0 ms held back while its queue stands" in unread.message
    assert order == ["high", "low", "low"]


def test_before_decoding_the_queue_is_judged_with_the_lag_as_after_decoding():
    """5 ms of lag and a 20 ms batch running, 10 ms per request, SLO 32 ms: the wait alone would not
    refuse a request (5 + 10 ms), but the queue is judged as admission judges it after decoding, with
    the lag (5 + 20 + 10 ms): refused unread. With nothing known of the queue (the request may go to
    another model), only the wait is judged: 23 ms of lag refuses it. Only the wait's refusal is the
    iteration's (``refuses_turn``): the queue's is judged afresh for the next request.

    The wait of the second request read in an iteration counts the time since the first (the turn so
    far): 5 ms of lag leaves it 17 ms for that, where 21 ms had left it one, and a host that stalled
    the test for 1.3 ms between the two had the wait refuse it."""
    from edgeinfer.admission.lag import LoopLag

    async def main():
        backend = FakeBackend(hold=True)
        lag = LoopLag()
        adaptive = BatchPolicy(max_batch_size=4, adaptive=True)
        batcher = _seeded(backend, adaptive, QueueLimits(slo_s=0.032), lag)
        running = submit(batcher, 1.0, 2)
        await entered(backend, 1)
        await asyncio.sleep(0)  # a new loop iteration: no time spent in this one yet
        lag.lag_s, lag.turn_s = 0.005, 0.0  # (the test's own iterations are not load)
        assert batcher.refuse_unread(queue_known=False) is None
        refusal = batcher.refuse_unread()
        assert refusal is not None
        found = re.search(
            r"would finish in ([\d.]+) ms \(receiving and decoding one 0\.0 ms, queue ahead 20\.0 ms, "
            r"server busy ([\d.]+) ms\) against an SLO of 32 ms; it was refused before its body was read",
            refusal.message,
        )
        assert found is not None, refusal.message
        # the lag, and the time since this iteration's first request: what the host takes between the
        # two calls counts too (a stall of 0.05 ms shows as 5.1)
        assert float(found[2]) == pytest.approx(5.0, abs=1.0)
        assert float(found[1]) == pytest.approx(35.0, abs=1.0)
        assert not batcher.refuses_turn(refusal)
        await asyncio.sleep(0)
        lag.lag_s, lag.turn_s = 0.023, 0.0
        refusal = batcher.refuse_unread(queue_known=False)
        assert refusal is not None
        assert re.search(
            r"the server is 23\.0 ms behind and 2 loop iterations of 0\.0 ms from an answer, against an "
            r"SLO of 32 ms; it was refused before its body was read",
            refusal.message,
        )
        assert batcher.refuses_turn(refusal)
        lag.stop()
        backend.release()
        await running
        return batcher

    batcher = asyncio.run(main())
    assert batcher.recorder.metrics.refused == {"slo": 2}


@pytest.mark.parametrize(("reading_s", "refused"), [(0.002, False), (0.012, True)])
def test_before_decoding_the_time_a_request_takes_to_arrive_counts_as_the_models_recent_ones_took(
    reading_s: float, refused: bool
):
    """A 20 ms batch running, 10 ms per request, SLO 35 ms, no lag: a request whose body is still to
    come has, by the model's last request, ``reading_s`` ahead of it before it is even submitted (its
    SLO counts from its first bytes): 2 ms leaves it in time (32 ms), 12 ms does not (42 ms)."""

    async def main():
        backend = FakeBackend(hold=True)
        batcher = _seeded(backend, BatchPolicy(max_batch_size=4, adaptive=True), QueueLimits(slo_s=0.035))
        running = submit(batcher, 1.0, 2, received_at=time.monotonic() - reading_s)
        await entered(backend, 1)
        refusal = batcher.refuse_unread()
        backend.release()
        await running
        return refusal

    refusal = asyncio.run(main())
    assert (refusal is not None) is refused
    if refusal is not None:
        found = r"would finish in ([0-9.]+) ms \(receiving and decoding one ([0-9.]+) ms"
        match = re.search(found, refusal.message)
        assert match is not None
        assert float(match[1]) == pytest.approx(42.0, abs=0.5)
        assert float(match[2]) == pytest.approx(12.0, abs=0.5)


def _slo_batcher(lag):
    """An adaptive batcher that has measured 10 ms per request, with an SLO of 32 ms, on ``lag``."""
    return _seeded(FakeBackend(), BatchPolicy(max_batch_size=4, adaptive=True), QueueLimits(slo_s=0.032), lag)


async def _judged_next_iteration(batcher, lag, lag_s: float, turn_s: float):
    """``refuse_unread`` for the first request of the next loop iteration, the loop ``lag_s`` behind
    and its recent turns ``turn_s`` long."""
    await asyncio.sleep(0)
    lag.lag_s, lag.turn_s = lag_s, turn_s
    return batcher.refuse_unread()


def _admitted_refused_alone(refused_turn_s: float, margin_s: float):
    """``_slo_batcher``'s judgement of three first requests of an iteration: 0.1 ms behind with turns
    of 10 ms and no margin; 0.1 ms behind with turns of ``refused_turn_s`` and ``margin_s`` of margin;
    on time (a lone request) with turns of 15 ms."""
    from edgeinfer.admission.lag import LoopLag

    async def main():
        lag = LoopLag()
        batcher = _slo_batcher(lag)
        assert batcher.admission.margin is not None
        admitted = await _judged_next_iteration(batcher, lag, 0.0001, 0.010)
        batcher.admission.margin.margin_s = margin_s
        refused = await _judged_next_iteration(batcher, lag, 0.0001, refused_turn_s)
        alone = await _judged_next_iteration(batcher, lag, 0.0, 0.015)
        lag.stop()
        return admitted, refused, alone

    return asyncio.run(main())


def test_the_iterations_still_ahead_of_a_request_count_against_its_slo():
    """10 ms per request, SLO 32 ms, the loop 0.1 ms behind: recent iterations of 10 ms (two of them
    ahead of a request read now: 20 ms) leave it in time, of 11.5 ms (23 ms) not. A request with
    nothing behind it (no lag, the first of its iteration) has no iterations ahead: its turn is its
    own work."""
    admitted, refused, alone = _admitted_refused_alone(refused_turn_s=0.0115, margin_s=0.0)
    assert admitted is None
    assert refused is not None
    assert "0.1 ms behind and 2 loop iterations of 11.5 ms from an answer" in refused.message
    assert refused.retry_after_s == pytest.approx(0.0231, abs=0.0005)
    assert alone is None


def test_the_admission_margin_counts_for_a_request_that_waited_but_not_for_a_lone_one():
    """The margin steered by the misses (``margin.py``) is added to the wait's prediction too: 10 ms per
    request, SLO 32 ms, 0.1 ms behind with iterations of 10 ms (30.1 ms) is in time with no margin and
    refused with 2 ms of it; a lone request (no lag, the first of its iteration) is not judged on it."""
    admitted, refused, alone = _admitted_refused_alone(refused_turn_s=0.010, margin_s=0.002)
    assert admitted is None
    assert refused is not None
    assert (
        "from an answer, plus a margin of 2.0 ms (what keeps the requests missing it to 1 %)"
        in refused.message
    )
    assert alone is None


def test_the_requests_read_after_a_refused_one_in_the_same_iteration_share_its_refusal():
    """Within one loop iteration the wait only grows: once a request was refused for it, the rest of
    the iteration's are refused with the same error (each counted) without judging again; the next
    iteration judges afresh."""
    from edgeinfer.admission.lag import LoopLag

    async def main():
        lag = LoopLag()
        batcher = _slo_batcher(lag)
        first = await _judged_next_iteration(batcher, lag, 0.025, 0.0)
        assert first is not None
        lag.lag_s = 0.0  # the same iteration: what it refused stays refused
        assert [batcher.refuse_unread() for _ in range(3)] == [first] * 3
        await asyncio.sleep(0)  # the next iteration
        lag.turn_s = 0.0
        assert batcher.refuse_unread() is None
        lag.stop()
        return batcher

    batcher = asyncio.run(main())
    assert batcher.recorder.metrics.refused == {"slo": 4}


def test_a_refusal_is_given_again_only_within_its_own_iteration():
    """``refuse_again``: the service refuses the rest of an iteration's requests with its first refusal
    without judging them; the batcher says whether that refusal is still this iteration's, and counts
    each one it is given again. Not another error, not the next iteration's."""
    from edgeinfer.admission.lag import LoopLag

    async def main():
        lag = LoopLag()
        batcher = _slo_batcher(lag)
        first = await _judged_next_iteration(batcher, lag, 0.025, 0.0)
        assert first is not None
        again = [batcher.refuse_again(first), batcher.refuse_again(first)]
        other = batcher.refuse_again(ServerBusy("another refusal"))
        await asyncio.sleep(0)  # the next iteration
        later = batcher.refuse_again(first)
        lag.stop()
        return batcher, again, other, later

    batcher, again, other, later = asyncio.run(main())
    assert (again, other, later) == ([True, True], False, False)
    assert batcher.recorder.metrics.refused == {"slo": 3}


def test_higher_priority_is_admitted_where_lower_priority_is_refused():
    async def main():
        backend = FakeBackend(hold=True)
        adaptive = BatchPolicy(max_batch_size=4, adaptive=True)
        batcher = _seeded(backend, adaptive, QueueLimits(slo_s=0.035))
        running = submit(batcher, 1.0, 2)
        await entered(backend, 1)
        low = submit(batcher, 2.0, priority=5)
        with pytest.raises(ServerBusy):
            submit(batcher, 3.0, priority=5)  # behind the running batch and the other low one
        high = submit(batcher, 4.0, priority=1)  # the low one queued is not ahead of it
        backend.release()
        await asyncio.gather(running, low, high)
        return batcher

    batcher = asyncio.run(main())
    assert batcher.recorder.metrics.refused == {"slo": 1}


def test_admission_adds_a_margin_while_requests_miss_their_slo():
    """Requests miss their 10 ms SLO (the event loop is busy 12 ms before it gets to each answer, whatever
    the model's cost): the margin grows with each miss, and a request predicted to finish well within
    its SLO behind the one running is refused for it. Requests in time bring it back down."""
    slo_s = 0.010
    misses = math.ceil(1 / (margin.GAIN * 0.99)) + 1  # enough to take the margin to the whole SLO

    async def main():
        backend = FakeBackend()
        batcher = make(
            backend, policy=BatchPolicy(max_batch_size=4, adaptive=True), limits=QueueLimits(slo_s=slo_s)
        )
        for i in range(misses):
            answer = submit(batcher, float(i))
            time.sleep(0.012)  # the loop busy elsewhere before it gets to the answer
            await answer
        late_margin_s = batcher.slo_margin_s
        backend.hold()
        running = submit(batcher, 100.0)
        try:
            await entered(backend, misses + 1)
            with pytest.raises(ServerBusy, match=r"plus a margin of 10\.0 ms") as refused:
                submit(batcher, 101.0)
        finally:
            backend.release()
        await running
        for i in range(500):
            await submit(batcher, float(i))
        return batcher, late_margin_s, refused.value

    batcher, late_margin_s, refused = asyncio.run(main())
    assert late_margin_s == pytest.approx(slo_s)
    predicted_ms = float(re.search(r"would finish in ([\d.]+) ms", str(refused)).group(1))
    assert predicted_ms < 5, "without the margin it was predicted in time"
    assert batcher.recorder.metrics.refused == {"slo": 1}
    assert batcher.slo_margin_s < late_margin_s, "requests in time brought the margin down"


def test_a_queue_that_stands_under_an_overload_is_kept_to_half_the_slo():
    """Offered a request every 2 ms where each takes 5 ms, a model with an SLO of 100 ms first lets its
    queue grow to the SLO. Once it has stood deeper than half the SLO for half an SLO's time, admission
    holds back the other half (``standing.py``), says so in its refusals, and what it lets in from then
    on is answered in about half the SLO. Once the queue has emptied, nothing is held back."""
    slo_s = 0.100

    async def main():
        backend = FakeBackend(delay_s=0.005)
        batcher = make(backend, policy=BatchPolicy(max_batch_size=1), limits=QueueLimits(slo_s=slo_s))
        batcher.runner.cost.observe(1, 0.005)
        loop = asyncio.get_running_loop()
        held_back: list[asyncio.Future] = []  # admitted while half the SLO was held back
        latencies: list[float] = []
        futures, refusals = [], []
        began = time.monotonic()
        while time.monotonic() - began < 0.8:
            held = batcher.slo_margin_s >= slo_s / 2
            try:
                future = submit(batcher, 1.0)
            except ServerBusy as refused:
                refusals.append(str(refused))
            else:
                sent = loop.time()
                future.add_done_callback(lambda _, sent=sent: latencies.append(loop.time() - sent))
                futures.append(future)
                if held:
                    held_back.append(future)
            await asyncio.sleep(0.002)
        first_held = futures.index(held_back[0]) if held_back else len(futures)
        await asyncio.gather(*futures)
        answered_ahead = latencies[:first_held]
        await submit(batcher, 2.0)  # alone: the queue stays empty after it
        return batcher, refusals, latencies[first_held:], answered_ahead

    batcher, refusals, held_latencies, earlier = asyncio.run(main())
    assert held_latencies, "the queue never stood"
    assert any("held back while its queue stands" in text for text in refusals)
    assert max(earlier) > 0.7 * slo_s, "before it stood, the queue grew to about the SLO"
    assert np.median(held_latencies) < 0.7 * slo_s, "then it was kept to about half"
    assert batcher.slo_margin_s < slo_s / 2, "nothing is held back once the queue has emptied"


def test_the_loops_idle_ticks_calm_the_margin_while_the_model_has_nothing_to_do():
    """A margin learned under an overload (5 ms of a 10 ms SLO) would outlast it: in an idle spell no
    answers come to bring it down. The event loop's idle ticks (``lag.py``) do, while the model has
    nothing queued or running; while a batch runs they do not (that is the load the margin is for)."""
    from edgeinfer.admission.lag import LoopLag

    async def main():
        lag = LoopLag()
        backend = FakeBackend(hold=True)
        adaptive = BatchPolicy(max_batch_size=4, adaptive=True)
        batcher = _seeded(backend, adaptive, QueueLimits(slo_s=0.010), lag)
        assert batcher.admission.margin is not None
        batcher.admission.margin.margin_s = 0.005
        running = submit(batcher, 1.0)
        lag.stop()  # the ticks are the test's, below
        await entered(backend, 1)
        lag.idle_ticks += 10
        busy = batcher.slo_margin_s
        backend.release()
        await running
        lag.idle_ticks += 10
        return busy, batcher.slo_margin_s

    busy, idle = asyncio.run(main())
    assert busy == pytest.approx(0.005)
    in_time = margin.GAIN * 0.010 * 0.01  # what the request answered in time took away
    assert idle == pytest.approx((0.005 - in_time) * margin.CALM**10)


def test_a_request_predicted_to_miss_its_timeout_gets_504_at_once():
    async def main():
        backend = FakeBackend(hold=True)
        batcher = _seeded(backend, BatchPolicy(max_batch_size=4, adaptive=True), QueueLimits())
        running = submit(batcher, 1.0, 2)
        await entered(backend, 1)
        with pytest.raises(RequestTimeout, match=r"after its timeout of 15\.0 ms; it was refused at once"):
            submit(batcher, 2.0, timeout_s=0.015)
        within = submit(batcher, 3.0, timeout_s=10.0)
        backend.release()
        await asyncio.gather(running, within)
        return batcher, backend

    batcher, backend = asyncio.run(main())
    assert batcher.recorder.metrics.refused == {"deadline": 1}
    assert 2.0 not in backend.rows_run()


@pytest.mark.parametrize("forming_ahead", [False, True], ids=["fixed", "adaptive-forming-ahead"])
def test_a_newer_frame_of_a_stream_supersedes_the_queued_one(forming_ahead):
    """Also where batches form ahead of a free slot: a frame of a stream is not formed ahead (it would
    be committed to run), it waits in the queue where a newer frame can still replace it."""

    async def main():
        backend = FakeBackend(hold=True)
        if forming_ahead:
            batcher = _adaptive_with_prefetch(backend, per_row_s=0.010, per_batch_s=0.0)
        else:
            batcher = make(backend, policy=BatchPolicy(max_batch_size=1))
        running = submit(batcher, 1.0, stream="cam-1")
        await entered(backend, 1)
        stale = submit(batcher, 2.0, stream="cam-1")
        await asyncio.sleep(0)  # the queue is looked at: 2.0 stays in it
        assert batcher.queue_length == 1
        other = submit(batcher, 3.0, stream="cam-2")
        plain = submit(batcher, 4.0)
        newest = submit(batcher, 5.0, stream="cam-1")  # replaces 2.0, which has not started
        with pytest.raises(Superseded, match="superseded by a newer one of stream 'cam-1'; it was not run"):
            await stale
        backend.release()
        await asyncio.gather(running, other, plain, newest)
        return backend

    backend = asyncio.run(main())
    assert 2.0 not in backend.rows_run()
    assert {1.0, 3.0, 4.0, 5.0} <= set(backend.rows_run())


def test_the_loop_lag_follows_a_blocked_loop_and_falls_back():
    from edgeinfer.admission.lag import LoopLag

    async def main():
        lag = LoopLag()
        lag.start()
        await asyncio.sleep(0.02)
        quiet = lag.lag_s
        time.sleep(0.05)  # the loop is blocked, as by a long stretch of parsing
        # read in every iteration after it: the overdue tick raises the lag in one, and the next tick on
        # time lowers it again in a later one (a single read after a 1 ms sleep came after both once, on
        # a busy machine, and read 36.6 ms: 45.7 x 0.8)
        busy, unblocked = 0.0, time.monotonic()
        while time.monotonic() - unblocked < 0.01:
            await asyncio.sleep(0)
            busy = max(busy, lag.lag_s)
        # the fall, observed: each tick on time takes a share off (on a busy host ticks come late and
        # the fall is slower, so the test waits for it rather than for a fixed time)
        deadline = time.monotonic() + 10
        while lag.lag_s >= busy / 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        lag.stop()
        return quiet, busy, lag.lag_s

    quiet, busy, later = asyncio.run(main())
    assert quiet < busy, "the blocked loop raised the lag above what it was before"
    assert busy >= 0.04  # the first tick due after the block began came at least 45 ms late
    assert later < busy / 4, "the lag fell back"


def test_the_loop_lag_counts_against_the_slo_when_nothing_is_queued():
    """Nothing queued, but the loop is 50 ms behind: a 10 ms request with a 35 ms SLO is refused; one
    that takes 40 ms (it would miss anyway) is admitted."""
    from edgeinfer.admission.lag import LoopLag

    async def main():
        backend = FakeBackend()
        lag = LoopLag()
        adaptive, limits = BatchPolicy(max_batch_size=4, adaptive=True), QueueLimits(slo_s=0.035)
        batcher = _seeded(backend, adaptive, limits, lag)
        lag.lag_s = 0.050  # as measured after a 50 ms stretch of work
        with pytest.raises(ServerBusy, match=r"server busy 50\.0 ms\) against an SLO of 35 ms") as refused:
            submit(batcher, 1.0)
        slow = make(FakeBackend(), policy=adaptive, limits=limits, lag=lag)
        slow.runner.cost.observe(1, 0.040)
        slow.runner.cost.observe(4, 0.160)
        lag.lag_s = 0.050
        answered = await submit(slow, 2.0)
        return refused.value, answered, batcher

    refused, answered, batcher = asyncio.run(main())
    assert refused.retry_after_s == pytest.approx(0.050)
    assert answered["y"].shape == (1, 2)
    assert batcher.recorder.metrics.refused == {"slo": 1}
