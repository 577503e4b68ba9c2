"""How long a request waits before the server even reads it: the event loop's lag.

When the event loop is the bottleneck (a small model served at its limit: parsing and answering
requests is most of the work), requests do not queue in a batcher; they wait in the sockets' buffers
until the loop gets to them, where admission control cannot see them. The loop's lag is the same wait
seen from inside: a timer due every ``INTERVAL_S`` measures how late it runs. It rises at once with a
late tick and falls back gradually, so one quiet tick inside a busy period does not hide it.

The timer sees only the loop's lateness between iterations. Within one iteration the loop reads every
socket that was ready when it polled, one after another, so a request read late in a long iteration
waited for all those read before it, and the timer learns of it only after the iteration. So the
*turn* is measured too: ``waited_s`` is the lag plus the time since the loop read the first request
of this iteration, and ``turn_s`` how long recent turns took (what a request admitted now still has
ahead of it is counted in turns: ``batcher.TURNS_TO_ANSWER``). With admission on the timer's lag
alone, `tiny` offered twice what it sustains (9,000 requests/s) had its admitted requests answered in
115 ms at p99 and its refusals in 56-63 ms (SLO 9.5 ms): the iterations themselves were the wait.

A turn's length is taken in the loop thread's CPU time, not the clock's: what predicts the next turns
is the work the loop does in one, and time it lost to being descheduled does not recur. Under a light
load (`tiny` at 3,000/s, client and server on the same two cores) some iterations took 3.6-5 ms (about
a scheduler tick: 4 ms at 250 Hz) after their last read, with no Python running; with the server's
event loop and the client pinned to a core each, no request was refused at that rate in three runs,
against 3, 3 and 93 unpinned. Counted in clock time, such a turn made the next requests, which had
waited 0.1-0.3 ms, look two such turns from an answer: refused. Measured on fresh servers, three
rounds alternating (`tiny`, SLO 4.1 ms, the benchmark's server, 3 s steps), CPU time against clock
time: at 3,000/s 0 refusals in each round against 0, 8 and 41; at 18,000/s (about 0.9 of what it
sustains) 96.5-99.2 % answered against 79.7-98.0 %, p99 within the SLO in both; at 41,000/s (2x) the
admitted p99 3.6-3.8 ms against 3.4-3.6 ms, 5.7-8.2 % answered against 10.3-11.1 %. Three more rounds
at 18,000/s and 41,000/s: 86.1-97.5 % against 64.9-97.3 %, and at 2x the admitted p99 3.3-3.7 ms
against 4.7-23 ms (the SLO missed in all three). The request's own wait (``waited_s``) stays in clock
time: it did wait.

Two uses (``batcher.py``). Admission counts it as part of a request's wait: a request that has waited
``waited_s``, with the turns still ahead of it, is refused before it is decoded once that is more than
its SLO allows, and refusing costs less than answering, so the loop catches up. And adaptive batching
stops running a lone request at once while the loop lags: a model fast enough to run inline would
otherwise answer every request alone, in the order the loop reads them, and never merge the ones read
in the same iteration. The timer also counts its idle ticks (on time, and no request read since the
tick before): in such a spell the admission margin, learned under load, calms down (``margin.py``).
Cheap: 200 timer callbacks a second while requests come, none after ``IDLE_S`` without one; one
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
        # gradually with each shorter one
        # and each on-time tick (after an overload the loop is idle, and turns are few: the ticks are
        # what brings it down; it was 20 ms, and the first requests after it were refused for it)
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
