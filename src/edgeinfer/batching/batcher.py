"""The queue of one model version: it owns the pending requests, their futures and the timer.

Requests are submitted from the event loop and get a future. What to run together is decided by the
pure ``policy.next_batch``; how a batch runs is the runner's business (threads, the event loop, child
processes), and at most ``runner.capacity`` batches are handed to it at once (those beyond its
``concurrency`` only when ``policy.forms_ahead`` says a batch formed early is as good). Nothing here polls: a
batch starts when a request arrives or a batch finishes (if the runner has room and the policy says so),
or when the timer for the policy's ``wake_at`` or the next deadline fires.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Hashable
from functools import partial

from edgeinfer.admission.admission import Admission, QueueLimits
from edgeinfer.admission.estimates import follow
from edgeinfer.admission.lag import LoopLag
from edgeinfer.admission.view import QueueView
from edgeinfer.batching.jobs import BatchSpans, Job, as_error, report, settle
from edgeinfer.batching.policy import (
    BatchPolicy,
    Measured,
    Pending,
    forms_ahead,
    next_batch,
    next_deadline,
    runs_alone,
    split_expired,
)
from edgeinfer.batching.recorder import BatchRecorder
from edgeinfer.errors import ModelNotReady, RequestTimeout, ServerBusy, Superseded
from edgeinfer.outcome import RequestTrace
from edgeinfer.runners import BatchResult, BatchTimes, Result, Runner, Tensors, Work

# A merge trial (``policy.MERGE_TRIAL_ROWS``) once in this many scheduling passes that left mergeable
# requests unmerged (merging did not pay): at most one batch in 64 (docs/design/batcher.md).
MERGE_TRIAL_EVERY = 64


class Batcher:
    """Merges compatible requests into batches and hands them to ``runner``.

    Constructed on the event loop it serves. ``recorder`` gets every queue wait, batch and answer;
    ``spans`` (when tracing is on) every finished batch with the traces of its requests.
    """

    def __init__(
        self,
        name: str,
        runner: Runner,
        policy: BatchPolicy,
        limits: QueueLimits,
        recorder: BatchRecorder,
        lag: LoopLag | None = None,
        spans: BatchSpans | None = None,
    ) -> None:
        self.name = name
        self.runner = runner
        self.policy = policy
        self.limits = limits
        self.recorder = recorder
        self._loop = asyncio.get_running_loop()
        self._pending: list[Pending] = []
        self._view = view = QueueView()  # the counts admission reads, kept here as requests come and go
        self.admission = Admission(name, limits, policy, runner, view, lag)
        self._sequence = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._flush_soon = False
        self._ran_this_turn = False  # a request ran alone inline in this loop iteration (``_run_alone``)
        self._outstanding = 0  # submitted and not yet answered
        self._gap_s: float | None = None  # mean time between arrivals, while requests keep coming
        self.last_submit = time.monotonic()  # when a request last came (residency reads it)
        self._lag = lag  # how far behind the loop runs: the adaptive fast path reads it
        self._unmerged = 0  # scheduling passes that left requests unmerged since the last merge trial
        self._done_now: list[Callable[[], None]] = []  # ``on_done`` of requests answered in this pass
        self._spans = spans

    def expect(self) -> None:
        """A request let in by ``refuse_unread`` is being decoded off the event loop: until ``expected``,
        requests judged before decoding count it ahead of them, as one row (docs/design/admission.md)."""
        self._view.arriving += 1

    def expected(self) -> None:
        """The request of ``expect`` was submitted (judged then with the queue it finds) or failed."""
        self._view.arriving -= 1

    @property
    def queue_length(self) -> int:
        return len(self._pending)

    @property
    def drain_s_per_row(self) -> float:
        """How fast the queue last drained while work waited, seconds per row (0: not yet measured)."""
        return self.admission.drain.s_per_row or 0.0

    @property
    def slo_margin_s(self) -> float:
        """What admission adds now to its prediction for a request that would queue behind every other."""
        steered_s, cut_s = self.admission.margins()
        return steered_s + cut_s

    @property
    def outstanding(self) -> int:
        """Requests submitted and not yet answered (queued or in a running batch)."""
        return self._outstanding

    def submit(
        self,
        work: Work,
        group: Hashable,
        *,
        priority: int = 1,
        timeout_s: float | None = None,
        trace: RequestTrace | None = None,
        stream: str | None = None,
        received_at: float | None = None,
        on_done: Callable[[], None] | None = None,
    ) -> asyncio.Future[Tensors]:
        """Queue one request, or refuse it (``Admission``); the future resolves to its outputs or
        raises the batch's error. Cancelling the future takes a request not started out of the queue.

        ``stream``: a request of that stream still queued is answered ``Superseded`` and not run.
        ``received_at`` (``time.monotonic``): when the transport began receiving it; its SLO counts
        from then. ``on_done``: called in the loop iteration the batch completes the future in, an
        iteration before the future's callbacks (docs/design/batcher.md); not for a request that ran
        alone at once nor one that failed otherwise (expired, superseded, cancelled).
        """
        if self._closed:
            raise ModelNotReady(f"model {self.name} is unloading and takes no new requests")
        view = self._view
        if view.pending >= self.limits.max_queue_size:
            self.recorder.refused("queue_full")
            raise self.admission.queue_full()
        now = time.monotonic()
        gap = now - self.last_submit  # the mean gap between arrivals (a gap over a second: start afresh)
        self.last_submit = now
        self._gap_s = follow(self._gap_s, gap) if gap <= 1.0 else None
        lag = self._lag
        if lag is not None:
            lag.used(now)
        deadline = self.limits.deadline(now, timeout_s)
        due = self.admission.due(now, received_at) if self.limits.slo_s is not None else None
        if (deadline is not None or due is not None) and (view.busy or (lag is not None and lag.lag_s)):
            refusal = self.admission.judge(work.rows, priority, now, deadline, due)
            if refusal is not None:
                self.recorder.refused("deadline" if isinstance(refusal, RequestTimeout) else "slo")
                raise refusal
        if stream is not None:
            self._supersede(stream)
        idle = not self._outstanding and not self._ran_this_turn and view.running < self.runner.capacity
        if idle and self._goes_alone(work.rows, due, now):
            return self._run_alone(work, now, trace, due)
        future: asyncio.Future[Tensors] = self._loop.create_future()
        item = Pending(
            rows=work.rows,
            group=group,
            enqueued_at=now,
            priority=priority,
            deadline=deadline,
            sequence=next(self._sequence),
            payload=Job(work, future, trace, on_done),
            due=due,
            stream=stream,
        )
        self._idle.clear()
        future.add_done_callback(partial(self._on_answered, item))
        self._outstanding += 1
        self._pending.append(item)
        view.count(priority, item.rows, 1)
        if not self._flush_soon:
            # Under load, decide after this loop iteration: requests that arrived on other connections
            # in the same iteration are parsed by then and can join the batch (the hop costs < 1 us).
            self._flush_soon = True
            self._loop.call_soon(self._flush)
        return future

    def _run_alone(
        self, work: Work, now: float, trace: RequestTrace | None, due: float | None
    ) -> asyncio.Future[Tensors]:
        """Nothing else in flight: start now, without queueing. A fast model runs inline and the caller
        finds the future already done, counted here and now. Requests read later in the same loop
        iteration queue and merge (``_ran_this_turn``; docs/design/batcher.md, "Running alone")."""
        rows = work.rows
        if trace is not None:
            trace.queue_s, trace.batch_rows = 0.0, rows
        future: asyncio.Future[Tensors] = self._loop.create_future()
        done = self._hand_over([work], rows)
        if not isinstance(done, asyncio.Future):  # ran inline: its result or its error
            self._answer_alone(future, done, rows, now, trace, due)
            return future
        self._outstanding += 1  # in a thread: answered as a batch when it finishes
        self.recorder.started(0.0)
        self._idle.clear()
        future.add_done_callback(partial(self._answered, None, now, due=due))
        done.add_done_callback(partial(self._finish, [Job(work, future, trace)], rows, now))
        return future

    def _answer_alone(
        self,
        future: asyncio.Future[Tensors],
        done: BatchResult | BaseException,
        rows: int,
        started: float,
        trace: RequestTrace | None,
        due: float | None,
    ) -> None:
        """Answer and count a request whose batch of one ran inline (``done``: its result or its error):
        what ``_complete`` and ``_answered`` do, in fewer steps (at concurrency 1 each is latency)."""
        view = self._view
        view.running -= 1
        view.running_rows -= rows
        self.admission.drain.idle()  # inline: not a drain
        times: BatchTimes | None
        outputs: Result
        if isinstance(done, BaseException):
            times, outputs, error = None, done, done
        else:
            times, outputs, error = done.times, done.results[0], None
        if self._spans is not None:
            self._spans.batch_done(started, [trace], rows, times, error)
        if trace is not None and times is not None and times.infer_ns:
            trace.compute_s = times.infer_ns / 1e9
        succeeded = settle(future, outputs, self.name)
        answered = time.monotonic()
        self.recorder.ran_alone(rows, times, succeeded, answered - started)
        if succeeded and due is not None:
            self.admission.answered(answered > due)
        if not self._ran_this_turn:
            self._ran_this_turn = True
            self._loop.call_soon(self._turn_over)

    def _turn_over(self) -> None:
        """The loop iteration in which a request ran alone inline is over (see ``_run_alone``)."""
        self._ran_this_turn = False

    def _supersede(self, stream: str) -> None:
        """Answer the queued requests of ``stream`` as superseded (counted under status "superseded")."""
        stale = [item for item in self._pending if item.stream == stream]
        if not stale:
            return
        self._remove(stale)
        for item in stale:
            job: Job = item.payload  # type: ignore[assignment]
            if not job.future.done():
                job.future.set_exception(
                    Superseded(
                        f"request to model {self.name} was superseded by a newer one of stream "
                        f"{stream!r}; it was not run"
                    )
                )

    def measured(self) -> Measured | None:
        """What the adaptive policy decides from; None before the runner has run a batch."""
        cost = self.runner.cost
        if not cost.observed:
            return None
        spare = max(0, self.runner.concurrency - self._view.running - 1)
        return Measured(cost.per_row_s, cost.per_batch_s, self._gap_s, spare)

    def refuse_unread(self, queue_known: bool = True) -> ServerBusy | None:
        """The refusal (counted) of a request before its body is decoded (``Admission.before_reading``),
        or None."""
        refusal = self.admission.before_reading(time.monotonic(), queue_known)
        if refusal is not None:
            self.recorder.refused("slo")
        return refusal

    def refuses_turn(self, refusal: ServerBusy) -> bool:
        """Whether ``refusal`` is the one this loop iteration's requests are refused with before decoding."""
        return self.admission.refuses_turn(refusal)

    def refuse_again(self, refusal: ServerBusy) -> bool:
        """``refuses_turn``, counting one more request refused with it (``refused_again`` of the service)."""
        if not self.admission.refuses_turn(refusal):
            return False
        self.recorder.refused("slo")
        return True

    def _goes_alone(self, rows: int, due: float | None, now: float) -> bool:
        """Whether a request with nothing else in flight runs at once: as the policy says, but not while
        the loop lags (the requests read in the same iteration then form one batch)."""
        policy = self.policy
        if not policy.adaptive:
            return runs_alone(rows, due, policy, now)
        lag = self._lag
        if lag is not None and lag.lag_s and rows < policy.max_batch_size:
            return False  # the loop is behind: requests it reads in this iteration merge (lag.py)
        return runs_alone(rows, due, policy, now, self.measured())

    def _flush(self) -> None:
        self._flush_soon = False
        self._schedule(None)

    async def drain(self) -> None:
        """Refuse new requests and wait until every queued and running one is answered."""
        self._closed = True
        await self._idle.wait()

    def _on_answered(self, item: Pending, future: asyncio.Future[Tensors]) -> None:
        """Count a queued request; if it was cancelled while queued, take it out of the queue."""
        self._answered(item, item.enqueued_at, future, item.due)

    def _answered(
        self,
        item: Pending | None,
        enqueued_at: float,
        future: asyncio.Future[Tensors],
        due: float | None = None,
    ) -> None:
        """Count a request answered, failed or cancelled (``item``: its place in the queue, None for one
        that never queued); one with an SLO (``due``) tells admission whether it made it."""
        self._outstanding -= 1
        cancelled = future.cancelled()
        now = time.monotonic()
        ok = not cancelled and future.exception() is None
        self.recorder.answered(ok, now - enqueued_at)
        if ok and due is not None:
            self.admission.answered(now > due)
        if cancelled and item is not None and item in self._pending:
            self._remove([item])
            self._schedule(None)

    def _on_timer(self, when: float) -> None:
        self._timer = None
        # Timers may fire a hair early; treating now as the wake time avoids re-arming in a tight loop.
        self._schedule(max(time.monotonic(), when))

    def _schedule(self, now: float | None) -> None:
        measured = self.measured() if self.policy.adaptive else None  # a fixed policy does not use it
        if measured is not None and len(self._pending) > 1 and not measured.merging_pays():
            self._unmerged += 1  # requests could have merged and will not: now and then, a trial
            measured.trial = self._unmerged >= MERGE_TRIAL_EVERY
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if now is None:
            now = time.monotonic()
        wake_at: float | None = None
        runner = self.runner
        capacity = runner.capacity if forms_ahead(self.policy, measured) else runner.concurrency
        view = self._view
        while self._pending:
            if view.running >= capacity:
                expired = split_expired(self._pending, now)[1]
                self._remove(expired)
                self._expire(expired, now)
                wake_at = next_deadline(self._pending)
                break
            decision = next_batch(self._pending, self.policy, now, measured)
            self._expire(decision.expired, now)
            if view.running >= runner.concurrency and any(item.stream for item in decision.batch):
                self._remove(decision.expired)  # a frame of a stream waits here for a free slot:
                break  # formed ahead, it could no longer be superseded by a newer one
            self._remove(decision.expired + decision.batch)
            if not decision.batch:
                wake_at = decision.wake_at
                break
            if measured is not None and measured.trial and len(decision.batch) > 1:
                measured.trial, self._unmerged = False, 0  # the trial ran
            self._start(decision.batch, now)
        if wake_at is not None:
            self._timer = self._loop.call_later(max(0.0, wake_at - now), self._on_timer, wake_at)
        self._update_idle()
        if self._done_now:
            self._answer()

    def _answer(self) -> None:
        """The ``on_done`` of the requests answered in this pass, once the queue, the runner's slots and
        the timer are settled (one may submit again); if one raises, futures answer the rest."""
        done_now, self._done_now = self._done_now, []
        for on_done in done_now:
            on_done()

    def _remove(self, items: list[Pending]) -> None:
        if items:
            gone = {id(item) for item in items}
            self._pending = [item for item in self._pending if id(item) not in gone]
            view = self._view
            for item in items:
                view.count(item.priority, item.rows, -1)

    def _expire(self, expired: list[Pending], now: float) -> None:
        for item in expired:
            job: Job = item.payload  # type: ignore[assignment]
            if not job.future.done():
                waited_ms = (now - item.enqueued_at) * 1000
                job.future.set_exception(
                    RequestTimeout(
                        f"request to model {self.name} timed out after {waited_ms:.1f} ms in the queue; "
                        "it was not run"
                    )
                )

    def _start(self, batch: list[Pending], now: float) -> None:
        rows = sum(item.rows for item in batch) if len(batch) > 1 else batch[0].rows
        jobs: list[Job] = []
        oldest_due = None
        for item in batch:
            job: Job = item.payload  # type: ignore[assignment]
            jobs.append(job)
            waited = now - item.enqueued_at
            self.recorder.started(waited)
            if job.trace is not None:
                job.trace.queue_s, job.trace.batch_rows = waited, rows
            if item.due is not None and (oldest_due is None or item.due < oldest_due):
                oldest_due = item.due
        if oldest_due is not None:
            self.admission.batch_started(now, oldest_due, bool(self._pending))
        self._run(jobs, rows, now)

    def _run(self, jobs: list[Job], rows: int, now: float) -> None:
        """Hand the batch to the runner; it is answered now if it ran inline, else when it finishes."""
        done = self._hand_over([jobs[0].work] if len(jobs) == 1 else [job.work for job in jobs], rows)
        if isinstance(done, asyncio.Future):
            done.add_done_callback(partial(self._finish, jobs, rows, now))
        else:  # ran inline: answer now; the caller's scheduling loop goes on
            self._complete(jobs, rows, now, done, inline=True)

    def _hand_over(
        self, works: list[Work], rows: int
    ) -> asyncio.Future[BatchResult] | BatchResult | BaseException:
        """Count a batch as running and give it to the runner: a future, or what it ran inline to."""
        view = self._view
        view.running += 1
        view.running_rows += rows
        try:
            return self.runner.run(works)
        except Exception as error:  # it ran inline and failed
            return error

    def _finish(self, jobs: list[Job], rows: int, started: float, done: asyncio.Future[BatchResult]) -> None:
        """Runner callback: deliver the batch's results, then see what can run next."""
        outcome: BatchResult | BaseException
        if done.cancelled():
            outcome = ModelNotReady(f"model {self.name} stopped before the batch ran")
        else:
            outcome = done.exception() or done.result()
        self._complete(jobs, rows, started, outcome)
        self._schedule(None)

    def _complete(
        self,
        jobs: list[Job],
        rows: int,
        started: float,
        done: BatchResult | BaseException,
        inline: bool = False,
    ) -> None:
        """A batch handed to the runner at ``started`` finished: ``done`` is its result or its error."""
        view = self._view
        view.running -= 1
        view.running_rows -= rows
        if inline:  # the time between inline batches is the loop's own work, which the loop lag measures
            self.admission.drain.idle()
        else:
            self.admission.drain.batch_done(time.monotonic(), rows, view.busy)
        if self._spans is not None:
            report(self._spans, started, jobs, rows, done)
        if isinstance(done, BaseException):
            self._fail(jobs, done)
            return
        times = done.times
        if times.infer_ns:
            self.recorder.batch_done(rows, len(jobs), times)
            for job in jobs:
                if job.trace is not None:
                    job.trace.compute_s = times.infer_ns / 1e9
        for job, outputs in zip(jobs, done.results, strict=True):
            if job.future.done():
                continue
            settle(job.future, outputs, self.name)
            if job.on_done is not None:
                self._done_now.append(job.on_done)

    def _fail(self, jobs: list[Job], error: BaseException) -> None:
        error = as_error(self.name, error)
        for job in jobs:
            if not job.future.done():
                job.future.set_exception(error)
                if job.on_done is not None:
                    self._done_now.append(job.on_done)

    def _update_idle(self) -> None:
        if not self._pending and self._view.running == 0:
            self._idle.set()
            self.admission.drain.idle()  # the work that waited is gone (cancelled, expired)
