"""The V2 JSON body: decoding requests into numpy arrays and encoding responses.

Speed matters here more than anywhere: a request is parsed once, each tensor becomes a numpy array in one
C-level call, and responses hand numpy arrays straight to orjson. No per-element Python loops except for
BYTES, whose elements are Python strings anyway.

Small bodies are parsed by orjson. A larger one (from 4 KiB: a few hundred numbers; an image as JSON is
1.6 MB for 3x224x224 floats) would cost most of its time creating one Python number per element, so it
is parsed by simdjson instead, and each flat numeric ``data`` array is copied into numpy straight from
the parsed document (2.1x faster on a 64x64 image, 3.2x on the benchmark's 224x224 one). Anything
unusual about an input (nested or ragged data, non-numbers, values out of range) takes the ordinary
path, so the checks and messages are the same either way.

Where a JSON image must not hold the GIL (the HTTP server decodes large bodies on a worker thread, so
that its event loop goes on reading other requests), ``json_scan.float32_arrays`` takes the long numeric
arrays out first without the GIL, and ``decode_request`` parses only the rest (``_decode_scanned``):
the same request as the other paths, or, when an array is anything but data that fits its input
exactly (FP32, or integers for an integer type), the body decoded by them.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import math
import re
import secrets
from collections.abc import Callable
from types import ModuleType
from typing import Any, NoReturn

import numpy as np
import orjson

from edgeinfer.errors import InvalidInput, LimitExceeded
from edgeinfer.protocol.datatypes import V2_TO_NUMPY, check_shape, numpy_dtype, v2_datatype
from edgeinfer.protocol.json_depth import check_depth, may_nest_deeper
from edgeinfer.protocol.json_scan import NumericArrays
from edgeinfer.protocol.json_tensors import array_to_json, json_to_array, json_type
from edgeinfer.protocol.types import InferRequest, InferResponse, Parameters, RequestedOutput

log = logging.getLogger(__name__)

_DUMPS_OPTIONS = orjson.OPT_SERIALIZE_NUMPY
_REQUEST_FIELDS = frozenset(("id", "parameters", "inputs", "outputs"))
_TENSOR_FIELDS = frozenset(("name", "datatype", "shape", "parameters", "data"))
_IGNORED_SEEN_MAX = 64  # distinct ignored field names remembered (and logged) at most
_ignored_seen: set[str] = set()
MAX_DEPTH = 32  # nesting of objects and arrays, tensor data included (server.limits.max_json_depth)
LARGE_BODY_BYTES = 4096  # from about here on, simdjson's typed arrays beat orjson's Python numbers
# simdjson's buffer element type (double, int64, uint64) for each numeric datatype
_BUFFER_KIND = {
    "FP16": ("d", np.float64), "FP32": ("d", np.float64), "FP64": ("d", np.float64),
    "INT8": ("i", np.int64), "INT16": ("i", np.int64), "INT32": ("i", np.int64), "INT64": ("i", np.int64),
    "UINT8": ("i", np.int64), "UINT16": ("i", np.int64), "UINT32": ("i", np.int64),
    "UINT64": ("u", np.uint64),
}  # fmt: skip


def dumps(value: Any) -> bytes:
    """Serialise a JSON value (numpy arrays allowed) to bytes."""
    return orjson.dumps(value, option=_DUMPS_OPTIONS)


def loads_object(body: bytes | bytearray | memoryview, what: str = "request body") -> dict[str, Any]:
    """Parse a JSON object, turning every parse problem into an InvalidInput naming ``what``."""
    if not body:
        raise InvalidInput(f"{what} is empty; expected a JSON object")
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidInput(f"{what} must be a JSON object, not {json_type(value)}")
    return value


@functools.cache
def _simdjson() -> ModuleType | None:
    """simdjson, imported with the first large body (a server that never gets one saves its 1.8 MiB);
    None where it has no wheel: then orjson parses every body."""
    try:
        return importlib.import_module("simdjson")
    except ImportError:
        return None


def decode_request(
    body: bytes | bytearray | memoryview, max_depth: int = MAX_DEPTH, scanned: NumericArrays | None = None
) -> InferRequest:
    """Decode a V2 inference request whose tensors are all in JSON; ``scanned``: its long numeric arrays,
    already parsed (``json_scan.float32_arrays(body)``). Whichever decoder reads the body, the answer
    is the same request or the same error (tests/fuzz: the decoders against each other)."""
    if scanned is not None:
        request = _decode_scanned(bytes(body), scanned, max_depth)
        if request is not None:
            return request
    if len(body) >= LARGE_BODY_BYTES and _simdjson() is not None:
        # no bracket count here: on an image it costs a third of the parse, and the walk it would
        # spare is small (numeric data decoded into arrays is not walked)
        return decode_with_simdjson(bytes(body), max_depth)
    return decode_with_orjson(body, max_depth)


def decode_with_orjson(body: bytes | bytearray | memoryview, max_depth: int = MAX_DEPTH) -> InferRequest:
    """The ordinary decoder: orjson's document, every tensor converted from its Python values. What it
    makes of a body is the reference the other decoders keep to."""
    depth_limit = max_depth if may_nest_deeper(body, max_depth) else None
    document = loads_object(body)
    return named_exactly(body, document, lambda doc: decode_request_object(doc, None, depth_limit))


# A run of 19 digits: the shortest integer beyond 64 bits has 20 (-2**63 - 1 has 19 after its sign)
_LONG_DIGITS = re.compile(rb"[0-9]{19}")


def named_exactly(
    body: bytes | bytearray | memoryview,
    document: dict[str, Any],
    decode: Callable[[dict[str, Any]], InferRequest],
) -> InferRequest:
    """``decode(document)``, where ``document`` is orjson's reading of ``body``. orjson reads an integer
    beyond 64 bits as a float, so a refusal of such a body is decoded again from its exact document
    (``exact_document``), whose refusal names the integer as the client wrote it. Only after a refusal
    (not one for nesting, which the exact parse could not even read): a search of every body for such
    an integer would cost four times orjson's parse of a small request."""
    try:
        return decode(document)
    except LimitExceeded:
        raise
    except InvalidInput:
        exact = exact_document(body)
        if exact is None:
            raise
        try:
            decode(exact)
        except InvalidInput as named:
            raise named from None
        raise


