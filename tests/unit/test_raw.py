from __future__ import annotations

import numpy as np
import pytest

from edgeinfer.errors import InvalidInput
from edgeinfer.protocol.raw import array_to_raw, raw_to_array
from tests.support import NUMERIC_DTYPES


@pytest.mark.parametrize("name", list(NUMERIC_DTYPES))
def test_fixed_size_round_trip(name):
    array = (np.arange(6) % 2 if name == "BOOL" else np.arange(6)).astype(NUMERIC_DTYPES[name]).reshape(2, 3)
    decoded = raw_to_array("x", name, (2, 3), array_to_raw(array))
    np.testing.assert_array_equal(decoded, array)


def test_decoding_does_not_copy():
    buffer = bytearray(np.arange(4, dtype=np.float32).tobytes())
    array = raw_to_array("x", "FP32", (4,), memoryview(buffer))
    buffer[0:4] = np.float32(9).tobytes()
    assert array[0] == 9


def test_bytes_round_trip():
    array = np.array([b"", b"abc", "é".encode()], dtype=object)
    raw = array_to_raw(array)
    assert raw[:4] == b"\x00\x00\x00\x00"
    assert raw_to_array("s", "BYTES", (3,), raw).tolist() == array.tolist()


@pytest.mark.parametrize(
    ("datatype", "shape", "data", "words"),
    [
        ("FP32", (2,), b"\x00" * 7, "7 bytes of raw data, but shape [2] of FP32 needs 8 bytes"),
        ("INT64", (1,), b"", "0 bytes of raw data"),
        ("BYTES", (2,), b"\x04\x00\x00\x00abcd", "BYTES data ends after 1 of 2 elements"),
        ("BYTES", (1,), b"\x09\x00\x00\x00abc", "BYTES element 0 says 9 bytes but only 3 remain"),
        ("BYTES", (1,), b"\x01\x00\x00\x00ab", "1 bytes left over"),
    ],
)
def test_sizes_that_do_not_add_up(datatype, shape, data, words):
    with pytest.raises(InvalidInput) as caught:
        raw_to_array("t", datatype, shape, data)
    assert words in str(caught.value)
    assert "input 't'" in str(caught.value)


def test_a_huge_bytes_shape_is_refused_before_anything_is_allocated():
    """Found by the fuzzer: shape [2**40] with 4 bytes of data allocated 2**40 objects first."""
    with pytest.raises(InvalidInput, match=r"has 1099511627776 BYTES elements but the data has only 4 bytes"):
        raw_to_array("text", "BYTES", (2**40,), b"\x00\x00\x00\x00")
