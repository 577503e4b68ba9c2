"""`make bench`: edgeinfer against in-process ONNX Runtime and a bare FastAPI endpoint, in one run.

    python bench/run.py [--duration 5] [--models tiny,cnn] [--concurrency 1,8,64] [--threads 1]

1. builds the models (bench/models.py) and one JSON request body per model;
2. measures in-process ONNX Runtime throughput at each batch size with the same threads: the limit;
3. starts edgeinfer (`python -m edgeinfer serve`) and the FastAPI baseline (bench/baseline_fastapi.py),
   and drives each with wrk (a C load generator, so no Python client steals the server's CPU) at every
   concurrency, unpinned, and for `tiny` also pinned (server on CPU 0, wrk on CPU 1);
4. prints one table and writes it as JSON and Markdown under bench/results/. "vs in-process" divides the
   served rows/s by in-process rows/s at the measured batch size nearest the mean batch actually formed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
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

import models  # noqa: E402  (bench/ is not a package)

INPUTS = {"tiny": ("INPUT0", (16,)), "cnn": ("input", (3, 224, 224))}
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Row:
    server: str
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


def json_body(model: str, rows: int = 1) -> Path:
    name, shape = INPUTS[model]
    data = np.random.default_rng(0).standard_normal((rows, *shape)).astype(np.float32)
    body = {
        "inputs": [{"name": name, "shape": list(data.shape), "datatype": "FP32", "data": data.reshape(-1)}]
    }
    path = WORK / f"{model}.json"
    path.write_bytes(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY))
    return path


def inprocess(
    path: Path, model: str, threads: int, batch_sizes: list[int], seconds: float
) -> dict[int, float]:
    """Rows per second of session.run at each batch size: the ceiling for the server."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options)
    name, shape = INPUTS[model]
    limits = {}
    for batch in batch_sizes:
        feed = {name: np.random.default_rng(0).standard_normal((batch, *shape)).astype(np.float32)}
        session.run(None, feed)
        runs, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            session.run(None, feed)
            runs += 1
        limits[batch] = runs * batch / (time.perf_counter() - started)
    return limits


class Process:
    def __init__(self, name: str, command: list[str], port: int) -> None:
        self.name = name
        self.port = port
        self.log = (WORK / f"{name}.log").open("wb")
        self.process = subprocess.Popen(command, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)
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
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

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


def batch_counts(port: int, model: str) -> tuple[int, int]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{model}/stats", timeout=5) as reply:
            [entry] = json.loads(reply.read())["model_stats"]
        return entry["inference_count"], entry["execution_count"]
    except OSError:
        return 0, 0


def wrk(port: int, path: str, body: Path, concurrency: int, seconds: float, pinned: bool) -> dict:
    command = [
        "wrk", "-t1", f"-c{concurrency}", f"-d{max(1, round(seconds))}s", "--timeout", "10s",
        "-s", str(HERE / "report.lua"), f"http://127.0.0.1:{port}{path}",
    ]  # fmt: skip
    if pinned:
        command = ["taskset", "-c", "1", *command]
    result = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "BENCH_BODY": str(body)}
    )
    line = [text for text in result.stdout.splitlines() if text.startswith("{")]
    if not line:
        raise SystemExit(f"wrk failed: {result.stdout}\n{result.stderr}")
    return json.loads(line[-1])


def nearest_limit(limits: dict[int, float], batch: float) -> float:
    """In-process rows/s at the measured batch size closest (on a log scale) to the mean batch formed."""
    size = min(limits, key=lambda measured: abs(np.log(measured) - np.log(max(batch, 1.0))))
    return limits[size]


def measure(
    server: Process, label: str, model: str, body: Path, concurrency: int, seconds: float, pinned: bool,
    limits: dict[int, float],
) -> Row:  # fmt: skip
    path = f"/v2/models/{model}/infer"
    wrk(server.port, path, body, concurrency, min(1.0, seconds), pinned)  # warm up connections and caches
    rows_before, executions_before = batch_counts(server.port, model)
    cpu_before = server.cpu_s()
    result = wrk(server.port, path, body, concurrency, seconds, pinned)
    cpu = server.cpu_s() - cpu_before
    rows_after, executions_after = batch_counts(server.port, model)
    requests = max(1, result["requests"])
    rate = result["requests"] / (result["duration_us"] / 1e6)
    executions = executions_after - executions_before
    mean_batch = (rows_after - rows_before) / executions if executions else 1.0
    return Row(
        server=label,
        model=model,
        protocol="json",
        concurrency=concurrency,
        pinned=pinned,
        requests_per_s=round(rate, 1),
        rows_per_s=round(rate, 1),
        p50_ms=result["p50_us"] / 1000,
        p90_ms=result["p90_us"] / 1000,
        p99_ms=result["p99_us"] / 1000,
        mean_batch=round(mean_batch, 2),
        cpu_ms_per_request=round(cpu * 1000 / requests, 3),
        errors=result["status_errors"] + result["socket_errors"],
        ratio_to_inprocess=round(rate / nearest_limit(limits, mean_batch), 3),
    )


