"""The degradation ladder: a model's traffic goes to a cheaper model while its latency stays too high.

Three parts, each testable alone:

* ``LatencyWindow``: the latency of a model's recent requests (a fixed ring, so memory is bounded at any
  rate) and their p95 over the last ``window_s``. A request refused or timed out for load counts as
  infinitely slow: with an SLO, admission control keeps the latency of admitted requests low by
  refusing the rest, and a ladder that only saw the admitted ones would never step down.
* ``Hysteresis``: the pure state machine. It steps down when the p95 has stayed above the enter level
  for ``enter_after_s``, and back up when it has stayed below the exit level (lower) for
  ``exit_after_s``. Between the two levels nothing changes, and a single sample on the other side resets
  the clock: a load that hovers around one level cannot make it flap.
* ``Ladder``: both, plus what the outside sees: the switch counts, the last p95, a log line per switch.

What the window measures is what clients of the model's name get, whichever model answered: while
degraded, that is the fallback's latency. If the load that caused the switch is still there when the
ladder steps back up, it steps down again after ``enter_after_s``; the dwell times bound how often
that can happen.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from edgeinfer.model_config import FallbackConfig

log = logging.getLogger("edgeinfer.ladder")

WINDOW_SAMPLES = 2048  # the most recent requests kept; beyond it the window is the last 2048 requests
CHECK_EVERY_S = 0.1  # the p95 is recomputed at most this often (a numpy percentile over the window)


class LatencyWindow:
    """The latencies of the last ``WINDOW_SAMPLES`` requests with their times; ``p95`` over ``span_s``."""

    __slots__ = ("_at", "_next", "_seconds", "span_s")

    def __init__(self, span_s: float, capacity: int = WINDOW_SAMPLES) -> None:
        self.span_s = span_s
        self._at = np.full(capacity, -math.inf)
        self._seconds = np.zeros(capacity)
        self._next = 0

    def add(self, now: float, seconds: float) -> None:
        index = self._next
        self._at[index] = now
        self._seconds[index] = seconds
        self._next = (index + 1) % len(self._at)

    def p95(self, now: float) -> float | None:
        """The 95th percentile of the requests of the last ``span_s``; None when there were none."""
        recent = self._seconds[self._at >= now - self.span_s]
        if not len(recent):
            return None
        return float(np.quantile(recent, 0.95, method="higher"))


@dataclass(slots=True)
class Hysteresis:
    """Degraded or not, from a sequence of (p95, time) observations. Pure: no clock of its own."""

    enter_s: float
    exit_s: float
    enter_after_s: float
    exit_after_s: float
    degraded: bool = False
    crossing_since: float | None = None  # when the p95 last went to the side that would switch

    def step(self, p95_s: float | None, now: float) -> bool:
        """Take one observation; True when the state switched. No requests (None) counts as below both
        levels: the load that needed the fallback is gone."""
        if self.degraded:
            beyond = p95_s is None or p95_s < self.exit_s
            dwell = self.exit_after_s
        else:
            beyond = p95_s is not None and p95_s > self.enter_s
            dwell = self.enter_after_s
        if not beyond:
            self.crossing_since = None
            return False
        if self.crossing_since is None:
            self.crossing_since = now
        if now - self.crossing_since < dwell:
            return False
        self.degraded = not self.degraded
        self.crossing_since = None
        return True


class Ladder:
    """One model's ladder: fed every answered request (``observe``), asked on every request
    (``degraded``); the p95 is recomputed at most every ``CHECK_EVERY_S``."""

    def __init__(self, model: str, config: FallbackConfig) -> None:
        self.model = model
        self.config = config
        self.fallback = config.model
        self._window = LatencyWindow(config.window_s)
        self._state = Hysteresis(
            config.enter_p95_ms / 1000, config.exit_p95_ms / 1000, config.enter_after_s, config.exit_after_s
        )
        self._checked_at = -math.inf
        self.p95_s: float | None = None
        self.entered = 0
        self.exited = 0

    def observe(self, now: float, seconds: float) -> None:
        self._window.add(now, seconds)

    @property
    def stepped_down(self) -> bool:
        """Whether requests go to the fallback now (as ``degraded`` last found; it checks no window)."""
        return self._state.degraded

    def degraded(self, now: float) -> bool:
        if now - self._checked_at >= CHECK_EVERY_S:
            self._checked_at = now
            self.p95_s = self._window.p95(now)
            if self._state.step(self.p95_s, now):
                self._switched()
        return self._state.degraded

    def _switched(self) -> None:
        config = self.config
        shown = "none" if self.p95_s is None else f"{self.p95_s * 1000:.1f} ms"
        if self._state.degraded:
            self.entered += 1
            log.warning(
                "model %s: p95 %s stayed above %g ms for %g s; requests go to %s",
                self.model, shown, config.enter_p95_ms, config.enter_after_s, self.fallback,
            )  # fmt: skip
        else:
            self.exited += 1
            log.warning(
                "model %s: p95 %s stayed below %g ms for %g s; requests come back from %s",
                self.model, shown, config.exit_p95_ms, config.exit_after_s, self.fallback,
            )  # fmt: skip
