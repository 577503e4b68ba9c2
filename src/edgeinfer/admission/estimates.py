"""Running estimates of what recent requests and batches took, scale-free: what is measured sets them,
milliseconds or microseconds alike."""

from __future__ import annotations

ARRIVAL_MEMORY = 0.9  # the mean gap between arrivals follows the last ten or so
DRAIN_MEMORY = 0.9  # the drain rate follows the last ten or so batches that finished with work waiting
# the time a request takes to arrive and be decoded: near the top of recent ones (``follow_high``)
READING_RISE = 0.2
READING_FALL = 0.01


def follow(mean: float | None, value: float, memory: float = ARRIVAL_MEMORY) -> float:
    """A running mean over about the last ``1 / (1 - memory)`` values; the first value alone."""
    return value if mean is None else mean * memory + value * (1 - memory)


def follow_high(estimate: float | None, value: float) -> float:
    """A running estimate that moves ``READING_RISE`` of the way to a longer value and ``READING_FALL``
    to a shorter one: it settles near the top of recent values (the 0.95 expectile: 0.2 / (0.2 + 0.01)).
    The first value starts it."""
    if estimate is None:
        return value
    weight = READING_RISE if value > estimate else READING_FALL
    return estimate + (value - estimate) * weight


class DrainRate:
    """How fast a queue drains, seconds per row: the time between two batches finishing, per row of the
    later one, when work was waiting as the earlier one finished (so the runner never idled for want of
    work in between). Unlike the cost model it holds all the runner waited for besides the model (the
    loop busy decoding, the GIL, a shared CPU); batches run inline are not measured, as the time between
    them is the loop's own work, which the loop lag measures (docs/design/admission.md)."""

    __slots__ = ("_last_done", "s_per_row")

    def __init__(self) -> None:
        self.s_per_row: float | None = None
        self._last_done: float | None = None  # when the last batch finished, if work was waiting then

    @property
    def draining(self) -> bool:
        """The last batch finished with work waiting, and the queue has not emptied since."""
        return self._last_done is not None

    def batch_done(self, now: float, rows: int, waiting: bool) -> None:
        """A batch of ``rows`` not run inline finished at ``now``; ``waiting``: work is queued or
        running after it."""
        if self._last_done is not None and rows:
            self.s_per_row = follow(self.s_per_row, (now - self._last_done) / rows, DRAIN_MEMORY)
        self._last_done = now if waiting else None

    def idle(self) -> None:
        """The work that waited is gone (answered, cancelled, expired), or a batch ran inline: no
        longer draining."""
        self._last_done = None
