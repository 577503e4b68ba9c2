"""Every hard limit of ``server.limits`` against the real server: each is answered with a clear 4xx (or
gRPC status), counted in ``edgeinfer_limit_refusals_total{limit}``, and the server keeps serving.

Also here: the repository API does not leave the repository root, load requests cannot override the
keys that choose code or files, and a server open to the network without keys warns loudly.
"""

from __future__ import annotations

import gzip
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from edgeinfer.protocol.grpc_gen import edgeinfer_grpc_v2_pb2 as pb
from tests.support import (
    ROOT,
    ServerProcess,
    grpc_refusal,
    infer_body,
    matmul_model,
    queue_state,
    request,
    scrape,
    wait_for,
)

ONE_ROW = infer_body({"X": np.ones((1, 16), np.float32)})
TIMEOUT_S = 0.5


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("limited")
    matmul_model(root / "repo" / "simple" / "1" / "model.onnx")
    outside = root / "outside"
    matmul_model(outside / "1" / "model.onnx")
    (root / "config.yaml").write_text(
        f"model_store_path: {root / 'repo'}\n"
        "models:\n"
        "  sleepy: {backend: python, model_class: 'tests.python_models.models:Sleeper', max_batch_size: 0}\n"
        "server:\n"
        "  max_request_size_mb: 0.05\n"
        "  limits: {max_connections: 6, max_headers: 20, max_header_bytes: 4096,\n"
        f"           header_timeout_s: {TIMEOUT_S}, body_timeout_s: {TIMEOUT_S}, keepalive_timeout_s: 1.0,\n"
        "           max_tensor_elements: 1000, max_rows: 8, max_json_depth: 8, max_bytes_element: 64,\n"
        "           max_grpc_streams: 2}\n"
    )  # host is the default 0.0.0.0 and there are no keys: the server warns
    server = ServerProcess(["--config", str(root / "config.yaml")], env={"PYTHONPATH": str(ROOT)})
    server.start(root / "log")
    yield server
    server.stop()


def still_serving(server: ServerProcess) -> None:
    assert request(server.port, "POST", "/v2/models/simple/infer", ONE_ROW).status == 200


def refusals(server: ServerProcess, limit: str) -> float:
    """Refusals counted for ``limit`` so far (none yet: the sample is absent)."""
    samples = scrape(server.port).get("edgeinfer_limit_refusals_total", {})
    return samples.get((("limit", limit),), 0.0)


