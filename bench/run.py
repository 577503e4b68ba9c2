"""`make bench`: edgeinfer against in-process ONNX Runtime and a bare FastAPI endpoint, in one run.

    python bench/run.py [--duration 5] [--models tiny,cnn] [--concurrency 1,8,64] [--threads 1]
                        [--no-scaling] [--no-slo] [--no-tracing] [--reference]

1. builds the models (bench/models.py) and one JSON request body per model;
2. measures in-process ONNX Runtime throughput at each batch size with the same threads: the limit;
3. starts edgeinfer (`python -m edgeinfer serve`) and the FastAPI baseline (bench/baseline_fastapi.py)
   the two ways users write it: inference on the event loop (`fastapi`: one core) and in Starlette's
   thread pool (`fastapi_threads`: the loop goes on reading while ONNX Runtime runs), and drives each
   with wrk (a C load generator, so no Python client steals the server's CPU) at every
   concurrency, unpinned, and for `tiny` also pinned (server on CPU 0, wrk on CPU 1);
4. scaling (unless --no-scaling): edgeinfer with `workers: 1` and `workers: 2` on `cnn` over JSON at
   concurrency 16 (against in-process ONNX Runtime running two sessions in two threads, the 2-core
   ceiling) and `tiny` over JSON at 64; and a pure-Python model (bench/python_models.py) at
   concurrency 8 in a worker thread and in two process instances;
5. the latency-objective cases (unless --no-slo): bench/slo.py, with its targets, ramp table and plot;
6. routing (with `tiny`, JSON and concurrency 64 selected): what a weighted route costs per request, the
   router's pick in-process (bench/routing.py) and end to end: `tiny` over JSON at concurrency 64
   without a route and with a 90/10 route (both variants lead to a copy of `tiny`, so batching stays
   the same), alternating, three pairs;
7. gRPC (with gRPC selected too): server CPU per call for `tiny` over JSON and gRPC at concurrency 64 in
   the same run, against grpcio alone answering fixed bytes (bench/grpc_floor.py), and per
   ModelStreamInfer message, the same two ways;
8. tracing (unless --no-tracing; needs the `otel` extra, in the dev environment): `tiny` over JSON at
   concurrency 1 and 64 with OpenTelemetry tracing off and on (sampling ratios 0.01 and 1, spans
   exported over OTLP/HTTP to bench/otlp_sink.py), alternating, three rounds;
9. the headline case, `tiny` over JSON, once more on a server with the default logging (every other
   case logs at WARNING, which turns the access log off);
10. prints the tables and writes them as JSON and Markdown under bench/results/ (latest.md). "vs
   in-process" divides the served rows/s by in-process rows/s at the measured batch size nearest the
   mean batch actually formed. With --reference (every case must be selected) the run becomes
   bench/results/reference.md, the README's table is regenerated from it and the ramp's plot becomes
   docs/img/slo-ramp.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import orjson

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORK = HERE / ".work"
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))

import grpc_floor  # noqa: E402  (bench/ is not a package)
import models  # noqa: E402

INPUTS = {"tiny": ("INPUT0", (16,)), "cnn": ("input", (3, 224, 224)), "python": ("image", (64, 64))}
PYTHON_MODELS = ("python_thread", "python_process")  # bench/python_models.py:BoxBlur, two ways
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Row:
    server: str
    workers: int
    model: str
    protocol: str
    concurrency: int
    pinned: bool
    requests_per_s: float
    rows_per_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_batch: float
    cpu_ms_per_request: float
    errors: int
    ratio_to_inprocess: float


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def build_models() -> dict[str, Path]:
    return {"tiny": models.tiny(WORK / "tiny.onnx"), "cnn": models.cnn(WORK / "cnn.onnx")}


@dataclass
class Body:
    """A prepared request: the bytes a load generator sends, and the headers that go with them."""

    path: Path
    headers: dict[str, str]


def sample(model: str, rows: int = 1) -> tuple[str, np.ndarray]:
    name, shape = INPUTS[model]
    if model == "python":  # a grayscale image
        return name, np.random.default_rng(0).integers(0, 256, (rows, *shape)).astype(np.uint8)
    return name, np.random.default_rng(0).standard_normal((rows, *shape)).astype(np.float32)


def json_body(model: str) -> Body:
    name, data = sample(model)
    datatype = "UINT8" if data.dtype == np.uint8 else "FP32"
    body = {
        "inputs": [{"name": name, "shape": list(data.shape), "datatype": datatype, "data": data.reshape(-1)}]
    }
    path = WORK / f"{model}.json"
    path.write_bytes(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY))
    return Body(path, {})


def binary_body(model: str) -> Body:
    """Triton's binary tensor extension, as tritonclient sends it: JSON header, then raw bytes."""
    name, data = sample(model)
    raw = data.tobytes()
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "shape": list(data.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    )
    path = WORK / f"{model}.bin"
    path.write_bytes(header + raw)
    return Body(path, {"Inference-Header-Content-Length": str(len(header))})


def grpc_body(model: str) -> Body:
    """One length-prefixed gRPC message (ModelInferRequest with raw_input_contents)."""
    from tritonclient.grpc import service_pb2  # the client library users have, not our own messages

    name, data = sample(model)
    message = service_pb2.ModelInferRequest(model_name=model)
    message.inputs.add(name=name, datatype="FP32", shape=list(data.shape))
    message.raw_input_contents.append(data.tobytes())
    payload = message.SerializeToString()
    path = WORK / f"{model}.grpc"
    path.write_bytes(b"\x00" + struct.pack(">I", len(payload)) + payload)
    return Body(path, {"content-type": "application/grpc", "te": "trailers"})


INPROCESS_REPEATS = 5  # the ceiling is the median of this many samples: one sample was beaten by the server


