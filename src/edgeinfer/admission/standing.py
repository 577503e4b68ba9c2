"""A queue that stands under an overload is kept to half the SLO: the same throughput, half the wait.

Admission (``batcher.py``) lets a request in while it is predicted to finish within its SLO. Offered
more than it can serve, a model's queue then fills until the newest admitted request is predicted to
finish just at its SLO, and stays that deep: every answer waits nearly the whole SLO, and whenever the
queue drains more slowly than measured for a moment (a stall, a busy core), a burst of the requests
queued then misses it. A queue that deep does nothing for throughput that a shallower one would not:
either way the runner always has its next batch waiting. It is worth its depth only while it absorbs
a burst that passes, and such a queue empties again.

So once batches have started with a request that had used more than half its SLO (``KEEP``), for half
an SLO's time without the queue ever emptying, the queue *stands*: admission then holds back the other
half of the SLO (``cut_s``), and lets in only requests predicted to finish within the first half. It
stands until a batch starts and leaves the queue empty. The half kept is never less than three full
batches (``BATCHES_KEPT``: the one running, a full one queued behind it, and the newcomer's own), so a
model that batches still forms full batches from what it keeps. A model whose requests do not wait in
its queue (one fast enough to run on the event loop, where the wait is in the sockets: ``lag.py``)
never has a standing queue; nor does one offered less than it serves, whose queue empties between
bursts.

Measured with `cnn` over JSON (SLO 600 ms, an image 11.7-13.8 ms: it sustained about 70/s) offered
150/s for 10 s on fresh servers, three rounds alternating (docs/batching.md has the runs): admitted
p99 475-499 ms and no answer after its SLO, against 601-697 ms and 9-37 answers after it, in bursts;
752-821 answered against 728-796, refusals at p99 7.4-7.6 ms against 6.8-8.5 ms. What is left of the
p99 is the overload's first second, before the queue has stood long enough: from 1.5 s on, answers
took at most 322-329 ms. At 63/s (0.9 of what it sustained) it refused none of about 630 requests in
each of three runs (0-2 without).
"""

from __future__ import annotations

KEEP = 0.5  # of the SLO: deeper than this for this long is a standing queue, then kept to it
BATCHES_KEPT = 3  # full batches' time the kept part of the SLO holds at least


class StandingQueue:
    """Whether a model's queue stands (``standing``), from the batches it starts; ``cut_s``: what
    admission then holds back of the SLO."""

    __slots__ = ("_deep_since", "_keep_s", "cut_s", "slo_s", "standing")

    def __init__(self, slo_s: float) -> None:
        self.slo_s = slo_s
        self._keep_s = KEEP * slo_s
        self._deep_since: float | None = None  # batches have started deep since then, the queue never empty
        self.standing = False
        self.cut_s = 0.0

    def started(self, now: float, oldest_age_s: float, queue_left: bool, full_batch_s: float) -> None:
        """A batch started at ``now``; its oldest request had used ``oldest_age_s`` of its SLO; requests
        were still queued after it (``queue_left``) or not; a full batch takes ``full_batch_s`` (the
        cost model's; read only when requests were left, so a caller may pass 0 otherwise)."""
        if not queue_left:  # the queue emptied: whatever came, it was absorbed
            self._deep_since, self.standing, self.cut_s = None, False, 0.0
        elif oldest_age_s > self._keep_s:
            if self._deep_since is None:
                self._deep_since = now
            elif not self.standing and now - self._deep_since >= self._keep_s:
                kept_s = max(self._keep_s, BATCHES_KEPT * full_batch_s)
                self.standing, self.cut_s = True, max(0.0, self.slo_s - kept_s)
        elif not self.standing:
            self._deep_since = None  # a shallow start ends a deep spell before it counts
