"""A queue that stands under an overload is kept to half the SLO: the same throughput, half the wait.

Offered more than it can serve, a model's queue fills until the newest admitted request is predicted to
finish just at its SLO, and stays that deep. So once batches have started with a request that had used
more than half its SLO (``KEEP``), for half an SLO's time without the queue ever emptying, the queue
*stands*: admission (``admission.py``) then holds back the other half of the SLO (``cut_s``), and lets
in only requests predicted to finish within the first half. It stands until a batch starts and leaves
the queue empty. The half kept is never less than three full batches (``BATCHES_KEPT``: the one
running, a full one queued behind it, and the newcomer's own), so a model that batches still forms full
batches from what it keeps. A model whose requests do not wait in its queue (one fast enough to run on
the event loop, where the wait is in the sockets: ``lag.py``) never has a standing queue; nor does one
offered less than it serves, whose queue empties between bursts.

Why: a queue that deep does nothing for throughput that a shallower one would not (the runner always has
its next batch waiting), and whenever it drains more slowly than measured a burst of its requests
misses (docs/design/admission.md, "The standing queue"; docs/design/batching-experiments.md, "A queue
that stands").
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
