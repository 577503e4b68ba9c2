"""``QueueView``: what admission reads of one model version's queue."""

from __future__ import annotations


class QueueView:
    """Kept by the batcher as requests come and go, read by admission: per priority level the requests
    and rows queued, how many are queued in all, the batches running and their rows, and the requests
    let in before decoding that are still being decoded off the loop. Counted as they change, so that
    judging a request costs the same with 1 or 1,000 queued (it runs on every request)."""

    __slots__ = ("arriving", "pending", "queued", "running", "running_rows")

    def __init__(self) -> None:
        self.queued: dict[int, list[int]] = {}  # priority -> [requests, rows]
        self.pending = 0
        self.running = 0
        self.running_rows = 0
        self.arriving = 0

    def count(self, priority: int, rows: int, sign: int) -> None:
        """A request of ``rows`` at ``priority`` joined the queue (``sign`` 1) or left it (-1)."""
        counts = self.queued.get(priority)
        if counts is None:
            counts = self.queued[priority] = [0, 0]
        counts[0] += sign
        counts[1] += sign * rows
        self.pending += sign
        if not counts[0]:
            del self.queued[priority]

    def ahead(self, priority: int) -> tuple[int, int]:
        """The requests and rows queued ahead of a new request of ``priority``: at its level or a
        higher one (a lower number)."""
        requests_ahead = rows_ahead = 0
        for level, (count, rows_queued) in self.queued.items():
            if level <= priority:
                requests_ahead += count
                rows_ahead += rows_queued
        return requests_ahead, rows_ahead

    @property
    def busy(self) -> bool:
        """Something is queued or running."""
        return bool(self.pending or self.running)
