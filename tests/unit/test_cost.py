"""The cost model of runners: a * rows + b from measured batches, pure arithmetic."""

from __future__ import annotations

import pytest

from edgeinfer.batching.policy import Measured
from edgeinfer.runners import CostModel


def measured(cost: CostModel) -> Measured:
    return Measured(cost.per_row_s, cost.per_batch_s)


def test_nothing_measured_means_no_estimate():
    assert CostModel().estimate_s(4) is None


def test_one_batch_size_seen_estimates_proportionally():
    cost = CostModel()
    for _ in range(3):
        cost.observe(2, 0.010)
    assert cost.estimate_s(2) == pytest.approx(0.010)
    assert cost.estimate_s(4) == pytest.approx(0.020)


def test_a_fixed_cost_and_a_per_row_cost_are_told_apart():
    cost = CostModel()
    for rows in (1, 8, 1, 8, 4, 16):
        cost.observe(rows, 0.001 + 0.0005 * rows)  # 1 ms per call, 0.5 ms per row
    assert cost.estimate_s(1) == pytest.approx(0.0015)
    assert cost.estimate_s(32) == pytest.approx(0.017)


def test_recent_batches_count_more_than_old_ones():
    cost = CostModel(memory=0.5)
    for _ in range(20):
        cost.observe(1, 0.100)  # the machine was busy
    for _ in range(20):
        cost.observe(1, 0.001)
    assert cost.estimate_s(1) == pytest.approx(0.001, rel=0.01)


def test_noise_never_gives_a_negative_slope_or_cost():
    cost = CostModel()
    cost.observe(1, 0.005)
    cost.observe(8, 0.001)  # bigger batch measured faster (noise)
    assert cost.estimate_s(1) > 0
    assert cost.estimate_s(8) >= cost.estimate_s(1)


def test_what_warmup_measured_at_the_largest_batch_is_kept_while_traffic_runs_batches_of_one():
    cost = CostModel()
    cost.observe(1, 0.0012)
    cost.observe(32, 0.0043)  # warmup: 1 ms per call, 0.1 ms per row
    for _ in range(500):
        cost.observe(1, 0.0011)
    assert cost.per_row_s == pytest.approx(0.0001, rel=0.05)
    assert measured(cost).saving(8) > 0.5


@pytest.mark.parametrize(
    ("per_row", "per_call", "rows", "saving"),
    [(0.001, 0.0, 8, 0.0), (0.0, 0.001, 4, 0.75), (0.001, 0.001, 2, 0.25), (0.001, 0.001, 1, 0.0)],
)
def test_saving_per_row(per_row, per_call, rows, saving):
    cost = CostModel()
    for size in (1, 16):
        cost.observe(size, per_call + per_row * size)
    assert measured(cost).saving(rows) == pytest.approx(saving)


def test_sizes_not_seen_for_long_are_dropped():
    cost = CostModel()
    cost.observe(1000, 10.0)  # one odd batch long ago
    for rows in range(1, 40):
        cost.observe(rows, 0.001 * rows)
    assert cost.estimate_s(10) == pytest.approx(0.010)


def test_a_size_that_keeps_running_is_judged_by_its_own_recent_batches():
    """After load (large batches measured slow), batches of one are what they take now, not the line."""
    cost = CostModel()
    for rows in (8, 16, 32, 64):
        cost.observe(rows, 0.001 + 0.00001 * rows)  # under load: 1 ms per call
    for _ in range(30):
        cost.observe(1, 0.00002)  # alone: 20 us
    assert cost.estimate_s(1) > 0.0005  # the line still carries the load's fixed cost
    assert cost.recent_s(1) == pytest.approx(0.00002, rel=0.01)
    assert cost.recent_s(2) is None


def test_a_sizes_first_batch_is_provisional_the_faster_of_its_first_two_counts():
    cost = CostModel()
    cost.observe(4, 0.0040)  # the first run of a shape: ONNX Runtime plans its memory
    cost.observe(4, 0.0010)
    assert cost.recent_s(4) == pytest.approx(0.0010)
    cost.observe(2, 0.0005)
    cost.observe(2, 0.0030)  # preempted
    assert cost.recent_s(2) == pytest.approx(0.0005)


@pytest.mark.parametrize(("slow", "at_most"), [(0.010, 0.0011), (1.0, 0.0011), (0.0015, 0.00105)])
def test_one_slow_batch_moves_its_size_by_at_most_clip_times_its_average(slow, at_most):
    cost = CostModel()
    for _ in range(5):
        cost.observe(1, 0.001)
    cost.observe(1, slow)
    assert cost.recent_s(1) == pytest.approx(at_most)


def test_a_real_slowdown_is_followed_within_tens_of_batches():
    cost = CostModel()
    for _ in range(5):
        cost.observe(1, 0.001)
    for _ in range(40):
        cost.observe(1, 0.005)
    assert cost.recent_s(1) == pytest.approx(0.005, rel=0.05)


def test_a_size_seen_once_does_not_bend_the_line_of_sizes_seen_twice():
    """Measured: warmup's one batch of 32 at 303 us against 30-40 us later made `tiny` fit 35 us a row
    and no fixed cost; merging then never paid, so only batches of one ran and nothing corrected it."""
    cost = CostModel()
    cost.observe(32, 0.000303)  # warmup, cold
    for _ in range(3):
        for rows in (1, 2, 4, 6):
            cost.observe(rows, 0.000009 + 0.000002 * rows)
    assert cost.per_row_s == pytest.approx(0.000002)
    assert cost.per_batch_s == pytest.approx(0.000009)
    assert measured(cost).merging_pays()


def test_sizes_dropped_leave_the_fit_as_if_never_seen():
    cost = CostModel()
    for rows in range(100, 133):  # 33 sizes seen twice, slow ones; the first is dropped
        cost.observe(rows, 1.0)
        cost.observe(rows, 1.0)
    for rows in range(1, 33):  # 32 new sizes push out every slow one
        cost.observe(rows, 0.001 * rows)
        cost.observe(rows, 0.001 * rows)
    assert cost.per_row_s == pytest.approx(0.001)
    assert cost.per_batch_s == pytest.approx(0.0, abs=1e-9)
