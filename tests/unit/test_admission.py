"""Admission as table tests: a queue view, a learned cost and a lag set by hand, the time given to each
judgement, turns ended by the test (no event loop, no clock)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from edgeinfer.admission.admission import Admission, QueueLimits
from edgeinfer.admission.lag import LoopLag
from edgeinfer.admission.view import QueueView
from edgeinfer.batching.policy import HIGHEST_PRIORITY, BatchPolicy
from edgeinfer.errors import RequestTimeout, ServerBusy
from edgeinfer.runners.cost import CostModel

NOW = 100.0
MS = 0.001


@dataclass
class Runner:
    concurrency: int = 1
    cost: CostModel = field(default_factory=CostModel)


class Turns:
    """The event loop's ``call_soon`` as far as the lag uses it: the test ends each turn."""

    def __init__(self) -> None:
        self.waiting: list = []

    def __call__(self, callback) -> None:
        self.waiting.append(callback)

    def end(self) -> None:
        waiting, self.waiting = self.waiting, []
        for callback in waiting:
            callback()


def admission(
    per_row_ms: float = 10.0,
    slo_ms: float | None = 35.0,
    max_batch_size: int = 4,
    adaptive: bool = True,
    lag: LoopLag | None = None,
    queued: list[tuple[int, int]] = (),  # (priority, rows) of each queued request
    running_rows: int = 0,
    arriving: int = 0,
) -> Admission:
    runner = Runner()
    if per_row_ms:
        for rows in (1, 4):
            runner.cost.observe(rows, per_row_ms * MS * rows)  # per row only: merging does not pay
    view = QueueView()
    for priority, rows in queued:
        view.count(priority, rows, 1)
    if running_rows:
        view.running, view.running_rows = 1, running_rows
    view.arriving = arriving
    limits = QueueLimits(slo_s=slo_ms * MS if slo_ms is not None else None)
    return Admission(
        "m", limits, BatchPolicy(max_batch_size=max_batch_size, adaptive=adaptive), runner, view, lag
    )


@pytest.mark.parametrize(
    ("case", "setup", "rows", "priority", "timeout_ms", "refused"),
    [
        ("nothing measured yet: let in", {"per_row_ms": 0.0, "running_rows": 9}, 1, 1, 1.0, None),
        ("nothing ahead, a slow request: let in", {}, 4, 1, None, None),
        ("behind a running batch, within the SLO", {"running_rows": 1}, 1, 1, None, None),
        ("behind 3 rows: 40 ms against 35", {"running_rows": 1, "queued": [(1, 2)]}, 1, 1, None, ServerBusy),
        ("ahead of a lower priority", {"running_rows": 1, "queued": [(2, 2)]}, 1, 1, None, None),
        ("behind a higher priority", {"running_rows": 1, "queued": [(0, 2)]}, 1, 1, None, ServerBusy),
        ("a timeout the queue ahead misses", {"running_rows": 1}, 1, 1, 15.0, RequestTimeout),
        ("a timeout it makes", {"running_rows": 1}, 1, 1, 25.0, None),
        ("no SLO, no timeout", {"slo_ms": None, "running_rows": 9}, 1, 1, None, None),
    ],
)
def test_a_decoded_request_is_refused_when_predicted_to_finish_late(
    case, setup, rows, priority, timeout_ms, refused
):
    judged = admission(**setup)
    due = judged.due(NOW, None)
    deadline = NOW + timeout_ms * MS if timeout_ms is not None else None
    refusal = judged.judge(rows, priority, NOW, deadline, due)
    assert type(refusal) is refused if refused else refusal is None, case


def test_a_refusal_names_what_it_added_up_and_when_to_retry():
    judged = admission(running_rows=1, queued=[(1, 2)])
    refusal = judged.judge(1, 1, NOW, None, judged.due(NOW, None))
    assert isinstance(refusal, ServerBusy)
    assert str(refusal) == (
        "model m is over its latency objective: this request would finish in 40.0 ms (receiving it 0.0 ms, "
        "queue ahead 30.0 ms, server busy 0.0 ms) against an SLO of 35 ms; retry in 30 ms"
    )
    assert refusal.retry_after_s == pytest.approx(0.030)
    timeout = admission(running_rows=1).judge(1, 1, NOW, NOW + 0.015, None)
    assert str(timeout) == (
        "request to model m would finish in 20.0 ms (queue ahead 10.0 ms), after its timeout of 15.0 ms; "
        "it was refused at once and not run"
    )


