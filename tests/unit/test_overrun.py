"""Admission's margin: the SLO's quantile of how late recent requests finished against their prediction."""

from __future__ import annotations

import pytest

from edgeinfer.batching.overrun import Overruns, quantile


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([5.0], 0.99, 5.0),
        ([3.0, 1.0, 2.0], 0.5, 2.0),  # the smallest value at least half do not exceed
        ([float(i) for i in range(1, 101)], 0.99, 99.0),  # 99 of 100 are at most 99
        ([float(i) for i in range(1, 101)], 0.95, 95.0),
        ([float(i) for i in range(1, 201)], 0.99, 198.0),
        ([-4.0, -2.0, -1.0], 0.99, -1.0),
    ],
)
def test_quantile(values: list[float], q: float, expected: float) -> None:
    assert quantile(values, q) == expected


@pytest.mark.parametrize(
    ("trace", "expected_margin_s"),
    [
        ([0.010] * 3, 0.0),  # fewer than ``every`` overruns: not recomputed yet
        ([0.010] * 4, 0.010),  # four late by 10 ms: the margin is 10 ms
        ([-0.005] * 8, 0.0),  # early: never a negative margin (never admits more than predicted)
        ([0.001] * 7 + [0.050], 0.050),  # the worst of 8 is their 99th percentile
        ([0.050] + [0.001] * 11, 0.001),  # ... until it leaves the window of the last 8
        ([0.050] * 4 + [0.001] * 6, 0.050),  # recomputed only every fourth: still the old margin
    ],
)
def test_the_margin_follows_the_recent_overruns(trace: list[float], expected_margin_s: float) -> None:
    overruns = Overruns(0.99, window=8, every=4)
    for overrun_s in trace:
        overruns.add(overrun_s)
    assert overruns.margin_s == pytest.approx(expected_margin_s)


def test_a_p95_objective_keeps_the_95th_percentile():
    overruns = Overruns(0.95, window=100, every=100)
    for i in range(100):
        overruns.add(i / 1000)  # 0 to 99 ms
    assert overruns.margin_s == pytest.approx(0.094)


@pytest.mark.parametrize("q", [0.0, 1.0, 1.5])
def test_the_quantile_must_be_a_share(q: float) -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        Overruns(q)
