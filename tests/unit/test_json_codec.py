from __future__ import annotations

import numpy as np
import orjson
import pytest

from edgeinfer.errors import InvalidInput
from edgeinfer.protocol import json_codec, json_depth, json_tensors
from edgeinfer.protocol.datatypes import numpy_dtype as numpy_dtype_of
from edgeinfer.protocol.json_codec import decode_request, encode_response
from edgeinfer.protocol.types import InferResponse


def body(**fields) -> bytes:
    return orjson.dumps(fields)


def test_flat_and_nested_data_give_the_same_array():
    flat = decode_request(
        body(inputs=[{"name": "x", "shape": [2, 2], "datatype": "INT32", "data": [1, 2, 3, 4]}])
    )
    nested = decode_request(
        body(inputs=[{"name": "x", "shape": [2, 2], "datatype": "INT32", "data": [[1, 2], [3, 4]]}])
    )
    np.testing.assert_array_equal(flat.inputs["x"], nested.inputs["x"])
    assert flat.inputs["x"].dtype == np.int32


FLOAT_DATA = [
    [0.1, -2.5, 3.0, 1e-40],  # a float32 subnormal
    [1e300, -1e300, 3.4028235e38, 3.5e38],  # beyond float32's range: inf, as a cast anywhere
    [-0.0, float("inf"), float("nan"), 0.0],
    [1, 2, 3, 16777217],  # integers (2**24 + 1 rounds in float32)
    [2**63, 2**64 - 1, 5, 6],  # the largest integers orjson gives as integers
    [-(2**63), 7, 8, 9],
    [1.5, True, False, 2],  # numbers and booleans after one: numpy makes numbers of them too
]
BAD_DATA = [
    [True, False, True, True],  # booleans are not numbers
    [1.0, 2.0, "3", 4.0],
    [1.0, None, 3.0, 4.0],
    [1.0, [2.0], 3.0, 4.0],
    [1.0, {"a": 1}, 3.0, 4.0],
]


def _general(data: list, datatype: str) -> np.ndarray | str:
    """What the general path (numpy's kind check and cast) makes of ``data``, or its refusal."""
    try:
        return json_tensors._numbers(data, numpy_dtype_of(datatype), datatype)
    except (ValueError, TypeError, OverflowError) as exc:
        return f"input 'x': data does not fit datatype {datatype}: {exc}"


@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
@pytest.mark.parametrize("data", FLOAT_DATA, ids=repr)
def test_flat_floats_are_the_arrays_the_general_path_makes(data: list, datatype: str):
    fast = json_tensors._flat_numbers(data, datatype)
    assert fast is not None  # taken by the one-call conversion
    general = _general(data, datatype)
    assert isinstance(general, np.ndarray)
    assert fast.dtype == general.dtype
    np.testing.assert_array_equal(fast, general)  # nan equal to nan, inf to inf
    assert np.signbit(fast).tolist() == np.signbit(general).tolist()  # -0.0 stays negative
    decoded = json_tensors.json_to_array("x", datatype, (2, 2), data)
    assert decoded.shape == (2, 2)
    assert decoded.flags.c_contiguous


@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
@pytest.mark.parametrize("data", BAD_DATA, ids=repr)
def test_what_flat_floats_does_not_take_is_refused_as_before(data: list, datatype: str):
    assert json_tensors._flat_numbers(data, datatype) is None
    general = _general(data, datatype)
    assert isinstance(general, str)
    with pytest.raises(InvalidInput) as raised:
        json_tensors.json_to_array("x", datatype, (4,), data)
    assert str(raised.value) == general


INTEGER_DATATYPES = ["INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"]


def _limits(datatype: str) -> tuple[int, int]:
    info = np.iinfo(numpy_dtype_of(datatype))
    return int(info.min), int(info.max)


