"""Converting between the gRPC messages (``grpc_gen``) and the core's request and response types.

No grpc import here: this is protobuf only, so it can be tested without a server. Outputs always go
back in ``raw_output_contents``, the only place tritonclient reads them from.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from edgeinfer.errors import InvalidInput
from edgeinfer.protocol.datatypes import check_shape, numpy_dtype, outside_range, v2_datatype
from edgeinfer.protocol.grpc_gen import edgeinfer_grpc_v2_pb2 as pb
from edgeinfer.protocol.raw import array_to_raw, raw_to_array
from edgeinfer.protocol.types import InferRequest, InferResponse, Parameters, RequestedOutput

# Which InferTensorContents field carries each datatype (FP16 has none: it must be sent raw).
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def parameters_to_dict(parameters: Mapping[str, Any]) -> Parameters:
    result: Parameters = {}
    for key, parameter in parameters.items():
        which = parameter.WhichOneof("parameter_choice")
        result[key] = getattr(parameter, which) if which else None
    return result


def set_parameter(parameter: pb.InferParameter, value: Any) -> None:
    """One response parameter in the field its Python type maps to (bool before int: bool is an int)."""
    if isinstance(value, bool):
        parameter.bool_param = value
    elif isinstance(value, int):
        parameter.int64_param = value
    elif isinstance(value, float):
        parameter.double_param = value
    else:
        parameter.string_param = str(value)


RAW_INPUT_CONTENTS = 7  # ModelInferRequest's field number of raw_input_contents
SPLIT_ABOVE_BYTES = 64 * 1024  # smaller messages: protobuf parses them whole faster than Python walks them


class LargeInferRequest:
    """A ModelInferRequest whose ``raw_input_contents`` are views of the bytes it arrived in; every
    other field is read from ``message``, the rest of it, parsed by protobuf (see ``parse_infer_request``)."""

    __slots__ = ("message", "raw_input_contents")

    def __init__(self, message: pb.ModelInferRequest, raw_input_contents: list[memoryview]) -> None:
        self.message = message
        self.raw_input_contents = raw_input_contents

    def __getattr__(self, name: str) -> Any:
        return getattr(self.message, name)


def parse_infer_request(
    data: bytes, split_above: int = SPLIT_ABOVE_BYTES
) -> pb.ModelInferRequest | LargeInferRequest:
    """A ModelInferRequest from its wire bytes; a large one keeps its tensor bytes where they arrived.

    protobuf copies a bytes field into the message it parses, and reading the field copies it again:
    two copies of every tensor, 1.2 MB for one 224x224 FP32 image, on the event loop. Above
    ``split_above`` bytes the message's top-level fields (a handful) are walked instead:
    ``raw_input_contents`` become views of ``data`` and only the rest (names, shapes, parameters) is
    parsed. Raises ``DecodeError`` for what protobuf would refuse to parse."""
    if len(data) <= split_above:
        return pb.ModelInferRequest.FromString(data)
    view = memoryview(data)
    raw: list[memoryview] = []
    rest: list[memoryview] = []
    position, end = 0, len(view)
    while position < end:
        start = position
        tag, position = _varint(view, position)
        kind = tag & 7
        if kind == 2:  # length-delimited: every field of ModelInferRequest
            length, position = _varint(view, position)
            if position + length > end:
                raise DecodeError(f"a field says {length} bytes but only {end - position} remain")
            if tag >> 3 == RAW_INPUT_CONTENTS:
                raw.append(view[position : position + length])
            else:
                rest.append(view[start : position + length])
            position += length
            continue
        if kind == 0:  # unknown varint field
            _, position = _varint(view, position)
        elif kind in (1, 5):  # unknown fixed64 / fixed32 field
            position += 8 if kind == 1 else 4
        else:  # groups (or garbage): protobuf decides
            return pb.ModelInferRequest.FromString(data)
        if position > end:
            raise DecodeError("truncated message")
        rest.append(view[start:position])
    return LargeInferRequest(pb.ModelInferRequest.FromString(b"".join(rest)), raw)


def _varint(view: memoryview, position: int) -> tuple[int, int]:
    value = shift = 0
    for index in range(position, min(position + 10, len(view))):
        byte = view[index]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, index + 1
        shift += 7
    raise DecodeError("truncated or overlong varint")


def decode_infer_request(message: pb.ModelInferRequest | LargeInferRequest) -> InferRequest:
    raw = message.raw_input_contents
    if raw and len(raw) != len(message.inputs):
        raise InvalidInput(
            f"raw_input_contents has {len(raw)} entries but the request has {len(message.inputs)} inputs; "
            "give raw contents for every input or for none"
        )
    inputs: dict[str, np.ndarray] = {}
    input_parameters: dict[str, Parameters] = {}
    for position, tensor in enumerate(message.inputs):
        name = tensor.name
        if not name:
            raise InvalidInput(f"inputs[{position}] has no name")
        if name in inputs:
            raise InvalidInput(f"input {name!r} appears more than once")
        if not tensor.datatype:
            raise InvalidInput(f"input {name!r} has no datatype")
        numpy_dtype(tensor.datatype)
        shape = tuple(tensor.shape)
        check_shape(name, shape)
        if raw:
            inputs[name] = raw_to_array(name, tensor.datatype, shape, raw[position])
        else:
            inputs[name] = contents_to_array(name, tensor.datatype, shape, tensor.contents)
        if tensor.parameters:
            input_parameters[name] = parameters_to_dict(tensor.parameters)
    outputs = [
        RequestedOutput(output.name, parameters_to_dict(output.parameters)) for output in message.outputs
    ]
    return InferRequest(
        inputs=inputs,
        id=message.id or None,
        parameters=parameters_to_dict(message.parameters),
        outputs=outputs or None,
        input_parameters=input_parameters,
    )


def contents_to_array(
    name: str, datatype: str, shape: tuple[int, ...], contents: pb.InferTensorContents
) -> np.ndarray:
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise InvalidInput(f"input {name!r}: {datatype} data must be sent in raw_input_contents")
    values = getattr(contents, field)
    expected = math.prod(shape)
    if len(values) != expected:
        raise InvalidInput(
            f"input {name!r}: shape {list(shape)} needs {expected} elements but contents.{field} has "
            f"{len(values)}"
        )
    if datatype == "BYTES":
        array = np.empty(expected, dtype=object)
        array[:] = list(values)
        return array.reshape(shape)
    dtype = numpy_dtype(datatype)
    if dtype.kind in "iu" and dtype.itemsize < 4 and values:  # int_contents and uint_contents are 32-bit
        wide = np.array(values, dtype=np.int64)
        problem = outside_range(wide, dtype)
        if problem:  # worded as JSON's data is (json_codec): one message whatever the transport
            raise InvalidInput(f"input {name!r}: data does not fit datatype {datatype}: {problem}")
        return wide.astype(dtype).reshape(shape)
    return np.array(values, dtype=dtype).reshape(shape)


def encode_infer_response(response: InferResponse) -> pb.ModelInferResponse:
    message = pb.ModelInferResponse(
        model_name=response.model_name, model_version=response.model_version, id=response.id or ""
    )
    for key, value in response.parameters.items():
        set_parameter(message.parameters[key], value)
    for name, array in response.outputs.items():
        output = message.outputs.add(name=name, datatype=v2_datatype(array.dtype), shape=array.shape)
        for key, value in response.output_parameters.get(name, {}).items():
            output.parameters[key].string_param = str(value)
        message.raw_output_contents.append(array_to_raw(array))
    return message


def from_dict(document: Mapping[str, Any], message: Any) -> Any:
    """Fill a message from the JSON layout the HTTP side already answers with (same field names)."""
    return json_format.ParseDict(document, message, ignore_unknown_fields=True)