def inprocess(
    path: Path, model: str, threads: int, batch_sizes: list[int], seconds: float
) -> dict[int, float]:
    """Rows per second of session.run at each batch size: the ceiling for the server. Each is the median
    of ``INPROCESS_REPEATS`` samples of ``seconds`` (a single 2 s sample of `cnn` came out 2-18 % below
    what the server then got through it: the host's noise, not the server beating the runtime)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options)
    name, shape = INPUTS[model]
    limits = {}
    for batch in batch_sizes:
        feed = {name: np.random.default_rng(0).standard_normal((batch, *shape)).astype(np.float32)}
        session.run(None, feed)
        samples = []
        for _ in range(INPROCESS_REPEATS):
            runs, started = 0, time.perf_counter()
            while time.perf_counter() - started < seconds:
                session.run(None, feed)
                runs += 1
            samples.append(runs * batch / (time.perf_counter() - started))
        limits[batch] = float(np.median(samples))
    return limits


def inprocess_parallel(path: Path, model: str, sessions: int, seconds: float) -> float:
    """Images/s of ``sessions`` sessions (one ONNX Runtime thread each) run by as many threads: with two on
    a 2-core box, the most any server can get out of it."""
    import threading

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    name, shape = INPUTS[model]
    feed = {name: np.random.default_rng(0).standard_normal((1, *shape)).astype(np.float32)}
    runs = [0] * sessions
    built = [ort.InferenceSession(str(path), options) for _ in range(sessions)]
    for session in built:
        session.run(None, feed)
    stop = time.perf_counter() + seconds

    def loop(index: int) -> None:
        while time.perf_counter() < stop:
            built[index].run(None, feed)
            runs[index] += 1

    threads = [threading.Thread(target=loop, args=(index,)) for index in range(sessions)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(runs) / (time.perf_counter() - started)


def inprocess_python(seconds: float) -> float:
    """Images/s of the pure-Python model called directly in one thread (one core's worth)."""
    import python_models

    _, image = sample("python")
    pixels = image[0].tolist()
    runs, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        python_models._blurred_histogram(pixels)
        runs += 1
    return runs / (time.perf_counter() - started)


class Process:
    def __init__(
        self, name: str, command: list[str], port: int, grpc_port: int = 0, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.port = port
        self.grpc_port = grpc_port
        self.log = (WORK / f"{name}.log").open("wb")
        self.process = subprocess.Popen(
            command, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        self.ready_s = self._wait_ready()

    def _wait_ready(self) -> float:
        started = time.perf_counter()
        while time.perf_counter() - started < 60:
            if self.process.poll() is not None:
                raise SystemExit(f"{self.name} exited; see {self.log.name}")
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.port}/v2/health/ready", timeout=1
                ) as reply:
                    if reply.status == 200:
                        return time.perf_counter() - started
            except OSError:
                time.sleep(0.02)
        raise SystemExit(f"{self.name} not ready; see {self.log.name}")

    def cpu_s(self) -> float:
        """CPU seconds of the server and every process under it (workers, process instances)."""
        return sum(_cpu_s(pid) for pid in _tree(self.process.pid))

    def memory_mib(self, key: str) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
        return 0.0

    def pin(self, cpus: str) -> None:
        subprocess.run(
            ["taskset", "-a", "-p", "-c", cpus, str(self.process.pid)], check=True, capture_output=True
        )

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=20)
        self.log.close()


def _tree(pid: int) -> list[int]:
    pids = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except FileNotFoundError:
            continue
        for child in children:
            pids += _tree(int(child))
    return pids


