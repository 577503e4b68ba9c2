from __future__ import annotations

import numpy as np
import pytest

from edgeinfer.errors import InvalidInput
from edgeinfer.protocol.datatypes import ONNX_TO_V2, V2_TO_NUMPY, check_shape, numpy_dtype, v2_datatype


@pytest.mark.parametrize("name", list(V2_TO_NUMPY))
def test_every_datatype_maps_to_numpy_and_back(name):
    assert v2_datatype(numpy_dtype(name)) == name


def test_numpy_strings_are_bytes():
    assert v2_datatype(np.array(["a"]).dtype) == "BYTES"
    assert v2_datatype(np.array([b"a"]).dtype) == "BYTES"


def test_unknown_datatype_is_a_client_error():
    with pytest.raises(InvalidInput, match="unknown datatype 'FLOAT32'"):
        numpy_dtype("FLOAT32")


def test_unsupported_numpy_dtype():
    with pytest.raises(TypeError, match="complex"):
        v2_datatype(np.dtype(np.complex64))


def test_onnx_types_cover_every_v2_datatype():
    assert set(ONNX_TO_V2.values()) == set(V2_TO_NUMPY)


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ((0, 2**62), "is too large for any tensor"),
        ((2**40, 2**40), "is too large for any tensor"),
        ((1,) * 33, "shape has 33 dimensions; at most 32"),
        ((2, -1), "has a negative dimension"),
    ],
)
def test_shapes_numpy_cannot_hold_are_the_clients_error(shape, message):
    """Found by the fuzzer: [0, 2**62] has no elements, and numpy's 'array is too big' was a 500."""
    with pytest.raises(InvalidInput, match=message):
        check_shape("x", shape)
    check_shape("x", (0, 2**40))
    check_shape("x", (1,) * 32)
