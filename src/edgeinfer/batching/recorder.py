"""What a model version's batcher records: Triton's statistics and the Prometheus histograms, in one place.

The batcher says what happened (a request started after waiting, a batch ran, a request was answered);
this object turns it into both views, so the batcher knows nothing about either format. Called on the
event loop only, so nothing here takes a lock; the records are made once the loop iteration's answers
are written (``afterwards.py``).
"""

from __future__ import annotations

import time

from edgeinfer.afterwards import Afterwards
from edgeinfer.batching.stats import ModelStatistics
from edgeinfer.metrics import ModelMetrics
from edgeinfer.runners import BatchTimes


class BatchRecorder:
    def __init__(self, metrics: ModelMetrics) -> None:
        self.metrics = metrics
        self.stats = ModelStatistics()
        self._afterwards = Afterwards()

    def started(self, waited_s: float) -> None:
        """A request left the queue for a batch after waiting ``waited_s``."""
        self._afterwards.call(self._started, waited_s)

    def batch_done(self, rows: int, requests: int, times: BatchTimes) -> None:
        self._afterwards.call(self._batch_done, rows, requests, times)

    def ran_alone(self, rows: int, times: BatchTimes | None, succeeded: bool, elapsed_s: float) -> None:
        """A request ran at once in a batch of its own, inline: ``started``, ``batch_done`` (``times``:
        None if the batch failed) and ``answered`` in one record (the light-load path)."""
        self._afterwards.call(self._ran_alone, rows, times, succeeded, elapsed_s)

    def _ran_alone(self, rows: int, times: BatchTimes | None, succeeded: bool, elapsed_s: float) -> None:
        self._started(0.0)
        if times is not None and times.infer_ns:
            self._batch_done(rows, 1, times)
        self._answered(succeeded, elapsed_s)

    def refused(self, reason: str) -> None:
        """A request was refused before it was queued (``reason``: queue_full, slo or deadline); Triton's
        statistics count it as a failure, as they count one that failed in the queue."""
        self._afterwards.call(self._refused, reason)

    def answered(self, succeeded: bool, elapsed_s: float) -> None:
        """A request got its result (or error, or was cancelled) ``elapsed_s`` after it was queued."""
        self._afterwards.call(self._answered, succeeded, elapsed_s)

    def _started(self, waited_s: float) -> None:
        self.stats.queue.add(int(waited_s * 1e9))
        self.metrics.queue.observe(waited_s)

    def _batch_done(self, rows: int, requests: int, times: BatchTimes) -> None:
        self.stats.record_batch(rows, requests, times)
        self.metrics.batch_done(rows, times.infer_ns / 1e9)

    def _refused(self, reason: str) -> None:
        self.metrics.refused_one(reason)
        self.stats.fail.add(0)

    def _answered(self, succeeded: bool, elapsed_s: float) -> None:
        if succeeded:
            self.stats.success.add(int(elapsed_s * 1e9))
            self.stats.last_inference_ms = int(time.time() * 1000)
        else:
            self.stats.fail.add(int(elapsed_s * 1e9))
