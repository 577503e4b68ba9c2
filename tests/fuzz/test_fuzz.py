"""Generated malformed and adversarial input (Hypothesis), for the decoders and the real server.

Property, everywhere: a clear client error (``InvalidInput`` in the decoders; a 4xx with a JSON
``error`` over HTTP; a gRPC status other than INTERNAL/UNKNOWN) or a success, never a 500, a hang or a
crashed worker; and the server answers a good request after every case.

The budget is bounded (``FUZZ_EXAMPLES`` per test, 200 unless the environment says otherwise); the
examples differ run to run, so CI keeps exploring. A failure prints the example to reproduce it with.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from unittest import mock

import grpc
import numpy as np
import orjson
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st

from edgeinfer.errors import InvalidInput
from edgeinfer.protocol import grpc_codec, http_binary, json_codec, json_scan
from edgeinfer.protocol.grpc_gen import edgeinfer_grpc_v2_pb2 as pb
from edgeinfer.validation import RequestLimits, check_sizes
from tests.fuzz.budget import FUZZ
from tests.support import ServerProcess, examples_server_that_survives, infer_body, request

DATATYPES = ["BOOL", "UINT8", "INT8", "INT32", "INT64", "UINT64", "FP16", "FP32", "FP64", "BYTES"]
GOOD = infer_body({"INPUT0": np.ones((1, 16), np.float32)})
INT64 = st.integers(min_value=-(2**63), max_value=2**64 - 1)  # what JSON encoders write (larger: bytes tests)

json_values = st.recursive(
    st.none() | st.booleans() | INT64 | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
shapes = st.lists(st.integers(min_value=-2, max_value=2**40) | st.sampled_from([0, 1, 2, 16]), max_size=5)
tensors = st.fixed_dictionaries(
    {},
    optional={
        "name": st.sampled_from(["INPUT0", "INPUT1", ""]) | json_values,
        "datatype": st.sampled_from(DATATYPES) | json_values,
        "shape": shapes | json_values,
        "data": st.lists(st.floats(allow_nan=False) | INT64 | st.text(max_size=4), max_size=40) | json_values,
        "parameters": st.dictionaries(
            st.sampled_from(["binary_data_size", "content_type", "x"]), json_values
        ),
    },
)
documents = st.fixed_dictionaries(
    {},
    optional={
        "id": json_values,
        "inputs": st.lists(tensors, max_size=3) | json_values,
        "outputs": st.lists(st.fixed_dictionaries({"name": json_values}), max_size=2) | json_values,
        "parameters": st.dictionaries(st.text(max_size=8), json_values, max_size=3) | json_values,
    },
)


def decode_or_client_error(decode: object, *args: object) -> None:
    try:
        request = decode(*args)  # type: ignore[operator]
        check_sizes(request, RequestLimits())
    except InvalidInput:
        pass


# ---- the decoders alone ----


@FUZZ
@given(st.binary(max_size=2000))
def test_json_decoder_on_any_bytes(body: bytes):
    decode_or_client_error(json_codec.decode_request, body)


@FUZZ
@given(documents, st.booleans())
def test_json_decoder_on_v2_shaped_documents(document: dict, large: bool):
    body = orjson.dumps(document)
    if large:  # the simdjson path for bodies from 4 KiB on
        body = (
            body[:-1] + b"," + b'"pad":"' + b"x" * json_codec.LARGE_BODY_BYTES + b'"}'
            if body != b"{}"
            else body
        )
    decode_or_client_error(json_codec.decode_request, body)


def decoded_or_message(decode: object, *args: object) -> object:
    """What a decoder makes of a body: the request's fields, or its client error's message."""
    try:
        request = decode(*args)  # type: ignore[operator]
    except InvalidInput as error:
        return str(error)
    inputs = {name: (array.dtype, array.shape, array.tobytes()) for name, array in request.inputs.items()}
    return (inputs, request.id, request.parameters, request.outputs, request.input_parameters)


# text made of JSON's punctuation and of numbers, good and bad: arrays of numbers, broken ones, strings
number_text = (
    st.floats(allow_nan=False).map(repr)
    | st.floats(width=32).map(repr)
    | st.integers(-(2**70), 2**70).map(str)
    | st.sampled_from(["-0", "0.0", "-0.0", "1e5", "1E-5", "01", "1.", ".5", "+1", "1e", "-", "NaN"])
)
punctuation = st.sampled_from(["[", "]", ",", " ", "\n", '"', "\\", '\\"', "{", "}", ":", "x"])
arrays_text = st.lists(number_text, min_size=1, max_size=8).map(lambda numbers: "[" + ",".join(numbers) + "]")
json_like_text = st.text(alphabet='0123456789[]{}",:.eE+- \\\ntx', max_size=400) | st.lists(
    arrays_text | number_text | punctuation, max_size=30
).map("".join)


@FUZZ
@given(json_like_text)
def test_the_gil_free_scan_on_json_like_text(text: str):
    """The C scan on text made of JSON's punctuation and numbers' characters: it never reads out of
    bounds (a crash would end the run) and every array it takes is, by the ordinary parser, a flat
    array of numbers whose float32 values are the ones it gives."""
    if not json_scan.available():
        pytest.skip("the C library was not built (no compiler)")
    body = text.encode()
    with mock.patch.object(json_scan, "MIN_COUNT", 1):
        found = json_scan.float32_arrays(body)
    if found is None:
        return
    for start, end, values in zip(found.starts, found.ends, found.values, strict=True):
        numbers = orjson.loads(body[start:end])
        assert isinstance(numbers, list)
        assert all(isinstance(number, (int, float)) and not isinstance(number, bool) for number in numbers)
        expected = np.array([float(number) for number in numbers]).astype(np.float32)
        np.testing.assert_array_equal(values.view(np.uint32), expected.view(np.uint32))


# tensors whose data fits their shape: numbers of every kind a client writes, for any datatype
fitting_tensors = st.builds(
    lambda name, datatype, data: {"name": name, "datatype": datatype, "shape": [len(data)], "data": data},
    st.sampled_from(["x", "y"]),
    st.sampled_from(DATATYPES),
    st.lists(
        st.one_of(INT64, st.integers(-300, 300), st.floats(), st.floats(width=32)), min_size=1, max_size=6
    )
    | st.lists(st.integers(0, 255), min_size=1, max_size=6),
)
fitting_documents = st.fixed_dictionaries(
    {"inputs": st.lists(fitting_tensors | tensors, min_size=1, max_size=3)},
    optional={"id": json_values, "parameters": st.dictionaries(st.text(max_size=8), json_values, max_size=3)},
)


@FUZZ
@given(documents | fitting_documents)
def test_json_decoder_with_every_numeric_array_scanned_without_the_gil(document: dict):
    """The GIL-free scan (json_scan.py), taking every numeric array of two numbers or more: the same
    request or the same message as the other paths."""
    if not json_scan.available():
        pytest.skip("the C library was not built (no compiler)")
    body = orjson.dumps(document)
    with mock.patch.object(json_scan, "MIN_COUNT", 2):  # shapes here are [n]: data alone
        scanned = json_scan.float32_arrays(body)
    expected = decoded_or_message(json_codec.decode_request, body)
    assert decoded_or_message(json_codec.decode_request, body, json_codec.MAX_DEPTH, scanned) == expected


@FUZZ
@given(documents, st.binary(max_size=300), st.integers(min_value=-5, max_value=5000))
def test_binary_extension_decoder(document: dict, tail: bytes, header_length_shift: int):
    header = orjson.dumps(document)
    header_length = max(-1, len(header) + header_length_shift) if header_length_shift % 3 else len(header)
    decode_or_client_error(http_binary.decode_request, header + tail, header_length)


grpc_tensors = st.builds(
    lambda name, datatype, shape, floats, byte_items: pb.ModelInferRequest.InferInputTensor(
        name=name,
        datatype=datatype,
        shape=shape,
        contents=pb.InferTensorContents(fp32_contents=floats, bytes_contents=byte_items),
    ),
    st.text(max_size=8),
    st.sampled_from([*DATATYPES, "", "FP8", "STRING"]),
    st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=4),
    st.lists(st.floats(width=32, allow_nan=False), max_size=20),
    st.lists(st.binary(max_size=8), max_size=5),
)


@FUZZ
@given(st.lists(grpc_tensors, max_size=3), st.lists(st.binary(max_size=64), max_size=3))
def test_grpc_decoder_on_generated_messages(inputs: list, raw: list[bytes]):
    message = pb.ModelInferRequest(model_name="m", inputs=inputs, raw_input_contents=raw)
    decode_or_client_error(grpc_codec.decode_infer_request, message)


@FUZZ
@given(st.binary(max_size=500))
def test_grpc_decoder_on_any_bytes(data: bytes):
    try:
        message = pb.ModelInferRequest.FromString(data)
    except (DecodeError, RuntimeError):  # what protobuf raises (RuntimeError: its C++ parser)
        return
    decode_or_client_error(grpc_codec.decode_infer_request, message)


# ---- the real server ----


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with examples_server_that_survives(tmp_path_factory.mktemp("fuzz")) as server:
        yield server


def still_answers(server: ServerProcess) -> None:
    reply = request(server.port, "POST", "/v2/models/simple/infer", GOOD, timeout=10)
    assert reply.status == 200, reply.body


def exchange(port: int, wire: bytes) -> bytes:
    """Send, close our side, read what comes back until the server closes (a hang fails here)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            sock.sendall(wire)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server answered and closed before taking everything: it is allowed to
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
        return data


