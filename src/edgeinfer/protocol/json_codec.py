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
from array import array as c_array
from collections.abc import Callable
from types import ModuleType
from typing import Any, Literal, NoReturn, TypeAlias

import numpy as np
import orjson

from edgeinfer.errors import InvalidInput, LimitExceeded
from edgeinfer.protocol.datatypes import V2_TO_NUMPY, check_shape, numpy_dtype, outside_range, v2_datatype
from edgeinfer.protocol.json_scan import NumericArrays
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
        raise InvalidInput(f"{what} must be a JSON object, not {_json_type(value)}")
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


def may_nest_deeper(raw: bytes | bytearray | memoryview, limit: int) -> bool:
    """Whether ``raw`` has more opening brackets than ``limit``: if not, no nesting can exceed it and
    the walk is skipped (a C-speed count, a fifth of what walking a small request costs)."""
    data = raw if not isinstance(raw, memoryview) else raw.tobytes()
    return data.count(b"[") + data.count(b"{") > limit


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
        raise InvalidInput(f"request body must be a JSON object, not {_json_type(_plain(document))}")
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
        raise InvalidInput(f"'id' must be a string, not {_json_type(request_id)}")
    parameters = _parameters(document.get("parameters"), "request 'parameters'")

    raw_inputs = document.get("inputs", [])  # a model may take no inputs (parameters only)
    if not isinstance(raw_inputs, list):
        raise InvalidInput(f"'inputs' must be a list of tensors, not {_json_type(raw_inputs)}")
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


def check_depth(document: dict[str, Any], limit: int) -> None:
    """Refuse a document nested deeper than ``limit`` (orjson alone stops at 1024 levels).

    Everything but tensor data is walked (headers and parameters are small). Tensor data is followed
    down its first elements only: deeper nesting anywhere else in it fails the shape check later.
    """
    for key, value in document.items():
        if key == "inputs" and isinstance(value, list):
            for tensor in value:
                if isinstance(tensor, dict):
                    for field, item in tensor.items():
                        if field == "data":
                            if (depth := 3 + _first_depth(item)) > limit:
                                _too_deep(f"{depth} levels", limit)
                        elif _depth(item, limit - 3) + 3 > limit:
                            _too_deep(f"at least {limit + 1} levels", limit)
                elif _depth(tensor, limit - 2) + 2 > limit:
                    _too_deep(f"at least {limit + 1} levels", limit)
        elif _depth(value, limit - 1) + 1 > limit:
            _too_deep(f"at least {limit + 1} levels", limit)


def _depth(value: Any, budget: int) -> int:
    """Levels of containers in ``value`` (a scalar has 0), stopping once it is over ``budget``."""
    if isinstance(value, dict):
        items: Any = value.values()
    elif isinstance(value, list):
        items = value
    else:
        return 0
    if budget <= 0:
        return 1
    deepest = 0
    for item in items:
        if isinstance(item, (dict, list)):
            deepest = max(deepest, _depth(item, budget - 1))
            if deepest >= budget:
                break
    return 1 + deepest


def _first_depth(data: Any) -> int:
    depth = 0
    while isinstance(data, list):
        depth += 1
        data = data[0] if data else None
    return depth


def _too_deep(depth: str, limit: int) -> None:
    raise LimitExceeded(
        f"the JSON body is nested {depth} deep; the limit is {limit} (server.limits.max_json_depth)",
        "json_depth",
    )


def decode_tensor_header(raw: Any, position: int) -> tuple[str, str, tuple[int, ...], Parameters]:
    """Check the name, datatype, shape and parameters of ``inputs[position]`` (shared by JSON and binary
    inputs). Every request passes here: its messages are built only when they are raised."""
    if not isinstance(raw, dict):
        raise InvalidInput(f"inputs[{position}] must be a JSON object, not {_json_type(raw)}")
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


