"""The batching decision as a pure function of (pending requests, policy, now).

No event loop, no model, no clock: the batcher calls ``next_batch`` with what is queued and the current
monotonic time, and the unit tests call it with hand-made lists. The rules follow Triton's dynamic
batcher:

* Requests are ordered by priority (lower first), then by arrival. The first one (the head) decides the
  group: only requests whose non-batch shapes and datatypes equal the head's may join it. Requests of
  other groups keep their places for a later batch.
* Rows are counted, not requests. Requests join in order while the total stays within
  ``max_batch_size``; the first one of the group that does not fit closes the batch (no overtaking).
* A batch is sent when it is full, when a request of its group is left waiting because it did not fit,
  when its rows reach the largest preferred batch size available, or when the head has waited
  ``max_queue_delay_s``. Otherwise the batcher should look again at ``wake_at``.
* A request whose deadline has passed is expired, never run.

With ``adaptive`` (the default unless a model sets ``batch_timeout_millis``) there is no fixed wait; what
the batcher has measured (``Measured``: the cost model's per-row and per-call cost, the time between
arrivals) decides (why, with the measurements: docs/design/batcher.md):

* Merging pays only when a call's fixed cost is at least its cost per row (``per_batch_s >= per_row_s``;
  a batch of two then saves at least a quarter of the time per row): k requests queued on one slot
  finish at ``t(1), 2 t(1), ... k t(1)`` one by one and all at ``t(k)`` merged, and the mean of the
  first is ``(k + 1)(a + b) / 2``, of the second ``b + k a``: merged is sooner on average exactly when
  ``b >= a``. Otherwise the head runs alone (a convolutional network on a CPU: merging four requests
  makes the first wait for all four) and nothing waits; but when the batcher asks for a merge trial
  (``Measured.trial``, ``MERGE_TRIAL_ROWS``), so that sizes above one keep being measured.
* Waiting for one more request pays only when one is expected sooner than a batch of one would take
  (the mean time between arrivals is at most ``t(1)``), and only while the oldest request, once the next
  arrives and the larger batch runs, still finishes by its due time (its SLO). Otherwise the batch goes
  now: at concurrency 1 nothing else arrives while a request waits, so nothing ever waits.
* Never wait while another of the runner's slots is idle: running now uses it, waiting leaves it idle
  (docs/design/batcher.md, "Never waiting while a slot is idle").
* Under load no wait is needed: requests queue while the runner is busy, and the batch formed when it
  frees holds them all. When merging does not pay, the next request is handed to the runner while the
  current one computes instead (``forms_ahead``): it starts the moment the slot frees.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """How one model version batches. ``max_batch_size`` 0 means every request runs alone. ``adaptive``:
    waits and sizes come from what is measured, ``max_queue_delay_s`` is not used."""

    max_batch_size: int
    max_queue_delay_s: float = 0.0
    preferred_batch_sizes: tuple[int, ...] = ()
    adaptive: bool = False


@dataclass(slots=True)
class Measured:
    """What the adaptive policy decides from: batch time ``per_batch_s + per_row_s * rows`` and the mean
    time between arrivals (None until measured)."""

    per_row_s: float
    per_batch_s: float
    interarrival_s: float | None = None
    spare_slots: int = 0  # runner slots idle besides the one the next batch takes
    trial: bool = False  # merge even though merging does not pay (``MERGE_TRIAL_ROWS``)

    def batch_s(self, rows: int) -> float:
        return self.per_batch_s + self.per_row_s * rows

    def saving(self, rows: int) -> float:
        """The share of time per row that a batch of ``rows`` saves against batches of one (0 to 1)."""
        one = self.batch_s(1)
        if rows <= 1 or one <= 0:
            return 0.0
        return 1.0 - self.batch_s(rows) / (rows * one)

    def merging_pays(self) -> bool:
        return merging_pays(self.per_row_s, self.per_batch_s)


def merging_pays(per_row_s: float, per_batch_s: float) -> bool:
    """Merging lowers the mean completion time of what it merges (see the module docstring)."""
    return per_batch_s > 0 and per_batch_s >= per_row_s


# While merging does not pay, only batches of one run, so only they are measured, and a line bent by
# a few slow batches (``runners/cost.py``) would never be corrected: merging would never pay again. So
# now and then the batcher asks for a trial (``Measured.trial``): the head merged with what follows, up
# to this many rows. Four, because the first merge costs the most (a batch of one skips concatenating
# and splitting), so two alone do not show the slope (docs/design/batcher.md, "Merge trials"). What a
# trial costs is small and bounded: the head waits for up to three more rows.
MERGE_TRIAL_ROWS = 4
HIGHEST_PRIORITY = 1  # the lowest level number a request can have (0 asks for the model's default)


class Pending:
    """A queued request as the policy sees it. ``group`` is equal for requests that can be merged.
    (A plain class, not a dataclass, like every object made per request: docs/design/mypyc.md.)"""

    __slots__ = (
        "deadline",
        "due",
        "enqueued_at",
        "group",
        "payload",
        "priority",
        "rows",
        "sequence",
        "stream",
    )

    def __init__(
        self,
        rows: int,
        group: Hashable,
        enqueued_at: float,
        priority: int = HIGHEST_PRIORITY,
        deadline: float | None = None,
        sequence: int = 0,
        payload: Any = None,
        due: float | None = None,  # when its SLO wants it answered (adaptive batching aims for it)
        stream: str | None = None,  # a newer request of this stream replaces it while queued (drop_stale)
    ) -> None:
        self.rows = rows
        self.group = group
        self.enqueued_at = enqueued_at
        self.priority = priority
        self.deadline = deadline
        self.sequence = sequence
        self.payload = payload
        self.due = due
        self.stream = stream

    def __repr__(self) -> str:  # what a failing table test prints
        return (
            f"Pending(rows={self.rows}, group={self.group!r}, enqueued_at={self.enqueued_at}, "
            f"priority={self.priority}, deadline={self.deadline}, sequence={self.sequence}, due={self.due})"
        )


@dataclass(slots=True)
class Decision:
    batch: list[Pending]
    expired: list[Pending]
    wake_at: float | None


def queue_order(pending: Pending) -> tuple[int, float, int]:
    return (pending.priority, pending.enqueued_at, pending.sequence)


def split_expired(pending: Sequence[Pending], now: float) -> tuple[list[Pending], list[Pending]]:
    """(still waiting, expired) — a request expires when its deadline is at or before ``now``."""
    alive: list[Pending] = []
    expired: list[Pending] = []
    for item in pending:
        (expired if item.deadline is not None and item.deadline <= now else alive).append(item)
    return alive, expired


def next_deadline(pending: Sequence[Pending]) -> float | None:
    deadlines = [item.deadline for item in pending if item.deadline is not None]
    return min(deadlines) if deadlines else None


def next_batch(
    pending: Sequence[Pending], policy: BatchPolicy, now: float, measured: Measured | None = None
) -> Decision:
    """Decide what to run now; ``pending`` may be in any order. ``measured`` is for adaptive policies;
    without it an adaptive policy runs what is queued at once."""
    alive, expired = split_expired(pending, now)
    if not alive:
        return Decision([], expired, None)
    ordered = sorted(alive, key=queue_order)
    head = ordered[0]
    limit = policy.max_batch_size
    if limit <= 1 or head.rows >= limit:
        return Decision([head], expired, None)

    candidates: list[Pending] = []
    rows = 0
    blocked = False
    for item in ordered:
        if item.group != head.group:
            continue
        if rows + item.rows > limit:
            blocked = True
            break
        candidates.append(item)
        rows += item.rows

    if policy.adaptive:
        return _adaptive(candidates, rows, blocked or rows == limit, measured, alive, expired, now)
    waited_enough = now - head.enqueued_at >= policy.max_queue_delay_s
    if rows == limit or blocked or waited_enough:
        return Decision(candidates, expired, None)

    preferred = _preferred_prefix(candidates, policy.preferred_batch_sizes)
    if preferred:
        return Decision(preferred, expired, None)

    wake_at = head.enqueued_at + policy.max_queue_delay_s
    deadline = next_deadline(alive)
    if deadline is not None:
        wake_at = min(wake_at, deadline)
    return Decision([], expired, wake_at)


def _adaptive(
    candidates: list[Pending],
    rows: int,
    full: bool,
    measured: Measured | None,
    alive: list[Pending],
    expired: list[Pending],
    now: float,
) -> Decision:
    """Run the head alone when merging does not pay (but for a merge trial); else run what is queued
    now unless one more request is expected before a batch of one would finish and the oldest request
    can afford to wait for it (see the module docstring)."""
    head = candidates[0]
    if measured is not None and not measured.merging_pays():
        if measured.trial:
            return Decision(_trial(candidates, head.due, measured, now), expired, None)
        return Decision(candidates[:1], expired, None)  # merging would raise the mean latency
    wait_s = _worth_waiting(rows, full, now - head.enqueued_at, head.due, now, measured)
    if wait_s is None:
        return Decision(candidates, expired, None)
    wake_at = now + wait_s
    deadline = next_deadline(alive)
    if deadline is not None:
        wake_at = min(wake_at, deadline)
    return Decision([], expired, wake_at)


def _worth_waiting(
    rows: int, full: bool, waited: float, due: float | None, now: float, measured: Measured | None
) -> float | None:
    """How long to wait for one more request (the expected gap), or None to run ``rows`` now: not
    full, no idle slot, one expected before a batch of one would finish, and the oldest request (it
    waited ``waited``, it is ``due``) still in time once the larger batch runs."""
    if full or measured is None or measured.interarrival_s is None or measured.spare_slots > 0:
        return None  # (a spare slot: run now, in parallel, not later)
    gap = measured.interarrival_s
    one = measured.batch_s(1)
    if gap > one or waited + gap > one:  # the next one is not expected in time, or waited enough
        return None
    if due is not None and now + gap + measured.batch_s(rows + 1) > due:
        return None
    return gap


def _trial(candidates: list[Pending], due: float | None, measured: Measured, now: float) -> list[Pending]:
    """The batch of a merge trial: the head and what follows it, up to ``MERGE_TRIAL_ROWS`` rows and
    as long as the head is still predicted to finish by its due time (those after it are due later)."""
    batch = candidates[:1]
    rows = batch[0].rows
    for item in candidates[1:]:
        rows += item.rows
        if rows > MERGE_TRIAL_ROWS or (due is not None and now + measured.batch_s(rows) > due):
            break
        batch.append(item)
    return batch


def runs_alone(
    rows: int, due: float | None, policy: BatchPolicy, now: float, measured: Measured | None = None
) -> bool:
    """Whether a request arriving with nothing else queued or running starts at once: what
    ``next_batch`` decides for a queue of just that request (it has not expired: it just came), without
    building the queue. The light-load path asks it for every request, so it must cost little."""
    limit = policy.max_batch_size
    if limit <= 1 or rows >= limit:
        return True
    if not policy.adaptive:
        return policy.max_queue_delay_s <= 0 or rows in policy.preferred_batch_sizes
    if measured is not None and not measured.merging_pays():
        return True
    return _worth_waiting(rows, False, 0.0, due, now, measured) is None


def forms_ahead(policy: BatchPolicy, measured: Measured | None) -> bool:
    """Whether the next batch may be formed before a compute slot frees (the runner's prefetch): a batch
    formed early holds only what is queued now, not what arrives while the current one computes. A
    fixed policy forms ahead as configured; an adaptive one only while merging does not pay: then the
    batch is one request either way, and formed ahead it starts the moment the slot frees instead of
    when the event loop next gets to it (a loop decoding a large JSON body holds it for milliseconds)."""
    return not policy.adaptive or (measured is not None and not measured.merging_pays())


def _preferred_prefix(candidates: list[Pending], preferred: tuple[int, ...]) -> list[Pending]:
    """The longest prefix whose rows equal one of the preferred sizes; empty if none does."""
    if not preferred:
        return []
    best = 0
    rows = 0
    for count, item in enumerate(candidates, start=1):
        rows += item.rows
        if rows in preferred:
            best = count
    return candidates[:best]