def _cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def batch_counts(port: int, model: str) -> tuple[int, int, int]:
    """(rows, batches, successful requests) so far, from edgeinfer's statistics; zeros elsewhere."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{model}/stats", timeout=5) as reply:
            [entry] = json.loads(reply.read())["model_stats"]
        success = entry["inference_stats"]["success"]["count"]
        return entry["inference_count"], entry["execution_count"], success
    except OSError:
        return 0, 0, 0


def wrk(port: int, path: str, body: Body, concurrency: int, seconds: float, pinned: bool) -> dict:
    command = [
        "wrk", "-t1", f"-c{concurrency}", f"-d{max(1, round(seconds))}s", "--timeout", "10s",
        "-s", str(HERE / "report.lua"), f"http://127.0.0.1:{port}{path}",
    ]  # fmt: skip
    if pinned:
        command = ["taskset", "-c", "1", *command]
    headers = ";".join(f"{key}: {value}" for key, value in body.headers.items())
    env = {**os.environ, "BENCH_BODY": str(body.path), "BENCH_HEADERS": headers}
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    line = [text for text in result.stdout.splitlines() if text.startswith("{")]
    if not line:
        raise SystemExit(f"wrk failed: {result.stdout}\n{result.stderr}")
    return json.loads(line[-1])


def h2load(port: int, path: str, body: Body, concurrency: int, seconds: float, pinned: bool) -> dict:
    """gRPC load with nghttp2's h2load (C): one stream per connection, like wrk's connections.

    h2load sees HTTP status only; gRPC errors travel in trailers, so callers count them from the
    server's statistics instead.
    """
    log = WORK / "h2load.log"
    log.unlink(missing_ok=True)  # h2load appends
    command = [
        "h2load", "-t1", f"-c{concurrency}", "-m1", f"-D{max(1, round(seconds))}", "-d", str(body.path),
        f"--log-file={log}", *(f"-H{key}: {value}" for key, value in body.headers.items()),
        f"http://127.0.0.1:{port}{path}",
    ]  # fmt: skip
    if pinned:
        command = ["taskset", "-c", "1", *command]
    result = subprocess.run(command, capture_output=True, text=True)
    finished = [line for line in result.stdout.splitlines() if line.startswith("finished in")]
    if not finished or not log.exists():
        raise SystemExit(f"h2load failed: {result.stdout}\n{result.stderr}")
    rows = [line.split("\t") for line in log.read_text().splitlines() if line.strip()]
    latencies = np.array([int(row[2]) for row in rows if row[1] == "200"], dtype=np.int64)
    duration_s = _h2load_seconds(finished[0].split()[2].rstrip(","))
    percentiles = np.percentile(latencies, [50, 90, 99]) if len(latencies) else [0, 0, 0]
    return {
        "requests": len(latencies),
        "duration_us": duration_s * 1e6,
        "status_errors": sum(1 for row in rows if row[1] != "200"),
        "socket_errors": 0,
        "p50_us": percentiles[0],
        "p90_us": percentiles[1],
        "p99_us": percentiles[2],
    }


def _h2load_seconds(text: str) -> float:
    """h2load prints its run time as 3.00s, 999.64ms or 950us."""
    for unit, scale in (("ms", 1e-3), ("us", 1e-6), ("s", 1.0)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    raise ValueError(f"h2load run time not understood: {text!r}")


def nearest_limit(limits: dict[int, float], batch: float) -> float:
    """In-process rows/s at the measured batch size closest (on a log scale) to the mean batch formed."""
    size = min(limits, key=lambda measured: abs(np.log(measured) - np.log(max(batch, 1.0))))
    return limits[size]


def measure(
    server: Process, label: str, model: str, protocol: str, body: Body, concurrency: int, seconds: float,
    pinned: bool, limits: dict[int, float], workers: int = 1, stats_model: str | None = None,
) -> Row:  # fmt: skip
    """One case; ``stats_model``: the model whose batches count (another when a route sends it there)."""
    if protocol == "grpc":
        port, path, load = server.grpc_port, "/inference.GRPCInferenceService/ModelInfer", h2load
    else:
        port, path, load = server.port, f"/v2/models/{model}/infer", wrk
    load(port, path, body, concurrency, min(1.0, seconds), pinned)  # warm up connections and caches
    stats_model = stats_model or model
    rows_before, executions_before, successes_before = batch_counts(server.port, stats_model)
    cpu_before = server.cpu_s()
    result = load(port, path, body, concurrency, seconds, pinned)
    cpu = server.cpu_s() - cpu_before
    rows_after, executions_after, successes_after = batch_counts(server.port, stats_model)
    requests = max(1, result["requests"])
    rate = result["requests"] / (result["duration_us"] / 1e6)
    executions = executions_after - executions_before
    mean_batch = (rows_after - rows_before) / executions if executions else 1.0
    errors = result["status_errors"] + result["socket_errors"]
    if protocol == "grpc" and label == "edgeinfer":
        errors += max(0, result["requests"] - (successes_after - successes_before))
    return Row(
        server=label,
        workers=workers,
        model=model,
        protocol=protocol,
        concurrency=concurrency,
        pinned=pinned,
        requests_per_s=round(rate, 1),
        rows_per_s=round(rate, 1),
        p50_ms=result["p50_us"] / 1000,
        p90_ms=result["p90_us"] / 1000,
        p99_ms=result["p99_us"] / 1000,
        mean_batch=round(mean_batch, 2),
        cpu_ms_per_request=round(cpu * 1000 / requests, 3),
        errors=errors,
        ratio_to_inprocess=round(rate / nearest_limit(limits, mean_batch), 3),
    )


def edgeinfer_config(
    paths: dict[str, Path], threads: int, python: bool = False, default_logging: bool = False
) -> Path:
    """The benchmark's server config; ``python``: with the pure-Python models too (the scaling cases).
    Logging at WARNING, which turns the access log off, unless ``default_logging`` (INFO, an access line
    for every request, as a server started without a logging key writes)."""
    config = {
        "models": {
            "tiny": {
                "model_path": str(paths["tiny"]),
                "backend_config": {"intra_op_num_threads": threads, "inter_op_num_threads": 1},
                "max_batch_size": 64,
                "batch_timeout_ms": 0,
                "max_queue_size": 1024,
            },
            "cnn": {
                "model_path": str(paths["cnn"]),
                "backend_config": {"intra_op_num_threads": threads, "inter_op_num_threads": 1},
                "max_batch_size": 1,
                "batch_timeout_ms": 0,
                "max_concurrent_batches": 1,
                "prefetch_batches": 1,
                "max_queue_size": 1024,
            },
        },
        "python_path": [str(HERE)],
        "logging": {"level": "WARNING"},
    }
    if python:
        config["models"]["python_thread"] = {
            "backend": "python",
            "model_class": "python_models:BoxBlur",
            "max_batch_size": 8,
            "max_queue_size": 1024,
        }
        config["models"]["python_process"] = {
            **config["models"]["python_thread"],
            "kind": "process",
            "instances": 2,
        }
    else:
        # a second copy of tiny: the routing case splits tiny's traffic 90/10 between the two
        config["models"][ROUTED_TO] = config["models"]["tiny"]
    if default_logging:
        del config["logging"]
    name = "edgeinfer-python" if python else "edgeinfer-logging" if default_logging else "edgeinfer"
    path = WORK / f"{name}.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def with_default_logging(
    paths: dict[str, Path], threads: int, body: Body, concurrencies: list[int], seconds: float, limit: dict
) -> list[Row]:
    """The headline case, `tiny` over JSON, on a server with the default logging: every other case runs
    at WARNING, without the access log a default server writes."""
    server = edgeinfer_process(edgeinfer_config(paths, threads, default_logging=True), 1, "edgeinfer-logging")
    rows = []
    try:
        for concurrency in concurrencies:
            row = measure(server, "edgeinfer (default logging)", "tiny", "json", body, concurrency, seconds,
                          False, limit)  # fmt: skip
            rows.append(row)
            print(table_line(row), flush=True)
    finally:
        server.stop()
    return rows


TABLE_HEADER = (
    "| server | workers | model | protocol | conc | pinned | req/s | rows/s | p50 ms | p90 ms | p99 ms "
    "| batch | CPU ms/req | errors | vs in-process |"
)


def table_line(row: Row) -> str:
    return (
        f"| {row.server} | {row.workers} | {row.model} | {row.protocol} | {row.concurrency} | "
        f"{'yes' if row.pinned else 'no'} | "
        f"{row.requests_per_s:,.0f} | {row.rows_per_s:,.0f} | {row.p50_ms:.3f} | {row.p90_ms:.3f} | "
        f"{row.p99_ms:.3f} | {row.mean_batch:.2f} | {row.cpu_ms_per_request:.3f} | {row.errors} | "
        f"{row.ratio_to_inprocess:.3f} |"
    )


def table(rows: list[Row]) -> str:
    return "\n".join([TABLE_HEADER, "|" + "---|" * 15, *(table_line(row) for row in rows)])


def edgeinfer_process(
    config: Path, workers: int, name: str | None = None, env: dict[str, str] | None = None
) -> Process:
    port, grpc_port = free_port(), free_port()
    return Process(
        name or f"edgeinfer-{workers}w",
        [sys.executable, "-m", "edgeinfer", "serve", "--config", str(config), "--http-port", str(port),
         "--grpc-port", str(grpc_port), "--metrics-port", str(free_port()), "--host", "127.0.0.1",
         "--workers", str(workers)],
        port,
        grpc_port,
        env,
    )  # fmt: skip


ROUTED_TO = "tiny_b"
# both variants resolve to the copy (one by version, one as its latest): every request takes the routed
# path, looked up and checked, while the batching stays what it is without a route (one model's batcher)
ROUTE = {"variants": [{"model": ROUTED_TO, "version": "1", "weight": 90}, {"model": ROUTED_TO, "weight": 10}]}
ROUTING_PAIRS = 3


def set_route(port: int, route: dict | None) -> None:
    """PUT (or, with None, DELETE) tiny's route through the running server's API."""
    data = None if route is None else json.dumps(route).encode()
    method = "DELETE" if route is None else "PUT"
    call = urllib.request.Request(f"http://127.0.0.1:{port}/v2/routes/tiny", data=data, method=method)
    with urllib.request.urlopen(call, timeout=5):
        pass


def routing(server: Process, duration: float, limits: dict[int, float]) -> tuple[list[Row], dict]:
    """What a weighted route costs per request on `tiny` at concurrency 64.

    The router's own pick is timed in-process (bench/routing.py: precise, a few microseconds). End to end,
    the server's CPU per request is compared without a route and with a 90/10 route (no routing key:
    each request draws its variant), in alternating runs so that the machine's drift hits both alike;
    the spread of the runs without a route says how much of the difference is noise. The route's two
    variants both lead to the copy of tiny, so batching is the same with and without it: a split across
    two models would also pay for a second batcher's smaller batches, which is not the router's cost.
    """
    import routing as router_bench

    with tempfile.TemporaryDirectory() as folder:
        picks = asyncio.run(router_bench.measure(100_000, Path(folder)))
    print("router pick per request (in-process): " + ", ".join(f"{k}: {v:.2f} us" for k, v in picks.items()))
    rows: list[Row] = []
    body = json_body("tiny")
    for _ in range(ROUTING_PAIRS):
        for routed in (False, True):
            set_route(server.port, ROUTE if routed else None)
            row = measure(server, "edgeinfer", "tiny", "json", body, 64, duration, False, limits,
                          stats_model=ROUTED_TO if routed else "tiny")  # fmt: skip
            row.server = "edgeinfer, route 90/10" if routed else "edgeinfer, no route"
            rows.append(row)
            print(table_line(row), flush=True)
    set_route(server.port, None)
    plain = [row.cpu_ms_per_request * 1000 for row in rows if row.server.endswith("no route")]
    routed = [row.cpu_ms_per_request * 1000 for row in rows if not row.server.endswith("no route")]
    rates = [(b.requests_per_s / a.requests_per_s) for a, b in zip(rows[::2], rows[1::2], strict=True)]
    summary = {
        "router_pick_us": {case: round(value, 2) for case, value in picks.items()},
        "router_adds_us": {
            case: round(value - picks["no route"], 2) for case, value in picks.items() if case != "no route"
        },
        "cpu_us_per_request_no_route": [round(value, 1) for value in plain],
        "cpu_us_per_request_route": [round(value, 1) for value in routed],
        "cpu_us_added_median": round(float(np.median(np.subtract(routed, plain))), 1),
        "cpu_us_spread_no_route": round(max(plain) - min(plain), 1),
        "req_per_s_route_vs_none_median": round(float(np.median(rates)), 3),
    }
    return rows, summary


def routing_markdown(rows: list[Row], summary: dict) -> str:
    adds = summary["router_adds_us"]
    worst = max(adds.values())
    return (
        f"Routing (`tiny` JSON, concurrency 64, {ROUTING_PAIRS} alternating pairs; a 90/10 route whose "
        "variants both lead to a copy of tiny, so that batching is the same; no routing key):\n\n"
        f"- the router's pick, in-process: {summary['router_pick_us']['no route']:.2f} us without a route; "
        "a route adds "
        + ", ".join(f"{value:.2f} us ({case.removeprefix('route, ')})" for case, value in adds.items())
        + f" (target < 5 us: {'met' if worst < 5 else 'not met'})\n"
        f"- end to end, server CPU per request: {summary['cpu_us_per_request_no_route']} us without, "
        f"{summary['cpu_us_per_request_route']} us with the route (median difference "
        f"{summary['cpu_us_added_median']:+.1f} us; the runs without a route alone spread over "
        f"{summary['cpu_us_spread_no_route']:.1f} us); req/s with / without: "
        f"{summary['req_per_s_route_vs_none_median']:.3f} (median)\n\n{table(rows)}\n"
    )


GRPC_STREAMS = 4  # ModelStreamInfer calls at once in the streaming case
GRPC_STREAM_MESSAGES = 2500  # per stream


class GrpcFloor(Process):
    """bench/grpc_floor.py: grpcio alone, answering ModelInfer (``unary``) or each ModelStreamInfer
    message (``stream``) with fixed bytes; it has no HTTP port (its statistics read as zeros)."""

    def __init__(self, kind: str) -> None:
        grpc_port = free_port()
        command = [sys.executable, str(HERE / "grpc_floor.py"), "serve", kind, str(grpc_port)]
        super().__init__(f"grpc-floor-{kind}", command, 0, grpc_port)

    def _wait_ready(self) -> float:
        started = time.perf_counter()
        while time.perf_counter() - started < 30:
            if self.process.poll() is not None:
                raise SystemExit(f"{self.name} exited; see {self.log.name}")
            if b"ready" in Path(self.log.name).read_bytes():
                return time.perf_counter() - started
            time.sleep(0.02)
        raise SystemExit(f"{self.name} not ready; see {self.log.name}")


def stream_cost(server: Process) -> dict[str, float]:
    """Server CPU per ModelStreamInfer message: GRPC_STREAMS streams of `tiny` requests (bench/grpc_floor.py's
    client, in its own process; its warm-up round, one window per stream, counts too: the server answered
    it)."""
    command = [sys.executable, str(HERE / "grpc_floor.py"), "stream", str(server.grpc_port),
               str(WORK / "tiny.grpc"), str(GRPC_STREAMS), str(GRPC_STREAM_MESSAGES)]  # fmt: skip
    cpu_before = server.cpu_s()
    result = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    cpu = server.cpu_s() - cpu_before
    messages = result["messages"] + GRPC_STREAMS * grpc_floor.WINDOW  # and the warm-up round
    return {
        "messages_per_s": round(result["messages"] / result["seconds"], 1),
        "cpu_us_per_message": round(cpu * 1e6 / messages, 1),
    }


def grpc_costs(server: Process, duration: float, limits: dict[int, float]) -> tuple[list[Row], dict]:
    """What a gRPC call costs the server, against JSON over HTTP and against grpcio alone (`tiny`, 64).

    grpc.aio spends a fixed amount of event-loop time per call (its call object, context, a completion
    queue round trip per operation) before a handler runs; the floor server measures exactly that, so
    the difference between it and edgeinfer is what edgeinfer's own code costs per call. JSON over HTTP
    runs in the same server, in the same run. Streams: the same, per ModelStreamInfer message.
    """
    rows = [
        measure(server, "edgeinfer", "tiny", protocol, body, 64, duration, False, limits)
        for protocol, body in (("json", json_body("tiny")), ("grpc", grpc_body("tiny")))
    ]
    edgeinfer_stream = stream_cost(server)
    floor = GrpcFloor("unary")
    try:
        body = grpc_body("tiny")
        rows.append(measure(floor, "grpcio alone", "tiny", "grpc", body, 64, duration, False, limits))
    finally:
        floor.stop()
    floor = GrpcFloor("stream")
    try:
        floor_stream = stream_cost(floor)
    finally:
        floor.stop()
    for row in rows:
        print(table_line(row), flush=True)
    json_row, grpc_row, floor_row = rows
    summary = {
        "grpc_vs_json_req_per_s": round(grpc_row.requests_per_s / json_row.requests_per_s, 3),
        "grpcio_alone_vs_json_req_per_s": round(floor_row.requests_per_s / json_row.requests_per_s, 3),
        "cpu_us_per_call": {
            "json": round(json_row.cpu_ms_per_request * 1000, 1),
            "grpc": round(grpc_row.cpu_ms_per_request * 1000, 1),
            "grpcio_alone": round(floor_row.cpu_ms_per_request * 1000, 1),
        },
        "stream": {"edgeinfer": edgeinfer_stream, "grpcio_alone": floor_stream},
    }
    return rows, summary


def grpc_markdown(rows: list[Row], summary: dict, main_rows: list[Row]) -> str:
    cpu, stream = summary["cpu_us_per_call"], summary["stream"]
    ratio = summary["grpc_vs_json_req_per_s"]
    cnn = [row for row in main_rows if row.model == "cnn" and row.protocol == "grpc"]
    cnn_text = ", ".join(f"c={row.concurrency}: {row.ratio_to_inprocess:.2f}" for row in cnn)
    return (
        "gRPC (`tiny`, concurrency 64; grpcio alone: a grpc.aio server answering fixed bytes, "
        "bench/grpc_floor.py):\n\n"
        f"- server CPU per call: JSON over HTTP {cpu['json']:.0f} us, gRPC {cpu['grpc']:.0f} us, grpcio "
        f"alone {cpu['grpcio_alone']:.0f} us\n"
        f"- gRPC req/s / JSON req/s: {ratio:.2f} (target >= 0.8: {'met' if ratio >= 0.8 else 'not met'}); "
        f"grpcio alone / JSON: {summary['grpcio_alone_vs_json_req_per_s']:.2f}\n"
        f"- ModelStreamInfer ({GRPC_STREAMS} streams, {grpc_floor.WINDOW} messages in flight each): "
        f"{stream['edgeinfer']['cpu_us_per_message']:.0f} us of server CPU per message "
        f"({stream['edgeinfer']['messages_per_s']:,.0f} messages/s), grpcio alone "
        f"{stream['grpcio_alone']['cpu_us_per_message']:.0f} us\n"
        + (f"- `cnn` over gRPC, vs in-process ONNX Runtime: {cnn_text} (target >= 0.95)\n" if cnn else "")
        + f"\n{table(rows)}\n"
    )


TRACING_CASES: tuple[tuple[str, float | None], ...] = (("off", None), ("ratio 0.01", 0.01), ("ratio 1", 1.0))
TRACING_ROUNDS = 3


def tracing_costs(config: Path, duration: float, limits: dict[int, float]) -> tuple[list[Row], dict]:
    """What OpenTelemetry tracing costs per request: `tiny` over JSON at concurrency 1 and 64, with
    tracing off (the SDK never imported) and on at sampling ratios 0.01 and 1, the spans exported over
    OTLP/HTTP to a receiver in another process that discards them (bench/otlp_sink.py). One server per
    case, all running; the cases alternate, TRACING_ROUNDS rounds, and the medians are reported."""
    sink_port = free_port()
    sink = subprocess.Popen(
        [sys.executable, str(HERE / "otlp_sink.py"), str(sink_port)], stdout=subprocess.PIPE, text=True
    )
    assert sink.stdout is not None
    assert sink.stdout.readline().strip() == "ready"
    base = json.loads(config.read_text())
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink_port}"}
    servers: dict[str, Process] = {}
    rows: list[Row] = []
    try:
        for label, ratio in TRACING_CASES:
            path = config
            if ratio is not None:
                path = WORK / f"edgeinfer-tracing-{ratio}.yaml"
                path.write_text(json.dumps({**base, "tracing": {"enabled": True, "sampling_ratio": ratio}}))
            servers[label] = edgeinfer_process(path, 1, f"edgeinfer-tracing-{ratio or 'off'}", env)
        footprint = {
            label: {"ready_s": round(server.ready_s, 3), "idle_rss_mib": round(server.memory_mib("VmRSS"), 1)}
            for label, server in servers.items()
        }
        body = json_body("tiny")
        for _ in range(TRACING_ROUNDS):
            for concurrency in (1, 64):
                for label, server in servers.items():
                    row = measure(server, f"edgeinfer, tracing {label}", "tiny", "json", body, concurrency,
                                  duration, False, limits)  # fmt: skip
                    rows.append(row)
                    print(table_line(row), flush=True)
    finally:
        for server in servers.values():
            server.stop()
        sink.terminate()
        exports = sink.communicate(timeout=10)[0].strip()
    summary: dict = {"footprint": footprint, "sink": exports}
    for concurrency in (1, 64):
        cases = {}
        for label, _ in TRACING_CASES:
            mine = [r for r in rows if r.concurrency == concurrency and r.server.endswith(f"tracing {label}")]
            cases[label] = {
                "req_per_s": round(float(np.median([r.requests_per_s for r in mine])), 1),
                "p50_ms": round(float(np.median([r.p50_ms for r in mine])), 3),
                "p99_ms": round(float(np.median([r.p99_ms for r in mine])), 3),
                "cpu_us_per_request": round(float(np.median([r.cpu_ms_per_request for r in mine])) * 1000, 1),
                "req_per_s_spread": round(
                    max(r.requests_per_s for r in mine) - min(r.requests_per_s for r in mine)
                ),
            }
        off = cases["off"]
        for values in cases.values():
            values["req_per_s_vs_off"] = round(values["req_per_s"] / off["req_per_s"], 3)
            values["cpu_us_added"] = round(values["cpu_us_per_request"] - off["cpu_us_per_request"], 1)
        summary[f"c{concurrency}"] = cases
    return rows, summary


def tracing_markdown(rows: list[Row], summary: dict) -> str:
    lines = [
        f"Tracing (`tiny` JSON; medians of {TRACING_ROUNDS} alternating rounds; spans exported over "
        "OTLP/HTTP to a receiver that discards them, bench/otlp_sink.py; idle RSS and ready time "
        f"{json.dumps(summary['footprint'])}):\n",
        "| tracing | conc | req/s | vs off | p50 ms | p99 ms | CPU us/req | added | req/s spread |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for concurrency in (1, 64):
        for label, values in summary[f"c{concurrency}"].items():
            lines.append(
                f"| {label} | {concurrency} | {values['req_per_s']:,.0f} | "
                f"{values['req_per_s_vs_off']:.3f} | "
                f"{values['p50_ms']:.3f} | {values['p99_ms']:.3f} | {values['cpu_us_per_request']:.1f} | "
                f"{values['cpu_us_added']:+.1f} | {values['req_per_s_spread']:,} |"
            )
    return "\n".join(lines) + f"\n\n{table(rows)}\n"


# (model, concurrency): the cases measured with workers 1 and 2 (JSON, unpinned)
SCALING_CASES = (("cnn", 16), ("tiny", 64))


def scaling(config: Path, duration: float, limits: dict[str, dict[int, float]]) -> tuple[list[Row], dict]:
    """workers: 1 against workers: 2, and the pure-Python model in a thread against two processes."""
    ceiling = {
        "cnn": {1: inprocess_parallel(WORK / "cnn.onnx", "cnn", 2, 3.0)},
        "tiny": limits.get("tiny") or {1: 1.0},
        "python": {1: inprocess_python(3.0)},
    }
    print(f"in-process cnn, two sessions in two threads: {ceiling['cnn'][1]:,.1f} images/s")
    print(f"in-process python model, one thread: {ceiling['python'][1]:,.1f} images/s")
    rows: list[Row] = []
    for workers in (1, 2):
        server = edgeinfer_process(config, workers)
        try:
            for model, concurrency in SCALING_CASES:
                row = measure(server, "edgeinfer", model, "json", json_body(model), concurrency, duration,
                              False, ceiling[model], workers)  # fmt: skip
                rows.append(row)
                print(table_line(row), flush=True)
            if workers == 1:
                for model in PYTHON_MODELS:
                    row = measure(server, "edgeinfer", model, "json", json_body("python"), 8, duration, False,
                                  ceiling["python"], workers)  # fmt: skip
                    rows.append(row)
                    print(table_line(row), flush=True)
        finally:
            server.stop()
    return rows, {"cnn_two_sessions_images_per_s": ceiling["cnn"][1], "python_one_thread_images_per_s":
                  ceiling["python"][1]}  # fmt: skip


def scaling_summary(rows: list[Row]) -> dict[str, float]:
    """The ratios the targets are about."""
    by = {(row.model, row.workers): row for row in rows}
    summary: dict[str, float] = {}
    if ("cnn", 1) in by and ("cnn", 2) in by:
        summary["cnn_json_c16_workers2_vs_inprocess_two_sessions"] = by["cnn", 2].ratio_to_inprocess
        summary["cnn_json_c16_workers2_vs_workers1"] = round(
            by["cnn", 2].rows_per_s / by["cnn", 1].rows_per_s, 2
        )
    if ("tiny", 1) in by and ("tiny", 2) in by:
        summary["tiny_json_c64_workers2_vs_workers1"] = round(
            by["tiny", 2].requests_per_s / by["tiny", 1].requests_per_s, 2
        )
    if ("python_thread", 1) in by and ("python_process", 1) in by:
        summary["python_c8_process2_vs_thread"] = round(
            by["python_process", 1].rows_per_s / by["python_thread", 1].rows_per_s, 2
        )
    return summary


README = ROOT / "README.md"
DOCS_PLOT = ROOT / "docs" / "img" / "slo-ramp.png"
RAMP_HEADING = "Ramp (open-loop Poisson):"
TABLE_START, TABLE_END = "<!-- bench:start -->", "<!-- bench:end -->"


def write_reference(markdown: str) -> None:
    """The run becomes the reference, and the README's table between the markers is regenerated."""
    (RESULTS / "reference.md").write_text(markdown)
    README.write_text(readme_with_reference(README.read_text(), markdown))