def json_to_array(name: str, datatype: str, shape: tuple[int, ...], data: Any) -> np.ndarray:
    """Turn JSON tensor data (flat or nested, row-major) into an array of ``shape``.

    The element count is checked against the shape before numpy allocates anything, so a huge declared
    shape with little data costs nothing.
    """
    expected = math.prod(shape)
    if not isinstance(data, list):
        data = [data]
    if data and isinstance(data[0], list):
        _check_nested_lengths(name, shape, data)
    elif len(data) != expected:
        raise InvalidInput(
            f"input {name!r}: shape {list(shape)} needs {expected} elements but 'data' has {len(data)}"
        )
    else:
        numbers = _flat_numbers(data, datatype)
        if numbers is not None:
            return numbers.reshape(shape)
    dtype = numpy_dtype(datatype)
    try:
        values = _bytes_array(data) if datatype == "BYTES" else _numbers(data, dtype, datatype)
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidInput(f"input {name!r}: data does not fit datatype {datatype}: {exc}") from None
    if values.size != expected:
        raise InvalidInput(
            f"input {name!r}: shape {list(shape)} needs {expected} elements but 'data' has {values.size}"
        )
    return values.reshape(shape)


_TypeCode: TypeAlias = Literal["f", "d", "b", "h", "i", "q", "B", "H", "I", "Q"]  # of array.array

# the datatypes taken in one call: array.array's typecode and the dtype (given positionally: by keyword
# it costs 0.5 us more). A typecode names a C type, whose size is the platform's: only those of the
# dtype's size are used (on Linux x86-64 and arm64, all of them).
_TYPECODES: dict[str, _TypeCode] = {
    "FP32": "f",
    "FP64": "d",
    "INT8": "b",
    "INT16": "h",
    "INT32": "i",
    "INT64": "q",
    "UINT8": "B",
    "UINT16": "H",
    "UINT32": "I",
    "UINT64": "Q",
}
_ONE_CALL: dict[str, tuple[_TypeCode, np.dtype]] = {
    datatype: (typecode, numpy_dtype(datatype))
    for datatype, typecode in _TYPECODES.items()
    if c_array(typecode).itemsize == numpy_dtype(datatype).itemsize
}


def _flat_numbers(data: list[Any], datatype: str) -> np.ndarray | None:
    """A flat list of JSON numbers as an array of a numeric datatype, converted in one C call
    (``array.array``). None for anything else, which ``_numbers`` then converts or refuses with its
    message: other datatypes (BOOL, FP16, BYTES), a first element that is a boolean (a list of
    booleans is not numbers), an element that is not a number, a fraction for an integer datatype, an
    integer outside the datatype's range.

    What ``array`` takes is what ``_numbers`` takes, converted alike: for floats each number as a C
    double, cast (a float beyond float32's range becomes inf); for integers each one must be a Python
    int within the C type's range (a float, even 2.0, raises ``TypeError``; a value outside,
    ``OverflowError``). Booleans after a number are ints to both.

    Why: the general path's kind check, range check and cast are three or four calls into numpy's
    Python code per tensor. For floats they took 22,400 of the 55,400 instructions that decoding
    `tiny`'s body (16 floats) cost (``valgrind --tool=callgrind``); with this the body takes 40,400, and
    6.8-8.8 us instead of 9.4-15.4 (``timeit``, three rounds alternating on a noisy host). For a
    request of BERT's three inputs of 128 integers, 232,900 instructions instead of 365,700, and 28-32
    us instead of 54-64 (docs/batching.md)."""
    taken = _ONE_CALL.get(datatype)
    if taken is None or not data or type(data[0]) is bool:
        return None
    typecode, dtype = taken
    try:
        return np.frombuffer(c_array(typecode, data), dtype)
    except (TypeError, OverflowError):  # not a number there, a fraction for integers, out of range
        return None


# The element kinds numpy finds in JSON values that each datatype kind accepts: JSON has one kind of
# number, so integers fit float tensors; nothing else converts (no "3" for 3, no null, no 2.5 for 2).
_ACCEPTED_KINDS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}
_KIND_NAMES = {"b": "booleans", "i": "integers", "u": "integers", "f": "fractional numbers", "U": "strings"}


