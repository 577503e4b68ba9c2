"""What a batch of n rows costs, learned from the batches a runner ran.

The model is the one batch time follows on most hardware, ``a * rows + b`` (a per-row cost and a fixed
cost per call), fitted by weighted least squares over recent batches: each new batch counts as much as
the one before it times ``memory``, so the estimate follows a machine that slows down or speeds up.
While every batch seen had the same row count, the fixed part cannot be told apart, and the estimate is
proportional to rows. Pure arithmetic: no clock, no event loop.
"""

from __future__ import annotations


class CostModel:
    """Asked on every batch (``estimate_s``) and told after every batch (``observe``), so the fit is
    updated when told and the estimate is one multiply-add."""

    __slots__ = ("_intercept", "_memory", "_n", "_slope", "_x", "_xx", "_xy", "_y", "observed")

    def __init__(self, memory: float = 0.9) -> None:
        self._memory = memory
        self._n = self._x = self._y = self._xx = self._xy = 0.0
        self._slope = self._intercept = 0.0
        self.observed = 0

    def observe(self, rows: int, seconds: float) -> None:
        keep = self._memory
        self._n = n = self._n * keep + 1.0
        self._x = x = self._x * keep + rows
        self._y = y = self._y * keep + seconds
        self._xx = xx = self._xx * keep + rows * rows
        self._xy = xy = self._xy * keep + rows * seconds
        self.observed += 1
        mean_x, mean_y = x / n, y / n
        variance = xx / n - mean_x * mean_x
        if variance <= 1e-9 * (mean_x * mean_x + 1.0):  # one batch size seen so far
            self._slope, self._intercept = (mean_y / mean_x, 0.0) if mean_x > 0 else (0.0, mean_y)
            return
        slope = (xy / n - mean_x * mean_y) / variance
        self._slope = slope = slope if slope > 0.0 else 0.0
        intercept = mean_y - slope * mean_x
        self._intercept = intercept if intercept > 0.0 else 0.0

    def estimate_s(self, rows: int) -> float | None:
        """Predicted seconds for a batch of ``rows``; None before the first batch."""
        if not self.observed:
            return None
        return self._slope * rows + self._intercept