def _integer_data(datatype: str) -> list[list]:
    low, high = _limits(datatype)
    return [
        [low, high, 0, 1],  # the datatype's whole range
        [high, high - 1, low + 1, low],
        [1, True, False, 2],  # booleans after a number: numpy makes integers of them too
    ]


def _bad_integer_data(datatype: str) -> list[list]:
    low, high = _limits(datatype)
    return [
        [high + 1, 0, 0, 0],  # outside the range, either side
        [0, 0, 0, low - 1],
        [1, 2.5, 3, 4],  # a fraction
        [1, 2.0, 3, 4],  # a float, even a whole one: JSON wrote 2.0, the client sent a float
        [True, False, True, True],  # booleans are not numbers
        [1, "2", 3, 4],
        [1, None, 3, 4],
        [1, [2], 3, 4],
        [1, {"a": 1}, 3, 4],
    ]


@pytest.mark.parametrize("datatype", INTEGER_DATATYPES)
def test_flat_integers_are_the_arrays_the_general_path_makes(datatype: str):
    for data in _integer_data(datatype):
        fast = json_tensors._flat_numbers(data, datatype)
        assert fast is not None, data  # taken by the one-call conversion
        general = _general(data, datatype)
        assert isinstance(general, np.ndarray), data
        assert fast.dtype == general.dtype == numpy_dtype_of(datatype)
        assert fast.tolist() == general.tolist() == [int(value) for value in data]
        decoded = json_tensors.json_to_array("x", datatype, (2, 2), data)
        assert decoded.shape == (2, 2)
        assert decoded.flags.c_contiguous


@pytest.mark.parametrize("datatype", INTEGER_DATATYPES)
def test_what_flat_integers_does_not_take_is_refused_as_before(datatype: str):
    """Out of range, fractions, floats, booleans, strings, nulls, lists, objects: the one-call path
    takes none of them, and the general path refuses each with its message."""
    for data in _bad_integer_data(datatype):
        assert json_tensors._flat_numbers(data, datatype) is None, data
        general = _general(data, datatype)
        assert isinstance(general, str), data
        with pytest.raises(InvalidInput) as raised:
            json_tensors.json_to_array("x", datatype, (4,), data)
        assert str(raised.value) == general


def test_flat_numbers_leaves_other_datatypes_and_a_first_boolean_to_the_general_path():
    assert all(json_tensors._flat_numbers([1, 0], name) is None for name in ("FP16", "BOOL", "BYTES"))
    assert json_tensors._flat_numbers([], "FP32") is None
    for datatype, data in (("FP32", [True, 1.5, 2.0, 3.0]), ("INT64", [True, 1, 2, 3])):
        assert (
            json_tensors._flat_numbers(data, datatype) is None
        )  # numbers after all: the general path takes them
        np.testing.assert_array_equal(
            json_tensors.json_to_array("x", datatype, (4,), data), _general(data, datatype)
        )


def test_every_numeric_datatype_but_fp16_and_bool_is_taken_in_one_call():
    """The one-call table holds a typecode for every integer and float datatype here (a C type of the
    datatype's size exists on the platforms this runs on)."""
    assert set(json_tensors._ONE_CALL) == {"FP32", "FP64", *INTEGER_DATATYPES}


def test_request_fields_are_kept():
    request = decode_request(
        body(
            id="r1",
            parameters={"timeout": 5},
            inputs=[{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.5], "parameters": {"a": 1}}],
            outputs=[{"name": "y", "parameters": {"binary_data": True}}],
        )
    )
    assert request.id == "r1"
    assert request.parameters == {"timeout": 5}
    assert request.input_parameters == {"x": {"a": 1}}
    assert request.outputs is not None
    assert [(o.name, o.parameters) for o in request.outputs] == [("y", {"binary_data": True})]


def test_scalar_data_for_a_one_element_tensor():
    request = decode_request(body(inputs=[{"name": "x", "shape": [1], "datatype": "FP64", "data": 2.5}]))
    assert request.inputs["x"].tolist() == [2.5]


