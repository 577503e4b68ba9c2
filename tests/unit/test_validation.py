"""The request size limits (server.limits) on decoded requests, whatever their transport, and the
messages for inputs and outputs a model does not have."""

from __future__ import annotations

import numpy as np
import pytest

from edgeinfer.errors import InvalidInput, TooLarge
from edgeinfer.protocol.types import InferRequest, RequestedOutput, TensorSpec
from edgeinfer.validation import RequestLimits, check_request, check_rows, check_sizes

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


DIGITS = [TensorSpec("float_input", "FP32", (-1, 64))]
OUTPUTS = [TensorSpec("label", "INT64", (-1,)), TensorSpec("probabilities", "FP32", (-1, 10))]


@pytest.mark.parametrize(
    ("given", "outputs", "message"),
    [
        (  # a typo: the unknown name, the expected one, and the close match
            {"float_inptu": np.zeros((1, 64), np.float32)},
            None,
            "unknown input(s) 'float_inptu' (did you mean 'float_input'?); model 'digits' needs input(s) "
            "'float_input'; expected inputs: 'float_input' (FP32 [-1, 64])",
        ),
        (  # nothing close: both names, no guess
            {"pixels": np.zeros((1, 64), np.float32)},
            None,
            "unknown input(s) 'pixels'; model 'digits' needs input(s) 'float_input'",
        ),
        ({}, None, "model 'digits' needs input(s) 'float_input'; expected inputs: 'float_input' (FP32 [-1,"),
        (
            {"float_input": np.zeros((1, 64), np.float32), "extra": np.zeros(1, np.int8)},
            None,
            "unknown input(s) 'extra'; model 'digits' has inputs: 'float_input' (FP32 [-1, 64])",
        ),
        (
            {"float_input": np.zeros((1, 64), np.float32)},
            ["probabilites"],
            "model 'digits' has no output(s) 'probabilites' (did you mean 'probabilities'?); its outputs "
            "are: 'label', 'probabilities'",
        ),
    ],
)
def test_a_wrong_name_is_named_with_what_the_model_expects(given, outputs, message):
    requested = None if outputs is None else [RequestedOutput(name, {}) for name in outputs]
    with pytest.raises(InvalidInput) as raised:
        check_request("digits", DIGITS, OUTPUTS, True, InferRequest(inputs=given, outputs=requested))
    assert str(raised.value).startswith(message), str(raised.value)
