"""How long a request waits before the server even reads it: the event loop's lag, and its turns.

When the event loop is the bottleneck (a small model served at its limit), requests do not queue in a
batcher; they wait in the sockets' buffers, where admission cannot see them. ``LoopLag`` measures that
wait from inside:

* the *lag*: a timer due every ``INTERVAL_S`` measures how late it runs (``next_lag``: up at once with
  a late tick, down gradually, so one quiet tick inside a busy period does not hide it);
* the *turn*: within one iteration the loop reads every socket that was ready when it polled, one after
  another, and the timer learns of a long iteration only after it. ``waited_s`` is the lag plus the time
  since the loop read the first request of this iteration (clock time: the request did wait);
  ``turn_s`` is how long recent turns took, in the loop thread's CPU time, not the clock's, because
  time lost to being descheduled does not recur in the next turns;
* the *idle ticks* (on time, and no request read since the tick before), in which the admission margin
  learned under load calms down (``margin.py``).

Two uses. Admission (``admission.py``) counts ``waited_s``, with the turns still ahead of the request
(``TURNS_TO_ANSWER``), as part of its wait, and refuses it before it is decoded once that is more than
its SLO allows; adaptive batching (``batcher.py``) stops running a lone request at once while the loop
lags, so that the requests read in the same iteration merge. Refusing costs less than answering, so
judging the wait in the sockets lets the loop catch up (docs/design/admission.md, "The lag and the
turns"). Cheap: 200 timer callbacks a second while requests come, none after ``IDLE_S`` without one; one
callback per iteration that reads an inference request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

INTERVAL_S = 0.005
TIMER_SLACK_S = 0.001  # libuv's timers have millisecond resolution: lateness below this is not lag
FALL = 0.8  # each on-time tick keeps this share of the lag
GONE_S = TIMER_SLACK_S / 10  # a falling lag below this is over: 0 (not a tail that never quite ends)
IDLE_S = 1.0  # no request for this long: stop ticking (an idle box wakes for nothing)


def next_lag(lag_s: float, late_s: float) -> float:
    """The lag after a tick that ran ``late_s`` after it was due: up at once, down gradually, and 0 once
    it has fallen below ``GONE_S``. Exactly 0 matters: the hot path asks only whether there is a lag at
    all, and a geometric fall alone would leave a few nanoseconds of it for many seconds after one late
    tick, making every light-load request take the slower under-load path all that time."""
    late = max(0.0, late_s - TIMER_SLACK_S)
    if late > lag_s:
        return late
    falling = lag_s * FALL + late * (1 - FALL)
    return falling if falling >= GONE_S else 0.0


class LoopLag:
    """One per event loop (the composition root's); ``lag_s`` is read on the hot path. ``call_soon``
    schedules the end of a turn (default: the running loop's; a test gives its own to end turns)."""

    __slots__ = (
        "_call_soon",
        "_handle",
        "_last_use",
        "_loop",
        "_turn_cpu",
        "_turn_started",
        "idle_ticks",
        "lag_s",
        "turn_s",
        "turns",
    )

    def __init__(self, call_soon: Callable[[Callable[[], None]], object] | None = None) -> None:
        self._call_soon = call_soon
        self.lag_s = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_use = time.monotonic()
        self._turn_started: float | None = None  # when this loop iteration read its first request
        self._turn_cpu = 0.0  # the loop thread's CPU time then (``time.thread_time``)
        self.turns = 0  # turns over so far: equal numbers, the same iteration
        self.idle_ticks = 0  # ticks so far that came on time with no request read since the one before
        # how long recent turns took, in the loop thread's CPU time: up at once with a long one, down
        # gradually with each shorter one and each on-time tick (after an overload the loop is idle and
        # turns are few: the ticks are what brings it down; docs/design/admission.md)
        self.turn_s = 0.0

    def waited_s(self, now: float) -> float:
        """How long a request read ``now`` (monotonic) has waited at least: the lag, plus the time since
        the first request of this loop iteration was read (the first one starts the turn: 0)."""
        self._last_use = now
        started = self._turn_started
        if started is None:
            self._turn_started = now
            self._turn_cpu = time.thread_time()
            if self._call_soon is not None:
                self._call_soon(self._turn_over)
            else:
                asyncio.get_running_loop().call_soon(self._turn_over)
            return self.lag_s
        return self.lag_s + (now - started)

    def _turn_over(self) -> None:
        """Runs at the start of the next iteration: the requests it reads start a new turn."""
        started = self._turn_started
        self._turn_started = None
        self.turns += 1
        if started is not None:
            took = time.thread_time() - self._turn_cpu  # the loop's work, not time it was descheduled
            self.turn_s = took if took > self.turn_s else self.turn_s * FALL + took * (1 - FALL)

    def used(self, now: float) -> None:
        """A request came (``now``: monotonic): keep measuring, or start again after an idle spell."""
        self._last_use = now
        if self._handle is None:
            self.start()

    def start(self) -> None:
        """Start ticking on the running loop (again, if it ran on another loop before)."""
        loop = asyncio.get_running_loop()
        if self._handle is not None and self._loop is loop:
            return
        self.stop()
        self._loop = loop
        self._schedule(time.monotonic())

    def _schedule(self, now: float) -> None:
        assert self._loop is not None
        due = now + INTERVAL_S
        self._handle = self._loop.call_at(self._loop.time() + INTERVAL_S, self._tick, due)

    def _tick(self, due: float) -> None:
        now = time.monotonic()
        late_s = now - due
        self.lag_s = next_lag(self.lag_s, late_s)
        if late_s <= TIMER_SLACK_S:  # on time: the loop is not behind, and long turns are past
            self.turn_s = next_lag(self.turn_s, 0.0)
            if now - self._last_use > INTERVAL_S:
                self.idle_ticks += 1
        if now - self._last_use > IDLE_S:
            self._handle = None
            self.lag_s = self.turn_s = 0.0
            return
        self._schedule(now)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
