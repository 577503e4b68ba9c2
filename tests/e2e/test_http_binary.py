"""The binary tensor extension and compression over HTTP, with tritonclient.http and by hand."""

from __future__ import annotations

import gzip
import struct
import zlib

import numpy as np
import onnxruntime as ort
import orjson
import pytest
import tritonclient.http as httpclient

from tests.support import EXAMPLES, NUMERIC_DTYPES, ServerProcess, request

REPO = EXAMPLES / "model_repository"


@pytest.fixture
def client(example_server: ServerProcess):
    client = httpclient.InferenceServerClient(f"127.0.0.1:{example_server.port}")
    yield client
    client.close()


def expected_simple(x: np.ndarray, version: str = "2") -> np.ndarray:
    return ort.InferenceSession(str(REPO / "simple" / version / "model.onnx")).run(None, {"INPUT0": x})[0]


def tensor(name: str, array: np.ndarray, datatype: str, binary: bool) -> httpclient.InferInput:
    value = httpclient.InferInput(name, list(array.shape), datatype)
    value.set_data_from_numpy(array, binary_data=binary)
    return value


@pytest.mark.parametrize(("binary_in", "binary_out"), [(True, True), (False, True), (True, False)])
def test_binary_and_json_in_and_out(client, binary_in, binary_out):
    x = np.random.default_rng(3).standard_normal((4, 16)).astype(np.float32)
    result = client.infer(
        "simple",
        [tensor("INPUT0", x, "FP32", binary_in)],
        outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_out)],
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected_simple(x))


def test_default_request_gets_every_output_in_binary(client):
    x = np.ones((1, 16), np.float32)
    result = client.infer("simple", [tensor("INPUT0", x, "FP32", True)])  # names no outputs
    [output] = result.get_response()["outputs"]
    assert "data" not in output
    assert output["parameters"]["binary_data_size"] == 64
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected_simple(x))


def test_mixed_json_and_binary_outputs_in_one_response(client):
    rng = np.random.default_rng(4)
    inputs = {
        f"IN_{name}": (rng.integers(0, 50, (2, 4))).astype(dtype) for name, dtype in NUMERIC_DTYPES.items()
    }
    tensors = [
        tensor(key, value, key[3:], binary=index % 2 == 0)
        for index, (key, value) in enumerate(inputs.items())
    ]
    outputs = [
        httpclient.InferRequestedOutput("OUT_FP16", binary_data=True),
        httpclient.InferRequestedOutput("OUT_INT8", binary_data=False),
        httpclient.InferRequestedOutput("DOUBLE_INT64", binary_data=True),
        httpclient.InferRequestedOutput("NOT_BOOL", binary_data=False),
    ]
    result = client.infer("all_dtypes", tensors, outputs=outputs)
    session = ort.InferenceSession(str(REPO / "all_dtypes" / "1" / "model.onnx"))
    names = ["OUT_FP16", "OUT_INT8", "DOUBLE_INT64", "NOT_BOOL"]
    for name, want in zip(names, session.run(names, inputs), strict=True):
        np.testing.assert_array_equal(result.as_numpy(name), want)
    described = {output["name"]: output for output in result.get_response()["outputs"]}
    assert "data" in described["OUT_INT8"]
    assert "binary_data_size" in described["OUT_FP16"]["parameters"]


@pytest.mark.parametrize("binary", [True, False])
def test_bytes_in_binary_and_json(client, binary):
    text = np.array([b"MiXeD", b"", b"CASE"], dtype=object)
    result = client.infer(
        "text_lower",
        [tensor("TEXT", text, "BYTES", binary)],
        outputs=[httpclient.InferRequestedOutput("LOWER", binary_data=binary)],
    )
    assert [value.decode() if isinstance(value, bytes) else value for value in result.as_numpy("LOWER")] == [
        "mixed",
        "",
        "case",
    ]


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compression_both_ways(client, algorithm):
    x = np.random.default_rng(5).standard_normal((64, 16)).astype(np.float32)
    result = client.infer(
        "simple",
        [tensor("INPUT0", x, "FP32", True)],
        request_compression_algorithm=algorithm,
        response_compression_algorithm=algorithm,
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected_simple(x))


