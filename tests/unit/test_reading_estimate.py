"""The reading time judged before decoding (``batcher._follow_high``): near the top of recent ones."""

from __future__ import annotations

import numpy as np
import pytest

from edgeinfer.admission.estimates import follow_high as _follow_high


def follow(values: list[float]) -> float:
    estimate = None
    for value in values:
        estimate = _follow_high(estimate, value)
    assert estimate is not None
    return estimate


def test_the_first_value_starts_it_and_a_steady_one_keeps_it():
    assert follow([0.004]) == 0.004
    assert follow([0.004] * 50) == pytest.approx(0.004)


def test_it_settles_near_the_top_of_recent_values_not_at_their_mean():
    values = list(np.arange(1.0, 11.0)) * 60  # 1-10 ms in turn: mean 5.5, 0.95 expectile about 8.6
    assert 8.0 <= follow(values) <= 9.5


def test_it_rises_fast_to_a_longer_value_and_falls_slowly_from_it():
    settled = follow([2.0] * 20)
    assert follow([2.0] * 20 + [12.0]) == pytest.approx(settled + 0.2 * 10)
    assert follow([12.0] * 20 + [2.0]) == pytest.approx(12.0 - 0.01 * 10)


def test_it_is_scale_free():
    rng = np.random.default_rng(7)
    values = list(rng.exponential(1.0, 400))
    assert follow([value * 1e-6 for value in values]) == pytest.approx(follow(values) * 1e-6)
