"""Large ModelInferRequests keep their tensor bytes where they arrived (grpc_codec.parse_infer_request):
the split parse must read every message exactly as protobuf's own parse does, and refuse what it refuses."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from edgeinfer.errors import InvalidInput
from edgeinfer.protocol import grpc_codec
from edgeinfer.protocol.grpc_gen import edgeinfer_grpc_v2_pb2 as pb


def request(rows: int = 2) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m", model_version="3", id="request-1")
    message.parameters["priority"].int64_param = 2
    message.parameters["stream_id"].string_param = "camera-7"
    images = np.arange(rows * 3 * 4, dtype=np.float32).reshape(rows, 3, 4)
    labels = np.array([[b"cat"], [b"dog"]][:rows], dtype=object)
    first = message.inputs.add(name="image", datatype="FP32", shape=images.shape)
    first.parameters["layout"].string_param = "NCHW"
    message.inputs.add(name="label", datatype="BYTES", shape=labels.shape)
    message.outputs.add(name="scores").parameters["classification"].int64_param = 3
    message.raw_input_contents.append(images.tobytes())
    message.raw_input_contents.append(b"".join(len(v).to_bytes(4, "little") + v for v in labels.reshape(-1)))
    return message


def decoded(parsed: object) -> dict:
    """What the server takes from a request: the decoded InferRequest, as comparable plain data."""
    infer = grpc_codec.decode_infer_request(parsed)  # type: ignore[arg-type]
    return {
        "inputs": {
            name: (array.dtype.str, array.shape, array.tolist()) for name, array in infer.inputs.items()
        },
        "id": infer.id,
        "parameters": infer.parameters,
        "outputs": [(output.name, output.parameters) for output in infer.outputs or []],
        "input_parameters": infer.input_parameters,
    }


def with_unknown_fields(data: bytes) -> bytes:
    """The message with unknown fields of every wire type a newer client might add (10: varint,
    11: fixed64, 12: fixed32, 13: length-delimited)."""
    return (
        data
        + bytes([10 << 3 | 0]) + b"\x96\x01"
        + bytes([11 << 3 | 1]) + b"\x01" * 8
        + bytes([12 << 3 | 5]) + b"\x02" * 4
        + bytes([13 << 3 | 2, 3]) + b"abc"
    )  # fmt: skip


@pytest.mark.parametrize(
    "data",
    [
        request().SerializeToString(),
        request(rows=1).SerializeToString(),
        pb.ModelInferRequest(model_name="m").SerializeToString(),
        with_unknown_fields(request().SerializeToString()),
    ],
    ids=["two inputs", "one row", "no inputs", "unknown fields"],
)
def test_the_split_parse_reads_what_protobuf_reads(data):
    split = grpc_codec.parse_infer_request(data, split_above=0)
    assert isinstance(split, grpc_codec.LargeInferRequest)
    assert decoded(split) == decoded(pb.ModelInferRequest.FromString(data))


def test_large_requests_are_split_and_their_tensors_are_views_of_the_received_bytes():
    image = np.random.default_rng(0).random((1, 3, 96, 96), dtype=np.float32)
    message = pb.ModelInferRequest(model_name="cnn")
    message.inputs.add(name="image", datatype="FP32", shape=image.shape)
    message.raw_input_contents.append(image.tobytes())
    data = message.SerializeToString()
    assert len(data) > grpc_codec.SPLIT_ABOVE_BYTES
    parsed = grpc_codec.parse_infer_request(data)
    assert isinstance(parsed, grpc_codec.LargeInferRequest)
    array = grpc_codec.decode_infer_request(parsed).inputs["image"]
    np.testing.assert_array_equal(array, image)
    assert np.shares_memory(array, np.frombuffer(data, dtype=np.uint8))  # no copy of the tensor


def test_small_requests_are_parsed_whole():
    data = request().SerializeToString()
    assert isinstance(grpc_codec.parse_infer_request(data), pb.ModelInferRequest)


def outcome(parse: object, data: bytes) -> object:
    """The decoded request, or the error that stopped it (a parse error, or the request's own)."""
    try:
        return decoded(parse(data))  # type: ignore[operator]
    except DecodeError:
        return "DecodeError"
    except InvalidInput as error:
        return f"InvalidInput: {error}"


def test_every_truncation_is_refused_or_read_as_protobuf_reads_it():
    """A cut at a field boundary is a shorter valid message; anywhere else both parses refuse it."""
    data = request().SerializeToString()

    def split(cut: bytes) -> object:
        return grpc_codec.parse_infer_request(cut, split_above=0)

    outcomes = [
        (outcome(split, data[:cut]), outcome(pb.ModelInferRequest.FromString, data[:cut]))
        for cut in range(1, len(data))
    ]
    assert [ours for ours, _ in outcomes] == [theirs for _, theirs in outcomes]
    assert "DecodeError" in [theirs for _, theirs in outcomes]  # the cuts do reach malformed messages


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (bytes([7 << 3 | 2]) + b"\x80", "truncated or overlong varint"),
        (bytes([7 << 3 | 2, 100]) + b"x" * 10, "a field says 100 bytes but only 10 remain"),
        (bytes([10 << 3 | 1]) + b"\x01" * 3, "truncated message"),
        (b"\xff" * 11, "truncated or overlong varint"),
    ],
)
def test_malformed_wire_data_names_the_problem(data, words):
    with pytest.raises(DecodeError, match=words):
        grpc_codec.parse_infer_request(data, split_above=0)
