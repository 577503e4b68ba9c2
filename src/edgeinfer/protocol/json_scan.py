"""The long numeric arrays of a JSON body, parsed into float32 without holding the GIL.

Why: every Python JSON parser holds the GIL for the whole parse, and a JSON image (1.6 MB for
3x224x224 floats) takes milliseconds. On the event loop that is milliseconds in which no other request
is read, not even one the server would refuse at once; on a worker thread it is the same, because the
loop waits for the GIL. ``_jsonscan.c`` is plain C called through ctypes, which releases the GIL for the
call: run on a worker thread, it leaves the loop free (json_codec.py uses what it finds).

The C library is built with the package when a C compiler is there (setup.py; an optional extension).
Without it ``available()`` is False and bodies are decoded as before, on the loop.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MIN_COUNT = 256  # numbers in an array worth taking out; the rest of a body is parsed the ordinary way
MAX_ARRAYS = 64  # arrays taken out of one body at most (more: the body is decoded the ordinary way)


@dataclass(frozen=True, slots=True)
class NumericArrays:
    """What the scan found: per array the offset of its ``[``, the offset past its ``]``, its values, and
    whether every number in it was written as an integer (no fraction, no exponent)."""

    starts: list[int]
    ends: list[int]
    values: list[np.ndarray]
    integers: list[bool]


def _load() -> ctypes._NamedFuncPointer | None:
    here = Path(__file__).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = here / f"_jsonscan{suffix}"
        if path.exists():
            try:
                function = ctypes.CDLL(str(path)).edgeinfer_float32_arrays
            except (OSError, AttributeError):
                return None
            function.restype = ctypes.c_int64
            function.argtypes = [
                ctypes.c_char_p,
                ctypes.c_int64,
                ctypes.c_int64,
                ctypes.c_void_p,
                ctypes.c_int64,
                ctypes.c_void_p,
                ctypes.c_int64,
            ]
            return function
    return None


_FUNCTION = _load()


def available() -> bool:
    """Whether the C library was built (``setup.py``): without it nothing here is used."""
    return _FUNCTION is not None


def float32_arrays(body: bytes) -> NumericArrays | None:
    """The flat arrays of at least ``MIN_COUNT`` numbers in ``body`` (outside strings), each number as
    the float32 nearest to its nearest double (what numpy's cast of the parsed value gives); None when
    there are none, too many, or the library is not built. Holds the GIL only around the call."""
    function = _FUNCTION
    if function is None:
        return None
    values = np.empty(len(body) // 2 + 1, dtype=np.float32)  # n numbers need 2n - 1 characters
    spans = np.empty((MAX_ARRAYS, 5), dtype=np.int64)
    found = function(
        body, len(body), MIN_COUNT, values.ctypes.data, values.size, spans.ctypes.data, MAX_ARRAYS
    )
    if found <= 0:
        return None
    starts, ends, offsets, counts, integers = spans[:found].T.tolist()
    return NumericArrays(
        starts,
        ends,
        [values[offset : offset + count].copy() for offset, count in zip(offsets, counts, strict=True)],
        [bool(flag) for flag in integers],
    )
