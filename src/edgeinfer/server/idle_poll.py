"""Poll the sockets for a moment after the last answer instead of sleeping at once.

Why: a loop with nothing to do sleeps in ``epoll_wait``, and its CPU goes idle; the next request then
waits for that CPU to wake, which on a virtual machine is as much as a small model's whole request, and
a client that sends its next request as soon as it has the answer (concurrency 1, a pipeline's steps)
pays that wake every time (docs/design/accept-and-idle-poll.md).

How long: polling costs the CPU it spins, so it is bounded by what it serves. ``SpinWindow`` polls at
most as long as the loop's own work on the answers before it took (polling never more than doubles the
loop's CPU, and costs nothing while traffic is sparse), at most twice the gaps it has caught (requests
that come back soon need no long polling), and only while it catches most of them: when fewer
than half of the polled gaps end within the window, it stops, and tries again every ``PROBE_EVERY``
idle periods. Everything it decides on is measured here, per process; nothing is a machine-speed
constant.

What it must not take: a polling loop holds the GIL between its zero-timeout polls, and a thread waiting
for it gets it only when the interpreter forces a switch (``sys.getswitchinterval()``, 5 ms). So it does
not poll while anything is in flight elsewhere (a batch in a worker thread, a gRPC request: the server's
``working``), nor longer than that interval: a thread waits no longer than Python's own scheduling
lets it. ``IdlePoll`` drives it on the loop: one ``call_soon`` per iteration keeps uvloop polling with a
zero timeout until a request arrives or the window ends.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable

WEIGHT = 1 / 8  # of a new measurement in each running average (about the last eight idle periods)
HIT_RATE_TO_POLL = 0.5  # poll while at least this share of polled gaps ends within the window
PROBE_EVERY = 16  # idle periods between tries once polling has stopped paying
GAP_MARGIN = 2.0  # the window: this many times the mean gap caught (gaps vary; a missed one costs a wake)


class SpinWindow:
    """How long to poll after going idle, from what the last idle and busy periods measured (no clock,
    no loop: the caller measures)."""

    def __init__(self) -> None:
        self.work_s: float | None = None  # running mean of the busy time before each idle period
        self.caught_s: float | None = None  # running mean of the gaps that ended while polling
        self.hit_rate = 1.0  # running share of the polled idle periods that ended within the window
        self._unpolled = 0  # idle periods in a row without polling (for the probes)

    def worked(self, busy_s: float) -> None:
        """The loop spent ``busy_s`` of CPU from the request that ended an idle period to this one."""
        self.work_s = _moved(self.work_s, busy_s)

    def ended(self, gap_s: float, window_s: float) -> None:
        """An idle period that was given ``window_s`` of polling ended ``gap_s`` after it began."""
        if window_s <= 0:
            return  # a slept gap includes the wake: it says nothing about what polling would catch
        caught = gap_s <= window_s
        self.hit_rate = _moved(self.hit_rate, 1.0 if caught else 0.0)
        if caught:
            self.caught_s = _moved(self.caught_s, gap_s)

    def window_s(self, longest_s: float) -> float:
        """Seconds to poll in the idle period beginning now (0: sleep at once), at most ``longest_s``."""
        budget = self.work_s
        if not budget:
            return 0.0
        budget = min(budget, longest_s)
        if self.hit_rate < HIT_RATE_TO_POLL:
            self._unpolled += 1
            if self._unpolled < PROBE_EVERY:
                return 0.0
            self._unpolled = 0
            return budget  # a probe: do requests come back soon again?
        self._unpolled = 0
        if self.caught_s is None:
            return budget
        return min(budget, GAP_MARGIN * self.caught_s)


def _moved(mean: float | None, value: float) -> float:
    """A running mean after one more ``value`` (the first value starts it)."""
    return value if mean is None else mean + (value - mean) * WEIGHT


class IdlePoll:
    """Keeps the running loop polling through a ``SpinWindow`` after the server goes idle.

    The HTTP server calls ``arrived`` when request bytes come in and ``idle`` when it has answered
    everything in flight; ``working`` says whether anything else is (then it does not poll). The work
    between the two is the loop's own CPU time (``time.thread_time``): a request that waited for a model
    in a worker thread buys no longer polling than one answered inline.

    The server is idle only if nothing more arrives in the rest of the loop iteration: ``idle`` notes
    when, and the decision (the work measured, the window) is made once, at the start of the next
    iteration, before the loop polls its sockets again. Under load one iteration reads and answers
    many requests, each answer leaving nothing in flight for a moment (a refusal, a model run inline);
    deciding at each of them cost the loop a share of its time under an overload of refusals, and counted
    the next socket's request, read microseconds later in the same iteration, as a gap the polling had
    caught (docs/design/accept-and-idle-poll.md)."""

    def __init__(self, working: Callable[[], bool] = lambda: False) -> None:
        self.policy = SpinWindow()
        self._working = working
        self._answered_at: float | None = None  # nothing in flight since then (``idle``), if so
        self._deciding = False  # the decision is due at the start of the next iteration
        self._idle_since: float | None = None  # when the idle period now on began
        self._busy_since: float | None = None  # the loop thread's CPU time when the work began
        self._window_s = 0.0
        self._until = 0.0
        self._polling = False

    @property
    def polling(self) -> bool:
        return self._polling

    def arrived(self) -> None:
        self._answered_at = None
        idle_since = self._idle_since
        if idle_since is None:
            if self._busy_since is None:  # the first request of the process
                self._busy_since = time.thread_time()
            return
        self.policy.ended(time.perf_counter() - idle_since, self._window_s)
        self._idle_since = None
        self._busy_since = time.thread_time()

    def idle(self) -> None:
        self._answered_at = time.perf_counter()
        if not self._deciding:
            self._deciding = True
            asyncio.get_running_loop().call_soon(self._decide)

    def _decide(self) -> None:
        self._deciding = False
        answered_at = self._answered_at
        if answered_at is None:  # a request came later in the same iteration: not idle
            return
        self._answered_at = None
        self._idle_since = answered_at
        if self._busy_since is not None:
            self.policy.worked(time.thread_time() - self._busy_since)
            self._busy_since = None
        if self._working():  # a batch in a worker thread, a gRPC request: polling would hold the GIL
            self._window_s = 0.0
            return
        self._window_s = window = self.policy.window_s(sys.getswitchinterval())
        if window > 0:
            self._until = answered_at + window
            if not self._polling:
                self._polling = True
                asyncio.get_running_loop().call_soon(self._poll)

    def _poll(self) -> None:
        if self._idle_since is not None and time.perf_counter() < self._until:
            asyncio.get_running_loop().call_soon(self._poll)
        else:
            self._polling = False
