"""tritonclient.grpc (sync, aio and streaming) against the real server; malformed messages; shared batches."""

from __future__ import annotations

import asyncio
import queue
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from tests.support import (
    EXAMPLES,
    NUMERIC_DTYPES,
    ServerProcess,
    infer_body,
    json_log_lines,
    request,
    scrape,
    wait_for,
    wait_queue,
)

REPO = EXAMPLES / "model_repository"
METHOD = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture
def client(example_server: ServerProcess):
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{example_server.grpc_port}")
    yield client
    client.close()


def reference(model: str, version: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(REPO / model / version / "model.onnx"))
    names = [output.name for output in session.get_outputs()]
    return dict(zip(names, session.run(names, inputs), strict=True))


def grpc_input(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def test_health_metadata_config_and_index(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("simple", "1")
    metadata = client.get_server_metadata(as_json=True)
    assert metadata["name"] == "edgeinfer"
    assert "binary_tensor_data" in metadata["extensions"]
    model = client.get_model_metadata("simple", as_json=True)
    assert model["versions"] == ["1", "2"]
    assert model["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "16"]}]
    config = client.get_model_config("simple", as_json=True)["config"]
    assert config["max_batch_size"] == 32
    assert config["input"] == [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": ["16"]}]
    index = client.get_model_repository_index(as_json=True)["models"]
    assert {"name": "simple", "version": "2", "state": "READY"} in index


def test_infer_raw_matches_onnxruntime(client):
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    result = client.infer("simple", [grpc_input("INPUT0", x, "FP32")], model_version="1", request_id="g-1")
    np.testing.assert_array_equal(
        result.as_numpy("OUTPUT0"), reference("simple", "1", {"INPUT0": x})["OUTPUT0"]
    )
    response = result.get_response()
    assert (response.id, response.model_version) == ("g-1", "1")


def test_every_numeric_datatype_and_requested_outputs(client):
    rng = np.random.default_rng(2)
    inputs = {
        f"IN_{name}": (rng.integers(0, 100, size=(2, 4)) / (3 if name.startswith("FP") else 1)).astype(dtype)
        for name, dtype in NUMERIC_DTYPES.items()
    }
    tensors = [grpc_input(key, value, key[3:]) for key, value in inputs.items()]
    wanted = ["OUT_FP16", "OUT_UINT64", "NOT_BOOL", "DOUBLE_INT64", "FP64_AS_FP16"]
    result = client.infer(
        "all_dtypes", tensors, outputs=[grpcclient.InferRequestedOutput(name) for name in wanted]
    )
    expected = reference("all_dtypes", "1", inputs)
    assert [output.name for output in result.get_response().outputs] == wanted
    for name in wanted:
        np.testing.assert_array_equal(result.as_numpy(name), expected[name])


def test_typed_contents_are_accepted(example_server: ServerProcess):
    request_message = service_pb2.ModelInferRequest(model_name="simple", model_version="1")
    tensor = request_message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
    tensor.contents.fp32_contents.extend([float(i) for i in range(16)])
    with grpc.insecure_channel(f"127.0.0.1:{example_server.grpc_port}") as channel:
        call = channel.unary_unary(
            METHOD,
            request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=service_pb2.ModelInferResponse.FromString,
        )
        response = call(request_message, timeout=10)
    got = np.frombuffer(response.raw_output_contents[0], dtype=np.float32)
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    np.testing.assert_array_equal(got, reference("simple", "1", {"INPUT0": x})["OUTPUT0"].reshape(-1))


def test_bytes_over_grpc(client):
    text = np.array([b"HeLLo", b"", b"WORLD"], dtype=object)
    result = client.infer("text_lower", [grpc_input("TEXT", text, "BYTES")])
    assert result.as_numpy("LOWER").tolist() == [b"hello", b"", b"world"]


def test_aio_client_concurrent_requests(example_server: ServerProcess):
    async def main():
        client = aioclient.InferenceServerClient(f"127.0.0.1:{example_server.grpc_port}")
        try:
            xs = [np.full((1 + i % 3, 16), i, dtype=np.float32) for i in range(40)]
            tensors = []
            for x in xs:
                tensor = aioclient.InferInput("INPUT0", list(x.shape), "FP32")
                tensor.set_data_from_numpy(x)
                tensors.append(tensor)
            results = await asyncio.gather(*(client.infer("simple", [t], model_version="2") for t in tensors))
            return xs, [result.as_numpy("OUTPUT0") for result in results]
        finally:
            await client.close()

    xs, outputs = asyncio.run(main())
    for x, y in zip(xs, outputs, strict=True):
        np.testing.assert_allclose(y, reference("simple", "2", {"INPUT0": x})["OUTPUT0"], rtol=1e-6)


def test_stream_of_100_requests_all_answered_in_order(client):
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    xs = [np.full((1, 16), i / 10, dtype=np.float32) for i in range(100)]
    try:
        for index, x in enumerate(xs):
            client.async_stream_infer("simple", [grpc_input("INPUT0", x, "FP32")], request_id=str(index))
        received = [answers.get(timeout=30) for _ in xs]
    finally:
        client.stop_stream()
    session = ort.InferenceSession(str(REPO / "simple" / "2" / "model.onnx"))
    for index, (result, error) in enumerate(received):
        assert error is None, error
        assert result.get_response().id == str(index)
        np.testing.assert_allclose(
            result.as_numpy("OUTPUT0"), session.run(None, {"INPUT0": xs[index]})[0], rtol=1e-6
        )


def test_stream_reports_a_bad_request_and_goes_on(client):
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("simple", [grpc_input("INPUT0", np.zeros((1, 15), np.float32), "FP32")])
        client.async_stream_infer("simple", [grpc_input("INPUT0", np.zeros((1, 16), np.float32), "FP32")])
        first, second = answers.get(timeout=10), answers.get(timeout=10)
    finally:
        client.stop_stream()
    assert first[0] is None
    assert "expects [-1, 16]" in str(first[1])
    assert second[1] is None


def _raw_request(**fields) -> bytes:
    message = service_pb2.ModelInferRequest(**{k: v for k, v in fields.items() if k != "inputs"})
    for spec in fields.get("inputs", []):
        message.inputs.add(**spec)
    return message.SerializeToString()


def _with_raw(message_fields: dict, raw: list[bytes]) -> bytes:
    message = service_pb2.ModelInferRequest.FromString(_raw_request(**message_fields))
    message.raw_input_contents.extend(raw)
    return message.SerializeToString()


def _typed(name, datatype, shape, field, values) -> bytes:
    message = service_pb2.ModelInferRequest(model_name="simple")
    tensor = message.inputs.add(name=name, datatype=datatype, shape=shape)
    getattr(tensor.contents, field).extend(values)
    return message.SerializeToString()


F16 = np.zeros((1, 16), np.float32).tobytes()
SIMPLE_INPUT = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16]}

MALFORMED = [
    ("not protobuf", b"\xff\xff\xff\xff", grpc.StatusCode.INVALID_ARGUMENT, "not a valid ModelInferRequest"),
    ("truncated message", _with_raw({"model_name": "simple", "inputs": [SIMPLE_INPUT]}, [F16])[:-9],
     grpc.StatusCode.INVALID_ARGUMENT, "not a valid ModelInferRequest"),
    # over 64 KiB: the tensor bytes stay where they arrived (grpc_codec.parse_infer_request)
    ("truncated large message", _with_raw({"model_name": "simple", "inputs": [SIMPLE_INPUT]}, [bytes(70000)])[:-10],
     grpc.StatusCode.INVALID_ARGUMENT,
     "not a valid ModelInferRequest protobuf message: a field says 70000 bytes but only 69990 remain"),
    ("large raw size differs from shape", _with_raw({"model_name": "simple", "inputs": [SIMPLE_INPUT]}, [bytes(70000)]),
     grpc.StatusCode.INVALID_ARGUMENT, "70000 bytes of raw data, but shape [1, 16] of FP32 needs 64 bytes"),
    ("unknown model", _with_raw({"model_name": "nope", "inputs": [SIMPLE_INPUT]}, [F16]),
     grpc.StatusCode.NOT_FOUND, "unknown model 'nope'"),
    ("unknown version", _with_raw({"model_name": "simple", "model_version": "7", "inputs": [SIMPLE_INPUT]}, [F16]),
     grpc.StatusCode.NOT_FOUND, "has no version '7'"),
    ("no inputs", _raw_request(model_name="simple"), grpc.StatusCode.INVALID_ARGUMENT, "model 'simple' needs input(s) 'INPUT0'"),
    ("raw count differs from inputs", _with_raw({"model_name": "simple", "inputs": [SIMPLE_INPUT]}, [F16, F16]),
     grpc.StatusCode.INVALID_ARGUMENT, "raw_input_contents has 2 entries but the request has 1 inputs"),
    ("raw size differs from shape", _with_raw({"model_name": "simple", "inputs": [SIMPLE_INPUT]}, [F16[:-4]]),
     grpc.StatusCode.INVALID_ARGUMENT, "60 bytes of raw data, but shape [1, 16] of FP32 needs 64 bytes"),
    ("wrong datatype", _with_raw({"model_name": "simple", "inputs": [{**SIMPLE_INPUT, "datatype": "INT32"}]}, [F16]),
     grpc.StatusCode.INVALID_ARGUMENT, "has datatype INT32 but model 'simple' expects FP32"),
    ("unknown datatype", _with_raw({"model_name": "simple", "inputs": [{**SIMPLE_INPUT, "datatype": "F32"}]}, [F16]),
     grpc.StatusCode.INVALID_ARGUMENT, "unknown datatype 'F32'"),
    ("negative dimension", _with_raw({"model_name": "simple", "inputs": [{**SIMPLE_INPUT, "shape": [-1, 16]}]}, [F16]),
     grpc.StatusCode.INVALID_ARGUMENT, "has a negative dimension"),
    ("missing input name", _with_raw({"model_name": "simple", "inputs": [{**SIMPLE_INPUT, "name": ""}]}, [F16]),
     grpc.StatusCode.INVALID_ARGUMENT, "inputs[0] has no name"),
    ("extra input", _with_raw({"model_name": "simple", "inputs": [SIMPLE_INPUT, {**SIMPLE_INPUT, "name": "X"}]},
     [F16, F16]), grpc.StatusCode.INVALID_ARGUMENT, "unknown input(s) 'X'"),
    ("typed contents of the wrong length", _typed("INPUT0", "FP32", [1, 16], "fp32_contents", [1.0] * 3),
     grpc.StatusCode.INVALID_ARGUMENT, "needs 16 elements but contents.fp32_contents has 3"),
    ("FP16 in typed contents", _typed("INPUT0", "FP16", [1, 16], "fp32_contents", [1.0] * 16),
     grpc.StatusCode.INVALID_ARGUMENT, "FP16 data must be sent in raw_input_contents"),
    ("BYTES lengths that overrun",
     _with_raw({"model_name": "text_lower", "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1]}]},
               [b"\x10\x00\x00\x00ab"]),
     grpc.StatusCode.INVALID_ARGUMENT, "BYTES element 0 says 16 bytes but only 2 remain"),
    ("unknown output",
     _with_raw({"model_name": "simple", "inputs": [SIMPLE_INPUT], "outputs": [{"name": "NOPE"}]}, [F16]),
     grpc.StatusCode.INVALID_ARGUMENT, "model 'simple' has no output(s) 'NOPE'; its outputs are: 'OUTPUT0'"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "code", "words"), [case[1:] for case in MALFORMED], ids=[c[0] for c in MALFORMED]
)
def test_malformed_requests_get_a_clear_status(example_server: ServerProcess, body, code, words):
    with grpc.insecure_channel(f"127.0.0.1:{example_server.grpc_port}") as channel:
        call = channel.unary_unary(METHOD)  # raw bytes in, raw bytes out
        with pytest.raises(grpc.RpcError) as caught:
            call(body, timeout=10)
        assert caught.value.code() == code
        assert words in caught.value.details()
        # the server keeps serving
        good = channel.unary_unary(METHOD)(
            _with_raw({"model_name": "simple", "inputs": [SIMPLE_INPUT]}, [F16])
        )
        assert service_pb2.ModelInferResponse.FromString(good).model_name == "simple"


def test_same_messages_as_http(client, example_server: ServerProcess):
    x = np.zeros((1, 15), np.float32)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("simple", [grpc_input("INPUT0", x, "FP32")])
    http = request(example_server.port, "POST", "/v2/models/simple/infer", infer_body({"INPUT0": x}))
    assert http.error in caught.value.message()
    assert "INVALID_ARGUMENT" in str(caught.value.status())


def test_http_and_grpc_requests_share_a_batch(special_server: ServerProcess, special_models: Path):
    port, grpc_port = special_server.port, special_server.grpc_port

    def executions_by_size() -> dict[int, int]:
        [entry] = request(port, "GET", "/v2/models/slow_shared/versions/1/stats").json()["model_stats"]
        return {batch["batch_size"]: batch["compute_infer"]["count"] for batch in entry["batch_stats"]}

    before = executions_by_size()
    x = np.full((1, 256), 0.01, dtype=np.float32)
    expected = ort.InferenceSession(str(special_models / "slow.onnx")).run(None, {"X": x})[0]
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            blocker_body = infer_body({"X": np.full((8, 256), 0.01, np.float32)})
            blocker = pool.submit(request, port, "POST", "/v2/models/slow_shared/infer", blocker_body)
            wait_queue(port, "slow_shared", 0, 1)  # the blocker runs; what comes now queues together
            http_calls = [
                pool.submit(request, port, "POST", "/v2/models/slow_shared/infer", infer_body({"X": x}))
                for _ in range(3)
            ]
            grpc_calls = [
                pool.submit(client.infer, "slow_shared", [grpc_input("X", x, "FP32")]) for _ in range(3)
            ]
            wait_queue(port, "slow_shared", 6, 7)
            assert blocker.result().status == 200
            http_outputs = [call.result().json()["outputs"][0] for call in http_calls]
            grpc_outputs = [call.result().as_numpy("Y") for call in grpc_calls]
    finally:
        client.close()
    for output in http_outputs:
        np.testing.assert_allclose(np.array(output["data"], np.float32).reshape(1, 256), expected, rtol=1e-5)
    for output in grpc_outputs:
        np.testing.assert_allclose(output, expected, rtol=1e-5)
    after = executions_by_size()
    assert after.get(6, 0) == before.get(6, 0) + 1, "the six requests, three per protocol, ran as one batch"


def test_grpc_deadline_drops_the_queued_request(special_server: ServerProcess):
    port = special_server.port

    def stats() -> dict:
        return request(port, "GET", "/v2/models/slow_unbatched/versions/1/stats").json()["model_stats"][0]

    before = stats()["execution_count"]
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{special_server.grpc_port}")
    x = np.full((1, 256), 0.01, dtype=np.float32)
    blocker_body = infer_body({"X": np.full((6, 256), 0.01, np.float32)})
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            blocker = pool.submit(request, port, "POST", "/v2/models/slow_unbatched/infer", blocker_body)
            wait_queue(port, "slow_unbatched", 0, 1)
            with pytest.raises(InferenceServerException) as caught:
                client.infer("slow_unbatched", [grpc_input("X", x, "FP32")], client_timeout=0.05)
            assert "DEADLINE_EXCEEDED" in str(caught.value.status())
            wait_queue(port, "slow_unbatched", 0, 1)  # the expired request left the queue
            assert blocker.result().status == 200
    finally:
        client.close()
    wait_queue(port, "slow_unbatched", 0, 0)
    assert stats()["execution_count"] - before == 1, "only the blocker ran"


def test_a_malformed_message_inside_a_stream_is_answered_and_the_stream_goes_on(
    example_server: ServerProcess,
):
    good = _with_raw({"model_name": "simple", "inputs": [SIMPLE_INPUT], "id": "good"}, [F16])
    with grpc.insecure_channel(f"127.0.0.1:{example_server.grpc_port}") as channel:
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        answers = [
            service_pb2.ModelStreamInferResponse.FromString(raw)
            for raw in stream(iter([good, b"\xff\xff", good]))
        ]
    assert [answer.infer_response.id for answer in answers] == ["good", "", "good"]
    assert answers[0].error_message == answers[2].error_message == ""
    assert "not a valid ModelInferRequest" in answers[1].error_message


def test_a_request_id_in_metadata_is_used_and_sent_back(example_server: ServerProcess):
    body = _with_raw({"model_name": "simple", "inputs": [SIMPLE_INPUT]}, [F16])
    with grpc.insecure_channel(f"127.0.0.1:{example_server.grpc_port}") as channel:
        _, call = channel.unary_unary(METHOD).with_call(body, metadata=(("x-request-id", "grpc-meta-7"),))
        trailing = dict(call.trailing_metadata())
    assert trailing["x-request-id"] == "grpc-meta-7"
    # the access log is written after the answer (afterwards.py): the client may read its answer first
    wait_for(lambda: '"request_id":"grpc-meta-7"' in example_server.log(), what="the access-log line")
    [line] = [line for line in json_log_lines(example_server) if line.get("request_id") == "grpc-meta-7"]
    assert (line["protocol"], line["model"], line["status"]) == ("grpc", "simple", "success")


def test_a_cancelled_call_drops_its_queued_request(special_server: ServerProcess):
    port = special_server.port

    def counted() -> tuple[int, float]:
        [entry] = request(port, "GET", "/v2/models/slow_unbatched/versions/1/stats").json()["model_stats"]
        samples = scrape(port)
        labels = {"model": "slow_unbatched", "version": "1", "protocol": "grpc", "status": "client_error"}
        return entry["execution_count"], samples.get("edgeinfer_inference_requests_total", {}).get(
            tuple(sorted(labels.items())), 0.0
        )

    executions, cancelled = counted()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{special_server.grpc_port}")
    answers: queue.Queue = queue.Queue()
    blocker_body = infer_body({"X": np.full((6, 256), 0.01, np.float32)})
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            blocker = pool.submit(request, port, "POST", "/v2/models/slow_unbatched/infer", blocker_body)
            wait_queue(port, "slow_unbatched", 0, 1)
            x = np.full((1, 256), 0.01, dtype=np.float32)
            context = client.async_infer(
                "slow_unbatched", [grpc_input("X", x, "FP32")], lambda result, error: answers.put(error)
            )
            wait_queue(port, "slow_unbatched", 1, 2)
            context.cancel()
            wait_queue(port, "slow_unbatched", 0, 1)  # out of the queue at once
            assert blocker.result().status == 200
    finally:
        client.close()
    wait_queue(port, "slow_unbatched", 0, 0)
    assert "CANCELLED" in str(answers.get(timeout=10).status())
    now_executions, now_cancelled = counted()
    assert now_executions - executions == 1, "the cancelled request never ran"
    assert now_cancelled - cancelled == 1, "counted as a client error"
