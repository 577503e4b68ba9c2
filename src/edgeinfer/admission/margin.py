"""The margin admission keeps to a model's SLO, steered by how many answered requests missed it.

Admission (``admission.py``) predicts when a request would finish (the queue ahead at the measured cost
and drain, its own batch, the event loop's lag) and refuses one predicted to miss its SLO. It adds this
margin to every prediction, and the margin follows the objective itself: each answered request that
missed its SLO raises it by ``GAIN`` x the SLO x the share allowed to make it (0.99 for a p99
objective), each one in time lowers it by ``GAIN`` x the SLO x the share allowed to miss (0.01). It
settles where the allowed share misses: no margin while fewer do, as much as it takes under overload.
``GAIN`` is a share of the SLO, not a time: at 1 %, about 100 misses in a row take the margin from 0 to
the whole SLO, and a hundred requests in time take back one miss (how fast that is in seconds follows the
request rate).

The margin moves only with answers, so one learned under an overload would outlast it in an idle spell.
So each of the event loop's idle ticks (``lag.py``: on time, no request read since the tick before)
keeps ``CALM`` of the margin while the model has nothing queued or running (``calm``): a third is left
after 100 ms (20 ticks). Under load no tick is idle, and the margin stays.

Why: a prediction is a central estimate, and under overload the queue fills until the newest admitted
request is predicted to finish just at its SLO, so many finish after it (docs/design/admission.md, "The
margin").
"""

from __future__ import annotations

GAIN = 0.01  # of the SLO per answered request, times the share allowed the other way
CALM = 0.95  # each idle moment (``calm``) keeps this share of the margin


class SloMargin:
    """The margin (``margin_s``, between 0 and the SLO) that keeps the share of answered requests
    finishing after their SLO at ``1 - quantile``."""

    __slots__ = ("_down", "_slo_s", "_up", "margin_s")

    def __init__(self, slo_s: float, quantile: float, gain: float = GAIN) -> None:
        if not 0.0 < quantile < 1.0:
            raise ValueError(f"the quantile must be between 0 and 1, got {quantile}")
        self._slo_s = slo_s
        self._up = gain * slo_s * quantile  # for a miss
        self._down = gain * slo_s * (1.0 - quantile)  # for a request in time
        self.margin_s = 0.0

    def answered(self, missed: bool) -> None:
        """One request was answered, after its SLO (``missed``) or within it."""
        if missed:
            margin = self.margin_s + self._up
            self.margin_s = margin if margin < self._slo_s else self._slo_s
        elif self.margin_s:
            margin = self.margin_s - self._down
            self.margin_s = margin if margin > 0.0 else 0.0

    def calm(self, moments: int) -> None:
        """Nothing came for ``moments`` of the event loop's timer ticks (``lag.py``), none of them late:
        an idle spell, in which no answers come to bring down a margin learned under an overload."""
        margin = self.margin_s * CALM**moments
        self.margin_s = margin if margin > self._down else 0.0
