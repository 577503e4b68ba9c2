"""Batching, limits, deadlines, disconnects and model failures against the real server process."""

from __future__ import annotations

import http.client
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import grpc
import numpy as np
import onnxruntime as ort
import orjson
import pytest
import tritonclient.grpc as grpcclient

from edgeinfer.protocol.grpc_gen import edgeinfer_grpc_v2_pb2 as pb
from tests.support import (
    ServerProcess,
    grpc_refusal,
    infer_body,
    metric,
    needs_tool,
    queue_state,
    request,
    scrape,
    wait_for,
    wait_queue,
)

T = TypeVar("T")


def stats(server: ServerProcess, model: str) -> dict:
    [entry] = request(server.port, "GET", f"/v2/models/{model}/versions/1/stats").json()["model_stats"]
    return entry


def slow_body(rows: int, **extra) -> dict:
    return infer_body({"X": np.full((rows, 256), 0.01, dtype=np.float32)}, **extra)


def test_concurrent_requests_with_different_rows_get_their_own_rows(special_server, special_models: Path):
    session = ort.InferenceSession(str(special_models / "matmul.onnx"))
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal((1 + i % 4, 16)).astype(np.float32) for i in range(200)]
    before = stats(special_server, "matmul")

    def call(x: np.ndarray) -> np.ndarray:
        reply = request(special_server.port, "POST", "/v2/models/matmul/infer", infer_body({"X": x}))
        assert reply.status == 200, reply.body
        [output] = reply.json()["outputs"]
        return np.array(output["data"], dtype=np.float32).reshape(output["shape"])

    with ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(call, inputs))
    for x, y in zip(inputs, results, strict=True):
        np.testing.assert_allclose(y, session.run(None, {"X": x})[0], rtol=1e-5, atol=1e-5)
    after = stats(special_server, "matmul")
    assert after["inference_count"] - before["inference_count"] == sum(len(x) for x in inputs)
    assert after["execution_count"] - before["execution_count"] < len(inputs), "requests were batched"
    assert max(entry["batch_size"] for entry in after["batch_stats"]) <= 16


def test_statistics_carry_the_learned_batch_cost(special_server):
    """Beside Triton's fields, the batch time the server learned (what adaptive batching decides on)."""
    reply = request(special_server.port, "POST", "/v2/models/slow/infer", slow_body(2))
    assert reply.status == 200
    cost = stats(special_server, "slow")["batch_cost"]
    assert cost["batches_observed"] >= 1
    assert cost["per_row_ns"] + cost["per_batch_ns"] > 0


def test_a_full_queue_gets_429_at_once_with_retry_after(special_server):
    """slow: max_queue_size 4. One batch running, four queued: the next requests are refused before the
    running one finishes, i.e. without waiting."""
    port = special_server.port
    finished: list[tuple[str, int]] = []
    lock = threading.Lock()

    def call(label: str, rows: int) -> None:
        reply = request(port, "POST", "/v2/models/slow/infer", slow_body(rows))
        with lock:
            finished.append((label, reply.status))

    with ThreadPoolExecutor(max_workers=5) as pool:
        blocker = pool.submit(call, "blocker", 8)
        wait_queue(port, "slow", 0, 1)
        queued = [pool.submit(call, "queued", 8) for _ in range(4)]
        wait_queue(port, "slow", 4, 5)
        rejected = [request(port, "POST", "/v2/models/slow/infer", slow_body(1)) for _ in range(3)]
        with lock:
            assert not finished, "the rejections came while the first batch was still running"
        for future in (blocker, *queued):
            future.result()
    for reply in rejected:
        assert reply.status == 429
        assert "'slow' version 1 has 4 requests queued, its limit (max_queue_size)" in reply.error
        assert int(reply.headers["retry-after"]) >= 1
        assert int(reply.headers["retry-after-ms"]) >= 1  # the queue ahead at its measured cost
    assert sorted(status for _, status in finished) == [200] * 5
    # batches finished with work waiting: the queue's drain was measured (admission reads it)
    assert stats(special_server, "slow")["batch_cost"]["drain_per_row_ns"] > 0
    labels = {"model": "slow", "version": "1", "part": "drain_per_row"}
    assert metric(scrape(port), "edgeinfer_batch_cost_seconds", **labels) > 0


