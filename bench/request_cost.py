"""What one request costs the server's own code, in instructions: the host's noise does not move them.

    python bench/request_cost.py [--model tiny] [--requests 500] [--callgrind]

The real server (``Server``, the plain config with a large SLO: nothing is refused however slow the
run) is started in this process, and one ``HttpConnection`` is fed the bytes wrk sends for the model's
JSON request, through a transport that only keeps what is written: no sockets, no kernel, no client.
Without ``--callgrind`` it prints the answers and the microseconds a request took in process (as noisy
as the host). With it, the same run goes under ``valgrind --tool=callgrind``, collecting only inside
``HttpConnection.data_received`` (from the HTTP bytes to the batch) and, in a second run, inside
``HttpInference._reply`` (the answer), and prints the instructions per request of the compiled functions
below each (docs/batching.md, "Counted in instructions"). Under valgrind the batch runs in a worker
thread: ONNX Runtime's own instructions are in neither count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from edgeinfer.app import Server
from edgeinfer.config_file import load_config
from edgeinfer.server.http_protocol import HttpConnection

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run  # noqa: E402  (the shared helpers of bench/run.py)
import slo  # noqa: E402

WARMUP = 200  # requests before the measured ones: the cost model and the runner settle
LARGE_SLO_MS = 100_000.0  # valgrind runs some 50 times slower: an SLO it cannot miss
TOGGLES = {
    "to the batch": "CPyPy_http_protocol___HttpConnection___data_received",
    "the answer": "CPyDef_http_infer___HttpInference____reply",
}


class RecordingTransport(asyncio.Transport):
    """Keeps the last answer written and wakes whoever waits for it."""

    def __init__(self) -> None:
        super().__init__()
        self.written = 0
        self.last = b""
        self.waiter: asyncio.Future[None] | None = None

    def write(self, data: Any) -> None:
        self.written += 1
        self.last = bytes(data)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def request_bytes(model: str) -> bytes:
    body = run.json_body(model).path.read_bytes()
    head = f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def config_file(model: str, slo_ms: float) -> Path:
    path = run.build_models()[model]
    config = {
        "models": {model: slo.plain(path, slo_ms)},
        "logging": {"level": "WARNING"},
        "server": {"host": "127.0.0.1", "http_port": 0, "grpc_port": None, "metrics_port": None},
    }
    target = run.WORK / f"request-cost-{model}.yaml"
    target.write_text(json.dumps(config))
    return target


async def drive(config: Path, model: str, requests: int) -> dict[str, Any]:
    """Feed ``WARMUP`` then ``requests`` requests one after another; their statuses and timing."""
    server = Server(load_config(str(config), {}))
    await server.start()
    wire = request_bytes(model)
    transport = RecordingTransport()
    connection = HttpConnection(server._http._state)  # (private: no public way in, for a harness)
    connection.connection_made(transport)
    statuses: dict[str, int] = {}
    try:
        for index in range(WARMUP + requests):
            if index == WARMUP:
                started, cpu = time.perf_counter(), time.thread_time()
            wanted = transport.written + 1
            connection.data_received(wire)
            if transport.written < wanted:
                transport.waiter = asyncio.get_running_loop().create_future()
                await transport.waiter
                transport.waiter = None
            else:
                await asyncio.sleep(0)  # answered inline: let the loop turn, as between real requests
            status = transport.last.split(b" ", 2)[1].decode()
            statuses[status] = statuses.get(status, 0) + 1
        took, cpu = time.perf_counter() - started, time.thread_time() - cpu
    finally:
        connection.connection_lost(None)
        await server.stop()
    return {
        "statuses": statuses,
        "last_answer": transport.last.decode("utf-8", "replace"),
        "us_per_request": took / requests * 1e6,
        "cpu_us_per_request": cpu / requests * 1e6,
    }


def callgrind(model: str, requests: int, toggle: str) -> dict[str, int]:
    """Instructions per request of each compiled function under ``toggle`` (inclusive)."""
    valgrind, annotate = shutil.which("valgrind"), shutil.which("callgrind_annotate")
    if valgrind is None or annotate is None:
        raise SystemExit("--callgrind needs valgrind (apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "callgrind.out"
        command = [valgrind, "--tool=callgrind", f"--toggle-collect={toggle}", f"--callgrind-out-file={out}"]
        command += [sys.executable, __file__, "--model", model, "--requests", str(requests)]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        report = subprocess.run(
            [annotate, "--inclusive=yes", "--show=Ir", str(out)], check=True, capture_output=True, text=True
        ).stdout
    return per_request(report, WARMUP + requests)


_LINE = re.compile(r"^\s*([\d,]+) \([^)]*\)\s+\S*__native_edgeinfer\.c:CPyDef_(\S+)")


def per_request(report: str, calls: int) -> dict[str, int]:
    """``callgrind_annotate``'s inclusive counts of the compiled functions, per request."""
    counts: dict[str, int] = {}
    for line in report.splitlines():
        found = _LINE.match(line)
        if found:
            name = found.group(2)
            counts[name] = max(counts.get(name, 0), int(found.group(1).replace(",", "")) // calls)
    return dict(sorted(counts.items(), key=lambda item: -item[1]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="tiny", choices=sorted(run.build_models()))
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--callgrind", action="store_true")
    parser.add_argument("--top", type=int, default=25, help="functions shown per count")
    args = parser.parse_args()
    if not args.callgrind:
        import uvloop

        result = uvloop.run(drive(config_file(args.model, LARGE_SLO_MS), args.model, args.requests))
        print(json.dumps({key: value for key, value in result.items() if key != "last_answer"}))
        return
    for what, toggle in TOGGLES.items():
        counts = callgrind(args.model, args.requests, toggle)
        print(f"\n{args.model}: instructions per request, {what} ({toggle}; inclusive, and counted only")
        print("inside it: its callers show its count)")
        for name, count in list(counts.items())[: args.top]:
            print(f"{count:>9,}  {name}")


if __name__ == "__main__":
    main()
