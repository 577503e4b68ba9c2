"""Transport-neutral request, response and metadata types.

Every transport decodes into these and encodes from them; the core (``service.py``) sees nothing else.
Tensors are numpy arrays: BYTES tensors are object arrays of ``bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

Parameters = dict[str, Any]


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One model input or output as the model declares it; -1 marks a dynamic dimension.

    ``content_type`` tags what the elements mean beyond their datatype, as MLServer's clients read it
    from the tensor's ``parameters``: ``"str"`` for BYTES elements that are UTF-8 text (JSON documents
    included). It appears in the model metadata and on every response output.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    content_type: str | None = None

    # pickled to and from a Python model's processes (runners/process.py); compiled (setup.py), a frozen
    # dataclass cannot be unpickled by setting its fields
    def __reduce__(self) -> tuple[type[TensorSpec], tuple[str, str, tuple[int, ...], str | None]]:
        return (TensorSpec, (self.name, self.datatype, self.shape, self.content_type))

    def as_metadata(self) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}
        if self.content_type is not None:
            metadata["parameters"] = {"content_type": self.content_type}
        return metadata


class RequestedOutput:
    """An output the client asked for, with its per-output parameters (e.g. ``binary_data``)."""

    __slots__ = ("name", "parameters")

    def __init__(self, name: str, parameters: Parameters | None = None) -> None:
        self.name = name
        self.parameters: Parameters = {} if parameters is None else parameters

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RequestedOutput):
            return NotImplemented
        return self.name == other.name and self.parameters == other.parameters

    def __repr__(self) -> str:
        return f"RequestedOutput(name={self.name!r}, parameters={self.parameters!r})"

    def __reduce__(self) -> tuple[type[RequestedOutput], tuple[str, Parameters]]:  # compiled: none of its own
        return (RequestedOutput, (self.name, self.parameters))


class InferRequest:
    """A decoded inference request. ``outputs`` is None when the client asked for every output.

    A plain class, not a dataclass, because every request makes one and the module is compiled
    (setup.py): mypyc keeps a dataclass's generated ``__init__``, which runs as Python. So does
    ``InferResponse``."""

    __slots__ = ("id", "input_parameters", "inputs", "outputs", "parameters")

    def __init__(
        self,
        inputs: dict[str, np.ndarray],
        id: str | None = None,
        parameters: Parameters | None = None,
        outputs: list[RequestedOutput] | None = None,
        input_parameters: dict[str, Parameters] | None = None,
    ) -> None:
        self.inputs = inputs
        self.id = id
        self.parameters: Parameters = {} if parameters is None else parameters
        self.outputs = outputs
        self.input_parameters: dict[str, Parameters] = {} if input_parameters is None else input_parameters

    def __reduce__(self) -> tuple[type[InferRequest], tuple[Any, ...]]:  # compiled: none of its own
        return (InferRequest, (self.inputs, self.id, self.parameters, self.outputs, self.input_parameters))

    def __repr__(self) -> str:
        return (
            f"InferRequest(inputs={list(self.inputs)}, id={self.id!r}, parameters={self.parameters!r}, "
            f"outputs={self.outputs!r})"
        )


class InferResponse:
    """The answer to one request: only the outputs it asked for, in model order.

    ``output_parameters`` are sent with each named output (e.g. its ``content_type``)."""

    __slots__ = (
        "id",
        "model_name",
        "model_version",
        "output_parameters",
        "outputs",
        "parameters",
        "requested",
    )

    def __init__(
        self,
        model_name: str,
        model_version: str,
        outputs: dict[str, np.ndarray],
        id: str | None = None,
        parameters: Parameters | None = None,
        requested: list[RequestedOutput] | None = None,
        output_parameters: dict[str, Parameters] | None = None,
    ) -> None:
        self.model_name = model_name
        self.model_version = model_version
        self.outputs = outputs
        self.id = id
        self.parameters: Parameters = {} if parameters is None else parameters
        self.requested = requested
        self.output_parameters: dict[str, Parameters] = {} if output_parameters is None else output_parameters

    def __reduce__(self) -> tuple[type[InferResponse], tuple[Any, ...]]:  # compiled: none of its own
        return (
            InferResponse,
            (
                self.model_name,
                self.model_version,
                self.outputs,
                self.id,
                self.parameters,
                self.requested,
                self.output_parameters,
            ),
        )

    def __repr__(self) -> str:
        return (
            f"InferResponse(model_name={self.model_name!r}, model_version={self.model_version!r}, "
            f"outputs={list(self.outputs)}, id={self.id!r}, parameters={self.parameters!r})"
        )