def test_response_is_compressed_when_asked(example_server: ServerProcess):
    body = {"inputs": [{"name": "INPUT0", "shape": [64, 16], "datatype": "FP32", "data": [0.5] * 1024}]}
    reply = request(example_server.port, "POST", "/v2/models/simple/infer", body, {"Accept-Encoding": "gzip"})
    assert reply.status == 200
    assert reply.headers["content-encoding"] == "gzip"
    document = orjson.loads(gzip.decompress(reply.body))
    assert document["outputs"][0]["shape"] == [64, 16]


def binary_body(header: dict, raw: bytes) -> tuple[bytes, dict[str, str]]:
    json_part = orjson.dumps(header)
    return json_part + raw, {"Inference-Header-Content-Length": str(len(json_part))}


F16 = np.zeros(16, np.float32).tobytes()
INPUT = {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}}

BAD_BINARY = [
    ("header length past the body", orjson.dumps({"inputs": [INPUT]}) + F16, {"Inference-Header-Content-Length": "99999"},
     400, "Inference-Header-Content-Length is 99999 but the body has only"),
    ("header length not a number", *binary_body({"inputs": [INPUT]}, F16)[:1], {"Inference-Header-Content-Length": "ten"},
     400, "Inference-Header-Content-Length 'ten' is not a number"),
    ("binary size larger than the data", *binary_body({"inputs": [INPUT]}, F16[:40]), 400,
     "binary_data_size is 64 but only 40 bytes of binary data remain"),
    ("binary sizes do not add up", *binary_body({"inputs": [INPUT]}, F16 + b"xx"), 400,
     "66 bytes after the JSON header but the inputs' binary_data_size add up to 64"),
    ("binary size does not match the shape",
     *binary_body({"inputs": [{**INPUT, "parameters": {"binary_data_size": 60}}]}, F16[:60]), 400,
     "60 bytes of raw data, but shape [1, 16] of FP32 needs 64 bytes"),
    ("negative binary size", *binary_body({"inputs": [{**INPUT, "parameters": {"binary_data_size": -4}}]}, b""), 400,
     "binary_data_size must be a non-negative integer"),
    ("BYTES lengths that overrun",
     *binary_body({"inputs": [{"name": "TEXT", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 6}}]},
                  struct.pack("<I", 50) + b"ab"), 400, "BYTES element 0 says 50 bytes but only 2 remain"),
    ("JSON header that is not JSON", b"{nope" + F16, {"Inference-Header-Content-Length": "5"}, 400,
     "JSON header of the binary request is not valid JSON"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "headers", "status", "words"), [case[1:] for case in BAD_BINARY],
                         ids=[case[0] for case in BAD_BINARY])  # fmt: skip
def test_bad_binary_bodies(example_server: ServerProcess, body, headers, status, words):
    model = "text_lower" if b"TEXT" in body else "simple"
    reply = request(example_server.port, "POST", f"/v2/models/{model}/infer", body, headers)
    assert reply.status == status, reply.body
    assert words in reply.error
    good = request(
        example_server.port, "POST", "/v2/models/simple/infer", *binary_body({"inputs": [INPUT]}, F16)
    )
    assert good.status == 200


def test_bad_compression(example_server: ServerProcess):
    reply = request(
        example_server.port, "POST", "/v2/models/simple/infer", b"not gzip", {"Content-Encoding": "gzip"}
    )
    assert reply.status == 400
    assert "cannot be decompressed" in reply.error
    reply = request(example_server.port, "POST", "/v2/models/simple/infer", b"{}", {"Content-Encoding": "br"})
    assert reply.status == 400
    assert "Content-Encoding 'br' is not supported" in reply.error


def test_a_zip_bomb_is_refused(special_server: ServerProcess):
    bomb = zlib.compress(b" " * 5_000_000, 9)  # 5 MB of spaces in a few KB; the limit is 52 KB
    assert len(bomb) < 52_000
    reply = request(
        special_server.port, "POST", "/v2/models/matmul/infer", bomb, {"Content-Encoding": "deflate"}
    )
    assert reply.status == 413
    assert "decompresses to more than the limit of 52428 bytes" in reply.error
