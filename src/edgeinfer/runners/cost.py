"""What a batch of n rows costs, learned from the batches a runner ran.

The model is the one batch time follows on most hardware, ``a * rows + b`` (a per-row cost and a fixed
cost per call). Each batch size seen keeps its own moving average (a new batch weighs ``1 - memory``),
and the line is fitted over the sizes, each size counting once. So the estimate follows a machine that
slows down or speeds up, and what warmup measured at the largest batch is not forgotten while traffic
runs batches of one: a fit over recent batches only would forget the slope, decide batching does not
pay, run batches of one, and never learn otherwise. While one size has been seen, the fixed part cannot
be told apart, and the estimate is proportional to rows. Pure arithmetic: no clock, no event loop.
"""

from __future__ import annotations

SIZES_KEPT = 32  # distinct batch sizes remembered (the least recently seen is dropped)


class CostModel:
    """Asked on every batch (``estimate_s``) and told after every batch (``observe``), so the fit is
    updated when told and the estimate is one multiply-add."""

    __slots__ = ("_by_rows", "_memory", "_sums", "observed", "per_batch_s", "per_row_s")

    def __init__(self, memory: float = 0.9) -> None:
        self._memory = memory
        self._by_rows: dict[int, float] = {}  # rows -> moving average of seconds, least recent first
        self._sums = [0.0, 0.0, 0.0, 0.0]  # over the table: x, y, x*x, x*y (kept, not recomputed)
        # the fitted line, read (not written) by the batcher: the fixed cost of one call whatever its
        # rows (what merging requests saves), and the cost of each row
        self.per_row_s = self.per_batch_s = 0.0
        self.observed = 0

    def observe(self, rows: int, seconds: float) -> None:
        by_rows, sums = self._by_rows, self._sums
        previous = by_rows.pop(rows, None)  # re-inserted last: the dict is ordered by recency
        if previous is None:
            self._account(rows, seconds, 1.0)
        else:  # the size's average moves: only the sums over seconds change (on every batch: inline)
            seconds = previous * self._memory + seconds * (1 - self._memory)
            sums[1] += seconds - previous
            sums[3] += rows * (seconds - previous)
        by_rows[rows] = seconds
        if len(by_rows) > SIZES_KEPT:
            oldest = next(iter(by_rows))
            self._account(oldest, by_rows.pop(oldest), -1.0)
        self.observed += 1
        self._fit()

    def _account(self, rows: int, seconds: float, sign: float) -> None:
        sums = self._sums
        sums[0] += sign * rows
        sums[1] += sign * seconds
        sums[2] += sign * rows * rows
        sums[3] += sign * rows * seconds

    def _fit(self) -> None:
        count = len(self._by_rows)
        sum_x, sum_y, sum_xx, sum_xy = self._sums
        mean_x, mean_y = sum_x / count, sum_y / count
        if count == 1:
            self.per_row_s, self.per_batch_s = (mean_y / mean_x, 0.0) if mean_x > 0 else (0.0, mean_y)
            return
        variance = sum_xx / count - mean_x * mean_x
        slope = (sum_xy / count - mean_x * mean_y) / variance if variance > 0 else 0.0
        self.per_row_s = slope = slope if slope > 0.0 else 0.0
        intercept = mean_y - slope * mean_x
        self.per_batch_s = intercept if intercept > 0.0 else 0.0

    def estimate_s(self, rows: int) -> float | None:
        """Predicted seconds for a batch of ``rows``; None before the first batch."""
        if not self.observed:
            return None
        return self.batch_s(rows)

    def batch_s(self, rows: int) -> float:
        """The fitted line at ``rows`` (0 before the first batch: ask ``observed`` first)."""
        return self.per_row_s * rows + self.per_batch_s

    def recent_s(self, rows: int) -> float | None:
        """The moving average of batches of exactly ``rows``, None if none was seen (or it was dropped).

        What decides between paths for a size that keeps running (the thread runner's inline choice):
        the line is fitted over every size ever seen, so after a burst of large batches measured under
        load its value at 1 row can stay far above what batches of one take now, and a decision made
        on it would never be revisited."""
        return self._by_rows.get(rows)