def exact_document(body: bytes | bytearray | memoryview) -> dict[str, Any] | None:
    """``body`` (which orjson read as an object) with its integers beyond 64 bits as Python ints, not
    as the floats orjson makes of them; None when it has none, or when Python's parser cannot read it
    (an integer of over 4,300 digits, nesting past its recursion limit): then orjson's reading stands."""
    if not _LONG_DIGITS.search(body):
        return None
    try:
        document = json.loads(bytes(body))
    except (ValueError, RecursionError):
        return None
    return document if isinstance(document, dict) else None


# What stands for a scanned array in the rest of the body: a string no client can guess, so that none
# sends one in the place of an array to get another's data.
_SCANNED = f"edgeinfer-scanned-{secrets.token_hex(16)}-"
_EXACT_IN_FLOAT32 = 2**24 - 1  # integers up to this magnitude convert to float32 and back unchanged


def _decode_scanned(body: bytes, scanned: NumericArrays, max_depth: int) -> InferRequest | None:
    """The request, its scanned arrays standing in for the inputs' ``data`` they are, or None when they
    are anything else (in another field, not what ``_scanned_tensor`` takes, or not the input's size):
    the body then goes the other paths, which say what is wrong if anything is."""
    pieces: list[bytes] = []
    position = 0
    for index, (start, end) in enumerate(zip(scanned.starts, scanned.ends, strict=True)):
        pieces += (body[position:start], b'"', f"{_SCANNED}{index}".encode(), b'"')
        position = end
    pieces.append(body[position:])
    rest = b"".join(pieces)
    try:
        document = orjson.loads(rest)
    except orjson.JSONDecodeError:
        return None  # the other paths give the message about the whole body
    raw_inputs = document.get("inputs") if isinstance(document, dict) else None
    if not isinstance(raw_inputs, list):
        return None
    names = [raw.get("name") for raw in raw_inputs if isinstance(raw, dict)]
    if len(set(map(repr, names))) != len(names):
        return None  # a name twice: the other paths say which comes first, the same way
    arrays: dict[str, np.ndarray] = {}
    for raw in raw_inputs:
        data = raw.get("data") if isinstance(raw, dict) else None
        if not isinstance(data, str) or not data.startswith(_SCANNED):
            continue
        index = int(data[len(_SCANNED) :])
        values = _scanned_tensor(raw.get("datatype"), scanned.values[index], scanned.integers[index])
        name, shape = raw.get("name"), raw.get("shape")
        if values is None or not isinstance(name, str):
            return None
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            return None
        if math.prod(shape) != values.size:
            return None
        arrays[name] = values.reshape(shape)
        del raw["data"]
    if len(arrays) != len(scanned.values):
        return None  # an array somewhere else (or a placeholder twice): decoded the ordinary way
    depth_limit = max_depth if may_nest_deeper(rest, max_depth) else None
    try:
        return decode_request_object(document, arrays, depth_limit)
    except InvalidInput:
        if _LONG_DIGITS.search(rest):
            return None  # an integer beyond 64 bits: the other paths name it (``exact_document``)
        raise


