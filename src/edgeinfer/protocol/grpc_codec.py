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

from edgeinfer.errors import InvalidInput
from edgeinfer.protocol.datatypes import check_shape, numpy_dtype, v2_datatype
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


def decode_infer_request(message: pb.ModelInferRequest) -> InferRequest:
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
    try:
        return np.array(values, dtype=numpy_dtype(datatype)).reshape(shape)
    except OverflowError as exc:
        raise InvalidInput(f"input {name!r}: a value does not fit {datatype}: {exc}") from None


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
