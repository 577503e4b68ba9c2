"""``Admission``: whether a request may queue on one model version, refused at once (with when to retry)
rather than queued to fail later.

Two judgements, each given the time: ``before_reading``, of a request whose body is not decoded yet
(its most favourable case: one row, the highest priority), and ``judge``, of a decoded one. Both
predict when the request would finish: the queue ahead of it and the batches running, at the measured
cost shared by the runner's slots (at least at the rate the queue drains), then its own batch; against
the SLO also the loop's lag (``lag.py``), the margin steered by the misses (``margin.py``) and the part
of the SLO held back while the queue stands (``standing.py``). Why each term, with its measurements:
docs/design/admission.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from edgeinfer.admission.estimates import DrainRate, follow_high
from edgeinfer.admission.lag import LoopLag
from edgeinfer.admission.margin import SloMargin
from edgeinfer.admission.standing import StandingQueue
from edgeinfer.admission.view import QueueView
from edgeinfer.batching.policy import HIGHEST_PRIORITY, BatchPolicy, merging_pays
from edgeinfer.errors import RequestTimeout, ServerBusy
from edgeinfer.runners.cost import CostModel

# A request read in a loop iteration is answered in the next one (its batch runs first thing there and
# the transport writes the answer in the same pass), so under load a request read now has the rest of
# this iteration and the next ahead of it: two turns as long as recent ones.
TURNS_TO_ANSWER = 2


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """How much may wait: requests (not rows) before 429, and how long before 504. ``slo_s``: the time
    a request may take (the model's latency objective): one predicted to take longer is refused (429);
    ``slo_quantile``: the share of requests the objective is for (0.99 for a p99 one)."""

    max_queue_size: int = 512
    queue_timeout_s: float | None = None
    slo_s: float | None = None
    slo_quantile: float = 0.99

    def deadline(self, now: float, timeout_s: float | None) -> float | None:
        """The earlier of the request's timeout and the queue timeout, from ``now`` (None: neither)."""
        queue_timeout_s = self.queue_timeout_s
        if timeout_s is None:
            return None if queue_timeout_s is None else now + queue_timeout_s
        return now + (timeout_s if queue_timeout_s is None else min(timeout_s, queue_timeout_s))


class Measures(Protocol):
    """What admission reads of the runner: its learned cost and how many batches compute at once."""

    @property
    def cost(self) -> CostModel: ...

    @property
    def concurrency(self) -> int: ...


class Admission:
    """The admission of one model version named ``name``, reading its batcher's ``view``; ``lag``: the
    event loop's (None: not counted)."""

    def __init__(
        self,
        name: str,
        limits: QueueLimits,
        policy: BatchPolicy,
        runner: Measures,
        view: QueueView,
        lag: LoopLag | None = None,
    ) -> None:
        self.name = name
        self.limits = limits
        self.policy = policy
        self.runner = runner
        self.view = view
        self.lag = lag
        slo_s = limits.slo_s
        self.margin = SloMargin(slo_s, limits.slo_quantile) if slo_s is not None else None
        self.standing = StandingQueue(slo_s) if slo_s is not None else None
        self.drain = DrainRate()
        self.reading_s: float | None = None  # arriving and decoding: near the top of recent ones
        self._idle_seen = 0  # the loop's idle ticks the margin has been calmed for
        self._refused_turn: tuple[int, ServerBusy] | None = None  # (turn, the refusal of its requests)

    # ---- what the batcher tells it ----

    def due(self, now: float, received_at: float | None) -> float | None:
        """When a request submitted ``now`` must be answered for the SLO (None: no SLO), counted from
        when the transport began receiving it; that reading time feeds the estimate ``before_reading``
        uses."""
        slo_s = self.limits.slo_s
        if slo_s is None:
            return None
        if received_at is not None and received_at < now:
            self.reading_s = follow_high(self.reading_s, now - received_at)
            return received_at + slo_s
        return now + slo_s

    def answered(self, missed: bool) -> None:
        """A request with an SLO was answered, after its due time or not: the margin follows."""
        if self.margin is not None:
            self.margin.answered(missed)

    def batch_started(self, now: float, oldest_due: float, queue_left: bool) -> None:
        """A batch whose oldest request is due at ``oldest_due`` started; ``queue_left``: requests still
        queue behind it (the standing-queue rule)."""
        standing = self.standing
        if standing is not None:
            age_s = standing.slo_s - (oldest_due - now)
            standing.started(now, age_s, queue_left, self._full_batch_s() if queue_left else 0.0)

    # ---- the judgements ----

    def queue_full(self) -> ServerBusy:
        """The refusal of a request finding ``max_queue_size`` requests queued: retry once the queue
        ahead has run at the measured cost (1 s before any is measured)."""
        cost = self.runner.cost
        retry_s = self.backlog_s(cost, *self.view.ahead(HIGHEST_PRIORITY)) if cost.observed else 1.0
        return ServerBusy.retry_in(
            f"model {self.name} has {self.view.pending} requests queued, its limit (max_queue_size)", retry_s
        )

    def judge(
        self, rows: int, priority: int, now: float, deadline: float | None, due: float | None
    ) -> RequestTimeout | ServerBusy | None:
        """The refusal of a decoded request predicted to finish after its ``deadline`` (504: the
        client's timeout) or its ``due`` time (429: the SLO), or None. With nothing queued, a request
        that would miss its SLO even without the lag and margins is let in (it cannot do better)."""
        cost = self.runner.cost
        if not cost.observed:
            return None
        view = self.view
        requests_ahead, rows_ahead = view.ahead(priority)
        backlog_s = self.backlog_s(cost, requests_ahead, rows_ahead)
        own_s = cost.batch_s(rows)
        finish = now + backlog_s + own_s
        if deadline is not None and finish > deadline:
            return RequestTimeout(
                f"request to model {self.name} would finish in {(finish - now) * 1000:.1f} ms (queue "
                f"ahead {backlog_s * 1000:.1f} ms), after its timeout of {(deadline - now) * 1000:.1f} ms; "
                "it was refused at once and not run"
            )
        if due is None:
            return None
        lag_s = self.lag.lag_s if self.lag is not None else 0.0
        steered_s, cut_s = self.margins()
        if requests_ahead != view.pending:
            # a higher priority than some of the queue: it goes ahead of them and does not join a queue
            # that stands, so that queue's part of the SLO is not held back from it
            cut_s = 0.0
        if finish + lag_s + steered_s + cut_s > due and (view.busy or now + own_s <= due):
            arrived = (self.limits.slo_s or 0.0) - (due - now)  # how long ago it began to arrive
            return self._over_slo(
                "this request", "receiving it", arrived, backlog_s, own_s, lag_s, (steered_s, cut_s), ""
            )
        return None

    def before_reading(self, now: float, queue_known: bool = True) -> ServerBusy | None:
        """The refusal of a request before its body is decoded, when it would miss the SLO even at its
        most favourable (one row, the highest priority), or None. Two measures: how long it waited
        before it was read (the loop's lag and this iteration's turn so far) with the turns still ahead
        of it; or the queue as ``judge`` counts it, with the time it will take to arrive and decode
        estimated near the top of recent ones. ``queue_known`` False: the request may go to another
        model's queue (a route, a fallback), so only the wait is judged. Once a request of this loop
        iteration was refused for its wait, the rest of the iteration's get the same refusal (they
        waited longer still)."""
        slo_s, lag = self.limits.slo_s, self.lag
        if slo_s is None:
            return None
        if lag is not None:
            memo = self._refused_turn
            if memo is not None and memo[0] == lag.turns:
                return memo[1]
            waited_s = lag.waited_s(now)
            # turns ahead only while the loop is behind: a lone request's turn is its own processing
            turns_s = TURNS_TO_ANSWER * lag.turn_s if waited_s else 0.0
        else:
            waited_s = turns_s = 0.0
        view = self.view
        queued_behind = queue_known and bool(view.pending or view.running or view.arriving)
        if not (waited_s or turns_s or queued_behind):
            return None
        cost = self.runner.cost
        if not cost.observed:
            return None
        own_s = cost.batch_s(1)
        # its priority unknown: judged as one that would join a queue that stands
        margins = self.margins()
        behind = margins if waited_s else (0.0, 0.0)  # like the turns: only for a request that waited
        if waited_s + turns_s + own_s + behind[0] + behind[1] > slo_s >= own_s:
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
        requests_ahead, rows_ahead = view.ahead(HIGHEST_PRIORITY)
        arriving = view.arriving
        backlog_s = self.backlog_s(cost, requests_ahead + arriving, rows_ahead + arriving)
        lag_s = lag.lag_s if lag is not None else 0.0
        reading_s = self.reading_s or 0.0
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

    def refuses_turn(self, refusal: ServerBusy) -> bool:
        """Whether ``refusal`` is the one this loop iteration's requests are refused with before decoding
        (a refusal for the queue ahead is not: the next request is judged afresh)."""
        memo, lag = self._refused_turn, self.lag
        return memo is not None and memo[1] is refusal and lag is not None and memo[0] == lag.turns

    # ---- the prediction's parts ----

    def margins(self) -> tuple[float, float]:
        """What is added to predictions now: the margin steered by the misses, first calmed for the
        loop's idle ticks since it was last read if the model has nothing queued or running, and the
        part of the SLO held back while the queue stands, which counts only for a request that would
        join that queue."""
        margin, lag, standing = self.margin, self.lag, self.standing
        if margin is None or standing is None:
            return 0.0, 0.0
        if lag is not None and lag.idle_ticks != self._idle_seen:
            if not self.view.busy:
                margin.calm(lag.idle_ticks - self._idle_seen)
            self._idle_seen = lag.idle_ticks
        return margin.margin_s, standing.cut_s

    def backlog_s(self, cost: CostModel, requests_ahead: int, rows_ahead: int) -> float:
        """How long until a request would start with ``requests_ahead`` (of ``rows_ahead`` rows) queued
        ahead of it and the batches now running, at the measured cost, shared by the runner's
        concurrent slots. Queued requests count as the batches they will run in: full ones where they
        merge, one each where the adaptive policy runs them alone. While the queue drains, at least at
        the rate it drains."""
        view = self.view
        most = self.policy.max_batch_size
        per_row_s, per_batch_s = cost.per_row_s, cost.per_batch_s
        batches = -(-rows_ahead // most) if self._merges(cost) else requests_ahead
        backlog_s = per_row_s * (rows_ahead + view.running_rows) + per_batch_s * (batches + view.running)
        backlog_s /= max(1, self.runner.concurrency)
        drain = self.drain
        if drain.s_per_row is not None and drain.draining:
            backlog_s = max(backlog_s, drain.s_per_row * (rows_ahead + view.running_rows))
        return backlog_s

    def _full_batch_s(self) -> float:
        """A full batch at the measured cost: ``max_batch_size`` rows where queued requests merge, one
        row where each runs alone."""
        cost = self.runner.cost
        return cost.batch_s(self.policy.max_batch_size if self._merges(cost) else 1)

    def _merges(self, cost: CostModel) -> bool:
        """Whether queued requests run merged into full batches: a fixed policy merges them, an adaptive
        one where merging pays."""
        most = self.policy.max_batch_size
        return most > 1 and (not self.policy.adaptive or merging_pays(cost.per_row_s, cost.per_batch_s))

    def _margin_text(self, steered_s: float, cut_s: float) -> str:
        """What the margins added to a refused request's prediction, for its refusal."""
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
        """The refusal of a request predicted to finish after its SLO: what the prediction added up."""
        slo_s = self.limits.slo_s or 0.0
        return ServerBusy.retry_in(
            f"model {self.name} is over its latency objective: {who} would finish in "
            f"{(reading_s + backlog_s + own_s + lag_s) * 1000:.1f} ms ({reading} {reading_s * 1000:.1f} ms, "
            f"queue ahead {backlog_s * 1000:.1f} ms, server busy {lag_s * 1000:.1f} ms)"
            f"{self._margin_text(*margins)} against an SLO of {slo_s * 1000:.0f} ms{done}",
            backlog_s + lag_s,
        )
