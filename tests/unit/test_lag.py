"""The event loop's lag as a pure function of the ticks' lateness: up at once, down gradually, then 0."""

from __future__ import annotations

import pytest

from edgeinfer.batching.lag import GONE_S, TIMER_SLACK_S, next_lag


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
