"""Tracing against the real server process: spans reach an OTLP receiver started by the test (over
OTLP/HTTP and OTLP/gRPC, chosen by the standard ``OTEL_*`` variables), continuing the ``traceparent``
that curl-style HTTP clients send as a header and tritonclient's gRPC client as metadata."""

from __future__ import annotations

import gzip
import queue
import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as otlp_grpc

from tests.support import ServerProcess, access_lines, infer_body, matmul_model, request, wait_for

HTTP_TRACE = "0af7651916cd43dd8448eb211c80319c"
GRPC_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
STREAM_TRACE = "5ce929d0e0e4736a3ce929d0e0e47360"
PARENT = "b7ad6b7169203331"
STREAM_PARENT = f"00-{STREAM_TRACE}-{PARENT}-01"  # every message of the stream continues its trace


class Received:
    """What an OTLP receiver got: every span with its resource's attributes."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def add(self, export: otlp.ExportTraceServiceRequest) -> None:
        with self._lock:
            for resource_spans in export.resource_spans:
                resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append(
                            {
                                "name": span.name,
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent": span.parent_span_id.hex(),
                                "attributes": {a.key: _value(a.value) for a in span.attributes},
                                "links": [link.span_id.hex() for link in span.links],
                                "resource": resource,
                            }
                        )

    def named(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            return [span for span in self.spans if span["name"] == name]


def _value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None


def http_receiver(received: Received) -> tuple[str, ThreadingHTTPServer]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            assert self.path == "/v1/traces", self.path
            received.add(otlp.ExportTraceServiceRequest.FromString(body))
            answer = otlp.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server


def grpc_receiver(received: Received) -> tuple[str, grpc.Server]:
    class Service(otlp_grpc.TraceServiceServicer):
        def Export(self, request: otlp.ExportTraceServiceRequest, context: Any) -> Any:
            received.add(request)
            return otlp.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    otlp_grpc.add_TraceServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return f"http://127.0.0.1:{port}", server


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(("http/protobuf", 1), id="OTLP/HTTP, 1 worker"),
        pytest.param(("grpc", 2), id="OTLP/gRPC, 2 workers", marks=pytest.mark.workers),
    ],
)
def traced(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A server exporting to a receiver started here; with 2 workers each forked worker exports its own."""
    root = tmp_path_factory.mktemp("traced")
    matmul_model(root / "matmul.onnx")
    (root / "config.yaml").write_text(
        "models: {matmul: {model_path: matmul.onnx, max_batch_size: 8}}\n"
        "logging: {format: json}\n"
        "tracing: {enabled: true, sampling_ratio: 0.0}\n"  # only what clients ask to sample is recorded
    )
    received = Received()
    protocol, workers = request.param
    endpoint, receiver = (http_receiver if protocol == "http/protobuf" else grpc_receiver)(received)
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_SERVICE_NAME": "edge-box-7",
    }
    server = ServerProcess(["--config", str(root / "config.yaml"), "--workers", str(workers)], env=env)
    server.start(root / "server.log")
    try:
        yield server, received
    finally:
        server.stop()
        if isinstance(receiver, ThreadingHTTPServer):
            receiver.shutdown()
            receiver.server_close()
        else:
            receiver.stop(None)


def test_http_and_grpc_requests_continue_the_clients_trace_and_reach_the_otlp_receiver(traced: Any):
    server, received = traced
    x = np.ones((1, 16), np.float32)
    reply = request(
        server.port,
        "POST",
        "/v2/models/matmul/infer",
        infer_body({"X": x}, id="http-7"),
        headers={"traceparent": f"00-{HTTP_TRACE}-{PARENT}-01"},
    )
    assert reply.status == 200
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        tensor = grpcclient.InferInput("X", [1, 16], "FP32")
        tensor.set_data_from_numpy(x)
        client.infer(
            "matmul", [tensor], request_id="grpc-7", headers={"traceparent": f"00-{GRPC_TRACE}-{PARENT}-01"}
        )
        unsampled = grpcclient.InferInput("X", [1, 16], "FP32")
        unsampled.set_data_from_numpy(x)
        client.infer("matmul", [unsampled], request_id="not-traced")  # ratio 0: no trace of its own
        answers: queue.Queue[Any] = queue.Queue()
        client.start_stream(lambda result, error: answers.put(error), headers={"traceparent": STREAM_PARENT})
        for index in range(2):
            client.async_stream_infer("matmul", [tensor], request_id=f"stream-{index}")
        assert [answers.get(timeout=30) for _ in range(2)] == [None, None]
        client.stop_stream()
    wait_for(lambda: len(received.named("encode")) >= 4, what="the four traced requests' spans exported")

    spans = {span["attributes"]["edgeinfer.request.id"]: span for span in received.named("infer matmul")}
    assert set(spans) == {"http-7", "grpc-7", "stream-0", "stream-1"}
    cases = (
        ("http-7", HTTP_TRACE, "http"),
        ("grpc-7", GRPC_TRACE, "grpc"),
        ("stream-0", STREAM_TRACE, "grpc"),
        ("stream-1", STREAM_TRACE, "grpc"),
    )
    for request_id, trace_id, protocol in cases:
        span = spans[request_id]
        assert (span["trace_id"], span["parent"]) == (trace_id, PARENT)
        assert span["attributes"]["edgeinfer.protocol"] == protocol
        assert span["attributes"]["edgeinfer.model.name"] == "matmul"
        assert span["attributes"]["edgeinfer.model.version"] == "1"
        assert span["resource"]["service.name"] == "edge-box-7", "OTEL_SERVICE_NAME is honoured"
        children = {s["name"] for s in received.spans if s["parent"] == span["span_id"]}
        assert children == {"decode", "queue", "compute", "encode"}
    batches = received.named("batch matmul")
    assert sorted(link for batch in batches for link in batch["links"]) == sorted(
        span["span_id"] for span in spans.values()
    )
    access = {line["request_id"]: line for line in access_lines(server)}
    assert access["http-7"]["trace_id"] == HTTP_TRACE, "the access log names the trace"
    assert "trace_id" not in access["not-traced"]


def test_tracing_without_the_sdk_is_refused_at_start_naming_the_extra(tmp_path: Path):
    (tmp_path / "config.yaml").write_text("tracing: {enabled: true}\n")
    # a directory named opentelemetry without an __init__ hides the installed package
    (tmp_path / "hide" / "opentelemetry").mkdir(parents=True)
    (tmp_path / "hide" / "opentelemetry" / "__init__.py").write_text("raise ImportError('hidden')\n")
    server = ServerProcess(
        ["--config", str(tmp_path / "config.yaml")], env={"PYTHONPATH": str(tmp_path / "hide")}
    )
    with pytest.raises(RuntimeError, match=r"pip install 'edgeinfer\[otel\]'"):
        server.start(tmp_path / "server.log", timeout=20)
    assert server.process is not None
    assert server.process.returncode == 2


def test_an_unknown_exporter_is_refused_at_start(tmp_path: Path):
    (tmp_path / "config.yaml").write_text("tracing: {enabled: true}\n")
    server = ServerProcess(
        ["--config", str(tmp_path / "config.yaml")], env={"OTEL_TRACES_EXPORTER": "zipkin"}
    )
    with pytest.raises(RuntimeError, match="OTEL_TRACES_EXPORTER names 'zipkin'"):
        server.start(tmp_path / "server.log", timeout=20)
    assert server.process is not None
    assert server.process.returncode == 2, "a configuration error"
