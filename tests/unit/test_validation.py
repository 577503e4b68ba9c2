"""The request size limits (server.limits) on decoded requests, whatever their transport."""

from __future__ import annotations

import numpy as np
import pytest

from edgeinfer.errors import TooLarge
from edgeinfer.protocol.types import InferRequest
from edgeinfer.validation import RequestLimits, check_rows, check_sizes

LIMITS = RequestLimits(max_tensor_elements=100, max_rows=4, max_bytes_element=8)


def bytes_tensor(*elements: bytes) -> np.ndarray:
    array = np.empty(len(elements), dtype=object)
    array[:] = list(elements)
    return array


@pytest.mark.parametrize(
    ("inputs", "limit"),
    [
        ({"a": np.zeros((10, 10), np.float32)}, None),
        ({"a": np.zeros((10, 10), np.float32), "b": np.zeros(1, np.int8)}, "tensor_elements"),
        ({"s": bytes_tensor(b"12345678", b"")}, None),
        ({"s": bytes_tensor(b"", b"123456789")}, "bytes_element"),
        ({"s": bytes_tensor()}, None),
    ],
)
def test_sizes(inputs: dict[str, np.ndarray], limit: str | None):
    request = InferRequest(inputs=inputs)
    if limit is None:
        check_sizes(request, LIMITS)
        return
    with pytest.raises(TooLarge) as raised:
        check_sizes(request, LIMITS)
    assert raised.value.limit == limit


def test_rows():
    check_rows(4, LIMITS)
    with pytest.raises(TooLarge, match="the request has 5 rows") as raised:
        check_rows(5, LIMITS)
    assert raised.value.limit == "rows"
