"""Large JSON bodies over HTTP: decoded on the server's JSON thread, their numbers without the GIL
(protocol/json_scan.py), with the same answers and errors as any other body."""

from __future__ import annotations

import gzip
import os
import socket
import zlib
from pathlib import Path

import numpy as np
import onnxruntime as ort
import orjson
import pytest
import tritonclient.http as httpclient

from edgeinfer.protocol import json_scan
from edgeinfer.server.http_infer import OFF_LOOP_BYTES
from tests.support import EXAMPLES, ServerProcess, request, scrape, wait_for

SIMPLE = EXAMPLES / "model_repository" / "simple" / "2" / "model.onnx"
ROWS = 4000  # x 16 floats: about 0.6 MB of JSON, well above OFF_LOOP_BYTES

pytestmark = pytest.mark.skipif(not json_scan.available(), reason="the C library was not built (no compiler)")


def rows(seed: int = 5) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((ROWS, 16)).astype(np.float32)


def body_of(x: np.ndarray, datatype: str = "FP32") -> bytes:
    document = {
        "inputs": [{"name": "INPUT0", "shape": list(x.shape), "datatype": datatype, "data": x.ravel()}]
    }
    body = orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)
    assert len(body) >= OFF_LOOP_BYTES
    return body


def expected(x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(SIMPLE)).run(None, {"INPUT0": x})[0]


@pytest.mark.parametrize("encoding", [None, "gzip", "deflate"])
def test_a_large_json_body_gets_the_answer_of_in_process_onnx_runtime(
    example_server: ServerProcess, encoding
):
    x = rows()
    body = body_of(x)
    headers = {}
    if encoding is not None:  # decompressed on the JSON thread too
        body = gzip.compress(body) if encoding == "gzip" else zlib.compress(body)
        headers["Content-Encoding"] = encoding
    reply = request(example_server.port, "POST", "/v2/models/simple/infer", body, headers)
    assert reply.status == 200, reply.body[:300]
    [output] = reply.json()["outputs"]
    assert output["shape"] == [ROWS, 16]
    np.testing.assert_array_equal(np.array(output["data"], np.float32).reshape(ROWS, 16), expected(x))


def test_tritonclient_sending_json_tensors(example_server: ServerProcess):
    x = rows(6)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{example_server.port}")
    try:
        value = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
        value.set_data_from_numpy(x, binary_data=False)
        result = client.infer("simple", [value])
    finally:
        client.close()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected(x))


@pytest.mark.parametrize(
    ("body", "headers", "message"),
    [
        (body_of(rows())[:-3], {}, "request body is not valid JSON: "),
        (
            body_of(rows()).replace(b'"shape":[4000,16]', b'"shape":[4001,16]'),
            {},
            "input 'INPUT0': shape [4001, 16] needs 64016 elements but 'data' has 64000",
        ),
        (  # floats for an integer type: the ordinary path says so
            body_of(rows(), "INT32"),
            {},
            "input 'INPUT0': data does not fit datatype INT32: the data holds fractional numbers",
        ),
        (  # integers, taken by the scan, for a model that wants FP32
            body_of(np.arange(ROWS * 16, dtype=np.int32).reshape(ROWS, 16), "INT32"),
            {},
            "input 'INPUT0' has datatype INT32 but model 'simple' expects FP32",
        ),
        (b"x" * OFF_LOOP_BYTES, {"Content-Encoding": "gzip"}, "the gzip request body cannot be decompressed"),
        (  # decompressed on the JSON thread, and cut short
            gzip.compress(body_of(rows()))[:-100],
            {"Content-Encoding": "gzip"},
            "the gzip request body cannot be decompressed",
        ),
    ],
    ids=["truncated", "miscounted", "floats-as-int32", "wrong-datatype", "not-gzip", "gzip-cut-short"],
)
def test_a_bad_large_body_gets_a_400_that_names_what_is_wrong(
    example_server: ServerProcess, body, headers, message
):
    assert len(body) >= OFF_LOOP_BYTES  # the JSON thread's path
    reply = request(example_server.port, "POST", "/v2/models/simple/infer", body, headers)
    assert reply.status == 400, reply.body[:300]
    assert reply.error.startswith(message), reply.error


def test_clients_that_leave_while_their_bodies_are_decoded_take_nothing_else_down(
    example_server: ServerProcess,
):
    """Twelve large requests at once, half of whose clients hang up as soon as they have sent: the rest
    are answered, each request is counted once (those that went while being decoded or queued as the
    client's error, 499), none as the server's, and the server then answers a small request as before."""
    counted_before = _counted(example_server.port)
    x = rows(7)
    body = body_of(x)
    wire = (
        f"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    sockets = []
    for index in range(12):
        connection = socket.create_connection(("127.0.0.1", example_server.port), timeout=30)
        connection.sendall(wire)
        if index % 2:
            connection.close()
        else:
            sockets.append(connection)
    for connection in sockets:
        with connection, connection.makefile("rb") as reader:
            status = reader.readline()
            assert b" 200 " in status, status
            headers = dict(line.rstrip().split(b": ", 1) for line in iter(reader.readline, b"\r\n"))
            length = int(headers[b"content-length"])
            [output] = orjson.loads(reader.read(length))["outputs"]
            np.testing.assert_array_equal(np.array(output["data"], np.float32).reshape(ROWS, 16), expected(x))
    small = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]}
    assert request(example_server.port, "POST", "/v2/models/simple/infer", small).status == 200
    wait_for(
        lambda: sum(_counted(example_server.port).values()) == sum(counted_before.values()) + 13,
        what="every request counted once",
        now=lambda: (counted_before, _counted(example_server.port)),
    )
    assert _counted(example_server.port).get("error", 0) == counted_before.get("error", 0)


def _counted(port: int) -> dict[str, float]:
    """Requests to ``simple`` version 2 over HTTP so far, by status."""
    samples = scrape(port)["edgeinfer_inference_requests_total"]
    found = {}
    for labels, value in samples.items():
        named = dict(labels)
        if (named["model"], named["version"], named["protocol"]) == ("simple", "2", "http"):
            found[named["status"]] = value
    return found


def test_the_json_thread_runs_below_the_event_loop(example_server: ServerProcess):
    """It is ``SCHED_IDLE`` (``server/offload.py``), alone of the server's threads (Linux: each thread
    has its own policy)."""
    assert request(example_server.port, "POST", "/v2/models/simple/infer", body_of(rows())).status == 200
    assert example_server.process is not None
    pid = example_server.process.pid
    tasks = Path(f"/proc/{pid}/task")

    def policy(task: Path) -> int:
        return int((task / "stat").read_text().rsplit(")", 1)[1].split()[38])  # field 41 of stat

    idle = [task for task in tasks.iterdir() if policy(task) == os.SCHED_IDLE]
    assert len(idle) == 1
    assert {policy(task) for task in tasks.iterdir() if task not in idle} == {os.SCHED_OTHER}
