"""Batch forming as a pure function: rows, timeouts from the oldest, preferred sizes, groups, priority,
expiry."""

from __future__ import annotations

from edgeinfer.batching.policy import BatchPolicy, Pending, next_batch

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
