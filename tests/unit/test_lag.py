"""The event loop's lag as a pure function of the ticks' lateness: up at once, down gradually, then 0."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from edgeinfer.admission.lag import GONE_S, TIMER_SLACK_S, next_lag


@pytest.mark.parametrize(
    ("lag_s", "late_s", "expected"),
    [
        (0.0, 0.0, 0.0),  # on time
        (0.0, TIMER_SLACK_S, 0.0),  # within the timer's resolution: no lag
        (0.0, 0.021, 0.020),  # late: the lag rises at once, less the timer's slack
        (0.010, 0.031, 0.030),  # later still: rises to it
        (0.010, 0.0, 0.008),  # on time: a fifth of it goes
        (0.010, 0.006, 0.009),  # late, but less than the lag: it falls towards the lateness
        (GONE_S * 1.2, 0.0, 0.0),  # fallen below GONE_S: over, exactly 0
    ],
)
def test_next_lag(lag_s: float, late_s: float, expected: float) -> None:
    assert next_lag(lag_s, late_s) == pytest.approx(expected, abs=1e-12)


def test_one_late_tick_is_forgotten_after_a_bounded_number_of_on_time_ticks():
    """The hot path reads 'is there a lag at all': after one 50 ms stall the answer is 'no' again
    within 30 ticks (150 ms at 5 ms a tick), not after the thousands a geometric fall alone takes."""
    lag = next_lag(0.0, 0.051)
    ticks = 0
    while lag:
        lag = next_lag(lag, 0.0)
        ticks += 1
    assert 10 < ticks <= 30


def test_the_wait_of_a_request_is_the_lag_plus_its_iteration_so_far():
    """The first request an iteration reads starts its turn (it waited the lag); one read 2 ms later
    in the same iteration waited 2 ms more; the next iteration starts a new turn."""
    import asyncio

    from edgeinfer.admission.lag import LoopLag

    async def main() -> list[float | int]:
        lag = LoopLag()
        lag.lag_s = 0.001
        first = lag.waited_s(100.0)
        later = lag.waited_s(100.002)
        turns = lag.turns
        await asyncio.sleep(0)
        return [first, later, turns, lag.waited_s(100.010), lag.turns]

    first, later, turns, next_first, next_turns = asyncio.run(main())
    assert (first, later) == (pytest.approx(0.001), pytest.approx(0.003))
    assert next_first == pytest.approx(0.001)  # a new turn: only the lag
    assert next_turns == turns + 1


def _busy(seconds: float) -> None:
    """Work for ``seconds`` of this thread's CPU time."""
    import time

    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


def _turns_after(work: Callable[[], None]) -> list[float]:
    """``turn_s`` after a turn in which ``work`` ran, then after a short turn."""
    import asyncio
    import time

    from edgeinfer.admission.lag import LoopLag

    async def main() -> list[float]:
        lag = LoopLag()
        lag.waited_s(time.monotonic())  # this iteration's first request
        work()
        await asyncio.sleep(0)
        after_long = lag.turn_s
        lag.waited_s(time.monotonic())
        await asyncio.sleep(0)
        return [after_long, lag.turn_s]

    return asyncio.run(main())


def test_a_long_turn_is_remembered_at_once_and_forgotten_gradually():
    after_long, after_short = _turns_after(lambda: _busy(0.004))
    assert after_long >= 0.004
    assert 0.8 * after_long <= after_short < after_long  # FALL: a short turn takes a fifth of it away


def test_a_turn_is_the_loops_work_not_the_time_it_was_not_running():
    """A turn counts in the loop thread's CPU time: 20 ms in which the thread did not run (here it
    sleeps; under load the OS runs another thread on its core) do not make the next turns look long."""
    import time

    after_pause, _ = _turns_after(lambda: time.sleep(0.020))
    assert after_pause < 0.005


def test_on_time_ticks_bring_a_long_turn_down_without_turns():
    """After an overload few requests come, so few turns: an on-time tick of the timer (the loop is not
    behind) lowers what the long turns left, as it lowers the lag; a late one leaves it."""
    import asyncio
    import time

    from edgeinfer.admission.lag import FALL, LoopLag

    async def main() -> list[float]:
        lag = LoopLag()
        lag.start()
        lag.turn_s = 0.020
        lag._tick(time.monotonic() - 0.010)  # 10 ms late
        late = lag.turn_s
        lag._tick(time.monotonic())  # on time
        on_time = lag.turn_s
        lag.stop()
        return [late, on_time]

    late, on_time = asyncio.run(main())
    assert late == pytest.approx(0.020)
    assert on_time == pytest.approx(0.020 * FALL)


def test_a_tick_on_time_with_no_request_read_since_the_last_one_counts_as_idle():
    """Idle ticks are what calms the admission margin after an overload: a tick on time with no
    request read for a whole interval counts; one after a request was read (``waited_s``), or a late
    one, does not."""
    import asyncio
    import time

    from edgeinfer.admission.lag import INTERVAL_S, LoopLag

    async def main() -> list[int]:
        lag = LoopLag()
        lag.start()
        counts = []

        def tick(due: float) -> None:  # one tick by hand (each schedules the next: cancelled)
            lag._tick(due)
            lag.stop()
            counts.append(lag.idle_ticks)

        lag._last_use = time.monotonic() - 2 * INTERVAL_S  # nothing read for two intervals
        tick(time.monotonic())
        lag.waited_s(time.monotonic())  # a request read
        tick(time.monotonic())
        lag._last_use = time.monotonic() - 2 * INTERVAL_S
        tick(time.monotonic() - 0.020)  # 20 ms late: the loop was behind, not idle
        return counts

    assert asyncio.run(main()) == [1, 1, 1]
