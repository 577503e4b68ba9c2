"""Triton's binary tensor data extension for HTTP, which tritonclient uses by default.

A body is a JSON header followed by raw tensor bytes; the ``Inference-Header-Content-Length`` header
says where the JSON ends. Each input sent in binary carries ``parameters.binary_data_size`` and its
bytes follow in input order. Outputs go back in binary when the output asks ``binary_data: true`` or
the request asks ``binary_data_output: true`` (what tritonclient sends when it names no outputs); the
response then carries the same header and each output's ``binary_data_size``. Without the header the
body is plain JSON: the Content-Type is never consulted (tritonclient sends none).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgeinfer.errors import InvalidInput
from edgeinfer.protocol import json_codec, json_depth
from edgeinfer.protocol.raw import array_to_raw, raw_to_array
from edgeinfer.protocol.types import InferRequest, InferResponse


def decode_request(
    body: bytes, header_length: int | None, max_depth: int = json_codec.MAX_DEPTH
) -> InferRequest:
    if header_length is None:
        return json_codec.decode_request(body, max_depth)
    if header_length < 0 or header_length > len(body):
        raise InvalidInput(
            f"Inference-Header-Content-Length is {header_length} but the body has only {len(body)} bytes"
        )
    view = memoryview(body)
    header = view[:header_length]
    document = json_codec.loads_object(header, "JSON header of the binary request")
    binary = view[header_length:]
    return json_codec.named_exactly(header, document, lambda doc: _decode(doc, header, binary, max_depth))


def _decode(document: dict[str, Any], header: memoryview, binary: memoryview, max_depth: int) -> InferRequest:
    binary_inputs: dict[str, np.ndarray] = {}
    offset = 0
    raw_inputs = document.get("inputs")
    for position, raw in enumerate(raw_inputs if isinstance(raw_inputs, list) else []):
        parameters = raw.get("parameters") if isinstance(raw, dict) else None
        if not isinstance(parameters, dict) or "binary_data_size" not in parameters:
            continue
        name, datatype, shape, _ = json_codec.decode_tensor_header(raw, position)
        size = parameters["binary_data_size"]
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidInput(
                f"input {name!r}: binary_data_size must be a non-negative integer, got {size!r}"
            )
        if offset + size > len(binary):
            raise InvalidInput(
                f"input {name!r}: binary_data_size is {size} but only {len(binary) - offset} bytes of binary "
                f"data remain (the binary part of the body is {len(binary)} bytes)"
            )
        binary_inputs[name] = raw_to_array(name, datatype, shape, binary[offset : offset + size])
        offset += size
    if offset != len(binary):
        raise InvalidInput(
            f"the body has {len(binary)} bytes after the JSON header but the inputs' binary_data_size "
            f"add up to {offset}"
        )
    depth_limit = max_depth if json_depth.may_nest_deeper(header, max_depth) else None
    return json_codec.decode_request_object(document, binary_inputs, depth_limit)


def binary_outputs(response: InferResponse, request_parameters: dict[str, Any]) -> set[str]:
    """The outputs to send as raw bytes, from the request's and each output's parameters."""
    default = request_parameters.get("binary_data_output") is True
    if not default and response.requested is None:
        return set()  # the common JSON request: nothing asks for binary
    asked = {wanted.name: wanted.parameters for wanted in response.requested or ()}
    chosen = set()
    for name in response.outputs:
        flag = asked.get(name, {}).get("binary_data")
        if flag is True or (flag is None and default):
            chosen.add(name)
    return chosen


def encode_response(response: InferResponse, binary: set[str]) -> tuple[bytes, int | None]:
    """The body, and the JSON header's length when any output is binary (None for plain JSON)."""
    if not binary:
        return json_codec.encode_response(response), None
    raws = {name: array_to_raw(response.outputs[name]) for name in response.outputs if name in binary}
    header = json_codec.dumps(
        json_codec.response_document(response, {name: len(raw) for name, raw in raws.items()})
    )
    return b"".join([header, *raws.values()]), len(header)