def _scanned_tensor(datatype: Any, values: np.ndarray, integers: bool) -> np.ndarray | None:
    """A scanned array as ``datatype``, if it is exactly what the other paths make of it: FP32 always
    (the scan rounds as they do); an integer type when every number was written as an integer of
    magnitude below 2^24 (float32 holds those exactly) within the type's range. None otherwise."""
    if datatype == "FP32":
        return values
    dtype = V2_TO_NUMPY.get(datatype) if isinstance(datatype, str) else None
    if dtype is None or dtype.kind not in "iu" or not integers:
        return None
    limits = np.iinfo(dtype)
    low, high = max(limits.min, -_EXACT_IN_FLOAT32), min(limits.max, _EXACT_IN_FLOAT32)
    if values.min() < low or values.max() > high:
        return None
    return values.astype(dtype)


def decode_with_simdjson(body: bytes, max_depth: int = MAX_DEPTH) -> InferRequest:
    """The large-body decoder: numeric tensors become arrays without Python floats, the rest plain
    values. A body simdjson reads otherwise than orjson goes to ``decode_with_orjson`` whole: one it
    refuses (JSON allows integers beyond 64 bits, which simdjson cannot hold, and its messages are
    worded its own way), or an object with a key it cannot look up (``_unusual_keys``)."""
    simdjson = _simdjson()
    assert simdjson is not None
    try:
        document = simdjson.Parser().parse(body)  # a parser per body: its proxies never outlive it
    except (ValueError, RuntimeError):  # invalid JSON, or BIGINT_ERROR for an integer beyond 64 bits
        return decode_with_orjson(body, max_depth)
    if not isinstance(document, simdjson.Object):
        raise InvalidInput(f"request body must be a JSON object, not {json_type(_plain(document))}")
    arrays: dict[str, np.ndarray] = {}
    plain: dict[str, Any] = {}
    try:
        if _unusual_keys(document):
            raise _Unusual
        for key in document.keys():  # noqa: SIM118 (items() would convert every value to Python)
            value = document[key]
            if key == "inputs" and isinstance(value, simdjson.Array):
                plain[key] = [_input_without_data(raw, arrays) for raw in value]
            else:
                plain[key] = _plain(value)
    except _Unusual:
        return decode_request_object(document.as_dict(), {}, max_depth)  # the ordinary path
    return decode_request_object(plain, arrays, max_depth)


class _Unusual(Exception):
    """An object of the body has keys a lookup would get wrong (``_unusual_keys``)."""


def _unusual_keys(value: Any) -> bool:
    """Whether a simdjson object has a key that looking it up would get wrong: one with a NUL character
    (its C++ side ends the key there) or one given twice (a lookup finds the first, while JSON parsers,
    orjson and simdjson's own ``as_dict`` among them, keep the last). No V2 field has either; such a
    body is converted whole instead, and then fails or not as the ordinary decoder has it."""
    keys = list(value.keys())
    return any("\x00" in key for key in keys) or len(set(keys)) != len(keys)


