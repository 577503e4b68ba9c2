"""The V2 tensor datatypes and their numpy equivalents.

BYTES tensors are numpy object arrays whose elements are ``bytes``; every other datatype maps to one
fixed-size numpy dtype. ONNX Runtime's type strings (``tensor(float)``) map onto the same names.
"""

from __future__ import annotations

import math

import numpy as np

from edgeinfer.errors import InvalidInput

MAX_DIMS = 32  # numpy 2 takes 64 and numpy 1 took 32; no model has more
_MAX_ELEMENTS = 2**58  # with 16-byte elements still below numpy's (and any machine's) limit

V2_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}

_NUMPY_TO_V2: dict[np.dtype, str] = {dtype: name for name, dtype in V2_TO_NUMPY.items()}

ONNX_TO_V2: dict[str, str] = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}


def numpy_dtype(datatype: str) -> np.dtype:
    """The numpy dtype for a V2 datatype name; unknown names are the client's error."""
    try:
        return V2_TO_NUMPY[datatype]
    except KeyError:
        known = ", ".join(V2_TO_NUMPY)
        raise InvalidInput(f"unknown datatype {datatype!r}; expected one of {known}") from None


def v2_datatype(dtype: np.dtype) -> str:
    """The V2 datatype name for a numpy dtype (``<U``/``S`` strings count as BYTES)."""
    name = _NUMPY_TO_V2.get(dtype)
    if name is not None:
        return name
    if dtype.kind in ("U", "S"):
        return "BYTES"
    raise TypeError(f"numpy dtype {dtype} has no Open Inference Protocol datatype")


def check_shape(name: str, shape: tuple[int, ...]) -> None:
    """A shape numpy can hold: at most ``MAX_DIMS`` dimensions, none negative, and (zero dimensions
    aside) a product it can address. A shape like [0, 2**62] describes no elements, but numpy still
    refuses it, so it is refused here with the client's error instead."""
    if len(shape) > MAX_DIMS:
        raise InvalidInput(
            f"input {name!r}: shape has {len(shape)} dimensions; at most {MAX_DIMS} are supported"
        )
    if shape and min(shape) < 0:
        raise InvalidInput(f"input {name!r}: shape {list(shape)} has a negative dimension")
    elements = math.prod(shape)  # at C speed: the common case ends here
    if elements > _MAX_ELEMENTS or (elements == 0 and math.prod(d for d in shape if d) > _MAX_ELEMENTS):
        raise InvalidInput(f"input {name!r}: shape {list(shape)} is too large for any tensor")


def outside_range(values: np.ndarray, dtype: np.dtype) -> str | None:
    """For an integer ``dtype``: ``"300 is outside [-128, 127]"`` naming the first of ``values`` it
    cannot hold, else None. ``values`` may be integers, floats (JSON's integers beyond 64 bits arrive
    as floats) or Python objects, of which only the numbers are looked at; anything else is left to
    the caller's check of the kind. One wording for every transport that carries integers."""
    limits = np.iinfo(dtype)
    flat = values.reshape(-1)
    if flat.dtype.kind == "O":
        for value in flat.tolist():
            if type(value) in (int, float) and not limits.min <= value <= limits.max:
                return _outside(value, limits)
        return None
    if flat.dtype.kind not in "iuf" or not flat.size:
        return None
    if flat.dtype.kind == "f":
        outside = (flat < limits.min) | (flat > limits.max)  # as doubles: 2**63 itself is outside int64
    else:
        outside = (flat < limits.min) if flat.dtype.kind == "i" else np.zeros(flat.shape, bool)
        outside |= flat > limits.max
    return _outside(flat[int(np.argmax(outside))].item(), limits) if outside.any() else None


def _outside(value: object, limits: np.iinfo) -> str:  # object: compiled, a float parameter rounds ints
    # an integral float is an integer beyond 64 bits as JSON wrote it (as its nearest double)
    shown = repr(int(value)) if isinstance(value, float) and value.is_integer() else repr(value)
    return f"{shown} is outside [{limits.min}, {limits.max}]"
