"""JSON tensor data and numpy arrays: a V2 input's ``data`` (flat or nested, checked against its
datatype and shape) as an array, and an output array as JSON. One C-level call per tensor where the
data allows it; the checks and messages are the same on every path (docs/design/json-scan.md)."""

from __future__ import annotations

import math
from array import array as c_array
from typing import Any, Literal, TypeAlias

import numpy as np

from edgeinfer.errors import InvalidInput
from edgeinfer.protocol.datatypes import numpy_dtype, outside_range


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
    Python code per tensor, most of what decoding a small body costs (docs/design/batching-experiments.md,
    "Counted in instructions")."""
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
            raise TypeError(f"BYTES elements must be strings in JSON, found {json_type(element)}")
    return out


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


def json_type(value: Any) -> str:
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