def _plain(value: Any) -> Any:
    simdjson = _simdjson()
    assert simdjson is not None
    if isinstance(value, simdjson.Object):
        return value.as_dict()
    if isinstance(value, simdjson.Array):
        return value.as_list()
    return value


def _input_without_data(raw: Any, arrays: dict[str, np.ndarray]) -> Any:
    """An input's header as plain values; its data decoded into ``arrays`` when it is a flat array of
    numbers that fits its shape and datatype, else left in the header for the ordinary path."""
    simdjson = _simdjson()
    assert simdjson is not None
    if not isinstance(raw, simdjson.Object):
        return _plain(raw)
    if _unusual_keys(raw):
        raise _Unusual
    header = {key: _plain(raw[key]) for key in raw.keys() if key != "data"}  # noqa: SIM118
    if "data" not in raw:
        return header
    data = raw["data"]
    array = _typed_array(header, data)
    if array is None:
        header["data"] = _plain(data)
    else:
        arrays[header["name"]] = array
    return header


def _typed_array(header: dict[str, Any], data: Any) -> np.ndarray | None:
    simdjson = _simdjson()
    assert simdjson is not None
    name, datatype, shape = header.get("name"), header.get("datatype"), header.get("shape")
    kind = _BUFFER_KIND.get(datatype) if isinstance(datatype, str) else None
    if kind is None or not isinstance(name, str) or not isinstance(data, simdjson.Array) or not len(data):
        return None
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        return None
    if len(data) != math.prod(shape) or isinstance(data[0], (simdjson.Array, simdjson.Object)):
        return None  # nested, ragged or miscounted: the ordinary path says what is wrong
    try:
        values = np.frombuffer(data.as_buffer(of_type=kind[0]), dtype=kind[1])
    except (TypeError, ValueError):  # a string, a boolean, null or a number out of range in there
        return None
    dtype = numpy_dtype(str(datatype))
    if dtype.kind in "iu":
        limits = np.iinfo(dtype)
        if values.min() < limits.min or values.max() > limits.max:
            return None
    with np.errstate(over="ignore"):  # as numpy's conversion of Python floats: out of range is inf
        return values.astype(dtype).reshape(shape)


def decode_request_object(
    document: dict[str, Any], binary_inputs: dict[str, np.ndarray] | None, max_depth: int | None = MAX_DEPTH
) -> InferRequest:
    """Build an InferRequest from a parsed body; ``binary_inputs`` holds tensors already decoded.
    ``max_depth`` None: the body cannot be nested that deep (``may_nest_deeper``), nothing to check."""
    if max_depth is not None:
        check_depth(document, max_depth)
    if not _REQUEST_FIELDS.issuperset(document):
        _ignore_fields(document.keys() - _REQUEST_FIELDS, "inference request")
    request_id = document.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInput(f"'id' must be a string, not {json_type(request_id)}")
    parameters = _parameters(document.get("parameters"), "request 'parameters'")

    raw_inputs = document.get("inputs", [])  # a model may take no inputs (parameters only)
    if not isinstance(raw_inputs, list):
        raise InvalidInput(f"'inputs' must be a list of tensors, not {json_type(raw_inputs)}")
    inputs: dict[str, np.ndarray] = {}
    input_parameters: dict[str, Parameters] = {}
    for position, raw in enumerate(raw_inputs):
        name, datatype, shape, params = decode_tensor_header(raw, position)
        if binary_inputs is not None and name in binary_inputs:
            array = binary_inputs[name]
        elif "data" in raw:
            array = json_to_array(name, datatype, shape, raw["data"])
        else:
            raise InvalidInput(f"input {name!r} has no 'data'")
        if name in inputs:
            raise InvalidInput(f"input {name!r} appears more than once")
        inputs[name] = array
        if params:
            input_parameters[name] = params

    raw_outputs = document.get("outputs")
    outputs = None if raw_outputs is None else _decode_requested_outputs(raw_outputs)
    return InferRequest(
        inputs=inputs,
        id=request_id,
        parameters=parameters,
        outputs=outputs,
        input_parameters=input_parameters,
    )