def test_ragged_nested_data_is_a_clear_error():
    with pytest.raises(InvalidInput, match="input 'x'"):
        decode_request(
            body(inputs=[{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3]]}])
        )


def test_bytes_are_utf8_encoded():
    request = decode_request(
        body(inputs=[{"name": "s", "shape": [2], "datatype": "BYTES", "data": ["é", "b"]}])
    )
    assert request.inputs["s"].tolist() == ["é".encode(), b"b"]


def test_response_encoding():
    response = InferResponse(
        model_name="m",
        model_version="3",
        outputs={
            "y": np.arange(4, dtype=np.float16).reshape(2, 2),
            "s": np.array([b"a", b"b"], dtype=object),
            "t": np.array([[True, False]]),
        },
        id="r",
    )
    document = orjson.loads(encode_response(response))
    assert document == {
        "model_name": "m",
        "model_version": "3",
        "id": "r",
        "outputs": [
            {"name": "y", "datatype": "FP16", "shape": [2, 2], "data": [0.0, 1.0, 2.0, 3.0]},
            {"name": "s", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]},
            {"name": "t", "datatype": "BOOL", "shape": [1, 2], "data": [True, False]},
        ],
    }


def test_non_utf8_bytes_output_names_the_output():
    response = InferResponse("m", "1", {"s": np.array([b"\xff"], dtype=object)})
    with pytest.raises(InvalidInput, match="output 's' holds bytes that are not UTF-8"):
        encode_response(response)


def test_non_contiguous_outputs_are_encoded_in_row_major_order():
    array = np.arange(6, dtype=np.int64).reshape(2, 3).T
    document = orjson.loads(encode_response(InferResponse("m", "1", {"y": array})))
    assert document["outputs"][0]["data"] == array.reshape(-1).tolist()


def test_fields_the_protocol_does_not_define_are_ignored_and_logged_once(caplog):
    tensor = {"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0], "kserve_extra_unit": "m"}
    body = orjson.dumps({"model_name": "m", "kserve_extra_top": 1, "inputs": [tensor]})
    with caplog.at_level("DEBUG", logger="edgeinfer.protocol.json_codec"):
        first = decode_request(body)
        second = decode_request(body)
    assert first.inputs["x"].tolist() == second.inputs["x"].tolist() == [1.0]
    logged = [record.getMessage() for record in caplog.records]
    assert sum("kserve_extra_top" in message for message in logged) == 1
    assert sum("kserve_extra_unit" in message for message in logged) == 1


# ---- nesting depth (server.limits.max_json_depth) ----


@pytest.mark.parametrize(
    ("document", "limit", "over"),
    [
        ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}]}, 4, False),
        ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [[1.0]]}]}, 4, True),
        ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [[1.0]]}]}, 5, False),
        ({"parameters": {"a": {"b": 1}}}, 3, False),
        ({"parameters": {"a": {"b": {"c": 1}}}}, 3, True),
        ({"parameters": {"a": [1, 2, [3]]}}, 3, True),
        ({"outputs": [{"name": "y", "parameters": {"k": 1}}]}, 4, False),
        ({"outputs": [{"name": "y", "parameters": {"k": [1]}}]}, 4, True),
        ({"inputs": [{"name": "x", "parameters": {"p": {"q": 1}}}]}, 5, False),
        ({"inputs": [{"name": "x", "parameters": {"p": {"q": [1]}}}]}, 5, True),
        ({"ignored": [[[[1]]]]}, 4, True),
    ],
)
def test_nesting_is_limited_everywhere(document: dict, limit: int, over: bool):
    from edgeinfer.errors import LimitExceeded

    if over:
        with pytest.raises(LimitExceeded, match=f"the limit is {limit}"):
            json_depth.check_depth(document, limit)
    else:
        json_depth.check_depth(document, limit)


def test_an_empty_outputs_list_asks_for_every_output():
    body = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}], "outputs": []}'
    assert json_codec.decode_request(body).outputs is None
