"""How much later than predicted admitted requests finish: the margin admission keeps to its SLO.

Admission (``batcher.py``) predicts when a request would finish (the queue ahead at the measured cost
and drain, its own batch, the event loop's lag) and refuses one predicted to miss its SLO. The
prediction is a central estimate, and under overload the queue fills until the newest admitted request
is predicted to finish just at its SLO: then about half of them finish after it. Measured with `cnn`
over JSON offered twice its sustainable rate (SLO 350 ms): the time requests finished against their
SLO, p50 28 ms before it, p90 30 ms and p99 82 ms after it.

So the batcher reports each admitted request's *overrun* (when it finished minus when it was predicted
to), and admission adds the SLO's own quantile of recent overruns (the 99th for a p99 objective) to
every prediction: a request is admitted when its prediction plus that margin is within the SLO. The
margin is what the predictions of this model on this machine under this load actually missed by, not
a constant; it is never negative (predictions that came true early do not admit more than predicted).
As the margin shortens the queue, predictions get closer and the margin shrinks with them.
"""

from __future__ import annotations

import math
from collections import deque

WINDOW = 512  # recent overruns kept
EVERY = 64  # the margin is recomputed after this many new ones (a sort of WINDOW floats)


class Overruns:
    """The last ``window`` overruns (seconds) and their ``quantile``, kept as ``margin_s``."""

    __slots__ = ("_every", "_fresh", "_quantile", "_samples", "margin_s")

    def __init__(self, quantile: float, window: int = WINDOW, every: int = EVERY) -> None:
        if not 0.0 < quantile < 1.0:
            raise ValueError(f"the quantile must be between 0 and 1, got {quantile}")
        self._quantile = quantile
        self._samples: deque[float] = deque(maxlen=window)
        self._every = every
        self._fresh = 0
        self.margin_s = 0.0

    def add(self, overrun_s: float) -> None:
        """One admitted request finished ``overrun_s`` after its predicted finish (negative: before)."""
        self._samples.append(overrun_s)
        self._fresh += 1
        if self._fresh >= self._every:
            self._fresh = 0
            self.margin_s = max(0.0, quantile(self._samples, self._quantile))


def quantile(values: deque[float] | list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (the smallest value at least ``q`` of them do not exceed)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