def decode_tensor_header(raw: Any, position: int) -> tuple[str, str, tuple[int, ...], Parameters]:
    """Check the name, datatype, shape and parameters of ``inputs[position]`` (shared by JSON and binary
    inputs). Every request passes here: its messages are built only when they are raised."""
    if not isinstance(raw, dict):
        raise InvalidInput(f"inputs[{position}] must be a JSON object, not {json_type(raw)}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"inputs[{position}] needs a 'name' string")
    datatype = raw.get("datatype")
    if not isinstance(datatype, str):
        raise InvalidInput(f"input {name!r} needs a 'datatype' string (e.g. \"FP32\")")
    if datatype not in V2_TO_NUMPY:
        numpy_dtype(datatype)  # raises a clear error for unknown names
    shape = raw.get("shape")
    if not isinstance(shape, list):
        _bad_shape(name, shape)
    for dim in shape:  # every dimension a non-negative integer (JSON's ``true`` is not: its type is bool)
        if type(dim) is not int or dim < 0:
            _bad_shape(name, shape)
    dims = tuple(shape)
    check_shape(name, dims)
    parameters = raw.get("parameters")  # (the message is built only for parameters that are there)
    parameters = {} if parameters is None else _parameters(parameters, f"input {name!r} 'parameters'")
    if not _TENSOR_FIELDS.issuperset(raw):
        _ignore_fields(raw.keys() - _TENSOR_FIELDS, "input tensor")
    return name, datatype, dims, parameters


def _bad_shape(name: str, shape: Any) -> NoReturn:
    raise InvalidInput(f"input {name!r}: 'shape' must be a list of non-negative integers, got {shape!r}")


def _ignore_fields(names: set[str], where: str) -> None:
    """Fields the protocol does not define are ignored, as its extensibility expects: KServe's own client
    sends ``model_name`` in every body. Each name is logged once, at debug level."""
    new = names - _ignored_seen
    if new and len(_ignored_seen) < _IGNORED_SEEN_MAX:
        _ignored_seen.update(new)
        log.debug("ignoring field(s) the protocol does not define in an %s: %s", where, sorted(new))


def _decode_requested_outputs(raw: Any) -> list[RequestedOutput] | None:
    if raw is None or raw == []:  # an empty list asks for nothing in particular: every output, as gRPC
        return None
    if not isinstance(raw, list):
        raise InvalidInput(f"'outputs' must be a list, not {json_type(raw)}")
    requested = []
    for position, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidInput(f"outputs[{position}] must be an object with a 'name' string")
        requested.append(
            RequestedOutput(item["name"], _parameters(item.get("parameters"), f"output {item['name']!r}"))
        )
    return requested


def _parameters(raw: Any, where: str) -> Parameters:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidInput(f"{where} must be a JSON object, not {json_type(raw)}")
    return raw


def encode_response(response: InferResponse) -> bytes:
    """Encode a response with every output as JSON data."""
    return dumps(response_document(response, binary_sizes={}))


def response_document(response: InferResponse, binary_sizes: dict[str, int]) -> dict[str, Any]:
    """The JSON part of a response; outputs named in ``binary_sizes`` carry their size, not data."""
    outputs = []
    for name, array in response.outputs.items():
        output: dict[str, Any] = {
            "name": name,
            "datatype": v2_datatype(array.dtype),
            "shape": list(array.shape),
        }
        parameters = dict(response.output_parameters.get(name, ()))
        size = binary_sizes.get(name)
        if size is not None:
            parameters["binary_data_size"] = size
        else:
            output["data"] = array_to_json(name, array)
        if parameters:
            output["parameters"] = parameters
        outputs.append(output)
    document: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": response.model_version,
        "outputs": outputs,
    }
    if response.id is not None:
        document["id"] = response.id
    if response.parameters:
        document["parameters"] = response.parameters
    return document