def edgeinfer_config(paths: dict[str, Path], threads: int) -> Path:
    config = {
        "models": {
            "tiny": {
                "model_path": str(paths["tiny"]),
                "backend_config": {"intra_op_num_threads": threads, "inter_op_num_threads": 1},
                "max_batch_size": 64,
                "batch_timeout_millis": 0,
                "max_queue_size": 1024,
            },
            "cnn": {
                "model_path": str(paths["cnn"]),
                "backend_config": {"intra_op_num_threads": threads, "inter_op_num_threads": 1},
                "max_batch_size": 8,
                "batch_timeout_millis": 0,
                "max_concurrent_batches": 2,
                "max_queue_size": 1024,
            },
        },
        "logging": {"level": "WARNING"},
    }
    path = WORK / "edgeinfer.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


TABLE_HEADER = (
    "| server | model | conc | pinned | req/s | rows/s | p50 ms | p90 ms | p99 ms | batch | CPU ms/req "
    "| errors | vs in-process |"
)


def table_line(row: Row) -> str:
    return (
        f"| {row.server} | {row.model} | {row.concurrency} | {'yes' if row.pinned else 'no'} | "
        f"{row.requests_per_s:,.0f} | {row.rows_per_s:,.0f} | {row.p50_ms:.3f} | {row.p90_ms:.3f} | "
        f"{row.p99_ms:.3f} | {row.mean_batch:.2f} | {row.cpu_ms_per_request:.3f} | {row.errors} | "
        f"{row.ratio_to_inprocess:.3f} |"
    )


def table(rows: list[Row]) -> str:
    return "\n".join([TABLE_HEADER, "|" + "---|" * 13, *(table_line(row) for row in rows)])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per case")
    parser.add_argument("--models", default="tiny,cnn")
    parser.add_argument("--concurrency", default="1,8,64")
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    parser.add_argument("--servers", default="edgeinfer,fastapi")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is needed: apt-get install wrk (make bench does this)")
    WORK.mkdir(parents=True, exist_ok=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    wanted_models = args.models.split(",")
    concurrencies = [int(value) for value in args.concurrency.split(",")]
    paths = build_models()
    bodies = {model: json_body(model) for model in wanted_models}

    limits = {}
    for model in wanted_models:
        limits[model] = inprocess(
            paths[model], model, args.threads, [1, 4, 16, 64] if model == "tiny" else [1, 4, 8], 2.0
        )
        print(
            f"in-process {model}: "
            + ", ".join(f"batch {b}: {r:,.0f} rows/s" for b, r in limits[model].items())
        )

    servers = {}
    if "edgeinfer" in args.servers:
        port = free_port()
        config = edgeinfer_config(paths, args.threads)
        servers["edgeinfer"] = Process(
            "edgeinfer",
            [sys.executable, "-m", "edgeinfer", "serve", "--config", str(config), "--http-port", str(port),
             "--host", "127.0.0.1"],
            port,
        )  # fmt: skip
    if "fastapi" in args.servers:
        port = free_port()
        servers["fastapi"] = Process(
            "fastapi",
            [sys.executable, str(HERE / "baseline_fastapi.py"), str(port), str(args.threads),
             *(f"{model}={paths[model]}" for model in wanted_models)],
            port,
        )  # fmt: skip
    footprint = {
        name: {"ready_s": round(server.ready_s, 3), "idle_rss_mib": round(server.memory_mib("VmRSS"), 1)}
        for name, server in servers.items()
    }

    rows: list[Row] = []
    try:
        for model in wanted_models:
            for pinned in [False, True] if model == "tiny" else [False]:
                for name, server in servers.items():
                    server.pin("0" if pinned else "0-1")
                    for concurrency in concurrencies:
                        row = measure(
                            server,
                            name,
                            model,
                            bodies[model],
                            concurrency,
                            args.duration,
                            pinned,
                            limits[model],
                        )
                        rows.append(row)
                        print(table_line(row), flush=True)
                    server.pin("0-1")
        for name, server in servers.items():
            footprint[name]["peak_rss_mib"] = round(server.memory_mib("VmHWM"), 1)
    finally:
        for server in servers.values():
            server.stop()

    summary = table(rows)
    print("\n" + summary)
    print("\nfootprint: " + json.dumps(footprint))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    document = {
        "when": stamp,
        "args": vars(args),
        "inprocess_rows_per_s": limits,
        "footprint": footprint,
        "rows": [asdict(row) for row in rows],
    }
    (RESULTS / f"{stamp}.json").write_text(json.dumps(document, indent=1))
    (RESULTS / "latest.md").write_text(
        f"# Benchmark {stamp}\n\nIn-process ONNX Runtime rows/s ({args.threads} thread): "
        + json.dumps({m: {b: round(r) for b, r in lim.items()} for m, lim in limits.items()})
        + f"\n\nFootprint: {json.dumps(footprint)}\n\n{summary}\n"
    )
    print(f"\nwrote {RESULTS / (stamp + '.json')} and {RESULTS / 'latest.md'}")


if __name__ == "__main__":
    main()