def raw_exchange(port: int, wire: bytes, wait_s: float = 10) -> bytes:
    """Send ``wire`` and read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        sock.sendall(wire)
        return read_all(sock)


def read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def status_and_error(answer: bytes) -> tuple[int, str]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), orjson.loads(body)["error"]


@pytest.mark.parametrize(
    ("limit", "body", "status", "message"),
    [
        (
            "tensor_elements",
            infer_body({"X": np.ones((70, 16), np.float32)}),
            413,
            "the request's inputs have 1120 elements in all; the limit is 1000 "
            "(server.limits.max_tensor_elements)",
        ),
        (
            "rows",
            infer_body({"X": np.ones((9, 16), np.float32)}),
            413,
            "the request has 9 rows (first dimension); the limit is 8 (server.limits.max_rows)",
        ),
        (
            "bytes_element",
            {"inputs": [{"name": "X", "datatype": "BYTES", "shape": [1], "data": ["a" * 65]}]},
            413,
            "input 'X' has a BYTES element of 65 bytes; the limit is 64 (server.limits.max_bytes_element)",
        ),
        (
            "json_depth",
            {**ONE_ROW, "parameters": {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": 1}}}}}}}}},
            400,
            "the JSON body is nested at least 9 levels deep; the limit is 8 (server.limits.max_json_depth)",
        ),
        (
            "json_depth",
            {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1] * 6, "data": [[[[[[1.0]]]]]]}]},
            400,
            "the JSON body is nested 9 levels deep; the limit is 8 (server.limits.max_json_depth)",
        ),
    ],
)
def test_request_size_limits(limited: ServerProcess, limit: str, body: dict, status: int, message: str):
    before = refusals(limited, limit)
    reply = request(limited.port, "POST", "/v2/models/simple/infer", body)
    assert (reply.status, reply.error) == (status, message)
    assert refusals(limited, limit) == before + 1
    still_serving(limited)


def test_a_grpc_size_refusal_tells_clients_not_to_retry(limited: ServerProcess):
    """RESOURCE_EXHAUSTED for a request over a size limit carries ``grpc-retry-pushback-ms: -1`` (gRFC A6):
    a client whose retry policy retries RESOURCE_EXHAUSTED, meant for refusals for load, does not send
    the same request again."""
    message = pb.ModelInferRequest(model_name="simple")
    message.inputs.add(name="X", datatype="FP32", shape=[9, 16]).contents.fp32_contents.extend([1.0] * 144)
    refused = grpc_refusal(limited.grpc_port, message)
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_rows" in refused.details()
    assert dict(refused.trailing_metadata())["grpc-retry-pushback-ms"] == "-1"


def test_size_limits_over_grpc(limited: ServerProcess):
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{limited.grpc_port}")
    try:
        rows = grpcclient.InferInput("X", [9, 16], "FP32")
        rows.set_data_from_numpy(np.ones((9, 16), np.float32))
        with pytest.raises(InferenceServerException, match=r"max_rows") as raised:
            client.infer("simple", [rows])
        assert raised.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        text = grpcclient.InferInput("X", [1], "BYTES")
        text.set_data_from_numpy(np.array([b"b" * 65], dtype=object))
        with pytest.raises(InferenceServerException, match=r"max_bytes_element") as raised:
            client.infer("simple", [text])
        assert raised.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    finally:
        client.close()


def test_body_and_decompressed_size(limited: ServerProcess):
    before = refusals(limited, "body_size"), refusals(limited, "decompressed_size")
    big = orjson.dumps({**ONE_ROW, "id": "x" * 60_000})
    reply = request(limited.port, "POST", "/v2/models/simple/infer", big)
    assert reply.status == 413
    assert "server.max_request_size_mb" in reply.error
    bomb = gzip.compress(b" " * 1_000_000)  # 1 MB of spaces in a 1 KB body
    reply = request(
        limited.port, "POST", "/v2/models/simple/infer", bomb, headers={"Content-Encoding": "gzip"}
    )
    assert reply.status == 413
    assert "decompresses to more than the limit" in reply.error
    assert (refusals(limited, "body_size"), refusals(limited, "decompressed_size")) == (
        before[0] + 1,
        before[1] + 1,
    )
    still_serving(limited)


def test_header_size_and_count(limited: ServerProcess):
    wire = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 5000 + b"\r\n\r\n"
    assert status_and_error(raw_exchange(limited.port, wire)) == (
        431,
        "request line and headers exceed 4096 bytes (server.limits.max_header_bytes)",
    )
    many = b"".join(b"X-H%d: 1\r\n" % index for index in range(21))
    wire = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n"
    assert status_and_error(raw_exchange(limited.port, wire)) == (
        431,
        "more than 20 header fields (server.limits.max_headers)",
    )
    assert refusals(limited, "header_count") >= 1
    assert refusals(limited, "header_size") >= 1
    still_serving(limited)


def trickle(port: int, head: bytes, piece: bytes) -> bytes:
    """Send ``head``, then ``piece`` every 0.1 s (for 2 s at most) until the server answers and closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head)
        for _ in range(20):
            try:
                sock.sendall(piece)
            except OSError:  # the server answered and closed
                break
            time.sleep(0.1)
        return read_all(sock)