def assert_no_server_error(answer: bytes) -> None:
    for response in answer.split(b"HTTP/1.1 ")[1:]:
        status = int(response[:3])
        assert status < 500 or status == 503, answer[:500]


GOOD_WIRE = (
    b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(orjson.dumps(GOOD)), orjson.dumps(GOOD))
)


HEADER_NAMES = [b"Content-Length", b"Transfer-Encoding", b"Expect", b"Content-Encoding",
                b"Inference-Header-Content-Length", b"Connection", b"X"]  # fmt: skip
HEADER_VALUES = [
    b"-1",
    b"chunked",
    b"gzip",
    b"100-continue",
    b"99999999999999999999",
    b"close",
    b"\x00\xff",
    b"",
]


@st.composite
def mutated_wire(draw: st.DrawFn) -> bytes:
    """A good request with a few bytes replaced, inserted or cut, or with garbage headers."""
    wire = bytearray(GOOD_WIRE)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        at = draw(st.integers(min_value=0, max_value=len(wire)))
        action = draw(st.sampled_from(["replace", "insert", "cut", "header"]))
        piece = draw(st.binary(min_size=1, max_size=16))
        if action == "replace":
            wire[at : at + len(piece)] = piece
        elif action == "insert":
            wire[at:at] = piece
        elif action == "cut":
            del wire[at : at + len(piece)]
        else:
            name = draw(st.sampled_from(HEADER_NAMES))
            value = draw(st.sampled_from(HEADER_VALUES))
            head_end = wire.find(b"\r\n") + 2
            wire[head_end:head_end] = name + b": " + value + b"\r\n"
    return bytes(wire)