def test_an_expired_deadline_gets_504_and_is_never_run(special_server):
    port = special_server.port
    before = stats(special_server, "slow_unbatched")
    with ThreadPoolExecutor(max_workers=1) as pool:
        long_running = pool.submit(request, port, "POST", "/v2/models/slow_unbatched/infer", slow_body(6))
        wait_queue(port, "slow_unbatched", 0, 1)
        reply = request(
            port,
            "POST",
            "/v2/models/slow_unbatched/infer",
            slow_body(3, parameters={"timeout": 20_000}),  # microseconds, as Triton clients send it
        )
        assert long_running.result().status == 200
    # refused at once when the batch ahead is predicted to outlast the timeout, else expired in the queue
    assert reply.status == 504
    assert "not run" in reply.error
    wait_queue(port, "slow_unbatched", 0, 0)
    after = stats(special_server, "slow_unbatched")
    assert after["execution_count"] - before["execution_count"] == 1, "only the long request ran"
    assert after["inference_stats"]["fail"]["count"] - before["inference_stats"]["fail"]["count"] == 1


def test_a_closed_connection_is_not_executed(special_server):
    """A request queued behind a running one, whose client hangs up: dropped from the queue, never run."""
    port = special_server.port
    before = stats(special_server, "slow_unbatched")
    with ThreadPoolExecutor(max_workers=1) as pool:
        long_running = pool.submit(request, port, "POST", "/v2/models/slow_unbatched/infer", slow_body(6))
        wait_queue(port, "slow_unbatched", 0, 1)
        body = orjson.dumps(slow_body(2))
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(
                b"POST /v2/models/slow_unbatched/infer HTTP/1.1\r\nHost: x\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\n\r\n"
                + body
            )
            wait_queue(port, "slow_unbatched", 1, 2)  # it is queued behind the long request
        # the hang-up took it out of the queue (the long request may be over by now on a fast machine:
        # whether the hung-up one ran is what the execution count below says)
        wait_for(lambda: queue_state(port, "slow_unbatched")[0] == 0, what="the queue emptied")
        assert long_running.result().status == 200
    wait_queue(port, "slow_unbatched", 0, 0)
    after = stats(special_server, "slow_unbatched")
    assert after["execution_count"] - before["execution_count"] == 1, "only the long request ran"
    assert after["inference_stats"]["fail"]["count"] - before["inference_stats"]["fail"]["count"] == 1


def test_a_model_failure_is_a_500_and_the_next_request_succeeds(special_server):
    x = np.ones((2, 4), dtype=np.float32)
    bad = request(
        special_server.port, "POST", "/v2/models/failing/infer", infer_body({"X": x, "I": np.array([0, 9])})
    )
    assert bad.status == 500
    assert "ONNX Runtime failed" in bad.error
    good = request(
        special_server.port, "POST", "/v2/models/failing/infer", infer_body({"X": x, "I": np.array([0, 3])})
    )
    assert good.status == 200


def test_outputs_that_cannot_be_split_back_are_a_clear_error(special_server):
    x = np.ones((2, 4), np.float32)
    kept = request(special_server.port, "POST", "/v2/models/row_changing/infer", infer_body({"X": x}))
    assert kept.status == 200
    x[1, 0] = -1  # the model drops this row
    reply = request(special_server.port, "POST", "/v2/models/row_changing/infer", infer_body({"X": x}))
    assert reply.status == 500
    assert "first dimension must equal the input rows" in reply.error
    assert "max_batch_size: 0" in reply.error


def test_a_model_with_a_fixed_first_dimension_is_not_batched(special_server):
    x = np.ones((2, 16), dtype=np.float32)
    assert request(special_server.port, "POST", "/v2/models/fixed/infer", infer_body({"X": x})).status == 200
    reply = request(special_server.port, "POST", "/v2/models/fixed/infer", infer_body({"X": x[:1]}))
    assert reply.status == 400
    assert "expects [2, 16]" in reply.error


def test_a_streamed_body_over_the_limit_is_413(special_server):
    def chunks():
        for _ in range(20):
            yield b" " * 8192

    connection = http.client.HTTPConnection("127.0.0.1", special_server.port, timeout=10)
    connection.request("POST", "/v2/models/matmul/infer", body=chunks(), encode_chunked=True)
    reply = connection.getresponse()
    assert reply.status == 413
    assert b"larger than the limit of 52428 bytes" in reply.read()
    connection.close()
    assert request(special_server.port, "GET", "/v2/health/ready").status == 200


