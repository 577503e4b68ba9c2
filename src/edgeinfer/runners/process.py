"""Batches in child processes: pure-Python models on every core, away from the server's GIL.

A ``ChildPool`` starts ``instances`` children (``python -m edgeinfer.runners.process``); each one receives
a picklable ``build`` callable, builds the model itself (so ``load()`` runs in the child) and answers with
what ``build`` reports (the model's tensors). A batch then goes to a free child: the requests are pickled
with protocol 5, so every contiguous array travels as an out-of-band buffer written straight from its
memory into the pipe, not copied into a pickle first; results come back the same way.

A child that dies while running a batch (``os._exit``, a segfault, the OOM killer) fails only that batch,
with an error naming the model and how the child ended, and is replaced in the background; the other
children keep serving. Children ignore SIGINT and SIGTERM: they stop when the server closes their pipe
(or dies), so a terminal's Ctrl-C or a service manager's SIGTERM to the whole group lets the server
drain first.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

from edgeinfer.errors import EdgeInferError, InferenceFailed, ModelLoadError
from edgeinfer.runners.base import BatchTimes, Execute, Result, RunnerSettings, Work
from edgeinfer.runners.thread import ThreadRunner

log = logging.getLogger(__name__)

# What a child runs: builds the model, returns its batch function and something picklable to report.
Build = Callable[[], tuple[Execute, Any]]

STOP_TIMEOUT_S = 5.0
MAX_RESTART_DELAY_S = 10.0


class ChildDied(Exception):
    """The pipe to a child closed in the middle of a call."""


def send(connection: Connection, value: Any) -> None:
    """Pickle ``value`` with its arrays out of band: one small message, then each buffer as it is."""
    buffers: list[pickle.PickleBuffer] = []
    header = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    connection.send_bytes(len(buffers).to_bytes(4, "big") + header)
    for buffer in buffers:
        connection.send_bytes(buffer.raw())


def receive(connection: Connection) -> Any:
    message = connection.recv_bytes()
    count = int.from_bytes(message[:4], "big")
    buffers = [connection.recv_bytes() for _ in range(count)]
    return pickle.loads(memoryview(message)[4:], buffers=buffers)


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class _Child:
    """One child process and the pipe to it."""

    def __init__(self, index: int, build: Build, name: str) -> None:
        self.index = index
        self._name = name
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "edgeinfer.runners.process", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
        )
        theirs.close()
        self._connection = Connection(ours.detach())
        send(self._connection, list(sys.path))  # first, so that unpickling ``build`` can import
        send(self._connection, build)

    def wait_ready(self) -> Any:
        try:
            status, detail = receive(self._connection)
        except (EOFError, OSError):
            code = self.process.wait()
            raise ModelLoadError(
                f"model {self._name}: process instance {self.index} ended while loading "
                f"({describe_exit(code)})"
            ) from None
        if status != "ready":
            self.stop()
            raise ModelLoadError(f"model {self._name}: process instance {self.index}: {detail}")
        return detail

    def call(self, batch: list[Work]) -> tuple[list[Result], BatchTimes]:
        """Run a batch in the child. The times are the child's, with the trip added: sending the inputs
        (pickling, the pipe) counts as input time, the rest of the round trip as output time, so what a
        batch costs here (the cost model, the statistics) includes what a process instance adds."""
        try:
            started = time.perf_counter_ns()
            send(self._connection, batch)
            sent = time.perf_counter_ns()
            status, *answer = receive(self._connection)
            finished = time.perf_counter_ns()
        except (EOFError, OSError):
            raise ChildDied(self.describe_death()) from None
        if status == "raise":
            raise answer[0]
        results, times = answer[0], answer[1]
        in_child = times.input_ns + times.infer_ns + times.output_ns
        times.input_ns += sent - started
        times.output_ns += max(0, finished - sent - in_child)
        return results, times

    def describe_death(self) -> str:
        try:
            code = self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        return (
            f"model {self._name}: process instance {self.index} (pid {self.process.pid}) died while "
            f"running the batch ({describe_exit(code)})"
        )

    def stop(self) -> None:
        self._connection.close()  # the child's next read ends: it exits
        try:
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class ChildPool:
    """``instances`` children of one model version; ``call`` runs a batch on a free one (blocking)."""

    def __init__(self, build: Build, name: str, instances: int) -> None:
        self._build = build
        self._name = name
        self.instances = instances
        self._idle: queue.SimpleQueue[_Child] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._children: set[_Child] = set()
        self._replacing = 0
        self._closed = False
        self._last_failure = ""
        started = [_Child(index, build, name) for index in range(instances)]
        self._children.update(started)
        try:
            reports = [child.wait_ready() for child in started]
        except BaseException:
            self.close()
            raise
        self.info = reports[0]
        for child in started:
            self._idle.put(child)

    def call(self, batch: list[Work], times: BatchTimes) -> list[Result]:
        child = self._take()
        try:
            results, measured = child.call(batch)
        except ChildDied as death:
            self._replace(child, str(death))
            raise InferenceFailed(str(death)) from None
        except BaseException:
            self._idle.put(child)
            raise
        self._idle.put(child)
        times.input_ns, times.infer_ns, times.output_ns = (
            measured.input_ns,
            measured.infer_ns,
            measured.output_ns,
        )
        return results

    def _take(self) -> _Child:
        """A free child; waits while all are busy or being replaced, fails when none is left."""
        while True:
            with contextlib.suppress(queue.Empty):
                return self._idle.get(timeout=0.5)
            with self._lock:
                if self._closed:
                    raise InferenceFailed(f"model {self._name} is shutting down")
                if not self._children and not self._replacing:
                    raise InferenceFailed(
                        f"model {self._name}: no process instance is running ({self._last_failure})"
                    )

    def _replace(self, dead: _Child, why: str) -> None:
        log.warning("%s; starting a new one", why)
        with self._lock:
            self._children.discard(dead)
            self._replacing += 1
        threading.Thread(
            target=self._restart, args=(dead.index,), name=f"edgeinfer-restart-{self._name}", daemon=True
        ).start()

    def _restart(self, index: int) -> None:
        failures = 0
        try:
            while not self._closed:
                try:
                    child = _Child(index, self._build, self._name)
                    child.wait_ready()
                except (ModelLoadError, OSError) as error:
                    failures += 1
                    self._last_failure = str(error)
                    delay = min(MAX_RESTART_DELAY_S, 0.5 * 2 ** (failures - 1))
                    log.error("%s; retrying in %.1f s", error, delay)
                    time.sleep(delay)
                    continue
                with self._lock:
                    if self._closed:
                        child.stop()
                        return
                    self._children.add(child)
                self._idle.put(child)
                log.info(
                    "model %s: process instance %d is back (pid %d)", self._name, index, child.process.pid
                )
                return
        finally:
            with self._lock:
                self._replacing -= 1

    def close(self) -> None:
        with self._lock:
            self._closed = True
            children = list(self._children)
            self._children.clear()
        for child in children:
            child.stop()


class ProcessRunner:
    """Worker threads that each hand their batch to a free child of ``pool`` and wait for the answer."""

    def __init__(self, pool: ChildPool, settings: RunnerSettings) -> None:
        self._pool = pool
        self._threads = ThreadRunner(
            self._execute, replace(settings, concurrency=pool.instances, inline_max_s=0.0)
        )
        self.capacity = self._threads.capacity
        self.concurrency = pool.instances
        self.cost = self._threads.cost

    def run(self, batch: list[Work]) -> Any:
        return self._threads.run(batch)

    def _execute(self, batch: list[Work], times: BatchTimes) -> list[Result]:
        return self._pool.call(batch, times)

    async def close(self) -> None:
        await self._threads.close()


def _portable(results: list[Result]) -> list[Result]:
    """Exceptions that do not pickle become plain errors with the same text."""
    portable: list[Result] = []
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, EdgeInferError):
            try:
                pickle.dumps(result)
            except Exception:
                result = RuntimeError(f"{type(result).__name__}: {result}")
        portable.append(result)
    return portable


def _child_main(fd: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    connection = Connection(fd)
    try:
        sys.path[:] = receive(connection)  # the server's import path (python_path, its working directory)
        build: Build = receive(connection)
        execute, info = build()
    except Exception as error:
        detail = str(error) if isinstance(error, EdgeInferError) else f"{type(error).__name__}: {error}"
        send(connection, ("failed", detail))
        return
    send(connection, ("ready", info))
    while True:
        try:
            batch = receive(connection)
        except (EOFError, OSError):
            return  # the server closed the pipe: stop
        times = BatchTimes()
        try:
            results = execute(batch, times)
        except Exception as error:
            try:
                send(connection, ("raise", error))
            except Exception:
                send(connection, ("raise", RuntimeError(f"{type(error).__name__}: {error}")))
            continue
        send(connection, ("ok", _portable(results), times))


if __name__ == "__main__":
    _child_main(int(sys.argv[1]))
