"""Raw tensor bytes: the layout of gRPC ``raw_input_contents`` and of HTTP binary tensor data.

Fixed-size datatypes are the elements in row-major order, little-endian, with nothing between them;
BOOL is one byte per element. BYTES is each element as a 4-byte little-endian length followed by
its bytes. Decoding fixed-size data makes a numpy array over the received buffer (no copy); every size
is checked first and a mismatch names the tensor and both sizes.
"""

from __future__ import annotations

import math
import struct

import numpy as np

from edgeinfer.errors import InvalidInput
from edgeinfer.protocol.datatypes import numpy_dtype

_LENGTH = struct.Struct("<I")


def raw_to_array(name: str, datatype: str, shape: tuple[int, ...], data: bytes | memoryview) -> np.ndarray:
    count = math.prod(shape)
    if datatype == "BYTES":
        return _bytes_elements(name, shape, count, data)
    dtype = numpy_dtype(datatype).newbyteorder("<")
    expected = count * dtype.itemsize
    if len(data) != expected:
        raise InvalidInput(
            f"input {name!r}: {len(data)} bytes of raw data, but shape {list(shape)} of {datatype} needs "
            f"{expected} bytes ({count} elements x {dtype.itemsize})"
        )
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def _bytes_elements(name: str, shape: tuple[int, ...], count: int, data: bytes | memoryview) -> np.ndarray:
    view = memoryview(data)
    if count * _LENGTH.size > len(view):  # checked before allocating: a shape may promise billions
        raise InvalidInput(
            f"input {name!r}: shape {list(shape)} has {count} BYTES elements but the data has only "
            f"{len(view)} bytes; each element needs at least a 4-byte length"
        )
    out = np.empty(count, dtype=object)
    offset = 0
    for index in range(count):
        if offset + 4 > len(view):
            raise InvalidInput(
                f"input {name!r}: BYTES data ends after {index} of {count} elements (at byte {offset} "
                f"of {len(view)}); each element needs a 4-byte length first"
            )
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        if offset + length > len(view):
            raise InvalidInput(
                f"input {name!r}: BYTES element {index} says {length} bytes but only {len(view) - offset} "
                "remain"
            )
        out[index] = bytes(view[offset : offset + length])
        offset += length
    if offset != len(view):
        raise InvalidInput(
            f"input {name!r}: {len(view) - offset} bytes left over after the {count} BYTES elements of "
            f"shape {list(shape)}"
        )
    return out.reshape(shape)


def array_to_raw(array: np.ndarray) -> bytes:
    """The raw bytes of an output (BYTES as length-prefixed elements)."""
    if array.dtype == object or array.dtype.kind in ("S", "U"):
        parts = []
        for element in array.reshape(-1):
            value = element if isinstance(element, bytes) else str(element).encode("utf-8")
            parts.append(_LENGTH.pack(len(value)))
            parts.append(value)
        return b"".join(parts)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return np.ascontiguousarray(array).tobytes()
