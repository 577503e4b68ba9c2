"""Test helpers: free ports, a plain HTTP client, the real server as a subprocess, and small ONNX models."""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import orjson
import pytest
from onnx import TensorProto, helper, numpy_helper
from prometheus_client.parser import text_string_to_metric_families

from edgeinfer.protocol.datatypes import v2_datatype

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


NUMERIC_DTYPES: dict[str, type] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}


def needs_tool(name: str) -> pytest.MarkDecorator:
    """Skip where the program ``name`` is not on PATH; in CI that skip is a failure (tests/conftest.py),
    so a machine without what ``make system-packages`` installs cannot pass by skipping."""
    return pytest.mark.skipif(
        shutil.which(name) is None, reason=f"{name} is not installed (make system-packages installs it)"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Reply:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return orjson.loads(self.body)

    @property
    def error(self) -> str:
        return self.json()["error"]


def request(
    port: int,
    method: str,
    path: str,
    body: bytes | dict | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30,
    tls: ssl.SSLContext | None = None,
) -> Reply:
    """One request on a new connection (over TLS with ``tls``, a client context)."""
    if isinstance(body, dict):
        body = orjson.dumps(body)
    connection = (
        http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=tls)
        if tls is not None
        else http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    )
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        connection.close()


def grpc_refusal(grpc_port: int, message: Any, metadata: tuple[tuple[str, str], ...] = ()) -> Any:
    """Send ``message`` (a ModelInferRequest) as a plain gRPC call that the server refuses: the
    ``grpc.RpcError``, with its code, details and trailing metadata (tritonclient's error keeps no
    trailers). Fails the test if the call is answered."""
    import grpc
    import pytest

    from edgeinfer.protocol.grpc_gen import edgeinfer_grpc_v2_pb2 as pb

    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        infer = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as raised:
            infer(message, metadata=metadata, timeout=10)
    return raised.value


