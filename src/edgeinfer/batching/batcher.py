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
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from edgeinfer.batching.lag import LoopLag
from edgeinfer.batching.margin import SloMargin
from edgeinfer.batching.policy import (
    HIGHEST_PRIORITY,
    BatchPolicy,
    Measured,
    Pending,
    forms_ahead,
    merging_pays,
    next_batch,
    next_deadline,
    runs_alone,
    split_expired,
)
from edgeinfer.batching.recorder import BatchRecorder
from edgeinfer.batching.standing import StandingQueue
from edgeinfer.errors import (
    EdgeInferError,
    InferenceFailed,
    ModelNotReady,
    RequestTimeout,
    ServerBusy,
    Superseded,
)
from edgeinfer.outcome import RequestTrace
from edgeinfer.runners import BatchResult, BatchTimes, Result, Runner, Tensors, Work
from edgeinfer.runners.cost import CostModel


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


class _Job:
    __slots__ = ("future", "on_done", "trace", "work")

    def __init__(
        self,
        work: Work,
        future: asyncio.Future[Tensors],
        trace: RequestTrace | None,
        on_done: Callable[[], None] | None = None,  # ``submit``'s
    ) -> None:
        self.work = work
        self.future = future
        self.trace = trace
        self.on_done = on_done


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """How much may wait: requests (not rows) before 429, and how long before 504. ``slo_s``: the time
    a request may take (the model's latency objective): one predicted to take longer is refused (429);
    ``slo_quantile``: the share of requests the objective is for (0.99 for a p99 one)."""

    max_queue_size: int = 512
    queue_timeout_s: float | None = None
    slo_s: float | None = None
    slo_quantile: float = 0.99