def test_a_request_that_would_miss_the_slo_gets_429_at_once_with_retry_after(special_server):
    port = special_server.port
    with ThreadPoolExecutor(max_workers=1) as pool:
        running = pool.submit(request, port, "POST", "/v2/models/slow_slo/infer", slow_body(8))
        wait_queue(port, "slow_slo", 0, 1)
        reply = request(port, "POST", "/v2/models/slow_slo/infer", slow_body(1))
        # the queue alone decides: the body is not even read (a garbled one is refused, not a 400)
        unread = request(port, "POST", "/v2/models/slow_slo/infer", b'{"inputs": [garbled')
        refused_while_running = not running.done()
        assert running.result().status == 200
    assert reply.status == 429
    assert "is over its latency objective" in reply.error
    assert "against an SLO of 1 ms" in reply.error
    assert int(reply.headers["retry-after"]) >= 1
    assert 1 <= int(reply.headers["retry-after-ms"]) <= 1000 * int(reply.headers["retry-after"]) + 500
    assert reply.error.endswith(f"; retry in {reply.headers['retry-after-ms']} ms")  # for streams, logs
    assert unread.status == 429
    assert "it was refused before its body was read" in unread.error
    assert refused_while_running, "refused at once, not after waiting for the running batch"
    samples = scrape(port)
    labels = {"model": "slow_slo", "version": "1"}
    assert metric(samples, "edgeinfer_requests_refused_total", **labels, reason="slo") == 2
    assert metric(samples, "edgeinfer_batch_cost_seconds", **labels, part="per_row") > 0, "the cost line"
    assert metric(samples, "edgeinfer_admission_margin_seconds", **labels) >= 0, "exported"
    assert stats(special_server, "slow_slo")["batch_cost"]["admission_margin_ns"] >= 0
    alone = request(port, "POST", "/v2/models/slow_slo/infer", slow_body(1))
    assert alone.status == 200, "with nothing ahead, a request is admitted whatever the SLO"


