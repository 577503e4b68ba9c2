"""What a batch of n rows costs, learned from the batches a runner ran.

The model is the one batch time follows on most hardware, ``a * rows + b`` (a per-row cost and a fixed
cost per call). Each batch size seen keeps its own moving average (a new batch weighs ``1 - memory``),
and the line is fitted over the sizes, each size counting once. So the estimate follows a machine that
slows down or speeds up, and what warmup measured at the largest batch is not forgotten while traffic
runs batches of one: a fit over recent batches only would forget the slope, decide batching does not
pay, run batches of one, and never learn otherwise. While one size has been seen, the fixed part cannot
be told apart, and the estimate is proportional to rows. Pure arithmetic: no clock, no event loop.

One slow batch must not bend the line for long, because the line decides whether merging pays, and
while it says no only batches of one run, so nothing measured corrects it (a fresh server could settle
on running every request alone: docs/design/batching-experiments.md, "Not stuck on one slow batch";
docs/design/batcher.md, "Merge trials"). Batches are measured slow, never fast, for reasons that are
not the model's: the first run of a shape (ONNX Runtime plans its memory then), a run preempted by
another process on the same cores. So:

* a size's first batch is provisional: the second sets its average to the faster of the two;
* from then on a batch counts at most ``CLIP`` times the size's average (a real slowdown still moves
  the average, by up to ``CLIP - 1`` x ``1 - memory`` a batch);
* the line is fitted over the sizes seen at least twice once there are two of them; before that, over
  every size seen (a fresh server knows warmup's sizes once each).
"""

from __future__ import annotations

SIZES_KEPT = 32  # distinct batch sizes remembered (the least recently seen is dropped)
CLIP = 2.0  # a batch counts at most this many times its size's average


class CostModel:
    """Asked on every batch (``estimate_s``) and told after every batch (``observe``), so the fit is
    updated when told and the estimate is one multiply-add."""

    __slots__ = ("_by_rows", "_every", "_memory", "_twice", "observed", "per_batch_s", "per_row_s")

    def __init__(self, memory: float = 0.9) -> None:
        self._memory = memory
        # rows -> [moving average of seconds, batches seen], least recent first
        self._by_rows: dict[int, list[float]] = {}
        # over the sizes kept (``_every``) and those seen at least twice (``_twice``): the number of
        # sizes, then the sums of x, y, x*x, x*y (kept as sizes come and go, not recomputed)
        self._every = [0.0, 0.0, 0.0, 0.0, 0.0]
        self._twice = [0.0, 0.0, 0.0, 0.0, 0.0]
        # the fitted line, read (not written) by the batcher: the fixed cost of one call whatever its
        # rows (what merging requests saves), and the cost of each row
        self.per_row_s = self.per_batch_s = 0.0
        self.observed = 0

    def observe(self, rows: int, seconds: float) -> None:
        by_rows = self._by_rows
        entry = by_rows.pop(rows, None)  # re-inserted last: the dict is ordered by recency
        if entry is None:
            entry = [seconds, 1.0]
            _account(self._every, rows, seconds, 1.0)
        else:
            previous, seen = entry
            if seen == 1.0:  # the provisional first batch: the faster of the two counts
                average = seconds if seconds < previous else previous
                _account(self._twice, rows, average, 1.0)
            else:
                limit = CLIP * previous
                counted = seconds if seconds < limit else limit
                average = previous * self._memory + counted * (1 - self._memory)
                _move(self._twice, rows, average - previous)
            _move(self._every, rows, average - previous)
            entry[0], entry[1] = average, seen + 1.0
        by_rows[rows] = entry
        if len(by_rows) > SIZES_KEPT:
            oldest = next(iter(by_rows))
            average, seen = by_rows.pop(oldest)
            _account(self._every, oldest, average, -1.0)
            if seen > 1.0:
                _account(self._twice, oldest, average, -1.0)
        self.observed += 1
        self._fit(self._twice if self._twice[0] >= 2 else self._every)

    def _fit(self, sums: list[float]) -> None:
        count, sum_x, sum_y, sum_xx, sum_xy = sums
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
        entry = self._by_rows.get(rows)
        return None if entry is None else entry[0]


def _account(sums: list[float], rows: int, seconds: float, sign: float) -> None:
    """Add (``sign`` 1) or take away (-1) one size's point."""
    sums[0] += sign
    sums[1] += sign * rows
    sums[2] += sign * seconds
    sums[3] += sign * rows * rows
    sums[4] += sign * rows * seconds


def _move(sums: list[float], rows: int, delta: float) -> None:
    """One size's average moved by ``delta``: only the sums over seconds change."""
    sums[2] += delta
    sums[4] += rows * delta
