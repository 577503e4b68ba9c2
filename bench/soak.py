"""Soak: many `tiny` requests over mixed HTTP JSON, HTTP binary and gRPC, with bad requests and clients
that hang up, against one real server; then: did it crash, did it answer every good request correctly,
and did memory, file descriptors or threads grow?

    python bench/soak.py [--requests 1000000] [--clients 4] [--bad 0.01] [--disconnects 0.005]

Each client process keeps one HTTP connection and one gRPC channel and sends, at random: JSON (45 %),
binary tensors (30 %), gRPC (25 %); a share ``--bad`` of malformed or wrong requests (each kind must get
its own 4xx or gRPC status); a share ``--disconnects`` sent and abandoned (the socket closed before the
answer, or a gRPC call cancelled). Inputs are eight fixed rows whose outputs in-process ONNX Runtime
computed: every answer is compared with them.

The server's RSS, open file descriptors and threads are sampled from /proc every second; the baseline is
taken after the warm-up (the first 10 % of the requests): growth is measured from there to the end.
Prints a table and writes the figures as JSON (``--json``). Exit 1 when a criterion fails: a crash, a
wrong or missing answer, an unexpected status, RSS growth >= 5 %, or fd/thread growth.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.models import tiny
from tests.support import ServerProcess

ROWS = np.random.default_rng(7).standard_normal((8, 16)).astype(np.float32)
WARMUP_SHARE = 0.1


def expected_outputs(model: Path) -> np.ndarray:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    result: np.ndarray = session.run(None, {"INPUT0": ROWS})[0]
    return result


# ---- requests ----


def http_wire(path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: soak", f"Content-Length: {len(body)}"]
    head += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def json_request(row: int) -> bytes:
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": ROWS[row].tolist()}]}
    return http_wire("/v2/models/tiny/infer", orjson.dumps(body))


def binary_request(row: int) -> bytes:
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [1, 16],
                    "parameters": {"binary_data_size": 64},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    )
    return http_wire(
        "/v2/models/tiny/infer",
        header + ROWS[row].tobytes(),
        {"Inference-Header-Content-Length": str(len(header))},
    )


BAD_HTTP = {  # kind -> (wire, expected status)
    "bad_json": (http_wire("/v2/models/tiny/infer", b'{"inputs": ['), 400),
    "wrong_shape": (
        http_wire(
            "/v2/models/tiny/infer",
            orjson.dumps(
                {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 15], "data": [0.0] * 15}]}
            ),
        ),
        400,
    ),
    "wrong_dtype": (
        http_wire(
            "/v2/models/tiny/infer",
            orjson.dumps(
                {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [0] * 16}]}
            ),
        ),
        400,
    ),
    "unknown_model": (http_wire("/v2/models/nope/infer", b"{}"), 404),
    "binary_size": (
        http_wire(
            "/v2/models/tiny/infer",
            b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,16],"parameters":{"binary_data_size":64}}]}'
            + b"\x00" * 10,
            {"Inference-Header-Content-Length": "103"},
        ),
        400,
    ),
}


class HttpClient:
    def __init__(self, port: int) -> None:
        self.port = port
        self.sock: socket.socket | None = None
        self.buffer = b""

    def _connect(self) -> socket.socket:
        if self.sock is None:
            self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.buffer = b""
        return self.sock

    def exchange(self, wire: bytes) -> tuple[int, dict[str, str], bytes]:
        sock = self._connect()
        sock.sendall(wire)
        while b"\r\n\r\n" not in self.buffer:
            self._read(sock)
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {
            name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])
        }
        length = int(headers["content-length"])
        while len(self.buffer) < length:
            self._read(sock)
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        if headers.get("connection") == "close":
            self.close()
        return status, headers, body

    def _read(self, sock: socket.socket) -> None:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self.buffer += chunk

    def abandon(self, wire: bytes) -> None:
        """Send a request and hang up before the answer."""
        sock = self._connect()
        sock.sendall(wire)
        self.close()

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


@dataclass
class Tally:
    good: int = 0
    correct: int = 0
    bad: int = 0
    bad_as_expected: int = 0
    disconnects: int = 0
    problems: list[str] = field(default_factory=list)  # the first few, for the report

    def problem(self, text: str) -> None:
        if len(self.problems) < 20:
            self.problems.append(text)

    def as_dict(self) -> dict[str, Any]:
        return {
            "good": self.good,
            "correct": self.correct,
            "bad": self.bad,
            "bad_as_expected": self.bad_as_expected,
            "disconnects": self.disconnects,
            "problems": self.problems,
        }


def client_main(
    http_port: int,
    grpc_port: int,
    count: int,
    bad: float,
    disconnects: float,
    seed: int,
    expected: np.ndarray,
) -> dict[str, Any]:
    import grpc

    from edgeinfer.protocol.grpc_gen import edgeinfer_grpc_v2_pb2 as pb

    rng = random.Random(seed)
    tally = Tally()
    http = HttpClient(http_port)
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    infer = channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=pb.ModelInferRequest.SerializeToString,
        response_deserializer=pb.ModelInferResponse.FromString,
    )
    json_wires = [json_request(row) for row in range(len(ROWS))]
    binary_wires = [binary_request(row) for row in range(len(ROWS))]
    grpc_requests = [
        pb.ModelInferRequest(
            model_name="tiny",
            inputs=[pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="FP32", shape=[1, 16])],
            raw_input_contents=[ROWS[row].tobytes()],
        )
        for row in range(len(ROWS))
    ]
    bad_grpc = pb.ModelInferRequest(
        model_name="tiny",
        inputs=[pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="FP32", shape=[1, 16])],
        raw_input_contents=[b"\x00" * 10],
    )
    for _ in range(count):
        row = rng.randrange(len(ROWS))
        draw = rng.random()
        kind = rng.random()
        try:
            if draw < bad:
                tally.bad += 1
                if kind < 0.25:
                    try:
                        infer(bad_grpc, timeout=30)
                        tally.problem("a bad gRPC request succeeded")
                    except grpc.RpcError as error:
                        if error.code() == grpc.StatusCode.INVALID_ARGUMENT:
                            tally.bad_as_expected += 1
                        else:
                            tally.problem(f"bad gRPC request: {error.code()} {error.details()}")
                    continue
                name = rng.choice(sorted(BAD_HTTP))
                wire, status = BAD_HTTP[name]
                got, _, body = http.exchange(wire)
                if got == status and orjson.loads(body).get("error"):
                    tally.bad_as_expected += 1
                else:
                    tally.problem(f"{name}: {got} {body[:200]!r}")
                continue
            if draw < bad + disconnects:
                tally.disconnects += 1
                if kind < 0.5:
                    http.abandon(json_wires[row])
                else:
                    future = infer.future(grpc_requests[row], timeout=30)
                    future.cancel()
                continue
            tally.good += 1
            if kind < 0.45:
                status, _, body = http.exchange(json_wires[row])
                output = (
                    np.asarray(orjson.loads(body)["outputs"][0]["data"], np.float32)
                    if status == 200
                    else None
                )
            elif kind < 0.75:
                status, headers, body = http.exchange(binary_wires[row])
                offset = int(headers.get("inference-header-content-length", len(body)))
                output = np.frombuffer(body[offset:], np.float32) if status == 200 else None
            else:
                reply = infer(grpc_requests[row], timeout=30)
                status, output = 200, np.frombuffer(reply.raw_output_contents[0], np.float32)
            if output is not None and np.allclose(output, expected[row], rtol=1e-5, atol=1e-5):
                tally.correct += 1
            else:
                tally.problem(
                    f"good request answered {status}: {body[:200]!r}" if status != 200 else "wrong output"
                )
        except (OSError, ConnectionError) as exc:
            tally.problem(f"connection error: {exc}")
            http.close()
        except grpc.RpcError as error:
            tally.problem(f"gRPC error on a good request: {error.code()} {error.details()}")
    http.close()
    channel.close()
    return tally.as_dict()


# ---- the server, watched ----


def proc_figures(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {
        "rss_mib": int(fields["VmRSS"].split()[0]) / 1024,
        "threads": int(fields["Threads"]),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
    }


class Watcher(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        try:
            while not self.stopped.wait(1.0):
                self.samples.append((time.monotonic(), proc_figures(self.pid)))
        except (OSError, KeyError):  # the server is gone: the report says so
            return


def soak(requests: int, clients: int, bad: float, disconnects: float, folder: Path) -> dict[str, Any]:
    model = tiny(folder / "repo" / "tiny" / "1" / "model.onnx")
    (folder / "repo" / "tiny" / "config.yaml").write_text("backend_config: {intra_op_num_threads: 1}\n")
    (folder / "config.yaml").write_text(
        f"model_store_path: {folder / 'repo'}\nserver: {{host: 127.0.0.1}}\nlogging: {{access_log: false}}\n"
    )
    expected = expected_outputs(model)
    server = ServerProcess(["--config", str(folder / "config.yaml")])
    server.start(folder / "server.log")
    assert server.process is not None
    pid = server.process.pid
    watcher = Watcher(pid)
    watcher.start()
    per_client = requests // clients
    warmup = max(1, int(per_client * WARMUP_SHARE))
    started = time.monotonic()
    try:
        with multiprocessing.get_context("spawn").Pool(clients) as pool:
            # warm-up first, then the baseline, then the rest
            args = [
                (server.port, server.grpc_port, warmup, bad, disconnects, seed, expected)
                for seed in range(clients)
            ]
            warm = pool.starmap(client_main, args)
            time.sleep(1.5)
            baseline = proc_figures(pid)
            args = [
                (server.port, server.grpc_port, per_client - warmup, bad, disconnects, 1000 + seed, expected)
                for seed in range(clients)
            ]
            rest = pool.starmap(client_main, args)
        time.sleep(1.5)
        elapsed = time.monotonic() - started
        alive = server.process.poll() is None
        final = proc_figures(pid) if alive else {}
    finally:
        watcher.stopped.set()
        exit_code = server.stop()
    tallies = warm + rest
    total = {
        key: sum(t[key] for t in tallies)
        for key in ("good", "correct", "bad", "bad_as_expected", "disconnects")
    }
    problems = [problem for t in tallies for problem in t["problems"]][:20]
    peak = max((sample["rss_mib"] for _, sample in watcher.samples), default=0.0)
    result = {
        "requests": sum(total[key] for key in ("good", "bad", "disconnects")),
        **total,
        "problems": problems,
        "seconds": round(elapsed, 1),
        "rate_per_s": round(sum(total[key] for key in ("good", "bad", "disconnects")) / elapsed),
        "server_alive_at_end": alive,
        "server_exit_code": exit_code,
        "baseline": baseline,
        "final": final,
        "peak_rss_mib": peak,
        "rss_growth": (final["rss_mib"] / baseline["rss_mib"] - 1) if final else None,
        "fd_growth": (final["fds"] - baseline["fds"]) if final else None,
        "thread_growth": (final["threads"] - baseline["threads"]) if final else None,
        "crashes_in_log": (folder / "server.log").read_text().count("Traceback"),
    }
    result["failures"] = failures(result)
    return result


def failures(result: dict[str, Any]) -> list[str]:
    found = []
    if not result["server_alive_at_end"] or result["crashes_in_log"]:
        found.append("the server crashed or logged a traceback")
    if result["correct"] != result["good"]:
        found.append(f"{result['good'] - result['correct']} good request(s) not answered correctly")
    if result["bad_as_expected"] != result["bad"]:
        found.append(f"{result['bad'] - result['bad_as_expected']} bad request(s) got another answer")
    if result["rss_growth"] is None or result["rss_growth"] >= 0.05:
        found.append(f"RSS grew {result['rss_growth']} after warm-up (limit 5 %)")
    if result["fd_growth"] is None or result["fd_growth"] > 0:
        found.append(f"open file descriptors grew by {result['fd_growth']}")
    if result["thread_growth"] is None or result["thread_growth"] > 0:
        found.append(f"threads grew by {result['thread_growth']}")
    return found


def report(result: dict[str, Any]) -> str:
    base, final = result["baseline"], result["final"] or {}
    lines = [
        f"soak: {result['requests']:,} requests in {result['seconds']} s ({result['rate_per_s']:,}/s)",
        f"  good {result['good']:,}, answered correctly {result['correct']:,}",
        f"  bad {result['bad']:,}, answered with their 4xx/gRPC status {result['bad_as_expected']:,}",
        f"  abandoned (client hung up / cancelled) {result['disconnects']:,}",
        f"  server alive at the end: {result['server_alive_at_end']}, "
        f"tracebacks in its log: {result['crashes_in_log']}",
        f"  RSS after warm-up {base['rss_mib']:.1f} MiB, at the end "
        f"{final.get('rss_mib', float('nan')):.1f} MiB (growth {100 * (result['rss_growth'] or 0):+.2f} %), "
        f"peak {result['peak_rss_mib']:.1f} MiB",
        f"  open fds {base['fds']} -> {final.get('fds')}, "
        f"threads {base['threads']} -> {final.get('threads')}",
        "  PASS" if not result["failures"] else "  FAIL: " + "; ".join(result["failures"]),
    ]
    lines += [f"    {problem}" for problem in result["problems"]]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--bad", type=float, default=0.01)
    parser.add_argument("--disconnects", type=float, default=0.005)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        result = soak(args.requests, args.clients, args.bad, args.disconnects, Path(folder))
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