@pytest.fixture
def priority_server(special_models: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    """``slow.onnx`` (about 0.1 s a row) alone, with an SLO and nothing formed ahead, so that a queued
    request can be overtaken; on a server of its own, so that its cost line is learned from a warmup
    that shared the cores with no other model's."""
    config = tmp_path / "config.yaml"
    slow = special_models / "slow.onnx"
    config.write_text(
        "models:\n"
        f"  slow_priority: {{model_path: {slow}, max_batch_size: 8, prefetch_batches: 0,\n"
        "    backend_config: {intra_op_num_threads: 1}, slo: {p99_ms: 1200}}\n"
    )
    server = ServerProcess(["--config", str(config)])
    server.start(tmp_path / "server.log")
    yield server
    server.stop()


def test_a_higher_priority_request_is_admitted_ahead_of_a_queue_where_a_lower_one_is_refused(priority_server):
    """``slow_priority`` (about 0.1 s a row, SLO 1.2 s, nothing formed ahead): while a batch of 4 rows
    runs and 4 rows of priority 2 wait, 8 rows of priority 2 would finish after about 1.6 s: refused at
    once, after decoding (before, its priority is not known, and as one row of priority 1 it could make
    it). A row of priority 1 goes ahead of the queued rows (about 0.5 s): admitted, and answered before
    them."""
    port, url = priority_server.port, "/v2/models/slow_priority/infer"

    def body(rows: int, priority: int) -> dict:
        return slow_body(rows, parameters={"priority": priority})

    with ThreadPoolExecutor(max_workers=2) as pool:
        running = pool.submit(request, port, "POST", url, body(4, 2))
        wait_queue(port, "slow_priority", 0, 1)
        queued = pool.submit(request, port, "POST", url, body(4, 2))
        wait_queue(port, "slow_priority", 1, 2)
        low = request(port, "POST", url, body(8, 2))
        high = request(port, "POST", url, body(1, 1))
        overtaken = not queued.done()
        assert (running.result().status, queued.result().status) == (200, 200)
    assert low.status == 429
    assert "is over its latency objective: this request would finish in" in low.error
    assert "against an SLO of 1200 ms" in low.error
    assert high.status == 200
    assert overtaken, "the priority-1 request was answered while the priority-2 one still waited"
    samples = scrape(port)
    labels = {"model": "slow_priority", "version": "1"}
    assert metric(samples, "edgeinfer_requests_refused_total", **labels, reason="slo") == 1


def _while_slow_slo_runs(port: int, action: Callable[[], T]) -> T:
    """``action()`` while a batch of ``slow_slo`` runs (0.8 s): any request queued behind it misses."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        running = pool.submit(request, port, "POST", "/v2/models/slow_slo/infer", slow_body(8))
        wait_queue(port, "slow_slo", 0, 1)
        result = action()
        assert not running.done(), "the batch was still running: the answers are its queue's"
        assert running.result().status == 200
    return result


def _read_response(client: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += client.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(rest) < length:
        rest += client.recv(65536)
    return head + b"\r\n\r\n" + rest


def test_a_request_that_would_miss_the_slo_is_refused_before_its_body_arrives(special_server):
    """A client uploading a body is answered 429 as soon as its headers arrive, while it still owes
    most of the body; the rest is read and dropped and the connection serves its next request."""
    port = special_server.port
    body = orjson.dumps(slow_body(1))

    def upload() -> tuple[bytes, bytes]:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(
                b"POST /v2/models/slow_slo/infer HTTP/1.1\r\nHost: x\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\n\r\n"
                + body[:10]
            )
            early = _read_response(client)  # while it still owes the rest of the body
            client.sendall(body[10:] + b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
            return early, _read_response(client)

    early, after = _while_slow_slo_runs(port, upload)
    assert early.startswith(b"HTTP/1.1 429"), early
    assert b"it was refused before its body was read" in early
    assert after.startswith(b"HTTP/1.1 200"), "the dropped body left the connection in step"
    assert after.endswith(b'{"ready":true}')


def test_a_grpc_refusal_for_the_slo_carries_the_retry_pushback(special_server):
    """RESOURCE_EXHAUSTED with ``grpc-retry-pushback-ms`` (gRFC A6) beside the request id echoed."""
    request_message = pb.ModelInferRequest(model_name="slow_slo")
    tensor = request_message.inputs.add(name="X", datatype="FP32", shape=[1, 256])
    tensor.contents.fp32_contents.extend([0.01] * 256)

    def call() -> grpc.RpcError:
        return grpc_refusal(special_server.grpc_port, request_message, (("x-request-id", "pushback-1"),))

    refused = _while_slow_slo_runs(special_server.port, call)
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "is over its latency objective" in refused.details()
    trailing = dict(refused.trailing_metadata())
    assert trailing["x-request-id"] == "pushback-1"
    assert int(trailing["grpc-retry-pushback-ms"]) >= 1


def test_a_grpc_client_with_a_retry_policy_retries_when_the_pushback_says(special_server):
    """tritonclient over a channel whose retry policy retries RESOURCE_EXHAUSTED twice, 10 ms apart: a
    request refused for the SLO while a batch of 8 rows runs is retried when the server's pushback says
    (the batch ahead at the cost it measured), and answered. Without the pushback both retries would come
    within some 20 ms, into the same running batch, and be refused as well."""
    policy = {
        "methodConfig": [
            {
                "name": [{"service": "inference.GRPCInferenceService", "method": "ModelInfer"}],
                "retryPolicy": {
                    "maxAttempts": 3,
                    "initialBackoff": "0.01s",
                    "maxBackoff": "0.01s",
                    "backoffMultiplier": 1,
                    "retryableStatusCodes": ["RESOURCE_EXHAUSTED"],
                },
            }
        ]
    }
    row = grpcclient.InferInput("X", [1, 256], "FP32")
    row.set_data_from_numpy(np.full((1, 256), 0.01, dtype=np.float32))

    def failed() -> int:  # refusals count as failures in Triton's statistics
        return int(stats(special_server, "slow_slo")["inference_stats"]["fail"]["count"])

    port = special_server.port
    client = grpcclient.InferenceServerClient(
        f"127.0.0.1:{special_server.grpc_port}",
        channel_args=[("grpc.enable_retries", 1), ("grpc.service_config", orjson.dumps(policy).decode())],
    )
    try:
        before = failed()
        with ThreadPoolExecutor(max_workers=1) as pool:
            running = pool.submit(request, port, "POST", "/v2/models/slow_slo/infer", slow_body(8))
            wait_queue(port, "slow_slo", 0, 1)
            started = time.monotonic()
            result = client.infer("slow_slo", [row])  # refused, then retried after the batch
            took = time.monotonic() - started
            assert running.result().status == 200
    finally:
        client.close()
    assert result.as_numpy("Y").shape == (1, 256)
    assert 1 <= failed() - before <= 2, "refused while the batch ran, then answered"
    assert took >= 0.1, "the retry waited for the batch ahead, not the policy's 10 ms"


@needs_tool("curl")
def test_curl_expecting_100_continue_gets_the_refusal_and_sends_no_body(special_server, tmp_path: Path):
    port = special_server.port
    (tmp_path / "body.json").write_bytes(orjson.dumps(slow_body(1)))

    def upload() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                "curl", "-s", "-o", str(tmp_path / "answer.json"), "-w", "%{http_code} %{size_upload}",
                "-H", "Expect: 100-continue", "-H", "Content-Type: application/json",
                "--data-binary", f"@{tmp_path / 'body.json'}",
                f"http://127.0.0.1:{port}/v2/models/slow_slo/infer",
            ],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip

    curl = _while_slow_slo_runs(port, upload)
    assert curl.stdout == "429 0", f"refused before it sent any body: {curl}"
    assert "over its latency objective" in (tmp_path / "answer.json").read_text()


def test_drop_stale_answers_the_superseded_frame_409_and_runs_the_newest(special_server):
    port = special_server.port
    frame = {"stream_id": "cam-7", "drop_stale": True}
    path = "/v2/models/slow_unbatched/infer"
    with ThreadPoolExecutor(max_workers=3) as pool:
        # 8 rows (0.8 s here; the body limit allows no more): the scrapes below fit in while it runs
        running = pool.submit(request, port, "POST", path, slow_body(8))
        wait_queue(port, "slow_unbatched", 0, 1)
        stale = pool.submit(request, port, "POST", path, slow_body(1, parameters=frame))
        wait_queue(port, "slow_unbatched", 1, 2)
        newest = pool.submit(request, port, "POST", path, slow_body(1, parameters=frame))
        assert stale.result().status == 409
        assert "superseded by a newer one of stream 'cam-7'; it was not run" in stale.result().error
        assert running.result().status == 200
        assert newest.result().status == 200
    samples = scrape(port)
    labels = {"model": "slow_unbatched", "version": "1", "protocol": "http"}
    assert metric(samples, "edgeinfer_inference_requests_total", **labels, status="superseded") == 1


def test_a_grpc_stream_is_its_own_stream_for_drop_stale(special_server):
    """On ModelStreamInfer, drop_stale needs no stream_id: the RPC is the stream. Its queued frame is
    answered with an error message and the stream goes on."""
    import queue

    import tritonclient.grpc as grpcclient

    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{special_server.grpc_port}")
    client.start_stream(callback=lambda result, error: answers.put((result, error)))

    def frame(rows: int, request_id: str, **parameters) -> None:
        x = grpcclient.InferInput("X", [rows, 256], "FP32")
        x.set_data_from_numpy(np.full((rows, 256), 0.01, np.float32))
        client.async_stream_infer("slow_unbatched", [x], request_id=request_id, parameters=parameters)

    port = special_server.port
    try:
        frame(8, "running")
        wait_queue(port, "slow_unbatched", 0, 1)
        # the stream keeps the order, so the two frames need no scrape between them (one would have to
        # fit in what is left of the running request: on a fast machine, tens of milliseconds)
        frame(1, "stale", drop_stale=True)
        frame(1, "newest", drop_stale=True)
        results = [answers.get(timeout=30) for _ in range(3)]
    finally:
        client.stop_stream()
        client.close()
    (running, ok), (_, stale), (newest, fine) = results
    assert ok is None
    assert running.get_response().id == "running"
    assert "superseded by a newer one of stream 'ModelStreamInfer#" in str(stale)
    assert fine is None
    assert newest.get_response().id == "newest"


@pytest.mark.parametrize(
    ("parameters", "words"),
    [
        (
            {"drop_stale": True},
            "parameter 'drop_stale' needs a 'stream_id' (a string or an integer), got None",
        ),
        ({"drop_stale": True, "stream_id": ""}, "needs a 'stream_id' (a string or an integer), got ''"),
        ({"drop_stale": True, "stream_id": [1]}, "needs a 'stream_id' (a string or an integer), got [1]"),
        ({"drop_stale": "yes", "stream_id": "a"}, "parameter 'drop_stale' must be true or false, got 'yes'"),
    ],
)
def test_drop_stale_parameters_are_checked(special_server, parameters, words):
    path = "/v2/models/slow_unbatched/infer"
    reply = request(special_server.port, "POST", path, slow_body(1, parameters=parameters))
    assert reply.status == 400
    assert words in reply.error
