from __future__ import annotations

import numpy as np
import orjson
import pytest

from edgeinfer.errors import InvalidInput
from edgeinfer.protocol import json_codec
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
            json_codec.check_depth(document, limit)
    else:
        json_codec.check_depth(document, limit)


def test_an_empty_outputs_list_asks_for_every_output():
    body = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}], "outputs": []}'
    assert json_codec.decode_request(body).outputs is None
