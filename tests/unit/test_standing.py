"""The standing queue: when admission keeps a model's queue to half its SLO, from the batches it starts."""

from __future__ import annotations

import pytest

from edgeinfer.admission.standing import BATCHES_KEPT, KEEP, StandingQueue

SLO_S = 1.0
DEEP = 0.7  # of the SLO used by the oldest request of a batch: over KEEP
SHALLOW = 0.3


def starts(trace: str, full_batch_s: float = 0.01) -> StandingQueue:
    """A batch every 0.1 s: ``D`` deep and ``S`` shallow with requests left queued, ``E`` leaving the
    queue empty."""
    queue = StandingQueue(SLO_S)
    for i, kind in enumerate(trace):
        age_s = DEEP if kind == "D" else SHALLOW
        queue.started(i * 0.1, age_s, kind != "E", full_batch_s)
    return queue


@pytest.mark.parametrize(
    ("trace", "standing"),
    [
        ("", False),
        ("DDDDD", False),  # deep for 0.4 s: not yet half the SLO
        ("DDDDDD", True),  # deep for 0.5 s: it stands
        ("D" * 20, True),
        ("DDDSDDDDD", False),  # a shallow start ended the first deep spell; the second is 0.4 s so far
        ("DDDSDDDDDD", True),
        ("DDDDDDS", True),  # once standing, the queue kept shallower is still standing...
        ("DDDDDD" + "S" * 50, True),
        ("DDDDDDE", False),  # ...until it empties
        ("DDDDDDED", False),  # and the time starts again
        ("DDDDDDEDDDDDD", True),
        ("SSSSSSSSSSSS", False),  # a queue that never waits long never stands, however long it lasts
        ("DEDEDEDEDEDE", False),  # deep bursts that empty between them are what a queue is for
    ],
)
def test_a_queue_stands_when_it_stays_deep_for_half_the_slo(trace: str, standing: bool) -> None:
    queue = starts(trace)
    assert queue.standing is standing
    assert queue.cut_s == pytest.approx((1 - KEEP) * SLO_S if standing else 0.0)


@pytest.mark.parametrize(
    ("full_batch_s", "cut_s"),
    [
        (0.0, 0.5),  # a cheap batch: half the SLO held back
        (0.1, 0.5),  # three batches (0.3 s) fit in the half kept
        (0.2, 0.4),  # they would not: 0.6 s kept
        (0.3, 0.1),
        (0.4, 0.0),  # three batches take more than the SLO: nothing held back
    ],
)
def test_the_part_kept_holds_three_full_batches(full_batch_s: float, cut_s: float) -> None:
    queue = starts("D" * 6, full_batch_s)
    assert queue.standing
    assert queue.cut_s == pytest.approx(cut_s)
    assert SLO_S - queue.cut_s >= min(SLO_S, BATCHES_KEPT * full_batch_s) - 1e-9
