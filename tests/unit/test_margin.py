"""Admission's margin, steered by the share of answered requests that missed their SLO."""

from __future__ import annotations

import pytest

from edgeinfer.admission.margin import CALM, GAIN, SloMargin

SLO_S = 0.100
UP = GAIN * SLO_S * 0.99  # a miss, for a p99 objective
DOWN = GAIN * SLO_S * 0.01  # a request in time


@pytest.mark.parametrize(
    ("trace", "expected_s"),
    [
        ("", 0.0),
        ("ok" * 50, 0.0),  # in time: never below 0
        ("M", UP),
        ("MMM", 3 * UP),
        ("M" + "o" * 99, UP - 99 * DOWN),  # 1 miss in 100: back to (almost) where it was
        ("M" + "o" * 200, 0.0),  # more in time than the miss allows: down to 0, not below
        ("M" * 200, SLO_S),  # never above the SLO (with it, nothing queued is admitted)
        ("M" * 200 + "o" * 100, SLO_S - 100 * DOWN),  # and down again from there
    ],
)
def test_the_margin_follows_the_misses(trace: str, expected_s: float) -> None:
    margin = SloMargin(SLO_S, 0.99)
    for outcome in trace:
        margin.answered(missed=outcome == "M")
    assert margin.margin_s == pytest.approx(expected_s)


@pytest.mark.parametrize(("quantile", "misses_per_100"), [(0.99, 1), (0.95, 5)])
def test_it_holds_still_where_the_allowed_share_misses(quantile: float, misses_per_100: int) -> None:
    margin = SloMargin(SLO_S, quantile)
    for _ in range(30):
        margin.answered(missed=True)
    held = margin.margin_s
    for _ in range(20):
        for i in range(100):
            margin.answered(missed=i < misses_per_100)
    assert margin.margin_s == pytest.approx(held)


def test_a_share_over_the_allowance_raises_it_and_under_lowers_it() -> None:
    over, under = SloMargin(SLO_S, 0.99), SloMargin(SLO_S, 0.99)
    for margin, misses in ((over, 2), (under, 0)):
        margin.margin_s = 0.050
        for i in range(1000):
            margin.answered(missed=i % 100 < misses)
    assert over.margin_s > 0.050 > under.margin_s


@pytest.mark.parametrize("q", [0.0, 1.0, 1.5])
def test_the_quantile_must_be_a_share(q: float) -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        SloMargin(SLO_S, q)


def test_an_idle_spell_calms_the_margin_and_ends_it_below_one_step():
    """Each idle tick keeps CALM of the margin; once it is below what one request in time takes away,
    it is 0 (no tail of nanoseconds)."""
    margin = SloMargin(SLO_S, 0.99)
    margin.margin_s = 0.002
    margin.calm(1)
    assert margin.margin_s == pytest.approx(0.002 * CALM)
    margin.calm(3)
    assert margin.margin_s == pytest.approx(0.002 * CALM**4)
    margin.calm(1_000)
    assert margin.margin_s == 0.0