def readme_with_reference(readme: str, markdown: str) -> str:
    """``readme`` with its table between the markers made from the reference run ``markdown`` (all of it
    but the ramp's steps, which stay in the reference). tests/unit/test_bench_reference.py holds the
    README to it."""
    ramp = markdown.find(RAMP_HEADING)
    if ramp >= 0:
        markdown = (
            markdown[:ramp] + "The ramp's steps are in bench/results/reference.md; its plot is in "
            "docs/batching.md.\n"
        )
    start, end = readme.index(TABLE_START) + len(TABLE_START), readme.index(TABLE_END)
    body = markdown.split("\n", 2)[2]  # without the title line
    return f"{readme[:start]}\n{body.strip()}\n{readme[end:]}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per case")
    parser.add_argument("--models", default="tiny,cnn")
    parser.add_argument("--concurrency", default="1,8,64")
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    parser.add_argument("--servers", default="edgeinfer,fastapi,fastapi_threads")
    parser.add_argument("--protocols", default="json,binary,grpc", help="binary and grpc: edgeinfer only")
    parser.add_argument("--no-scaling", action="store_true", help="skip the workers/process cases")
    parser.add_argument("--no-slo", action="store_true", help="skip the latency-objective cases (slo.py)")
    parser.add_argument("--no-tracing", action="store_true", help="skip the tracing cost cases")
    parser.add_argument("--reference", action="store_true", help="keep the run as the reference (all cases)")
    args = parser.parse_args()
    if args.reference and any(
        getattr(args, key) != parser.get_default(key)
        for key in (
            "models", "concurrency", "servers", "protocols", "no_scaling", "no_slo", "no_tracing", "threads"
        )
    ):  # fmt: skip
        raise SystemExit(
            "--reference needs every case: leave --models, --concurrency, --servers, --protocols, "
            "--threads, --no-scaling, --no-slo and --no-tracing at their defaults"
        )
    for tool in ("wrk", "h2load"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is needed: apt-get install wrk nghttp2-client (make bench does this)")
    WORK.mkdir(parents=True, exist_ok=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    wanted_models = args.models.split(",")
    concurrencies = [int(value) for value in args.concurrency.split(",")]
    paths = build_models()
    protocols = args.protocols.split(",")
    makers = {"json": json_body, "binary": binary_body, "grpc": grpc_body}
    bodies = {(model, protocol): makers[protocol](model) for model in wanted_models for protocol in protocols}

    limits = {}
    for model in wanted_models:
        limits[model] = inprocess(
            paths[model], model, args.threads, [1, 4, 16, 64] if model == "tiny" else [1, 4, 8], 1.0
        )
        print(
            f"in-process {model}: "
            + ", ".join(f"batch {b}: {r:,.0f} rows/s" for b, r in limits[model].items())
        )

    servers = {}
    config = edgeinfer_config(paths, args.threads)
    if "edgeinfer" in args.servers:
        servers["edgeinfer"] = edgeinfer_process(config, 1)
    for name, mode in (("fastapi", "loop"), ("fastapi_threads", "threadpool")):
        if name in args.servers.split(","):
            port = free_port()
            servers[name] = Process(
                name,
                [sys.executable, str(HERE / "baseline_fastapi.py"), str(port), str(args.threads), mode,
                 *(f"{model}={paths[model]}" for model in wanted_models)],
                port,
            )  # fmt: skip
    footprint = {
        name: {"ready_s": round(server.ready_s, 3), "idle_rss_mib": round(server.memory_mib("VmRSS"), 1)}
        for name, server in servers.items()
    }

    rows: list[Row] = []
    routed_rows: list[Row] = []
    routing_summary: dict = {}
    grpc_rows: list[Row] = []
    grpc_summary: dict = {}
    try:
        for model in wanted_models:
            for protocol in protocols:
                for pinned in [False, True] if model == "tiny" else [False]:
                    for name, server in servers.items():
                        if protocol != "json" and name != "edgeinfer":
                            continue  # the baseline speaks JSON only
                        server.pin("0" if pinned else "0-1")
                        for concurrency in concurrencies:
                            row = measure(
                                server, name, model, protocol, bodies[model, protocol], concurrency,
                                args.duration, pinned, limits[model],
                            )  # fmt: skip
                            rows.append(row)
                            print(table_line(row), flush=True)
                        server.pin("0-1")
        for name, server in servers.items():
            footprint[name]["peak_rss_mib"] = round(server.memory_mib("VmHWM"), 1)
        if "edgeinfer" in servers and "tiny" in wanted_models and "json" in protocols and 64 in concurrencies:
            routed_rows, routing_summary = routing(servers["edgeinfer"], args.duration, limits["tiny"])
            if "grpc" in protocols:
                grpc_rows, grpc_summary = grpc_costs(servers["edgeinfer"], args.duration, limits["tiny"])
    finally:
        for server in servers.values():
            server.stop()

    logged_rows: list[Row] = []
    if "edgeinfer" in args.servers and "tiny" in wanted_models and "json" in protocols:
        logged_rows = with_default_logging(
            paths, args.threads, bodies["tiny", "json"], concurrencies, args.duration, limits["tiny"]
        )
    traced_rows: list[Row] = []
    tracing_summary: dict = {}
    if "edgeinfer" in args.servers and "tiny" in wanted_models and not args.no_tracing:
        traced_rows, tracing_summary = tracing_costs(config, args.duration, limits["tiny"])
    scaled: list[Row] = []
    ceilings: dict[str, float] = {}
    if "edgeinfer" in args.servers and not args.no_scaling:
        scaled, ceilings = scaling(edgeinfer_config(paths, args.threads, python=True), args.duration, limits)
    slo_document: dict = {}
    slo_markdown = ""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    plot = RESULTS / f"slo-ramp-{stamp}.png"
    if not args.no_slo:
        import slo

        slo_document, slo_markdown = slo.measure_all(3.0, plot)
    summary = table(rows)
    ratios = scaling_summary(scaled)
    print("\n" + summary)
    if scaled:
        print("\n" + table(scaled) + "\n\n" + json.dumps(ratios, indent=1))
    print("\nfootprint: " + json.dumps(footprint))
    document = {
        "when": stamp,
        "args": vars(args),
        "inprocess_rows_per_s": limits,
        "inprocess_ceilings": ceilings,
        "footprint": footprint,
        "rows": [asdict(row) for row in rows],
        "default_logging_rows": [asdict(row) for row in logged_rows],
        "scaling_rows": [asdict(row) for row in scaled],
        "scaling_ratios": ratios,
        "routing_rows": [asdict(row) for row in routed_rows],
        "routing": routing_summary,
        "grpc_rows": [asdict(row) for row in grpc_rows],
        "grpc": grpc_summary,
        "tracing_rows": [asdict(row) for row in traced_rows],
        "tracing": tracing_summary,
        "slo": slo_document,
    }
    (RESULTS / f"{stamp}.json").write_text(json.dumps(document, indent=1))
    markdown = (
        f"# Benchmark {stamp}\n\nIn-process ONNX Runtime rows/s ({args.threads} thread; the median of "
        f"{INPROCESS_REPEATS} one-second samples at each batch size): "
        + json.dumps({m: {b: round(r) for b, r in lim.items()} for m, lim in limits.items()})
        + f"\n\nFootprint: {json.dumps(footprint)}\n\n{summary}\n"
    )
    if logged_rows:
        markdown += (
            "\nEvery case above logs at WARNING, which turns the access log off. The headline case with the "
            f"default logging (INFO: an access line a request, to a file):\n\n{table(logged_rows)}\n"
        )
    if scaled:
        markdown += (
            "\nScaling (`workers`, process instances); in-process ceilings: "
            + json.dumps({key: round(value, 1) for key, value in ceilings.items()})
            + f"\n\n{table(scaled)}\n\nRatios: {json.dumps(ratios)}\n"
        )
    if routed_rows:
        routing_text = routing_markdown(routed_rows, routing_summary)
        markdown += "\n" + routing_text
        print("\n" + routing_text)
    if grpc_rows:
        grpc_text = grpc_markdown(grpc_rows, grpc_summary, rows)
        markdown += "\n" + grpc_text
        print("\n" + grpc_text)
    if traced_rows:
        tracing_text = tracing_markdown(traced_rows, tracing_summary)
        markdown += "\n" + tracing_text
        print("\n" + tracing_text)
    if slo_markdown:
        markdown += "\n" + slo_markdown
        print("\n" + slo_markdown)
    (RESULTS / "latest.md").write_text(markdown)
    print(f"\nwrote {RESULTS / (stamp + '.json')} and {RESULTS / 'latest.md'}")
    if args.reference:
        write_reference(markdown)
        print(f"wrote {RESULTS / 'reference.md'} and the README table")
        if plot.exists():
            DOCS_PLOT.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(plot, DOCS_PLOT)
            print(f"wrote {DOCS_PLOT}")


if __name__ == "__main__":
    main()
