"""Batch forming as a pure function: rows, timeouts from the oldest, preferred sizes, groups, priority,
expiry."""

from __future__ import annotations

from dataclasses import replace

import pytest

from edgeinfer.batching.policy import (
    MERGE_TRIAL_ROWS,
    BatchPolicy,
    Measured,
    Pending,
    forms_ahead,
    next_batch,
    runs_alone,
)

POLICY = BatchPolicy(max_batch_size=8, max_queue_delay_s=0.010)


def pending(rows=1, at=0.0, group="a", priority=1, deadline=None, seq=None):
    return Pending(
        rows=rows, group=group, enqueued_at=at, priority=priority, deadline=deadline, sequence=seq or 0
    )


def test_nothing_pending_means_nothing_to_do():
    decision = next_batch([], POLICY, now=1.0)
    assert (decision.batch, decision.expired, decision.wake_at) == ([], [], None)


def test_waits_for_more_until_the_oldest_has_waited_the_delay():
    first, second = pending(at=0.000), pending(at=0.004)
    decision = next_batch([first, second], POLICY, now=0.005)
    assert decision.batch == []
    assert decision.wake_at == 0.010  # measured from the oldest request
    decision = next_batch([first, second], POLICY, now=0.010)
    assert decision.batch == [first, second]


def test_zero_delay_sends_at_once():
    only = pending()
    assert next_batch([only], BatchPolicy(max_batch_size=8), now=0.0).batch == [only]


def test_rows_are_counted_not_requests():
    items = [pending(rows=3, at=0.001 * i, seq=i) for i in range(3)]  # 9 rows, limit 8
    decision = next_batch(items, POLICY, now=0.0021)
    # the third request does not fit: the batch is as full as it gets and goes at once
    assert decision.batch == items[:2]


def test_full_batch_goes_without_waiting():
    items = [pending(rows=4, seq=i) for i in range(2)]
    assert next_batch(items, POLICY, now=0.0).batch == items


def test_oversized_request_runs_alone():
    big, small = pending(rows=20, at=0.0), pending(rows=1, at=0.001, seq=1)
    assert next_batch([big, small], POLICY, now=0.002).batch == [big]


def test_no_batching_runs_one_request_at_a_time():
    items = [pending(seq=i) for i in range(3)]
    decision = next_batch(items, BatchPolicy(max_batch_size=0, max_queue_delay_s=1.0), now=0.0)
    assert decision.batch == [items[0]]


def test_only_matching_shapes_are_merged_and_others_keep_their_place():
    a1, b1, a2 = (
        pending(group="a", at=0.0),
        pending(group="b", at=0.001, seq=1),
        pending(group="a", at=0.002, seq=2),
    )
    decision = next_batch([a1, b1, a2], POLICY, now=0.02)
    assert decision.batch == [a1, a2]
    decision = next_batch([b1], POLICY, now=0.02)
    assert decision.batch == [b1]


def test_no_overtaking_within_a_group():
    first = pending(rows=6, at=0.0)
    too_big = pending(rows=4, at=0.001, seq=1)
    would_fit = pending(rows=1, at=0.002, seq=2)
    decision = next_batch([first, too_big, would_fit], POLICY, now=0.003)
    assert decision.batch == [first]


def test_preferred_batch_size_sends_early():
    policy = BatchPolicy(max_batch_size=8, max_queue_delay_s=1.0, preferred_batch_sizes=(2, 4))
    items = [pending(seq=i, at=0.001 * i) for i in range(3)]
    decision = next_batch(items, policy, now=0.003)
    assert decision.batch == items[:2]  # 3 rows pending: the largest preferred prefix is 2
    items.append(pending(seq=3, at=0.003))
    assert next_batch(items, policy, now=0.004).batch == items


def test_lower_priority_number_runs_first():
    low = pending(priority=5, at=0.0)
    high = pending(priority=1, at=0.005, seq=1)
    decision = next_batch([low, high], BatchPolicy(max_batch_size=1), now=0.006)
    assert decision.batch == [high]


def test_priority_orders_the_rows_that_fit():
    policy = BatchPolicy(max_batch_size=4)
    old_low = pending(rows=3, priority=2, at=0.0)
    new_high = pending(rows=3, priority=1, at=0.001, seq=1)
    assert next_batch([old_low, new_high], policy, now=0.002).batch == [new_high]