def rollout(
    grpc_port: int,
    method: str,
    metadata: list[tuple[str, str]] | None = None,
    root_certificates: bytes | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """Call ``edgeinfer.rollouts.v1.RolloutService/<method>`` over gRPC (TLS when given the CA's PEM);
    its JSON answer, parsed. ``fields``: model_name, action, and ``document`` (sent as ``json``)."""
    import grpc

    from edgeinfer.protocol.grpc_gen import edgeinfer_rollouts_pb2 as pb

    document = fields.pop("document", None)
    if document is not None:
        fields["json"] = document if isinstance(document, str) else orjson.dumps(document).decode()
    if root_certificates is None:
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    else:
        credentials = grpc.ssl_channel_credentials(root_certificates=root_certificates)
        channel = grpc.secure_channel(f"localhost:{grpc_port}", credentials)
    with channel:
        call = channel.unary_unary(
            f"/edgeinfer.rollouts.v1.RolloutService/{method}",
            request_serializer=pb.RolloutRequest.SerializeToString,
            response_deserializer=pb.RolloutResponse.FromString,
        )
        answer = call(pb.RolloutRequest(**fields), metadata=metadata, timeout=30)
    return dict(orjson.loads(answer.json))


def infer_body(inputs: dict[str, np.ndarray], **extra: Any) -> dict:
    return {
        "inputs": [
            {
                "name": name,
                "shape": list(array.shape),
                "datatype": _v2(array),
                "data": [x.decode() for x in array.reshape(-1)]
                if array.dtype == object
                else array.reshape(-1).tolist(),
            }
            for name, array in inputs.items()
        ],
        **extra,
    }


def _v2(array: np.ndarray) -> str:
    return v2_datatype(array.dtype)


def scrape(port: int) -> dict[str, dict[tuple, float]]:
    """Every sample of ``GET /metrics``: name -> sorted labels -> value."""
    reply = request(port, "GET", "/metrics")
    assert reply.status == 200, reply.body
    assert reply.headers["content-type"].startswith("text/plain")
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(reply.body.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def metric(samples: dict[str, dict[tuple, float]], name: str, **labels: str) -> float:
    return samples[name][tuple(sorted(labels.items()))]


def wait_for(condition: Any, timeout: float = 10.0, what: str = "condition", now: Any = None) -> None:
    """Poll ``condition()`` until it is true; fail naming ``what`` after ``timeout`` seconds, and what
    ``now()`` says then (the state the condition read, at the end of the wait)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    state = f" (now {now()})" if now is not None else ""
    raise AssertionError(f"{what} not met within {timeout} s{state}")


def queue_state(port: int, model: str, version: str = "1") -> tuple[float, float]:
    """(requests queued, requests received and not yet answered) for one model version, from /metrics."""
    samples = scrape(port)
    labels = {"model": model, "version": version}
    return (
        metric(samples, "edgeinfer_queue_length", **labels),
        metric(samples, "edgeinfer_inflight_requests", **labels),
    )


def wait_queue(port: int, model: str, queued: int, inflight: int, timeout: float = 20.0) -> None:
    """Wait until ``model`` has exactly ``queued`` requests waiting and ``inflight`` not yet answered."""
    wait_for(
        lambda: queue_state(port, model) == (queued, inflight),
        timeout,
        f"{model}: {queued} queued and {inflight} in flight",
        now=lambda: queue_state(port, model),
    )


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (a supervisor's workers, a model's process instances), in the
    order the kernel lists them, whichever of its threads started them."""
    found: list[int] = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        with contextlib.suppress(FileNotFoundError):  # the thread ended meanwhile
            found += [int(child) for child in (task / "children").read_text().split()]
    return found


def wait_ready(
    port: int,
    timeout: float,
    process: subprocess.Popen[bytes] | None = None,
    tls: ssl.SSLContext | None = None,
) -> bool:
    """Poll /v2/health/ready until it answers 200 (True), the process exits or time runs out (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            return False
        try:
            if request(port, "GET", "/v2/health/ready", timeout=1, tls=tls).status == 200:
                return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


class ServerProcess:
    """``edgeinfer serve`` in a subprocess on a free port; ready means /v2/health/ready answered 200."""

    def __init__(
        self,
        args: list[str],
        cwd: Path = ROOT,
        env: dict[str, str] | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.tls = tls  # the client context that readiness is polled with, for a server serving TLS
        self.port = free_port()
        self.grpc_port = free_port()
        self.metrics_port = free_port()
        self.args = args
        self.cwd = cwd
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None

    def start(self, log_path: Path, timeout: float = 30) -> ServerProcess:
        """Start and wait until ready. A free port can be taken by another socket (a test client's
        outgoing connection) between ``free_port()`` and the server's bind: then new ports, twice more."""
        self.log_path = log_path
        for _attempt in range(3):
            command = [sys.executable, "-m", "edgeinfer", "serve", "--http-port", str(self.port)]
            command += [
                "--grpc-port",
                str(self.grpc_port),
                "--metrics-port",
                str(self.metrics_port),
                *self.args,
            ]
            with log_path.open("wb") as log:
                self.process = subprocess.Popen(
                    command, cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT
                )
            if wait_ready(self.port, timeout, self.process, self.tls):
                return self
            if self.process.poll() is None:
                self.stop()
                raise RuntimeError(f"server not ready in {timeout}s:\n{self.log()}")
            if self.process.returncode != 2 or "Address already in use" not in self.log():
                break
            self.port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path else ""

    def stop(self) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


@contextlib.contextmanager
def examples_server_that_survives(log_folder: Path) -> Iterator[ServerProcess]:
    """The bundled examples served for a module of generated inputs; at the end the server must still be
    running: no case crashed it."""
    server = ServerProcess(["--config", str(EXAMPLES / "config.yaml")])
    server.start(log_folder / "server.log")
    yield server
    assert server.process is not None
    assert server.process.poll() is None, "the server is still running after every case"
    server.stop()


def json_log_lines(server: ServerProcess) -> list[dict]:
    """The server's log lines in JSON format (``logging.format: json``), parsed."""
    return [orjson.loads(line) for line in server.log().splitlines() if line.startswith("{")]


def access_lines(server: ServerProcess) -> list[dict]:
    """The access log's lines: written just after each answer (``afterwards.py``), so a test that
    reads them right after an answer over gRPC waits for them."""
    return [line for line in json_log_lines(server) if line["logger"] == "edgeinfer.access"]


# ---- small ONNX models for the cases the examples do not cover ----

OPSET = [helper.make_opsetid("", 17)]


def save_model(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=OPSET)
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def matmul_model(path: Path, seed: int = 0, size: int = 16, fixed_batch: int | None = None) -> Path:
    """X FP32 [batch,size] -> MatMul -> Y FP32 [batch,size]."""
    weights = np.random.default_rng(seed).standard_normal((size, size)).astype(np.float32)
    batch: Any = fixed_batch if fixed_batch is not None else "batch"
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])],
        "matmul",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [batch, size])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [batch, size])],
        [numpy_helper.from_array(weights, "W")],
    )
    return save_model(graph, path)


