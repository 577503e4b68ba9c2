"""Checking a decoded request against the model it is sent to, before it is queued.

Pure functions: everything a request can get wrong about a model is found here, with a message that
names the input and says what the model expects, so the batcher only ever sees requests that can run.
"""

from __future__ import annotations

import difflib
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeinfer.errors import InvalidInput, TooLarge
from edgeinfer.protocol.datatypes import v2_datatype
from edgeinfer.protocol.types import InferRequest, TensorSpec


class Checked:
    """What the batcher needs to know about a valid request."""

    __slots__ = ("group", "output_names", "rows")

    def __init__(self, rows: int, group: Hashable, output_names: frozenset[str] | None) -> None:
        self.rows = rows
        self.group = group
        self.output_names = output_names


_OBJECT = np.dtype(object)  # BYTES tensors' dtype (numpy keeps one instance of it)


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """The size limits of ``server.limits`` that concern a decoded request (whatever its transport)."""

    max_tensor_elements: int = 64 * 1024 * 1024
    max_rows: int = 4096
    max_bytes_element: int = 16 * 1024 * 1024


def check_sizes(request: InferRequest, limits: RequestLimits) -> None:
    """Elements of all inputs together, and the longest BYTES element, against ``limits``."""
    elements = 0
    for name, array in request.inputs.items():
        elements += array.size
        if array.dtype is _OBJECT and array.size:
            longest = max(map(len, array.ravel()))  # BYTES: bytes objects, measured at C speed
            if longest > limits.max_bytes_element:
                raise TooLarge(
                    f"input {name!r} has a BYTES element of {longest} bytes; the limit is "
                    f"{limits.max_bytes_element} (server.limits.max_bytes_element)",
                    "bytes_element",
                )
    if elements > limits.max_tensor_elements:
        raise TooLarge(
            f"the request's inputs have {elements} elements in all; the limit is "
            f"{limits.max_tensor_elements} (server.limits.max_tensor_elements)",
            "tensor_elements",
        )


def check_rows(rows: int, limits: RequestLimits) -> None:
    if rows > limits.max_rows:
        raise TooLarge(
            f"the request has {rows} rows (first dimension); the limit is {limits.max_rows} "
            "(server.limits.max_rows)",
            "rows",
        )


def check_request(
    model: str,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    batching: bool,
    request: InferRequest,
) -> Checked:
    given = request.inputs
    if len(given) != len(inputs):
        _missing_or_extra(model, inputs, request)
    rows = -1
    for spec in inputs:
        name = spec.name
        array = given.get(name)
        if array is None:
            _missing_or_extra(model, inputs, request)
            raise AssertionError  # unreachable: the line above raised
        datatype = v2_datatype(array.dtype)
        if datatype != spec.datatype:
            raise InvalidInput(
                f"input {name!r} has datatype {datatype} but model {model!r} expects {spec.datatype}"
            )
        shape = array.shape
        if not _shape_fits(shape, spec.shape):
            raise InvalidInput(
                f"input {name!r} has shape {list(shape)} but model {model!r} expects "
                f"{list(spec.shape)} (-1 is any size)"
            )
        if batching:
            if rows < 0:
                rows = shape[0]
            elif shape[0] != rows:
                detail = ", ".join(f"{other} has {array.shape[0]}" for other, array in given.items())
                raise InvalidInput(f"all inputs must have the same batch size (first dimension): {detail}")
    if rows < 0:  # not batching, or a model that takes no inputs: one request is one row
        rows = 1
    elif rows < 1:
        raise InvalidInput("the batch size (first dimension of every input) must be at least 1")

    output_names = None
    if request.outputs is not None:
        known = {spec.name for spec in outputs}
        unknown = [wanted.name for wanted in request.outputs if wanted.name not in known]
        if unknown:
            raise InvalidInput(
                f"model {model!r} has no output(s) {_names(unknown)}"
                f"{_did_you_mean(unknown, [spec.name for spec in outputs])}; its outputs are: "
                f"{_names([spec.name for spec in outputs])}"
            )
        output_names = frozenset(wanted.name for wanted in request.outputs)

    return Checked(rows=rows, group=batch_group(request), output_names=output_names)


def _missing_or_extra(model: str, inputs: Sequence[TensorSpec], request: InferRequest) -> None:
    """Say which inputs the request lacks and which it has that the model does not: a misspelt name is
    both, and naming the two (with the closest expected name) is what tells the client its typo."""
    expected = [spec.name for spec in inputs]
    missing = [name for name in expected if name not in request.inputs]
    extra = [name for name in request.inputs if name not in expected]
    unknown = f"unknown input(s) {_names(extra)}{_did_you_mean(extra, missing)}" if extra else ""
    if missing:
        needs = f"model {model!r} needs input(s) {_names(missing)}; expected inputs: {_describe(inputs)}"
        raise InvalidInput(f"{unknown}; {needs}" if unknown else needs)
    raise InvalidInput(f"{unknown}; model {model!r} has inputs: {_describe(inputs)}")


def _did_you_mean(given: Sequence[str], known: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the first given name with a close match among ``known``, else ''."""
    for name in given:
        close = difflib.get_close_matches(name, known, n=1)
        if close:
            return f" (did you mean {close[0]!r}?)"
    return ""


def batch_group(request: InferRequest) -> Hashable:
    """Requests with equal groups have equal non-batch shapes and datatypes, so they can be merged."""
    inputs = request.inputs
    if len(inputs) == 1:
        for name, array in inputs.items():
            return ((name, array.dtype.str, array.shape[1:]),)
    return tuple((name, array.dtype.str, array.shape[1:]) for name, array in sorted(inputs.items()))


def parse_priority(parameters: dict[str, Any], default: int) -> int:
    value = parameters.get("priority")
    if value is None or value == 0:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidInput(f"parameter 'priority' must be a non-negative integer, got {value!r}")
    return value


def parse_stream(parameters: dict[str, Any], own: str | None = None) -> str | None:
    """The stream a request belongs to when it asks to replace its stream's queued frame
    (``stream_id`` and ``drop_stale: true``; ``own``: the transport's stream, when the body names
    none); None otherwise."""
    drop = parameters.get("drop_stale")
    if drop is None or drop is False:
        return None
    if drop is not True:
        raise InvalidInput(f"parameter 'drop_stale' must be true or false, got {drop!r}")
    stream = parameters.get("stream_id")
    if stream is None:
        stream = own
    if isinstance(stream, bool) or not isinstance(stream, (str, int)) or stream == "":
        raise InvalidInput(
            f"parameter 'drop_stale' needs a 'stream_id' (a string or an integer), got {stream!r}"
        )
    return str(stream)


def parse_timeout_s(parameters: dict[str, Any]) -> float | None:
    """Triton clients send ``timeout`` in microseconds; 0 or absent means no timeout."""
    value = parameters.get("timeout")
    if value is None or value == 0:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
        raise InvalidInput(
            f"parameter 'timeout' must be a non-negative number of microseconds, got {value!r}"
        )
    return value / 1_000_000


def _shape_fits(shape: tuple[int, ...], expected: tuple[int, ...]) -> bool:
    if len(shape) != len(expected):
        return False
    for got, want in zip(shape, expected):  # noqa: B905, SIM110 (lengths checked above; a loop beats all() here)
        if want != got and want != -1:
            return False
    return True


def _names(names: Sequence[str]) -> str:
    return ", ".join(repr(name) for name in names)


def _describe(specs: Sequence[TensorSpec]) -> str:
    return ", ".join(f"{spec.name!r} ({spec.datatype} {list(spec.shape)})" for spec in specs)