@FUZZ
@given(mutated_wire() | st.binary(max_size=600))
def test_the_http_parser_and_routes_never_fail_with_5xx(server: ServerProcess, wire: bytes):
    assert_no_server_error(exchange(server.port, wire))
    still_answers(server)


@FUZZ
@given(documents)
def test_v2_shaped_bodies_over_http_get_4xx_not_5xx(server: ServerProcess, document: dict):
    for path in ("/v2/models/simple/infer", "/v2/repository/index"):
        reply = request(server.port, "POST", path, orjson.dumps(document), timeout=10)
        assert reply.status < 500 or reply.status == 503, (path, reply.status, reply.body)
        if reply.status >= 400:
            assert reply.error
    still_answers(server)


@FUZZ
@given(st.binary(max_size=400) | st.lists(grpc_tensors, max_size=3).map(
    lambda inputs: pb.ModelInferRequest(model_name="simple", inputs=inputs).SerializeToString()
))  # fmt: skip
def test_grpc_messages_never_fail_with_internal(server: ServerProcess, data: bytes):
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        for method in ("ModelInfer", "ModelMetadata", "RepositoryModelLoad"):
            code, details = grpc_status(
                channel.unary_unary(f"/inference.GRPCInferenceService/{method}"), data
            )
            assert code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), (method, code, details)
            assert code != grpc.StatusCode.DEADLINE_EXCEEDED, "a hang"
    still_answers(server)


def grpc_status(call: grpc.UnaryUnaryMultiCallable, data: bytes) -> tuple[grpc.StatusCode, str]:
    try:
        call(data, timeout=10)
    except grpc.RpcError as error:
        return error.code(), error.details()
    return grpc.StatusCode.OK, ""