def test_expired_requests_are_never_batched():
    expired = pending(at=0.0, deadline=0.005)
    alive = pending(at=0.001, deadline=0.1, seq=1)
    decision = next_batch([expired, alive], POLICY, now=0.012)
    assert decision.expired == [expired]
    assert decision.batch == [alive]


def test_wake_at_is_the_earlier_of_delay_and_deadline():
    item = pending(at=0.0, deadline=0.004)
    assert next_batch([item], POLICY, now=0.001).wake_at == 0.004


# Adaptive batching: decisions from the measured cost line and arrival gaps, no fixed wait.
ADAPTIVE = BatchPolicy(max_batch_size=8, adaptive=True)
FIXED_COST = Measured(per_row_s=0.0001, per_batch_s=0.001)  # 1 ms per call: merging pays (t(1) = 1.1 ms)
PER_ROW = Measured(per_row_s=0.030, per_batch_s=0.0005)  # a CNN on a CPU: merging saves ~1 % per row


@pytest.mark.parametrize(
    ("case", "measured", "queued", "now", "due", "runs", "wake_at"),
    [
        # no measurements yet: run what is queued
        ("unmeasured", None, 2, 0.0, None, 2, None),
        ("no arrival rate yet", FIXED_COST, 2, 0.0, None, 2, None),
        # arrivals every 0.2 ms, a batch of one takes 1.1 ms: wait one gap for the next request
        ("next expected soon", replace(FIXED_COST, interarrival_s=0.0002), 2, 0.0, None, 0, 0.0002),
        # arrivals every 2 ms (slower than a batch of one, as at concurrency 1): never wait
        ("next not expected in time", replace(FIXED_COST, interarrival_s=0.002), 1, 0.0, None, 1, None),
        # the oldest has waited 1 ms already: one more gap would pass t(1)
        ("waited enough", replace(FIXED_COST, interarrival_s=0.0002), 2, 0.001, None, 2, None),
        # the SLO leaves no room for the wait and a larger batch
        ("due too soon", replace(FIXED_COST, interarrival_s=0.0002), 2, 0.0, 0.0012, 2, None),
        ("due allows it", replace(FIXED_COST, interarrival_s=0.0002), 2, 0.0, 0.0020, 0, 0.0002),
        # merging does not pay: no wait, whatever the arrivals, and the head runs alone (merging three
        # would make the first wait for all three: a mean of 90 ms instead of 61)
        ("per-row cost", replace(PER_ROW, interarrival_s=0.0001), 3, 0.0, None, 1, None),
        ("per-row cost, no arrivals measured", PER_ROW, 3, 0.0, None, 1, None),
        ("per-row cost, a spare slot", replace(PER_ROW, spare_slots=1), 3, 0.0, None, 1, None),
        # a merge trial (the batcher asks now and then): up to MERGE_TRIAL_ROWS rows, while the head
        # still finishes by its due time (t(3) = 90.5 ms, t(4) = 120.5 ms)
        ("trial", replace(PER_ROW, trial=True), 3, 0.0, None, 3, None),
        ("trial, more queued", replace(PER_ROW, trial=True), 7, 0.0, None, MERGE_TRIAL_ROWS, None),
        ("trial within the due time", replace(PER_ROW, trial=True), 7, 0.0, 0.100, 3, None),
        ("trial, due too soon for two", replace(PER_ROW, trial=True), 7, 0.0, 0.050, 1, None),
        ("trial, one queued", replace(PER_ROW, trial=True), 1, 0.0, None, 1, None),
        ("trial when merging pays anyway", replace(FIXED_COST, trial=True), 7, 0.0, None, 7, None),
        # another slot of the runner is idle: run now, in parallel
        ("spare slot", replace(FIXED_COST, interarrival_s=0.0002, spare_slots=1), 2, 0.0, None, 2, None),
        # a full batch goes without waiting
        ("full", replace(FIXED_COST, interarrival_s=0.0001), 8, 0.0, None, 8, None),
    ],
)
def test_adaptive_decisions(case, measured, queued, now, due, runs, wake_at):
    items = [pending(at=0.0, seq=i) for i in range(queued)]
    for item in items:
        item.due = due
    decision = next_batch(items, ADAPTIVE, now=now, measured=measured)
    assert len(decision.batch) == runs, case
    assert decision.wake_at == (pytest.approx(wake_at) if wake_at is not None else None), case


