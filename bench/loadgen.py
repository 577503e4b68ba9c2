"""An open-loop load generator: Poisson arrivals at a given rate, whatever the server does.

wrk and h2load are closed-loop: a slow answer delays the next request, so an overloaded server is
offered less load and its latency looks better than a client would see it. Here requests are sent at
times computed in advance, each on an idle keep-alive connection (a new one if none is idle), and a
request's latency runs from its *scheduled* time, so time a request spent waiting for the client to
send it counts too (no coordinated omission).

The times are a Poisson process given its count: exactly ``rate x seconds`` arrivals at independent,
uniformly distributed times (sorted), so the gaps between them are as bursty as exponential ones, but
every step offers exactly its rate. Exponential gaps drawn freely offer a rate off by the count's own
noise (1 / sqrt(count)): a 5 s step of `cnn` at 124.9/s drew 117.8/s, and a benchmark that asks whether
the SLO holds at 0.9 x a rate then tests 0.85 x.

Raw HTTP/1.1 over asyncio (uvloop): one prepared request, a response parsed just enough to find its
status and length. A step that would need more than ``MAX_OPEN`` requests in flight counts the excess
as ``client_overflow`` instead of queueing it in the client.

A connection whose answer came before the client had written all of its request (a server refusing a
large body from its headers) is idle again only once the rest is written: an HTTP/1.1 client cannot
start the next request before the last one's body is out, and the next request's time would otherwise
count the server reading and dropping that body (`cnn`'s 1.6 MB JSON images).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import re
import time
from dataclasses import dataclass

import numpy as np

MAX_OPEN = 1024  # requests in flight at once (connections)
_LENGTH = re.compile(rb"content-length:\s*(\d+)", re.IGNORECASE)
REFUSED = (429, 503, 504)


@dataclass
class StepResult:
    """One rate step. Latencies in seconds (of the requests sent after the warmup); ``ok`` answered 200,
    ``refused`` 429/503/504. ``answered``: 200 answers that arrived within the measured seconds, so a
    server that falls behind shows it (answers during the drain afterwards do not count)."""

    rate: float
    seconds: float
    sent: int
    answered: int
    ok_latency: np.ndarray
    refused_latency: np.ndarray
    errors: int
    client_overflow: int
    unanswered: int
    client_late_p99_s: float  # how late the client sent (its own CPU): above a few ms, it was the limit
    refused_after_send: np.ndarray  # the refusals' latency from when the client sent them, not when due
    host_steal: float = float("nan")  # ``steal_share`` over the step: the hypervisor's, not ours
    host_busy: float = float("nan")  # ``busy_share`` over the step: the machine's cores in use
    client_cores: float = float("nan")  # this client's own CPU time over the step, in cores
    handled: int = 0  # answers of any status over the whole step, warmup included: what the server did
    # how long the client's own write of a request took (p99): an answer cannot be read before it
    # returns, so a large body's refusal counts it (`cnn`: 1.6 MB on loopback takes the client milliseconds)
    client_write_p99_s: float = float("nan")

    @property
    def goodput(self) -> float:
        return self.answered / self.seconds

    def p(self, quantile: float, refused: bool = False) -> float:
        return _quantile(self.refused_latency if refused else self.ok_latency, quantile)

    def refused_after_send_p(self, quantile: float) -> float:
        """The refusals' latency from when they left the client: what the client's own lateness adds
        (``client_late_p99_s``, the client sharing the server's cores) is not in it."""
        return _quantile(self.refused_after_send, quantile)


def cpu_times() -> list[int] | None:
    """The machine's CPU time so far by kind (``/proc/stat``'s first line, in ticks), or None where
    there is no such file."""
    try:
        with open("/proc/stat") as stat:
            return [int(field) for field in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def _ticks(before: list[int] | None, after: list[int] | None) -> list[int] | None:
    """The ticks of each kind between two ``cpu_times`` (user nice system idle iowait irq softirq
    steal), or None where they are not counted or no time passed."""
    if before is None or after is None or len(before) < 8 or len(after) < 8:
        return None
    ticks = [now - then for now, then in zip(after[:8], before[:8], strict=True)]
    return ticks if sum(ticks) > 0 else None


def steal_share(before: list[int] | None, after: list[int] | None) -> float:
    """The share of the machine's CPU time between two ``cpu_times`` that the hypervisor gave to other
    guests (steal, the 8th field): time neither the server nor the client had, however they were
    written, so a step measured on a VM whose host was busy says so beside its latencies. NaN where it
    is not counted."""
    ticks = _ticks(before, after)
    return float("nan") if ticks is None else ticks[7] / sum(ticks)


def busy_share(before: list[int] | None, after: list[int] | None) -> float:
    """The share of the machine's CPU time between two ``cpu_times`` that was spent on anything but
    idling (idle and iowait, the 4th and 5th fields; steal counts as busy: the guest could not run).
    Beside the client's own cores and the server's, it says whether a step found the machine full: on
    a machine the client shares with the server, an overload is the whole machine's. NaN where it is
    not counted."""
    ticks = _ticks(before, after)
    return float("nan") if ticks is None else 1.0 - (ticks[3] + ticks[4]) / sum(ticks)


def _quantile(values: np.ndarray, quantile: float) -> float:
    return float(np.quantile(values, quantile)) if len(values) else float("nan")


class _Connection(asyncio.Protocol):
    def __init__(self, generator: _Generator) -> None:
        self.generator = generator
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.scheduled = 0.0
        self.sent = 0.0  # when the client wrote the request (later than scheduled when it fell behind)
        self.written = 0.0  # when its write returned (the kernel took the request, or the rest is buffered)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, request: bytes, scheduled: float) -> None:
        self.scheduled = scheduled
        self.sent = time.perf_counter()
        assert self.transport is not None
        self.transport.write(request)
        self.written = time.perf_counter()

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        match = _LENGTH.search(buffer, 0, end)
        total = end + 4 + (int(match.group(1)) if match else 0)
        if len(buffer) < total:
            return
        status = int(buffer[9:12])
        del buffer[:total]
        self.generator.answered(self, status)

    def connection_lost(self, exc: Exception | None) -> None:
        self.generator.lost(self)

    def still_writing(self) -> bool:
        """Whether part of the request is still in the client's buffer, not yet taken by the kernel."""
        return self.transport is not None and self.transport.get_write_buffer_size() > 0


class _Generator:
    def __init__(self, port: int, request: bytes) -> None:
        self.port = port
        self.request = request
        self.loop = asyncio.get_running_loop()
        self.idle: list[_Connection] = []
        self.busy: set[_Connection] = set()
        self.writing: list[_Connection] = []  # answered while their request was still being written
        # (scheduled, sent, written, answered, status)
        self.records: list[tuple[float, float, float, float, int]] = []
        self.errors = 0
        self.overflow = 0
        self.opening = 0
        self.late: list[float] = []  # how late each request was sent, by the client's own fault

    async def open(self) -> _Connection:
        _, connection = await self.loop.create_connection(lambda: _Connection(self), "127.0.0.1", self.port)
        return connection

    def send(self, scheduled: float) -> None:
        self.late.append(time.perf_counter() - scheduled)
        if self.writing:
            self._release_written()
        if self.idle:
            connection = self.idle.pop()
            self.busy.add(connection)
            connection.send(self.request, scheduled)
        elif len(self.busy) + len(self.writing) + self.opening < MAX_OPEN:
            self.opening += 1
            self.loop.create_task(self._open_and_send(scheduled))
        else:
            self.overflow += 1

    async def _open_and_send(self, scheduled: float) -> None:
        try:
            connection = await self.open()
        except OSError:
            self.errors += 1
            return
        finally:
            self.opening -= 1
        self.busy.add(connection)
        connection.send(self.request, scheduled)

    def answered(self, connection: _Connection, status: int) -> None:
        done = time.perf_counter()
        self.records.append((connection.scheduled, connection.sent, connection.written, done, status))
        self.busy.discard(connection)
        (self.writing if connection.still_writing() else self.idle).append(connection)

    def _release_written(self) -> None:
        """Make the connections whose request is written by now idle."""
        still: list[_Connection] = []
        for connection in self.writing:
            (still if connection.still_writing() else self.idle).append(connection)
        self.writing = still

    def lost(self, connection: _Connection) -> None:
        if connection in self.busy:
            self.busy.discard(connection)
            self.errors += 1
        if connection in self.idle:
            self.idle.remove(connection)
        if connection in self.writing:
            self.writing.remove(connection)

    def close(self) -> None:
        for connection in [*self.idle, *self.busy, *self.writing]:
            if connection.transport is None:
                continue
            if connection.still_writing():
                connection.transport.abort()  # close() would wait for the rest to be written
            else:
                connection.transport.close()


class _TimerSpec(ctypes.Structure):
    _fields_ = [  # struct itimerspec: it_interval, then it_value (each a timespec: seconds, nanoseconds)
        ("interval_s", ctypes.c_long),
        ("interval_ns", ctypes.c_long),
        ("value_s", ctypes.c_long),
        ("value_ns", ctypes.c_long),
    ]


class _Timer:
    """Wakes the event loop at a time to the microsecond: a Linux ``timerfd`` the loop watches.

    Why not ``asyncio.sleep``: the loop's own timers count whole milliseconds. Under uvloop a sleep of
    less than half a millisecond returns at once (6 us) and one of 0.6 ms takes 1.35 ms (2,000 of each,
    measured), so a generator that slept until its next send spun a core whenever sends were under
    half a millisecond apart (the load it was measuring runs on the same cores) and sent up to a
    millisecond late when they were further apart (a latency counted against the server).

    A wake is late too, by the kernel and the hypervisor (a vCPU that went idle; 50-90 us at p50 here),
    and a send made late by it would go out with the next ones due, in a burst a Poisson process does
    not have. So the timer is set that much early (a running 90th percentile of how late its wakes
    came), and the rest of the wait is passes of the loop, which read the answers meanwhile: the
    generator polls for the tail of each wait only, and at rates whose gaps are shorter than that, it
    polls throughout, as it must to send on time."""

    _CLOCK_MONOTONIC, _TFD_NONBLOCK, _TFD_CLOEXEC, _TFD_TIMER_ABSTIME = 1, 0o4000, 0o2000000, 1
    _PR_SET_TIMERSLACK = 29

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.timerfd_create(self._CLOCK_MONOTONIC, self._TFD_NONBLOCK | self._TFD_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self._libc.prctl(self._PR_SET_TIMERSLACK, 1, 0, 0, 0)  # this thread's timers: no 50 us slack
        self._loop = asyncio.get_running_loop()
        self._waiter: asyncio.Future[None] | None = None
        self._loop.add_reader(self._fd, self._fired)
        self.late_s = 100e-6  # how late the timer's wakes came: a running 90th percentile

    async def until(self, when: float) -> None:
        """Return at ``when`` (``time.perf_counter``'s clock), or at once if it has passed."""
        wake = when - self.late_s
        if wake > time.perf_counter():
            await self._sleep(wake)
            late = time.perf_counter() - wake  # 1.25 up, 1.25^(-1/9) down: settles where 10 % are above
            self.late_s *= 1.25 if late > self.late_s else 1.25 ** (-1 / 9)
        while time.perf_counter() < when:
            await asyncio.sleep(0)  # one pass of the loop, reading what came

    async def _sleep(self, until: float) -> None:
        at = time.clock_gettime(time.CLOCK_MONOTONIC) + until - time.perf_counter()  # (its own clock)
        seconds = int(at)
        spec = _TimerSpec(0, 0, seconds, max(1, int((at - seconds) * 1e9)))  # 0 would disarm it
        if self._libc.timerfd_settime(self._fd, self._TFD_TIMER_ABSTIME, ctypes.byref(spec), None) < 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")
        self._waiter = self._loop.create_future()
        await self._waiter

    def _fired(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:  # (a wake with nothing to read: the timer was set again meanwhile)
            return
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def close(self) -> None:
        self._loop.remove_reader(self._fd)
        os.close(self._fd)


async def _step(
    port: int, request: bytes, rate: float, seconds: float, seed: int, drain_s: float, warmup_s: float
) -> StepResult:
    if rate <= 0:
        raise ValueError(f"the rate must be positive, got {rate}")
    generator = _Generator(port, request)
    for _ in range(min(64, max(4, int(rate * 0.01)))):  # the connections a steady rate needs
        generator.idle.append(await generator.open())
    rng = np.random.default_rng(seed)
    offsets = arrival_times(rng, rate, warmup_s) + [
        warmup_s + offset for offset in arrival_times(rng, rate, seconds)
    ]
    start = time.perf_counter() + 0.01
    index = 0
    timer = _Timer()
    try:
        while index < len(offsets):
            now = time.perf_counter() - start
            while index < len(offsets) and offsets[index] <= now:
                generator.send(start + offsets[index])
                index += 1
            if index < len(offsets):
                await timer.until(start + offsets[index])
    finally:
        timer.close()
    deadline = time.perf_counter() + drain_s
    while generator.busy or generator.opening:
        if time.perf_counter() > deadline:
            break
        await asyncio.sleep(0.005)
    unanswered = len(generator.busy)
    generator.close()
    measured_from = start + warmup_s
    measured_to = measured_from + seconds
    answered = sum(
        1 for *_, done, status in generator.records if status == 200 and measured_from <= done <= measured_to
    )
    records = [record for record in generator.records if record[0] >= measured_from]
    ok = np.array([done - due for due, _, _, done, status in records if status == 200])
    refused = [(due, sent, done) for due, sent, _, done, status in records if status in REFUSED]
    errors = generator.errors + sum(1 for *_, status in records if status not in (200, *REFUSED))
    sent_count = sum(1 for offset in offsets if offset >= warmup_s)
    late_p99 = float(np.quantile(generator.late, 0.99)) if generator.late else 0.0
    writes = np.array([written - sent for _, sent, written, _, _ in records])
    return StepResult(
        rate,
        seconds,
        sent_count,
        answered,
        ok,
        np.array([done - due for due, _, done in refused]),
        errors,
        generator.overflow,
        unanswered,
        late_p99,
        np.array([done - sent for _, sent, done in refused]),
        handled=len(generator.records),
        client_write_p99_s=_quantile(writes, 0.99),
    )


def arrival_times(rng: np.random.Generator, rate: float, seconds: float) -> list[float]:
    """``round(rate x seconds)`` arrival times in [0, seconds), sorted: a Poisson process given its count."""
    return np.sort(rng.uniform(0.0, seconds, round(rate * seconds))).tolist()


def http_request(path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    for key, value in (headers or {}).items():
        head += f"{key}: {value}\r\n"
    return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def run_step(
    port: int,
    request: bytes,
    rate: float,
    seconds: float,
    seed: int = 0,
    drain_s: float = 10.0,
    warmup_s: float = 0.5,
) -> StepResult:
    """Offer ``rate`` requests/s for ``warmup_s + seconds``; what was scheduled after the warmup counts.
    Waits at most ``drain_s`` for the last answers, then closes every connection (the server drops what
    it still has queued for them)."""
    import gc

    import uvloop

    gc.disable()
    before, own_before, started = cpu_times(), time.process_time(), time.perf_counter()
    try:
        result = uvloop.run(_step(port, request, rate, seconds, seed, drain_s, warmup_s))
    finally:
        gc.enable()
    after, own_after, wall = cpu_times(), time.process_time(), time.perf_counter() - started
    result.host_steal = steal_share(before, after)
    result.host_busy = busy_share(before, after)
    result.client_cores = (own_after - own_before) / wall
    return result