def _numbers(data: list[Any], dtype: np.dtype, datatype: str) -> np.ndarray:
    values = np.array(data)  # numpy reads the kind of the values (and the nesting) in C
    found = values.dtype.kind
    if found in "fO" and dtype.kind == "u" and dtype.itemsize == 8:
        values = _uint64(data)  # integers beyond int64 next to small ones: numpy guessed float64
        found = values.dtype.kind
    elif found == "O" and dtype.kind == "f" and _all_numbers(values):
        values = values.astype(np.float64)  # integers beyond 64 bits (``exact_document``): as orjson's
        found = "f"
    if dtype.kind in "iu" and values.size and found in "iufO":
        limits = np.iinfo(dtype)  # before the kind: 1e20 is out of range, not a fraction
        if found == "O" or values.min() < limits.min or values.max() > limits.max:
            # named as the client wrote it, not as numpy's float of it (-1 beside 2**64 - 1)
            problem = outside_range(np.array(data, dtype=object), dtype) or outside_range(values, dtype)
            if problem:
                raise ValueError(problem)
    if values.size and found not in _ACCEPTED_KINDS[dtype.kind]:
        what = _KIND_NAMES.get(found, "nulls, objects or a mix of kinds")
        raise ValueError(f"the data holds {what}")
    if dtype.kind != "f":  # booleans, or integers within the type's range (above): nothing can overflow
        return values.astype(dtype, copy=False)
    with np.errstate(over="ignore"):  # a float beyond the type's range is inf, as in a cast anywhere
        return values.astype(dtype, copy=False)


def _all_numbers(values: np.ndarray) -> bool:
    """Numbers only (booleans count, as numpy counts them among floats); no strings, nulls or lists."""
    return all(type(value) in (int, float, bool) for value in values.reshape(-1).tolist())


def _uint64(data: list[Any]) -> np.ndarray:
    """UINT64 values numpy cannot type by itself: accepted only if every one is an integer within
    64 bits (else the objects, which the range and kind checks then name)."""
    values = np.array(data, dtype=object)
    if not all(type(value) is int and 0 <= value < 2**64 for value in values.reshape(-1).tolist()):
        return values
    return np.array(data, dtype=np.uint64)


def _check_nested_lengths(name: str, shape: tuple[int, ...], data: list[Any]) -> None:
    """Compare the nesting of ``data`` (along its first elements) with ``shape``; numpy checks the rest."""
    level: Any = data
    for depth, dim in enumerate(shape):
        if not isinstance(level, list):
            break
        if len(level) != dim:
            raise InvalidInput(
                f"input {name!r}: 'data' has {len(level)} elements at depth {depth} but shape "
                f"{list(shape)} says {dim}"
            )
        if not level:
            return
        level = level[0]
    if isinstance(level, list):
        raise InvalidInput(f"input {name!r}: 'data' is nested deeper than shape {list(shape)}")


def _bytes_array(data: list[Any]) -> np.ndarray:
    flat = np.array(data, dtype=object).reshape(-1)
    out = np.empty(flat.shape[0], dtype=object)
    for index, element in enumerate(flat):
        if isinstance(element, str):
            out[index] = element.encode("utf-8")
        else:
            raise TypeError(f"BYTES elements must be strings in JSON, found {_json_type(element)}")
    return out


def _decode_requested_outputs(raw: Any) -> list[RequestedOutput] | None:
    if raw is None or raw == []:  # an empty list asks for nothing in particular: every output, as gRPC
        return None
    if not isinstance(raw, list):
        raise InvalidInput(f"'outputs' must be a list, not {_json_type(raw)}")
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
        raise InvalidInput(f"{where} must be a JSON object, not {_json_type(raw)}")
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


def array_to_json(name: str, array: np.ndarray) -> Any:
    """Flat JSON data for an array: the array itself (orjson encodes it) or a list of strings."""
    if array.dtype == object or array.dtype.kind in ("S", "U"):
        return [_bytes_to_str(name, element) for element in array.reshape(-1)]
    return array.ravel()  # flat and contiguous (orjson encodes only those), a view when it can be


def _bytes_to_str(name: str, element: Any) -> str:
    if isinstance(element, bytes):
        try:
            return element.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput(
                f"output {name!r} holds bytes that are not UTF-8 text and cannot be sent as JSON; "
                "ask for it with the binary data extension"
            ) from None
    return str(element)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"