def test_adaptive_wait_is_bounded_by_a_batch_of_one_over_a_trace():
    """Arrival gaps measured at 0.3 ms but nobody comes: the head waits at most t(1) = 1.1 ms in all."""
    measured = replace(FIXED_COST, interarrival_s=0.0003)
    head = pending(at=0.0)
    now, wakes = 0.0, 0
    while True:
        decision = next_batch([head], ADAPTIVE, now=now, measured=measured)
        if decision.batch:
            break
        now, wakes = decision.wake_at, wakes + 1
    assert now <= measured.batch_s(1)
    assert wakes == 3


def test_adaptive_deadlines_still_expire_requests():
    late = pending(at=0.0, deadline=0.001)
    decision = next_batch([late], ADAPTIVE, now=0.002, measured=FIXED_COST)
    assert (decision.batch, decision.expired) == ([], [late])


@pytest.mark.parametrize(
    ("measured", "pays"),
    [
        (FIXED_COST, True),
        (PER_ROW, False),
        (Measured(0.0, 0.0), False),
        (Measured(0.001, 0.001), True),  # fixed cost = cost per row: the mean is the same either way
        (Measured(0.001, 0.0009), False),
    ],
)
def test_merging_pays_when_the_fixed_cost_is_at_least_the_cost_per_row(measured, pays):
    assert measured.merging_pays() is pays


@pytest.mark.parametrize(
    ("per_row", "per_batch"), [(1.0, 0.5), (1.0, 1.0), (1.0, 2.0), (0.1, 1.0), (1.0, 0.0)]
)
def test_merging_pays_exactly_when_it_lowers_the_mean_completion_time(per_row, per_batch):
    """k requests queued on one slot: one by one they finish at t(1), 2 t(1), ...; merged, all at t(k)."""
    measured = Measured(per_row, per_batch)
    for k in (2, 3, 8):
        alone = sum(i * measured.batch_s(1) for i in range(1, k + 1)) / k
        merged = measured.batch_s(k)
        assert (merged <= alone + 1e-12) is measured.merging_pays(), (per_row, per_batch, k)


@pytest.mark.parametrize(
    ("policy", "measured", "ahead"),
    [
        (POLICY, None, True),  # fixed: as configured (prefetch_batches)
        (POLICY, FIXED_COST, True),
        (ADAPTIVE, None, False),  # nothing measured yet: the batch forms when the slot frees
        (ADAPTIVE, PER_ROW, True),  # a batch of one either way: formed ahead, it starts at once
        (ADAPTIVE, FIXED_COST, False),  # formed ahead, it would miss what arrives meanwhile
        (ADAPTIVE, Measured(0.0, 0.0), True),  # no cost measured at all: merging does not pay
    ],
)
def test_a_batch_forms_ahead_of_a_free_slot_only_when_it_would_be_no_smaller(policy, measured, ahead):
    assert forms_ahead(policy, measured) is ahead


LONE_POLICIES = [
    ADAPTIVE,
    BatchPolicy(max_batch_size=0, adaptive=True),
    BatchPolicy(max_batch_size=1, adaptive=True),
    POLICY,
    BatchPolicy(max_batch_size=8),  # fixed, no wait
    BatchPolicy(max_batch_size=8, max_queue_delay_s=0.010, preferred_batch_sizes=(1, 4)),
]
LONE_MEASURED = [
    None,
    FIXED_COST,
    replace(FIXED_COST, interarrival_s=0.0002),
    replace(FIXED_COST, interarrival_s=0.002),
    replace(FIXED_COST, interarrival_s=0.0002, spare_slots=1),
    replace(PER_ROW, interarrival_s=0.0001),
    Measured(0.0, 0.0, interarrival_s=0.0001),
]


@pytest.mark.parametrize("policy", LONE_POLICIES)
@pytest.mark.parametrize("measured", LONE_MEASURED)
@pytest.mark.parametrize("rows", [1, 8, 9])
@pytest.mark.parametrize("due", [None, 0.0012])
def test_a_lone_request_runs_at_once_exactly_when_next_batch_would_run_it(policy, measured, rows, due):
    """``runs_alone`` is the light-load shortcut of ``next_batch`` for a queue of one request that has
    just arrived: over every policy kind, measurement, size and due time, the two agree."""
    item = Pending(rows=rows, group="a", enqueued_at=0.0, due=due)
    decided = next_batch([item], policy, now=0.0, measured=measured)
    assert runs_alone(rows, due, policy, 0.0, measured) is bool(decided.batch)
    assert decided.batch in ([], [item])