def test_the_slo_counts_from_when_the_request_began_to_arrive_and_that_time_is_learned():
    judged = admission(running_rows=1)
    assert judged.due(NOW, NOW - 0.020) == pytest.approx(NOW + 0.015)
    assert judged.reading_s == pytest.approx(0.020)
    assert isinstance(judged.judge(1, 1, NOW, None, NOW + 0.015), ServerBusy), "20 ms ahead, 15 left"
    judged.due(NOW, NOW - 0.040)
    assert judged.reading_s == pytest.approx(0.020 + 0.2 * 0.020), "up fast"
    judged.due(NOW, NOW - 0.0)
    assert judged.reading_s == pytest.approx(0.024), "a request that arrived now teaches nothing"


@pytest.mark.parametrize(
    ("case", "setup", "queue_known", "refused"),
    [
        ("idle: never judged", {}, True, False),
        ("a short queue", {"running_rows": 1}, True, False),
        ("a queue no request could beat", {"running_rows": 1, "queued": [(HIGHEST_PRIORITY, 3)]}, True, True),
        ("a queue any request goes ahead of", {"running_rows": 1, "queued": [(5, 3)]}, True, False),
        ("requests still being decoded count as a row each", {"running_rows": 1, "arriving": 3}, True, True),
        ("its queue not known (a route may move it)", {"running_rows": 1, "arriving": 3}, False, False),
        ("no SLO", {"slo_ms": None, "running_rows": 9}, True, False),
    ],
)
def test_before_decoding_a_request_is_judged_at_its_most_favourable(case, setup, queue_known, refused):
    refusal = admission(**setup).before_reading(NOW, queue_known)
    assert isinstance(refusal, ServerBusy) if refused else refusal is None, case


def test_a_request_that_waited_unread_is_refused_and_its_iterations_requests_with_it():
    turns = Turns()
    lag = LoopLag(turns)
    lag.lag_s, lag.turn_s = 0.030, 0.004
    judged = admission(per_row_ms=2.0, lag=lag)
    first = judged.before_reading(NOW)  # 30 ms behind + 2 turns of 4 ms + 2 ms > 35 ms
    assert isinstance(first, ServerBusy)
    assert "the server is 30.0 ms behind and 2 loop iterations of 4.0 ms from an answer" in str(first)
    assert judged.refuses_turn(first)
    assert judged.before_reading(NOW + 0.001) is first, "read later in the same iteration: the same"
    turns.end()
    assert not judged.refuses_turn(first), "the next iteration is judged afresh"
    lag.lag_s = 0.0
    assert judged.before_reading(NOW + 0.002) is None


def test_the_queue_counts_at_least_at_the_rate_it_drains():
    judged = admission(per_row_ms=1.0, running_rows=1, queued=[(1, 4)])
    assert judged.backlog_s(judged.runner.cost, 1, 4) == pytest.approx(0.005)
    judged.drain.batch_done(NOW, 4, waiting=True)
    judged.drain.batch_done(NOW + 0.020, 4, waiting=True)  # 5 ms a row, where the model takes 1
    assert judged.drain.s_per_row == pytest.approx(0.005)
    assert judged.backlog_s(judged.runner.cost, 1, 4) == pytest.approx(0.025)
    judged.drain.idle()
    assert judged.backlog_s(judged.runner.cost, 1, 4) == pytest.approx(0.005), "not draining: the cost"


def test_a_full_queue_is_told_when_the_queue_ahead_will_have_run():
    refusal = admission(queued=[(1, 1)] * 3, running_rows=1).queue_full()
    assert str(refusal) == "model m has 3 requests queued, its limit (max_queue_size); retry in 40 ms"
    assert refusal.retry_after_s == pytest.approx(0.040)
    assert admission(per_row_ms=0.0, queued=[(1, 1)]).queue_full().retry_after_s == 1.0, "nothing measured"


def test_misses_raise_the_margin_and_idle_ticks_calm_it_while_the_model_has_nothing_to_do():
    lag = LoopLag(Turns())
    judged = admission(lag=lag)
    for _ in range(50):
        judged.answered(missed=True)
    raised = judged.margins()[0]
    assert raised > 0
    judged.view.running = 1
    lag.idle_ticks += 10
    assert judged.margins()[0] == raised, "busy: the idle ticks are not the model's"
    judged.view.running = 0
    lag.idle_ticks += 10
    assert 0 < judged.margins()[0] < raised