def slow_model(path: Path, repeats: int = 100, size: int = 256, row_s: float | None = None) -> Path:
    """X FP32 [batch,size] -> outer product -> repeats x (MatMul size^3, Tanh) -> mean -> Y FP32 [batch,size].

    Compute-bound (about size^3 * repeats multiply-adds per row), for tests that need a batch to take a
    while: queueing, deadlines, disconnects. ``row_s``: as many repeats as take about that long per row
    on this machine (measured here), so that what a test fits in while a batch runs (a few scrapes, a
    request sent on another connection) fits on a fast machine too.
    """
    if row_s is not None:
        repeats = max(1, round(row_s / _repeat_s(path, size)))
    # scaled by 1/sqrt(size), the sum of ``size`` terms keeps its magnitude: scaled by 1/size, every
    # MatMul shrank the values 16 times, and after some 30 of them they were subnormal floats, several
    # times slower to compute (0.3 s a row where 0.1 was asked for, while zeros took 0.03)
    weights = (np.random.default_rng(0).standard_normal((size, size)) / np.sqrt(size)).astype(np.float32)
    axes2 = numpy_helper.from_array(np.array([2], dtype=np.int64), "axes2")
    axes1 = numpy_helper.from_array(np.array([1], dtype=np.int64), "axes1")
    nodes = [
        helper.make_node("Unsqueeze", ["X", "axes2"], ["column"]),
        helper.make_node("Unsqueeze", ["X", "axes1"], ["row"]),
        helper.make_node("MatMul", ["column", "row"], ["t_start"]),
    ]
    last = "t_start"
    for index in range(repeats):
        nodes.append(helper.make_node("MatMul", [last, "W"], [f"m{index}"]))
        nodes.append(helper.make_node("Tanh", [f"m{index}"], [f"t{index}"]))
        last = f"t{index}"
    nodes.append(
        helper.make_node("ReduceMean", [last], ["Y"], axes=[2], keepdims=0)
    )  # opset 17: an attribute
    graph = helper.make_graph(
        nodes,
        "slow",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", size])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", size])],
        [numpy_helper.from_array(weights, "W"), axes1, axes2],
    )
    return save_model(graph, path)


def _repeat_s(path: Path, size: int) -> float:
    """Seconds one repeat of ``slow_model`` takes for one row here (ONNX Runtime, one thread)."""
    import onnxruntime as ort

    probe = slow_model(path, repeats=20, size=size)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(probe), options, providers=["CPUExecutionProvider"])
    row = {"X": np.full((1, size), 0.01, np.float32)}
    session.run(None, row)
    times = []
    for _ in range(5):
        started = time.perf_counter()
        session.run(None, row)
        times.append(time.perf_counter() - started)
    return min(times) / 20


def row_changing_model(path: Path) -> Path:
    """X FP32 [batch,4] -> keeps only the rows whose first value is positive -> Y FP32 [rows,4].

    The output's first dimension is dynamic, so the model looks batchable, but a request with a
    non-positive first value gets fewer output rows than it sent: such outputs cannot be split back.
    """
    zero = numpy_helper.from_array(np.array(0, dtype=np.int64), "zero")
    threshold = numpy_helper.from_array(np.array(0, dtype=np.float32), "threshold")
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["X", "zero"], ["first"], axis=1),
            helper.make_node("Greater", ["first", "threshold"], ["keep"]),
            helper.make_node("Compress", ["X", "keep"], ["Y"], axis=0),
        ],
        "row_changing",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["kept", 4])],
        [zero, threshold],
    )
    return save_model(graph, path)


def failing_model(path: Path) -> Path:
    """X FP32 [batch,4], I INT64 [batch]: Gather(axis 1) fails at run time when I is out of range."""
    graph = helper.make_graph(
        [helper.make_node("Gather", ["X", "I"], ["Y"], axis=1)],
        "failing",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("I", TensorProto.INT64, ["batch"]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", "batch2"])],
    )
    return save_model(graph, path)


def dynamic_model(path: Path) -> Path:
    """X FP32 [batch, n] -> ReduceSum over n -> Y FP32 [batch, 1]: a dynamic dimension besides the batch."""
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["X", "axes"], ["Y"], keepdims=1)],
        "dynamic",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", "n"])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 1])],
        [numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")],
    )
    return save_model(graph, path)