def test_slow_clients_are_answered_408(limited: ServerProcess):
    """Slowloris: headers that never end, a body that trickles; both are cut at their deadline."""
    before = refusals(limited, "header_timeout"), refusals(limited, "body_timeout")
    started = time.monotonic()
    # a header line every 0.1 s: the connection is never idle
    answer = trickle(limited.port, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n", b"X-Slow: 1\r\n")
    assert status_and_error(answer) == (
        408,
        f"request headers not complete within {TIMEOUT_S:g} s (server.limits.header_timeout_s)",
    )
    assert time.monotonic() - started < TIMEOUT_S + 3
    head = b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
    answer = trickle(limited.port, head, b"{")
    assert status_and_error(answer) == (
        408,
        f"request body not complete within {TIMEOUT_S:g} s (server.limits.body_timeout_s)",
    )
    assert (refusals(limited, "header_timeout"), refusals(limited, "body_timeout")) == (
        before[0] + 1,
        before[1] + 1,
    )
    still_serving(limited)


def test_idle_keepalive_connections_are_closed(limited: ServerProcess):
    with socket.create_connection(("127.0.0.1", limited.port), timeout=10) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        assert sock.recv(4096) == b"", "the server closes the idle connection"
        assert 0.9 < time.monotonic() - started < 4
    assert refusals(limited, "keepalive_timeout") >= 1


def test_connections_over_the_limit_get_503(limited: ServerProcess):
    held = [socket.create_connection(("127.0.0.1", limited.port), timeout=10) for _ in range(6)]
    try:
        for sock in held:  # an answer on each: every one of them is accepted (and kept alive)
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        answer = raw_exchange(limited.port, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status_and_error(answer) == (
            503,
            "too many open connections (server.limits.max_connections: 6)",
        )
    finally:
        for sock in held:
            sock.close()
    wait = time.monotonic() + 5
    while request(limited.port, "GET", "/v2/health/live").status != 200:
        assert time.monotonic() < wait
    assert refusals(limited, "connections") >= 1


def test_concurrent_grpc_calls_over_the_limit_are_refused(limited: ServerProcess):
    """Three connections (grpcio would share one between channels to one address: on one connection
    HTTP/2's stream limit makes the third call wait instead, which the server also announces)."""
    clients = [
        grpcclient.InferenceServerClient(
            f"127.0.0.1:{limited.grpc_port}", channel_args=[("grpc.use_local_subchannel_pool", 1)]
        )
        for _ in range(3)
    ]
    data = grpcclient.InferInput("x", [1, 4], "FP32")
    data.set_data_from_numpy(np.ones((1, 4), np.float32))
    errors: list[BaseException] = []

    def slow_call(client: grpcclient.InferenceServerClient) -> None:
        try:
            client.infer("sleepy", [data], parameters={"sleep_ms": 1500})
        except InferenceServerException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=slow_call, args=(client,)) for client in clients[:2]]
    try:
        for thread in threads:
            thread.start()
        # both calls are open streams now: received, one running and one queued behind it
        wait_for(lambda: queue_state(limited.port, "sleepy")[1] == 2, what="two calls in flight")
        with pytest.raises(InferenceServerException) as raised:
            clients[2].infer("sleepy", [data])
        assert raised.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert "server.limits.max_grpc_streams: 2" in raised.value.message()
        for thread in threads:
            thread.join()
        assert errors == []
        clients[2].infer("sleepy", [data])  # with the two done, a third goes through
    finally:
        for client in clients:
            client.close()
    assert refusals(limited, "grpc_streams") >= 1


def test_the_repository_api_does_not_leave_the_root(limited: ServerProcess):
    repo = Path(limited.args[1]).parent / "repo"
    (repo / "escape").symlink_to(repo.parent / "outside")  # made now: at start-up it would stop the server
    try:
        reply = request(limited.port, "POST", "/v2/repository/models/escape/load", {})
        assert reply.status == 400
        assert "outside the model repository" in reply.error
        reply = request(limited.port, "POST", "/v2/repository/models/../load", {})
        assert reply.status in (400, 404)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{limited.grpc_port}")
        try:
            for name in ("../outside", "/etc", "..", ".hidden", "a\\b"):
                with pytest.raises(InferenceServerException) as raised:
                    client.load_model(name)
                assert raised.value.status() == "StatusCode.INVALID_ARGUMENT", name
                assert "is not a model name" in raised.value.message()
        finally:
            client.close()
    finally:
        (repo / "escape").unlink()
    still_serving(limited)


def test_load_requests_cannot_override_code_or_paths(limited: ServerProcess):
    for key, value in (
        ("model_class", "os:system"),
        ("model_path", "/etc/passwd"),
        ("python_path", "/tmp"),
    ):
        config = orjson.dumps({key: value}).decode()
        reply = request(
            limited.port, "POST", "/v2/repository/models/simple/load", {"parameters": {"config": config}}
        )
        assert reply.status == 403, reply.body
        assert reply.error.startswith(f"a load request may not override {key}")
    still_serving(limited)


def test_an_empty_outputs_list_means_every_output(limited: ServerProcess):
    reply = request(limited.port, "POST", "/v2/models/simple/infer", {**ONE_ROW, "outputs": []})
    assert reply.status == 200, reply.body
    assert [output["name"] for output in reply.json()["outputs"]] == ["Y"]


def test_a_server_open_to_the_network_without_keys_warns(limited: ServerProcess):
    assert "API key auth is OFF and the server listens on 0.0.0.0" in limited.log()


def test_a_bytes_shape_of_a_trillion_elements_is_refused_not_allocated(limited: ServerProcess):
    """Found by the fuzzer: the server allocated the shape's elements before looking at the data."""
    header = orjson.dumps(
        {
            "inputs": [
                {"name": "X", "datatype": "BYTES", "shape": [2**40], "parameters": {"binary_data_size": 4}}
            ]
        }
    )
    reply = request(
        limited.port,
        "POST",
        "/v2/models/simple/infer",
        header + b"\x00" * 4,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert reply.status == 400
    assert "has 1099511627776 BYTES elements but the data has only 4 bytes" in reply.error
    still_serving(limited)
