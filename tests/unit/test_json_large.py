"""Large JSON bodies take the simdjson path: the same tensors and the same errors as the orjson path."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from edgeinfer.errors import InvalidInput
from edgeinfer.protocol import json_codec

PADDING = "x" * json_codec.LARGE_BODY_BYTES  # makes any body large


def both(document: dict | list | bytes):
    """(simdjson result, orjson result) for one body; each a request or the InvalidInput message."""
    body = document if isinstance(document, bytes) else orjson.dumps(document)
    assert len(body) >= json_codec.LARGE_BODY_BYTES

    def attempt(decode):
        try:
            return decode()
        except InvalidInput as error:
            return str(error)

    large = attempt(lambda: json_codec.decode_request(body))
    small = attempt(lambda: json_codec.decode_request_object(json_codec.loads_object(body), None))
    return large, small


def tensor(name="x", datatype="FP32", shape=(2, 3), data=None):
    data = list(range(int(np.prod(shape)))) if data is None else data
    return {"name": name, "datatype": datatype, "shape": list(shape), "data": data}


def padded(*inputs, **extra):
    return {"inputs": list(inputs), "parameters": {"padding": PADDING}, **extra}


@pytest.mark.parametrize(
    "inputs",
    [
        [tensor()],
        [tensor(data=[0.1, -2.5e-7, 3, 4.75, 1e30, -0.0])],
        [tensor(datatype="FP16", data=[1.5, 2, 70000, -1, 0, 0.1])],
        [tensor(datatype="INT32", data=[1, -2, 3, 2**31 - 1, -(2**31), 0])],
        [tensor(datatype="UINT8", data=[0, 1, 2, 3, 4, 255])],
        [tensor(datatype="UINT64", data=[0, 2**64 - 1, 5, 6, 7, 8])],
        [tensor(datatype="INT64", data=[[1, 2, 3], [4, 5, 6]])],  # nested: the ordinary path
        [tensor(datatype="BOOL", data=[True, False, True, True, False, False])],
        [tensor(datatype="BYTES", shape=(2,), data=["a", "b"])],
        [tensor(name="a"), tensor(name="b", datatype="FP64", shape=(1, 1), data=[2.0])],
        [tensor(shape=(0, 3), data=[])],
        [{**tensor(), "unit": "m/s"}],  # fields the protocol does not define are ignored
    ],
    ids=[
        "fp32", "floats", "fp16", "int32", "uint8", "uint64", "nested", "bool", "bytes", "two", "empty",
        "extra-field",
    ],
)  # fmt: skip
def test_the_same_tensors_either_way(inputs):
    large, small = both(padded(*inputs, id="r1", outputs=[{"name": "y"}], model_name="m"))
    assert not isinstance(large, str), large
    assert large.id == small.id == "r1"
    assert large.parameters == small.parameters
    assert [output.name for output in large.outputs] == ["y"]
    assert large.inputs.keys() == small.inputs.keys()
    for name in small.inputs:
        assert large.inputs[name].dtype == small.inputs[name].dtype
        assert large.inputs[name].shape == small.inputs[name].shape
        np.testing.assert_array_equal(large.inputs[name], small.inputs[name])


@pytest.mark.parametrize(
    "document",
    [
        padded(tensor(data=[1, 2, 3])),  # too few
        padded(tensor(data=[[1, 2], [3, 4, 5, 6]])),  # ragged
        padded(tensor(data=[1, 2, "3", 4, 5, 6])),  # a string
        padded(tensor(data=[1, 2, None, 4, 5, 6])),
        padded(tensor(datatype="INT8", data=[1, 2, 3, 4, 5, 300])),  # out of range
        padded(tensor(datatype="INT32", data=[1, 2, 3.5, 4, 5, 6])),
        padded(tensor(datatype="UINT16", data=[1, 2, 3, 4, 5, -1])),
        padded(tensor(datatype="FP99")),
        padded(tensor(shape=(2, -3))),
        padded(tensor(), tensor()),  # twice
        padded(tensor(), id=5),
        padded({"\x00": None}),  # a key simdjson cannot look up (found by tests/fuzz)
        {"inputs": 5, "\x00": 1, "padding": PADDING},
        {"inputs": 5, "padding": PADDING},
        [PADDING],
        b'{"inputs": [' + PADDING.encode(),
    ],
)
def test_the_same_errors_either_way(document):
    large, small = both(document)
    assert isinstance(small, str), "the case is an error"
    if isinstance(document, bytes):  # the parsers word a syntax error each in their own way
        assert large.startswith("request body is not valid JSON")
    else:
        assert large == small


def nested(levels: int) -> object:
    value: object = 1
    for _ in range(levels):
        value = {"k": value}
    return value


@pytest.mark.parametrize(
    ("document", "limit", "over"),
    [
        ({**padded(tensor()), "parameters": {"padding": PADDING, "deep": nested(6)}}, 8, False),
        ({**padded(tensor()), "parameters": {"padding": PADDING, "deep": nested(7)}}, 8, True),
        (padded(tensor(shape=(1, 1, 1, 1, 1, 1), data=[[[[[[1]]]]]])), 8, True),  # nested data: walked
        (padded(tensor(shape=(1, 1, 1, 1, 1), data=[[[[[1]]]]])), 8, False),
        (padded(tensor(shape=(4096,), data=[0.5] * 4096)), 4, False),  # flat data decoded apart
    ],
)
def test_the_depth_limit_holds_for_large_bodies(document, limit, over):
    from edgeinfer.errors import LimitExceeded

    body = orjson.dumps(document)
    assert len(body) >= json_codec.LARGE_BODY_BYTES
    if over:
        with pytest.raises(LimitExceeded, match=f"the limit is {limit}"):
            json_codec.decode_request(body, max_depth=limit)
        with pytest.raises(LimitExceeded, match=f"the limit is {limit}"):  # as the small path
            json_codec.decode_request_object(json_codec.loads_object(body), None, max_depth=limit)
    else:
        json_codec.decode_request(body, max_depth=limit)
