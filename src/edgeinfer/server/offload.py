"""The thread the event loop hands CPU work to (decoding large JSON bodies): below every other thread,
unless that starves the work.

Why below: under overload the event loop, the inference threads, this thread and often the client
share the cores. A decode that waits delays only its own request; the loop waiting delays every
refusal. A ``SCHED_IDLE`` thread (Linux) gives the CPU up at once to any other thread that wakes,
where nice +10 only lowers its share (docs/design/json-scan.md; docs/design/batching-experiments.md,
"Decoding off the loop").

Why not always: against a normal thread a ``SCHED_IDLE`` one has a share of 3 to 1024, so while other
processes keep every CPU busy it barely runs. So each run measures its wall time against its own CPU
time (``Starvation``): while the idle thread's runs take many times their CPU time (and milliseconds
more), the work goes to a nice +10 thread, and it goes back once that thread's runs find the CPU free
again. Ratios, not durations: what a run costs differs by machine and body, how much of the CPU it got
does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)

STARVED_RATIO = 8.0  # wall / CPU time of the idle thread's runs above which the work moves to the low one
FREE_RATIO = 2.0  # ... and of the low thread's runs below which it moves back
DECAY = 0.75  # of the sums at each run: the last four or so runs count most
LOW_NICE = 10  # added to the low thread's nice value


class Starvation:
    """Which thread the next run goes to, from the wall and CPU times of the last runs (no clock, no
    threads: the caller measures). The ratio is of their sums, older runs counting less (``DECAY``):
    a short run held up by the loop (its result waits for the loop's next iteration) weighs as little
    as the work it did. ``shortest_wait_s``: less waiting than this, in the sums, moves nothing
    whatever the ratio: the hop to the thread and back, and a thread's first start, cost a fixed
    fraction of a millisecond, many times the CPU of a small run (docs/design/json-scan.md). Starts on
    the idle thread."""

    def __init__(self, shortest_wait_s: float) -> None:
        self.starved = False  # the idle thread does not get the CPU: runs go to the low one
        self._shortest_wait_s = shortest_wait_s
        self._wall_s = 0.0  # decayed sums over the runs on the thread now in use
        self._cpu_s = 0.0

    @property
    def ratio(self) -> float:
        """Wall time to CPU time of the recent runs on the thread now in use (1 before any)."""
        return self._wall_s / self._cpu_s if self._cpu_s > 0 else 1.0

    def ran(self, on_idle: bool, wall_s: float, cpu_s: float) -> None:
        """A run on the idle thread (``on_idle``) or the low one took ``wall_s``, of which ``cpu_s`` on
        the CPU. Runs on the thread no longer in use (handed out before a switch) say nothing new."""
        if on_idle == self.starved or cpu_s <= 0:
            return
        self._wall_s = self._wall_s * DECAY + wall_s
        self._cpu_s = self._cpu_s * DECAY + cpu_s
        if on_idle:
            if self.ratio > STARVED_RATIO and self._wall_s - self._cpu_s > self._shortest_wait_s:
                self.starved = True
                self._wall_s = self._cpu_s * STARVED_RATIO  # the low thread has to show a free CPU
        elif self.ratio < FREE_RATIO:
            self.starved = False
            self._wall_s = self._cpu_s


class OffloadThread:
    """Runs functions off the event loop on one thread at a time, idle or low (``Starvation``)."""

    def __init__(self, name: str) -> None:
        self.name = name
        # waits shorter than the interpreter's own turns between threads say nothing about the CPU
        self.starvation = Starvation(sys.getswitchinterval())
        self._workers: dict[bool, _Worker] = {}  # idle (True) and low, each made with its first run

    async def run(self, work: Callable[[], T]) -> T:
        """``work()``, on the thread that ``starvation`` picks. Its wall time runs from when it could
        have started (submitted, or when the run before it on the same thread was done: waiting behind
        other work is not starvation) to when the loop has its result: a ``SCHED_IDLE`` thread that has
        run for a while waits long for its next turn, which may come after its work is done and before
        its result is handed over (docs/design/json-scan.md)."""
        on_idle = not self.starvation.starved
        worker = self._worker(on_idle)
        submitted = time.perf_counter()
        result, cpu_s = await asyncio.get_running_loop().run_in_executor(worker.executor, _timed, work)
        now = time.perf_counter()
        wall_s, starved = now - max(submitted, worker.done_at), self.starvation.starved
        self.starvation.ran(on_idle, wall_s, cpu_s)
        worker.done_at = now
        if self.starvation.starved != starved:
            self._moved(wall_s, cpu_s)
        return result

    def _moved(self, wall_s: float, cpu_s: float) -> None:
        if self.starvation.starved:
            log.warning(
                "%s: other work on this machine leaves the idle thread little CPU (%.1f ms for %.1f ms "
                "of work); running at nice +%d until the CPU is free again",
                self.name,
                wall_s * 1000,
                cpu_s * 1000,
                LOW_NICE,
            )
        else:
            log.info("%s: the CPU is free again; running on the idle thread", self.name)

    def _worker(self, idle: bool) -> _Worker:
        worker = self._workers.get(idle)
        if worker is None:
            name, lower = (f"{self.name}-idle", _run_idle) if idle else (f"{self.name}-low", _run_low)
            worker = self._workers[idle] = _Worker(ThreadPoolExecutor(1, name, lower))
        return worker


@dataclass(slots=True)
class _Worker:
    executor: ThreadPoolExecutor  # of one thread
    done_at: float = 0.0  # when the loop last had a result from it


def _timed(work: Callable[[], T]) -> tuple[T, float]:
    """On the thread: ``work``'s result and the thread's CPU time in it."""
    cpu = time.thread_time()
    return work(), time.thread_time() - cpu


def _run_idle() -> None:
    """Make the calling thread ``SCHED_IDLE`` (Linux; elsewhere it stays as it is, and so do its
    ratios: it is never starved by a policy it does not have). Where a sandbox forbids the policy
    (a seccomp profile), it is lowered as the low thread is instead."""
    if sys.platform == "linux":
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except OSError:
            _run_low()


def _run_low() -> None:
    """Add ``LOW_NICE`` to the calling thread's nice value (Linux only: elsewhere the call would lower
    the whole process)."""
    if sys.platform == "linux":
        with contextlib.suppress(OSError):
            thread = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, thread, os.getpriority(os.PRIO_PROCESS, thread) + LOW_NICE)
