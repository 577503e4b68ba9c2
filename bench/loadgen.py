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

The sending is ``openloop.c``'s, a small C program built here on first use (``engine``) and run once
per step: raw HTTP/1.1 on keep-alive connections, one prepared request, an answer parsed just enough to
find its status and length, each send on time to within microseconds. It writes down when each request
was due, sent and answered; this module draws the arrival times and computes what a step measured.
Why not Python: the client shares the server's cores, and the asyncio engine it replaces took 69-71 us
of CPU a request at 13,000 requests/s (0.9 of a core) against 52-62 us, most of it the kernel's (the C
engine's own code: 7 us); at 6,000/s 115-148 us against 77-88 (`tiny`, three rounds alternating).
A step that would need more than ``MAX_OPEN`` requests in flight counts the excess as
``client_overflow`` instead of queueing it in the client.

A connection whose answer came before the client had written all of its request (a server refusing a
large body from its headers) is idle again only once the rest is written: an HTTP/1.1 client cannot
start the next request before the last one's body is out, and the next request's time would otherwise
count the server reading and dropping that body (`cnn`'s 1.6 MB JSON images).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAX_OPEN = 1024  # requests in flight at once (connections)
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


ENGINE_SOURCE = Path(__file__).with_name("openloop.c")
BUILT = Path(__file__).parent / ".work"


def engine() -> Path:
    """The engine, built from ``openloop.c`` once per version of it (its name carries the source's hash,
    so an edited source is built again, and a half-written build is never run)."""
    source = ENGINE_SOURCE.read_bytes()
    path = BUILT / f"openloop-{hashlib.sha256(source).hexdigest()[:16]}"
    if not path.exists():
        BUILT.mkdir(exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        compiler = os.environ.get("CC", "cc")
        flags = ["-O2", "-Wall", "-Wextra", "-Werror"]
        try:
            subprocess.run([compiler, *flags, "-o", str(partial), str(ENGINE_SOURCE)], check=True)
        except FileNotFoundError:
            raise RuntimeError(
                f"the load generator ({ENGINE_SOURCE.name}) is built with a C compiler: {compiler} was not "
                "found (set CC, or install one: `make bench` installs Debian's gcc)"
            ) from None
        partial.replace(path)
    return path


def arrival_times(rng: np.random.Generator, rate: float, seconds: float) -> np.ndarray:
    """``round(rate x seconds)`` arrival times in [0, seconds), sorted: a Poisson process given its count."""
    return np.sort(rng.uniform(0.0, seconds, round(rate * seconds)))


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
    """Offer ``rate`` requests/s for ``warmup_s + seconds``; what was due after the warmup counts.
    Waits at most ``drain_s`` for the last answers, then closes every connection (the server drops what
    it still has queued for them)."""
    if rate <= 0:
        raise ValueError(f"the rate must be positive, got {rate}")
    rng = np.random.default_rng(seed)
    warmup, measured = arrival_times(rng, rate, warmup_s), arrival_times(rng, rate, seconds)
    offsets = np.concatenate([warmup, warmup_s + measured])
    connections = min(64, max(4, int(rate * 0.01)))  # opened beforehand: the ones a steady rate needs
    program = engine()
    with tempfile.TemporaryDirectory(prefix="openloop-") as work:
        files = [os.path.join(work, name) for name in ("request", "offsets", "records", "late")]
        Path(files[0]).write_bytes(request)
        offsets.astype(np.float64).tofile(files[1])
        arguments = [str(port), files[0], files[1], str(drain_s), str(MAX_OPEN), str(connections), *files[2:]]
        before, started = cpu_times(), time.perf_counter()
        ran = subprocess.run([str(program), *arguments], capture_output=True, text=True)
        after, wall = cpu_times(), time.perf_counter() - started
        if ran.returncode != 0:
            raise RuntimeError(f"the load generator failed ({ran.returncode}): {ran.stderr.strip()}")
        records = np.fromfile(files[2], dtype=np.float64).reshape(-1, 5)
        late = np.fromfile(files[3], dtype=np.float64)
    errors, overflow, unanswered, cpu_s = ran.stdout.split()
    due, sent, written, done, status = records.T
    counted = due >= warmup_s  # due after the warmup
    ok, refused = status == 200, np.isin(status, REFUSED)
    in_time = (done >= warmup_s) & (done <= warmup_s + seconds)
    return StepResult(
        rate,
        seconds,
        sent=int(np.count_nonzero(offsets >= warmup_s)),
        answered=int(np.count_nonzero(ok & in_time)),
        ok_latency=(done - due)[counted & ok],
        refused_latency=(done - due)[counted & refused],
        errors=int(errors) + int(np.count_nonzero(counted & ~ok & ~refused)),
        client_overflow=int(overflow),
        unanswered=int(unanswered),
        client_late_p99_s=float(np.quantile(late, 0.99)) if len(late) else 0.0,
        refused_after_send=(done - sent)[counted & refused],
        host_steal=steal_share(before, after),
        host_busy=busy_share(before, after),
        client_cores=float(cpu_s) / wall,
        handled=len(records),
        client_write_p99_s=_quantile((written - sent)[counted], 0.99),
    )
