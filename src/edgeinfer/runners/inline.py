"""Whether a batch runs on the event loop or in a worker thread, from what both cost on this machine.

Handing a batch to a worker thread and back (the *hop*: the executor's queue, a thread wake-up, the
result's trip back to the loop) costs tens of microseconds of latency and loop time, more on a slow
machine. A batch that computes in less than the hop costs is better run on the event loop: it blocks
the loop for less time than the hop would take. Both sides are measured, not configured (why each rule,
and what the alternatives did: docs/design/inline-execution.md):

* the hop: each batch that went to a thread alone (no other batch queued in the runner), twice the
  time from hand-over until the thread started it (the way back, a wake-up of the loop, mirrors the way
  out); the least of the last ``HOP_SAMPLES``, because one above it waited for the CPU. On the way out
  only: the way back also waits for whatever the loop is busy with, and a limit raised by a busy loop
  lets slow batches run on the loop, which makes it busier;
* a batch's inline compute time: the median of the last ``INLINE_SAMPLES`` batches of its size run
  inline, not a moving average, in which one inline batch that waited for the GIL (another thread of
  the process busy for milliseconds) could send the size to threads for good.

The rule compares the two: inline when the inline time of this size is at most the hop. Before a size
has run inline its estimate is the thread-measured time, which is often higher (the loop thread
competes for the CPU meanwhile). So a size whose thread-measured time is within ``TRIAL_WITHIN`` hops
runs inline once to measure, at once and then every ``TRIAL_EVERY`` batches sent to threads: the
outcome then depends on the model's inline time against the hop, not on where the process started. A
trial blocks the loop for at most a few hops, once in hundreds of batches.

Pure arithmetic, no clock: the thread runner tells it what happened and asks before each batch.
"""

from __future__ import annotations

from collections import deque

HOP_SAMPLES = 16  # the hop is the least of this many recent ones
HOP_NEEDED = 3  # no inline before this many hops were measured
TRIAL_EVERY = 256  # thread batches of a size between two inline trials of it
TRIAL_WITHIN = 4.0  # only sizes estimated within this many hops are tried inline
INLINE_SAMPLES = 5  # a size's inline time is the median of this many recent inline batches
SIZES_KEPT = 64  # batch sizes tracked (beyond: the tables start afresh)


class InlineChoice:
    """``fixed_s``: a configured limit instead of the measured hop (0: never inline)."""

    __slots__ = ("_fixed_s", "_hop_s", "_hops", "_inline_s", "_recent_inline", "_threaded")

    def __init__(self, fixed_s: float | None = None) -> None:
        self._fixed_s = fixed_s
        self._hops: deque[float] = deque(maxlen=HOP_SAMPLES)
        self._hop_s: float | None = None
        self._recent_inline: dict[int, deque[float]] = {}  # per batch size: its last inline times
        self._inline_s: dict[int, float] = {}  # per batch size: their median
        self._threaded: dict[int, int] = {}  # thread batches of each size since its last inline trial

    @property
    def limit_s(self) -> float | None:
        """Batches predicted to take at most this run inline; None until the hop is measured."""
        return self._fixed_s if self._fixed_s is not None else self._hop_s

    def goes_inline(self, rows: int, thread_estimate_s: float | None) -> bool:
        """Ask before a batch of ``rows`` (with nothing else of the runner in a thread).
        ``thread_estimate_s``: what the cost model predicts for it (None: nothing known)."""
        limit = self.limit_s
        if not limit:
            return False
        estimate = self._inline_s.get(rows, thread_estimate_s)
        if estimate is None:
            return False
        if estimate <= limit:
            return True
        if (thread_estimate_s if thread_estimate_s is not None else estimate) > TRIAL_WITHIN * limit:
            return False  # a slow batch: never tried on the loop
        threaded = self._threaded.get(rows, 0) + 1
        if len(self._threaded) >= SIZES_KEPT and rows not in self._threaded:
            self._threaded.clear()
        self._threaded[rows] = threaded
        return threaded % TRIAL_EVERY == 1  # the first one, then every TRIAL_EVERY

    def ran_inline(self, rows: int, seconds: float) -> None:
        recent = self._recent_inline.get(rows)
        if recent is None:
            if len(self._recent_inline) >= SIZES_KEPT:
                self._recent_inline.clear()
                self._inline_s.clear()
            recent = self._recent_inline[rows] = deque(maxlen=INLINE_SAMPLES)
        recent.append(seconds)
        self._inline_s[rows] = sorted(recent)[len(recent) // 2]

    def hopped(self, seconds: float) -> None:
        """A batch that went to a thread alone took ``seconds`` to get there and back (estimated)."""
        self._hops.append(max(0.0, seconds))
        if len(self._hops) >= HOP_NEEDED:
            self._hop_s = min(self._hops)
