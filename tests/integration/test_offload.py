"""The offload thread on a real event loop with real threads: where the work runs, and that other
processes taking every CPU move it from the idle thread to the low one, and back once they stop."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from edgeinfer.server.offload import LOW_NICE, OffloadThread

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="thread scheduling policies are Linux's")


def where() -> tuple[str, int, int]:
    """On the thread: its name, scheduling policy and nice value."""
    thread = threading.get_native_id()
    return threading.current_thread().name, os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, thread)


def work() -> tuple[str, int, int]:
    """About 2 ms of CPU on this machine, then ``where``."""
    sum(range(60_000))
    return where()


@contextmanager
def every_cpu_taken() -> Iterator[None]:
    """One spinning process more than the CPUs this process may use."""
    count = len(os.sched_getaffinity(0)) + 1
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


@linux_only
def test_work_runs_on_an_idle_thread_and_its_errors_come_back():
    async def main():
        offload = OffloadThread("test-offload")
        ran = await offload.run(where)

        def fails() -> None:
            raise ValueError("bad body")

        with pytest.raises(ValueError, match="bad body"):
            await offload.run(fails)
        return ran, threading.get_native_id()

    (name, policy, _), _ = asyncio.run(main())
    assert name.startswith("test-offload-idle")
    assert policy == os.SCHED_IDLE


@linux_only
def test_other_processes_taking_every_cpu_move_the_work_to_the_low_thread_and_back(
    caplog: pytest.LogCaptureFixture,
):
    caplog.set_level(logging.INFO, "edgeinfer.server.offload")
    loop_nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    async def main():
        offload = OffloadThread("test-offload")
        quiet = [await offload.run(work) for _ in range(3)]
        with every_cpu_taken():
            await asyncio.sleep(0.2)
            busy = [await offload.run(work) for _ in range(6)]
        freed = [await offload.run(work) for _ in range(20)]
        return quiet, busy, freed

    quiet, busy, freed = asyncio.run(main())
    assert {policy for _, policy, _ in quiet} == {os.SCHED_IDLE}
    moved = [at for at, (name, _, _) in enumerate(busy) if "-low" in name]
    assert moved, f"still on the idle thread: {busy}"
    assert moved[0] <= 3, busy
    assert all("-low" in name for name, _, _ in busy[moved[0] :]), busy
    _, policy, nice = busy[-1]
    assert (policy, nice) == (os.SCHED_OTHER, loop_nice + LOW_NICE)
    assert "-idle" in freed[-1][0], f"did not go back: {freed}"
    moves = [(record.levelname, record.getMessage()) for record in caplog.records]
    # one line a move, the moves alternating: the host may take the CPU (and give it back) more than
    # once while the test runs, so the count is not fixed, but a move is never logged twice
    assert len(moves) >= 2, moves
    assert [level for level, _ in moves] == ["WARNING", "INFO"] * (len(moves) // 2), moves
    assert all("leaves the idle thread little CPU" in message for _, message in moves[::2]), moves
    assert set(moves[1::2]) == {("INFO", "test-offload: the CPU is free again; running on the idle thread")}


@linux_only
def test_where_the_idle_policy_is_forbidden_the_idle_thread_runs_at_the_low_nice(
    monkeypatch: pytest.MonkeyPatch,
):
    """A seccomp profile may refuse ``sched_setscheduler``: the thread is then lowered by nice instead."""

    def forbidden(*_: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", forbidden)
    loop_nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    async def main():
        return await OffloadThread("test-offload").run(where)

    name, policy, nice = asyncio.run(main())
    assert name.startswith("test-offload-idle")
    assert (policy, nice) == (os.SCHED_OTHER, loop_nice + LOW_NICE)