ARRIVAL_MEMORY = 0.9  # the mean gap between arrivals follows the last ten or so
DRAIN_MEMORY = 0.9  # the drain rate follows the last ten or so batches that finished with work waiting
# The reading time judged before decoding (``_follow_high``): a request that takes longer than the
# estimate to arrive and decode may be refused after decoding, having cost the client its wait and the
# server the decode, so the estimate sits near the top of recent readings rather than at their mean.
READING_RISE = 0.2
READING_FALL = 0.01
# A request read in a loop iteration is answered in the next one: the batch it joins runs first thing
# there (``_flush``), and the transport writes the answer in the same pass (``submit``'s ``on_done``),
# before the loop reads more requests. Under load each iteration takes about as long as recent ones
# (``LoopLag.turn_s``), so a request read now has the rest of this one and the next ahead of it: two
# turns. Answered from the future's callbacks, it waited one iteration more (three turns). Measured
# with `tiny` (SLO 3.8 ms) on the benchmark's server, open-loop steps of 3 s on fresh servers, three
# rounds alternating with the code before: at 18,900 requests/s (0.9 of what it sustains) 95.5-96.8 %
# answered at p99 3.46-3.58 ms, where three turns and answers an iteration later answered 87.1-93.0 %
# at p99 3.12-3.23 ms; at 13,345/s p50 0.44-0.48 against 0.63-0.64 ms.
TURNS_TO_ANSWER = 2
# A merge trial (``policy.MERGE_TRIAL_ROWS``) once in this many scheduling passes that found requests
# that could have merged and did not, because merging did not pay: a pass runs at least one batch, so
# at most one batch in 64 is a trial, and in it the head waits for at most three more rows.
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
        # per priority level: queued requests and rows, kept as they come and go, so that admission
        # costs the same with 1 or 1,000 queued (it runs on every request)
        self._queued: dict[int, list[int]] = {}
        self._running = 0
        self._sequence = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._flush_soon = False
        self._ran_this_turn = False  # a request ran alone inline in this loop iteration (``_run_alone``)
        self._outstanding = 0  # submitted and not yet answered
        self._running_rows = 0
        self._arriving = 0  # judged and let in, still being decoded off the loop (``expect``)
        self._gap_s: float | None = None  # mean time between arrivals, while requests keep coming
        # time from first bytes to submission, receiving and decoding a request: a running estimate
        # near the top of recent ones (``_follow_high``; refuse_unread)
        self._reading_s: float | None = None
        # the queue's measured drain: seconds per row between batches finishing while work waited
        self._drain_s_per_row: float | None = None
        self._last_done: float | None = None  # when the last batch finished, if work was waiting then
        self.last_submit = time.monotonic()  # when a request last came (residency reads it)
        self._lag = lag  # how far behind the loop runs: admission and the adaptive fast path read it
        self._refused_turn: tuple[int, ServerBusy] | None = None  # (turn, its refusal): refuse_unread
        self._unmerged = 0  # scheduling passes that left requests unmerged since the last merge trial
        self._done_now: list[Callable[[], None]] = []  # ``on_done`` of requests answered in this pass
        # what admission adds to its predictions, steered by the share of requests missing the SLO
        self._margin = SloMargin(limits.slo_s, limits.slo_quantile) if limits.slo_s is not None else None
        self._idle_seen = 0  # the loop's idle ticks (``lag.py``) the margin has been calmed for
        # under an overload, the queue kept to half the SLO (``standing.py``): admission holds back the rest
        self._standing = StandingQueue(limits.slo_s) if limits.slo_s is not None else None
        self._spans = spans

    def expect(self) -> None:
        """A request let in by ``refuse_unread`` is being decoded off the event loop (a large JSON body on
        the HTTP server's JSON thread): until ``expected``, requests judged before decoding count it
        ahead of them, as one row. Without it they see none of the requests still in the decoder's
        queue, and under overload let in many that are refused only after their turn to be decoded:
        `cnn` (1.6 MB JSON images) at twice what it sustains refused 44-49 % of its requests after
        decoding, at p50 34-44 ms; with it, 1-2 % (docs/batching.md, "Decoding off the loop")."""
        self._arriving += 1

    def expected(self) -> None:
        """The request of ``expect`` was submitted (``_admit`` judges it with the queue it then finds,
        so it no longer counts as arriving) or failed before it could be."""
        self._arriving -= 1

    @property
    def queue_length(self) -> int:
        return len(self._pending)

    @property
    def drain_s_per_row(self) -> float:
        """How fast the queue last drained while work waited, seconds per row (0: not yet measured)."""
        return self._drain_s_per_row or 0.0

    @property
    def slo_margin_s(self) -> float:
        """What admission adds now to its prediction for a request that would queue behind every other:
        both parts of ``_margins``."""
        steered_s, cut_s = self._margins()
        return steered_s + cut_s

    def _margins(self) -> tuple[float, float]:
        """What admission adds to its predictions now: the margin steered by the misses (``margin.py``),
        first calmed for the loop's idle ticks since it was last read if the model has nothing queued
        or running, and the part of the SLO held back while the queue stands (``standing.py``), which
        counts only for a request that would join that queue (``_admit``)."""
        margin, lag, standing = self._margin, self._lag, self._standing
        if margin is None or standing is None:
            return 0.0, 0.0
        if lag is not None and lag.idle_ticks != self._idle_seen:
            if not (self._pending or self._running):
                margin.calm(lag.idle_ticks - self._idle_seen)
            self._idle_seen = lag.idle_ticks
        return margin.margin_s, standing.cut_s

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
        """Queue one request; the future resolves to its outputs or raises the batch's error.

        Cancelling the future (the client went away) takes the request out of the queue if it has not
        started yet. ``stream``: a request of that stream still queued is answered ``Superseded`` and
        not run (video-like streams want the newest frame, not every frame late). ``received_at``
        (``time.monotonic``): when the transport began receiving the request; its SLO counts from
        then, not from now (a client's clock starts when it sends, and a large body takes a while to
        arrive on a busy server).

        ``on_done``: called once the future is done by its batch, in the same loop iteration (after
        the batcher has settled what runs next), where the future's own callbacks run in the next one.
        Under load the event loop reads other requests in between, for milliseconds: a transport that
        answers from ``on_done`` saves its request that wait (``_answer``). Not called for a request
        that ran alone at once (the future is done when ``submit`` returns) nor for one that fails
        otherwise (expired, superseded, cancelled): the future's callbacks see to those.
        """
        if self._closed:
            raise ModelNotReady(f"model {self.name} is unloading and takes no new requests")
        if len(self._pending) >= self.limits.max_queue_size:
            self.recorder.refused("queue_full")
            cost = self.runner.cost  # the hint: the queue ahead at the measured cost (1 s before any)
            retry_s = self._backlog_s(cost, *self._ahead(HIGHEST_PRIORITY)) if cost.observed else 1.0
            raise ServerBusy.retry_in(
                f"model {self.name} has {len(self._pending)} requests queued, its limit (max_queue_size)",
                retry_s,
            )
        now = time.monotonic()
        gap = now - self.last_submit  # the mean gap between arrivals (a gap over a second: start afresh)
        self.last_submit = now
        self._gap_s = _follow(self._gap_s, gap) if gap <= 1.0 else None
        lag = self._lag
        if lag is not None:
            lag.used(now)
        deadline = _deadline(now, timeout_s, self.limits.queue_timeout_s)
        due = None
        if self.limits.slo_s is not None:
            if received_at is not None and received_at < now:
                due = received_at + self.limits.slo_s
                self._reading_s = _follow_high(self._reading_s, now - received_at)
            else:
                due = now + self.limits.slo_s
        if (deadline is not None or due is not None) and (
            self._pending or self._running or (lag is not None and lag.lag_s)
        ):
            self._admit(work.rows, priority, now, deadline, due)
        if stream is not None:
            self._supersede(stream)
        idle = not self._outstanding and not self._ran_this_turn and self._running < self.runner.capacity
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
            payload=_Job(work, future, trace, on_done),
            due=due,
            stream=stream,
        )
        self._idle.clear()
        future.add_done_callback(partial(self._on_answered, item))
        self._outstanding += 1
        self._pending.append(item)
        self._count_queued(item, 1)
        if not self._flush_soon:
            # Under load, decide after this loop iteration: requests that arrived on other connections
            # in the same iteration are parsed by then and can join the batch (the hop costs < 1 us).
            self._flush_soon = True
            self._loop.call_soon(self._flush)
        return future

    def _run_alone(
        self, work: Work, now: float, trace: RequestTrace | None, due: float | None
    ) -> asyncio.Future[Tensors]:
        """Nothing else in flight: no other request can join, so start now, without queueing. A fast
        model runs inline and the caller finds the future already done; the request is then counted
        here and now (the light-load path: every object and callback it skips is latency at
        concurrency 1). Requests read later in the same loop iteration do not run alone: they queue
        and run together once the iteration is over (``_ran_this_turn``). Under load the loop reads
        many requests per iteration, and that is where they merge: `tiny` over JSON at concurrency 64
        ran batches of 1.00 row at 3,466 requests/s when each ran alone, 21.8 rows at 4,873/s when
        they merged."""
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
        done.add_done_callback(partial(self._finish, [_Job(work, future, trace)], rows, now))
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
        """Answer a request whose batch of one ran inline (``done``: its result or its error) and count
        it: what ``_complete`` and ``_answered`` do for a batch, in fewer steps (one record, no job, no
        callback), because at concurrency 1 each step is latency. The queue and the runner are as they
        were before the request, and so is ``_idle``."""
        self._running -= 1
        self._running_rows -= rows
        self._last_done = None  # inline: not a drain (``_drained``)
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
        if isinstance(outputs, BaseException):
            future.set_exception(self._as_error(outputs))
            succeeded = False
        else:
            future.set_result(outputs)
            succeeded = True
        answered = time.monotonic()
        self.recorder.ran_alone(rows, times, succeeded, answered - started)
        if succeeded and due is not None and self._margin is not None:
            self._margin.answered(answered > due)
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
            job: _Job = item.payload  # type: ignore[assignment]
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
        spare = max(0, self.runner.concurrency - self._running - 1)
        return Measured(cost.per_row_s, cost.per_batch_s, self._gap_s, spare)

    def _admit(self, rows: int, priority: int, now: float, deadline: float | None, due: float | None) -> None:
        """Refuse at once a request predicted to finish after its deadline (504: the client's timeout) or
        its due time (429: the SLO), rather than queue it to fail later. The prediction: the queued rows
        ahead of it (same or higher priority) and the batches now running, at the measured cost, shared
        by the runner's concurrent slots, then its own batch. Against the SLO the event loop's lag
        counts too: the request waited about that long before it was read (``lag.py``), and so does
        the margin that keeps the share of requests missing the SLO to the one allowed
        (``margin.py``); with nothing queued, a request that would miss its SLO even without those is
        admitted (it cannot do better)."""
        cost = self.runner.cost  # read directly, not through ``measured()``: this runs on every request
        if not cost.observed:
            return
        requests_ahead, rows_ahead = self._ahead(priority)
        backlog_s = self._backlog_s(cost, requests_ahead, rows_ahead)
        own_s = cost.batch_s(rows)
        finish = now + backlog_s + own_s
        if deadline is not None and finish > deadline:
            self.recorder.refused("deadline")
            raise RequestTimeout(
                f"request to model {self.name} would finish in {(finish - now) * 1000:.1f} ms (queue "
                f"ahead {backlog_s * 1000:.1f} ms), after its timeout of {(deadline - now) * 1000:.1f} ms; "
                "it was refused at once and not run"
            )
        if due is None:
            return
        lag_s = self._lag.lag_s if self._lag is not None else 0.0
        steered_s, cut_s = self._margins()
        if requests_ahead != len(self._pending):
            # a higher priority than some of the queue: it goes ahead of them and does not join a queue
            # that stands, so that queue's part of the SLO is not held back from it
            cut_s = 0.0
        margins = (steered_s, cut_s)
        queued_behind = bool(self._pending or self._running)
        if finish + lag_s + margins[0] + margins[1] > due and (queued_behind or now + own_s <= due):
            arrived = (self.limits.slo_s or 0.0) - (due - now)  # how long ago it began to arrive
            raise self._over_slo(
                "this request", "receiving it", arrived, backlog_s, own_s, lag_s, margins, ""
            )

    def _margin_text(self, steered_s: float, cut_s: float) -> str:
        """What admission added to a refused request's prediction (``_margins``, each 0 where it did not
        count), for its refusal."""
        if not (steered_s or cut_s):
            return ""
        parts = []
        if steered_s:
            missing = f"{(1 - self.limits.slo_quantile) * 100:g} %"
            parts.append(
                f"a margin of {steered_s * 1000:.1f} ms (what keeps the requests missing it to {missing})"
            )
        if cut_s:
            parts.append(f"{cut_s * 1000:.1f} ms held back while its queue stands (it is kept shorter)")
        return ", plus " + " and ".join(parts)

    def _ahead(self, priority: int) -> tuple[int, int]:
        """The requests and rows queued ahead of a new request of ``priority``: at its level or a
        higher one."""
        requests_ahead = rows_ahead = 0
        for level, (count, rows_queued) in self._queued.items():
            if level <= priority:
                requests_ahead += count
                rows_ahead += rows_queued
        return requests_ahead, rows_ahead

    def _backlog_s(self, cost: CostModel, requests_ahead: int, rows_ahead: int) -> float:
        """How long until a request would start with ``requests_ahead`` (of ``rows_ahead`` rows) queued
        ahead of it (``_ahead``) and the batches now running, at the measured cost, shared by the
        runner's concurrent slots. Queued requests count as the batches they will run in: full ones
        where they merge, one each where the adaptive policy runs them alone (merging does not pay):
        each pays the per-call cost. While the queue is draining, it counts at least at the rate it
        drains (``_drained``)."""
        most = self.policy.max_batch_size
        per_row_s, per_batch_s = cost.per_row_s, cost.per_batch_s
        batches = -(-rows_ahead // most) if self._merges(cost) else requests_ahead
        backlog_s = per_row_s * (rows_ahead + self._running_rows) + per_batch_s * (batches + self._running)
        backlog_s /= max(1, self.runner.concurrency)
        drain = self._drain_s_per_row
        if drain is not None and self._last_done is not None:  # draining now: as fast as measured
            backlog_s = max(backlog_s, drain * (rows_ahead + self._running_rows))
        return backlog_s

    def refuses_turn(self, refusal: ServerBusy) -> bool:
        """Whether ``refusal`` is the one this loop iteration's requests are refused with before decoding
        (``refuse_unread``: once one was refused for its wait, the rest of the iteration's waited
        longer still). A refusal for the queue ahead is not: the next request is judged afresh."""
        memo, lag = self._refused_turn, self._lag
        return memo is not None and memo[1] is refusal and lag is not None and memo[0] == lag.turns

    def refuse_again(self, refusal: ServerBusy) -> bool:
        """``refuses_turn``, counting one more request refused with it. Lets the service refuse such a
        request without judging it again (``InferenceService.refused_again``)."""
        if not self.refuses_turn(refusal):
            return False
        self.recorder.refused("slo")
        return True

    def refuse_unread(self, queue_known: bool = True) -> ServerBusy | None:
        """The refusal (counted) of a request before its body is decoded, when it would miss the SLO
        even at its most favourable (one row, the highest priority), by either of two measures: how
        long it waited before it was read (``lag.py``: the event loop's lag and this iteration's turn
        so far) with the turns still ahead of it, or the queue as ``_admit`` judges it after decoding.
        ``queue_known`` False: the request may go to another model's queue (a route, a fallback), so
        only the wait is judged here.

        Decoding is what the refusal skips, and under overload it is most of what a refusal costs: a
        model whose queue is full of JSON images spent the loop's time decoding requests only to refuse
        them, and the refusals waited behind those decodes. The queue check counts what ``_admit``
        counts: the batches running and the queue ahead, the loop's lag, the margin, and the time the
        request will take to arrive and be decoded, which is not known yet: a high estimate of the
        model's recent ones stands for it (``_follow_high``). What it refuses, ``_admit`` would refuse
        after decoding, unless this request arrives and decodes faster than most recent ones did. With
        the queue alone (no lag, no reading time) `cnn` (1.6 MB JSON images) at twice what it sustains
        (255/s, SLO 370 ms) had 43-51 % of its refusals made after decoding, answered 105-114 requests/s
        and refused at p99 27-50 ms; counting them with the mean reading time, 1 % were refused after
        decoding, 130-136/s were answered and refusals took 15-17 ms at p99 (three rounds alternating on
        fresh servers). That 1 %, refused after 15-35 ms each, set the refusals' p99. With the high
        estimate 0-1 of about 1,100 refusals came after decoding, against 3-8 with the mean, and
        refusals took 7.2-8.3 ms at p99 against 9.7-12.9 ms, for 140.4-141.3 answered/s against
        143.1-145.0 (10 s steps, three rounds alternating).

        The wait counts with what is still ahead of the request in the loop (``TURNS_TO_ANSWER`` turns
        as long as recent ones), when there is a wait: the first request an iteration reads while the
        loop is on time has nothing ahead of it (at concurrency 1 each turn is the request's own
        processing). Once a request of this iteration was refused for it, the rest of the iteration's
        are refused with the same error (they waited longer still), for the cost of counting them: under
        overload refusals are most of the loop's work (the service does not even ask about a request
        it can tell is one of them: ``refuse_again``). The admission margin (``margin.py``) counts here
        too, for a request that waited: at twice what it sustains (42,000/s, SLO 3.8 ms) `tiny` answered
        0.2-0.7 % of its requests at p99 4.4-874 ms without it, 6.9-10.7 % at p99 3.0-3.6 ms with it
        (three rounds alternating on fresh servers).

        The turns ahead count only in the wait's check: ``_admit`` does not count them, and this check
        refuses only what ``_admit`` would. The lag in the queue check had been tried before, on older
        code (no margin, no turns) and a slower VM: `tiny` offered its sustainable rate (4,400/s, 10
        fresh servers each) then answered a median of 2,400 instead of 4,000 requests/s. On this code
        it made no such difference: `tiny` (SLO 3.8 ms) answered 99.2-99.4 % at 13,345/s and 84.6-91.9 %
        at 18,900/s (about what it sustains) with it, 75.6-99.6 % and 86.4-89.3 % without it (three
        rounds alternating on fresh servers)."""
        slo_s, lag = self.limits.slo_s, self._lag
        if slo_s is None:
            return None
        if lag is not None:
            memo = self._refused_turn
            if memo is not None and memo[0] == lag.turns:
                self.recorder.refused("slo")
                return memo[1]
            waited_s = lag.waited_s(time.monotonic())
            # turns ahead only while the loop is behind: a lone request's turn is its own processing
            turns_s = TURNS_TO_ANSWER * lag.turn_s if waited_s else 0.0
        else:
            waited_s = turns_s = 0.0
        queued_behind = queue_known and bool(self._pending or self._running or self._arriving)
        if not (waited_s or turns_s or queued_behind):
            return None
        cost = self.runner.cost
        if not cost.observed:
            return None
        own_s = cost.batch_s(1)
        # its priority unknown, as one that would join a queue that stands (``_margins``; docs/batching.md,
        # "Priority levels under overload": judged as one that goes ahead of it, the requests let in to
        # be decoded and refused after it took the decoder from those of every level)
        margins = self._margins()
        behind = margins if waited_s else (0.0, 0.0)  # like the turns: only for a request that waited
        if waited_s + turns_s + own_s + behind[0] + behind[1] > slo_s >= own_s:
            self.recorder.refused("slo")
            refusal = ServerBusy.retry_in(
                f"model {self.name} is over its latency objective: the server is {waited_s * 1000:.1f} "
                f"ms behind and {TURNS_TO_ANSWER} loop iterations of {turns_s / TURNS_TO_ANSWER * 1000:.1f} "
                f"ms from an answer{self._margin_text(*behind)}, against an SLO of "
                f"{slo_s * 1000:.0f} ms; it was refused before its body was read",
                waited_s + turns_s,
            )
            if lag is not None:
                self._refused_turn = (lag.turns, refusal)
            return refusal
        if not queued_behind:
            return None
        # one row of the highest priority, behind the requests still being decoded
        requests_ahead, rows_ahead = self._ahead(HIGHEST_PRIORITY)
        arriving = self._arriving
        backlog_s = self._backlog_s(cost, requests_ahead + arriving, rows_ahead + arriving)
        lag_s = lag.lag_s if lag is not None else 0.0
        reading_s = self._reading_s or 0.0
        if lag_s + reading_s + backlog_s + own_s + margins[0] + margins[1] > slo_s:
            return self._over_slo(
                "a request",
                "receiving and decoding one",
                reading_s,
                backlog_s,
                own_s,
                lag_s,
                margins,
                "; it was refused before its body was read",
            )
        return None

    def _over_slo(
        self,
        who: str,
        reading: str,
        reading_s: float,
        backlog_s: float,
        own_s: float,
        lag_s: float,
        margins: tuple[float, float],
        done: str,
    ) -> ServerBusy:
        """The refusal (counted) of a request predicted to finish after its SLO, before decoding
        (``refuse_unread``) or after (``_admit``): what the prediction added up (``margins``: what
        ``_margins`` added to it)."""
        self.recorder.refused("slo")
        slo_s = self.limits.slo_s or 0.0
        return ServerBusy.retry_in(
            f"model {self.name} is over its latency objective: {who} would finish in "
            f"{(reading_s + backlog_s + own_s + lag_s) * 1000:.1f} ms ({reading} {reading_s * 1000:.1f} ms, "
            f"queue ahead {backlog_s * 1000:.1f} ms, server busy {lag_s * 1000:.1f} ms)"
            f"{self._margin_text(*margins)} against an SLO of {slo_s * 1000:.0f} ms{done}",
            backlog_s + lag_s,
        )

    def _goes_alone(self, rows: int, due: float | None, now: float) -> bool:
        """Whether a request with nothing else in flight runs at once. An adaptive policy is asked (it
        waits only when another request is due sooner than a batch of one would take); deferring the
        decision by one loop iteration costs a light-load request tens of microseconds. While the loop
        lags, it is deferred: the requests read in the same iteration then form one batch."""
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
        """Count a request answered (or failed, or cancelled); ``item``: its place in the queue, None
        for one that never queued (``_run_alone``). One answered with an SLO (``due``) steers the
        admission margin: it made its SLO or missed it (``margin.py``)."""
        self._outstanding -= 1
        cancelled = future.cancelled()
        now = time.monotonic()
        ok = not cancelled and future.exception() is None
        self.recorder.answered(ok, now - enqueued_at)
        if ok and due is not None and self._margin is not None:
            self._margin.answered(now > due)
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
        while self._pending:
            if self._running >= capacity:
                expired = split_expired(self._pending, now)[1]
                self._remove(expired)
                self._expire(expired, now)
                wake_at = next_deadline(self._pending)
                break
            decision = next_batch(self._pending, self.policy, now, measured)
            self._expire(decision.expired, now)
            if self._running >= runner.concurrency and any(item.stream for item in decision.batch):
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
        """Call the ``on_done`` of the requests answered in this scheduling pass, now that the queue,
        the runner's slots and the timer are settled: one may submit again (a pipelined request). If
        one raises, the rest are answered by their futures' callbacks, an iteration later."""
        done_now, self._done_now = self._done_now, []
        for on_done in done_now:
            on_done()

    def _remove(self, items: list[Pending]) -> None:
        if items:
            gone = {id(item) for item in items}
            self._pending = [item for item in self._pending if id(item) not in gone]
            for item in items:
                self._count_queued(item, -1)

    def _count_queued(self, item: Pending, sign: int) -> None:
        counts = self._queued.get(item.priority)
        if counts is None:
            counts = self._queued[item.priority] = [0, 0]
        counts[0] += sign
        counts[1] += sign * item.rows
        if not counts[0]:
            del self._queued[item.priority]

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

    def _start(self, batch: list[Pending], now: float) -> None:
        rows = sum(item.rows for item in batch) if len(batch) > 1 else batch[0].rows
        jobs: list[_Job] = []
        oldest_due = None
        for item in batch:
            job: _Job = item.payload  # type: ignore[assignment]
            jobs.append(job)
            waited = now - item.enqueued_at
            self.recorder.started(waited)
            if job.trace is not None:
                job.trace.queue_s, job.trace.batch_rows = waited, rows
            if item.due is not None and (oldest_due is None or item.due < oldest_due):
                oldest_due = item.due
        standing = self._standing
        if standing is not None and oldest_due is not None:
            age_s, left = standing.slo_s - (oldest_due - now), bool(self._pending)
            standing.started(now, age_s, left, self._full_batch_s() if left else 0.0)  # (only read if left)
        self._run(jobs, rows, now)

    def _full_batch_s(self) -> float:
        """What a full batch takes at the measured cost: of ``max_batch_size`` rows where queued requests
        merge, of one row where each runs alone."""
        cost = self.runner.cost
        return cost.batch_s(self.policy.max_batch_size if self._merges(cost) else 1)

    def _merges(self, cost: CostModel) -> bool:
        """Whether queued requests run merged into full batches: a fixed policy merges them, an adaptive
        one where merging pays (else it runs them one at a time)."""
        most = self.policy.max_batch_size
        return most > 1 and (not self.policy.adaptive or merging_pays(cost.per_row_s, cost.per_batch_s))

    def _run(self, jobs: list[_Job], rows: int, now: float) -> None:
        """Hand the batch to the runner; it is answered now if it ran inline, else when it finishes."""
        done = self._hand_over([jobs[0].work] if len(jobs) == 1 else [job.work for job in jobs], rows)
        if isinstance(done, asyncio.Future):
            done.add_done_callback(partial(self._finish, jobs, rows, now))
        else:  # ran inline: answer now; the caller's scheduling loop goes on
            self._complete(jobs, rows, now, done, inline=True)

    def _hand_over(
        self, works: list[Work], rows: int
    ) -> asyncio.Future[BatchResult] | BatchResult | BaseException:
        """Count a batch as running and give it to the runner: a future of its results, or, if the
        runner ran it inline, its results or its error."""
        self._running += 1
        self._running_rows += rows
        try:
            return self.runner.run(works)
        except Exception as error:  # it ran inline and failed
            return error

    def _finish(self, jobs: list[_Job], rows: int, started: float, done: asyncio.Future[BatchResult]) -> None:
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
        jobs: list[_Job],
        rows: int,
        started: float,
        done: BatchResult | BaseException,
        inline: bool = False,
    ) -> None:
        """A batch handed to the runner at ``started`` finished: ``done`` is its result or its error."""
        self._running -= 1
        self._running_rows -= rows
        self._drained(rows, inline)
        if self._spans is not None:
            traces = [job.trace for job in jobs]
            if isinstance(done, BaseException):
                self._spans.batch_done(started, traces, rows, None, done)
            else:
                self._spans.batch_done(started, traces, rows, done.times, None)
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
            if isinstance(outputs, BaseException):  # a per-request error from a Python model
                job.future.set_exception(self._as_error(outputs))
            else:
                job.future.set_result(outputs)
            if job.on_done is not None:
                self._done_now.append(job.on_done)

    def _drained(self, rows: int, inline: bool) -> None:
        """Measure how fast the queue drains: the time between two batches finishing, per row of the
        later one, when work was waiting as the earlier one finished (so the runner was never idle for
        want of work in between). Unlike the cost model, it holds all the runner waited for besides the
        model: the event loop busy decoding before it could start the next batch, the GIL, a CPU shared
        with the load. At twice its sustainable rate, `cnn` over JSON drained 8.8-10 ms per image
        while its cost model said 7.4 ms (its time in the model).

        Batches run inline are not measured: there the time between them is the event loop's own
        work, which ``lag.py`` measures already (counted twice, `tiny` open-loop at 14,000-18,000
        requests/s, 64-82 % of what it sustains, refused 1.1-3.8 times as many requests)."""
        if inline:
            self._last_done = None
            return
        now = time.monotonic()
        if self._last_done is not None and rows:
            sample = (now - self._last_done) / rows
            drain = self._drain_s_per_row
            self._drain_s_per_row = (
                sample if drain is None else drain * DRAIN_MEMORY + sample * (1 - DRAIN_MEMORY)
            )
        self._last_done = now if (self._pending or self._running) else None

    def _fail(self, jobs: list[_Job], error: BaseException) -> None:
        error = self._as_error(error)
        for job in jobs:
            if not job.future.done():
                job.future.set_exception(error)
                if job.on_done is not None:
                    self._done_now.append(job.on_done)

    def _as_error(self, error: BaseException) -> EdgeInferError:
        if isinstance(error, EdgeInferError):
            return error
        return InferenceFailed(f"model {self.name} failed: {type(error).__name__}: {error}")

    def _update_idle(self) -> None:
        if not self._pending and self._running == 0:
            self._idle.set()
            self._last_done = None  # the work that waited is gone (cancelled, expired): no longer draining


def _follow_high(estimate: float | None, value: float) -> float:
    """A running estimate that moves ``READING_RISE`` of the way to a longer value and ``READING_FALL``
    to a shorter one: it settles where longer values pull up as hard as shorter ones pull down, near
    the top of recent values (the 0.95 expectile: 0.2 / (0.2 + 0.01)), and is scale-free (what is
    measured sets it, milliseconds or microseconds alike). The first value starts it."""
    if estimate is None:
        return value
    weight = READING_RISE if value > estimate else READING_FALL
    return estimate + (value - estimate) * weight


def _follow(mean: float | None, value: float) -> float:
    """A running mean over about the last ten values (``ARRIVAL_MEMORY``); the first value alone."""
    return value if mean is None else mean * ARRIVAL_MEMORY + value * (1 - ARRIVAL_MEMORY)


def _deadline(now: float, timeout_s: float | None, queue_timeout_s: float | None) -> float | None:
    """The earlier of the request's timeout and the model's queue timeout, from ``now`` (None: neither)."""
    if timeout_s is None:
        return None if queue_timeout_s is None else now + queue_timeout_s
    return now + (timeout_s if queue_timeout_s is None else min(timeout_s, queue_timeout_s))
