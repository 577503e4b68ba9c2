"""Python models: a class with ``load`` and ``predict`` served like an ONNX model.

    class Classifier(edgeinfer.Model):
        inputs = [edgeinfer.TensorSpec("x", "FP32", (-1, 4))]
        outputs = [edgeinfer.TensorSpec("label", "INT64", (-1,))]

        def load(self):                      # once, before the model serves
            self.weights = ...

        def predict(self, requests):         # one batch: a list of Request, sync or async
            return [{"label": ...} for request in requests]

``predict`` gets every request of a batch with its own inputs and parameters and returns one response
(a dict of output arrays) per request, or a ``ModelError`` in a request's place to fail that request
alone; raising fails the whole batch. Models that prefer one concatenated batch override
``predict_batch(inputs) -> outputs`` instead, and rows are split back as for ONNX models.

Threading: a sync ``predict`` runs in the model's worker threads, so blocking I/O in it does not stall
the event loop or other models (the GIL is held while it runs Python code, so CPU-heavy Python work
competes with request decoding; numpy and most native libraries release it). An ``async def predict``
runs on the event loop and must not block.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from edgeinfer.config import ModelConfig
from edgeinfer.errors import ConfigError, InferenceFailed, InvalidInput, ModelLoadError
from edgeinfer.protocol.types import Parameters, TensorSpec

Tensors = dict[str, np.ndarray]


class ModelError(InvalidInput):
    """Return this in place of a response to fail that request alone (the client gets a 400)."""


@dataclass
class Request:
    """One request of a batch, as ``predict`` sees it."""

    inputs: Tensors
    parameters: Parameters = field(default_factory=dict)


class Model:
    """Base class of Python models. Declare ``inputs`` and ``outputs``; implement ``predict`` (or
    ``predict_batch``); ``parameters`` from the config are passed to the constructor."""

    inputs: ClassVar[Sequence[TensorSpec]] = ()
    outputs: ClassVar[Sequence[TensorSpec]] = ()

    def __init__(self, **parameters: Any) -> None:
        self.parameters = parameters

    def load(self) -> None:
        """Prepare the model (read weights, open files). Called once, in a worker thread."""

    def predict(self, requests: list[Request]) -> list[Tensors | ModelError]:
        """One response per request. The default concatenates the batch for ``predict_batch``."""
        raise NotImplementedError

    def predict_batch(self, inputs: Tensors) -> Tensors:
        """Outputs for the concatenated inputs of a batch; first dimensions must match the rows."""
        raise NotImplementedError


def _overrides(model: Model, method: str) -> bool:
    return getattr(type(model), method) is not getattr(Model, method)


class PythonBackend:
    """Adapts a ``Model`` to the Backend protocol (and the per-request path of the batcher)."""

    platform = "python"
    execution_provider = "python"

    def __init__(self, model: Model) -> None:
        self.model = model
        self.inputs = tuple(model.inputs)
        self.outputs = tuple(model.outputs)
        if not self.inputs or not self.outputs:
            raise ModelLoadError(
                f"{type(model).__name__} must declare its inputs and outputs (TensorSpec lists)"
            )
        self.per_request = _overrides(model, "predict")
        if not self.per_request and not _overrides(model, "predict_batch"):
            raise ModelLoadError(f"{type(model).__name__} must implement predict or predict_batch")
        self.is_async = self.per_request and inspect.iscoroutinefunction(model.predict)

    def infer(self, inputs: Tensors, output_names: Sequence[str] | None) -> Tensors:
        """The concatenated path (``predict_batch``)."""
        return _check_outputs(self.model.predict_batch(inputs), self.outputs, "predict_batch")

    def infer_requests(self, requests: list[Request]) -> list[Tensors | BaseException]:
        return self._check(self.model.predict(requests), len(requests))

    async def infer_requests_async(self, requests: list[Request]) -> list[Tensors | BaseException]:
        responses = await self.model.predict(requests)  # type: ignore[misc]
        return self._check(responses, len(requests))

    def _check(self, responses: Any, count: int) -> list[Tensors | BaseException]:
        if not isinstance(responses, list) or len(responses) != count:
            got = len(responses) if isinstance(responses, list) else type(responses).__name__
            raise InferenceFailed(
                f"{type(self.model).__name__}.predict returned {got} responses for a batch of {count} "
                "requests; it must return a list with one response (or ModelError) per request"
            )
        checked: list[Tensors | BaseException] = []
        for response in responses:
            if isinstance(response, BaseException):
                checked.append(response)
            else:
                try:
                    checked.append(_check_outputs(response, self.outputs, "predict"))
                except InferenceFailed as error:
                    checked.append(error)
        return checked

    def close(self) -> None:
        close = getattr(self.model, "close", None)
        if callable(close):
            close()


def _check_outputs(response: Any, outputs: tuple[TensorSpec, ...], where: str) -> Tensors:
    if not isinstance(response, dict):
        raise InferenceFailed(f"{where} must return a dict of output arrays, not {type(response).__name__}")
    missing = [spec.name for spec in outputs if spec.name not in response]
    if missing:
        raise InferenceFailed(f"{where} returned no {', '.join(map(repr, missing))}")
    result: Tensors = {}
    for spec in outputs:
        value = response[spec.name]
        array = np.asarray(value, dtype=object) if spec.datatype == "BYTES" else np.asarray(value)
        result[spec.name] = array
    return result


def import_class(target: str) -> type[Model]:
    """``package.module:ClassName`` to the class."""
    module_name, _, class_name = target.partition(":")
    if not module_name or not class_name:
        raise ConfigError(f"model_class {target!r} must look like 'package.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelLoadError(f"cannot import {module_name!r} for model_class {target!r}: {exc}") from None
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Model)):
        raise ModelLoadError(f"model_class {target!r} is not a subclass of edgeinfer.Model")
    return cls


def load(path: str, config: ModelConfig) -> PythonBackend:
    """Build the model from ``config.model_class`` and ``config.parameters``, then call its ``load``."""
    if not config.model_class:
        raise ModelLoadError("a python model needs model_class: 'package.module:ClassName'")
    model = import_class(config.model_class)(**config.parameters)
    return from_instance(model)


def from_instance(model: Model) -> PythonBackend:
    try:
        model.load()
    except Exception as exc:
        raise ModelLoadError(f"{type(model).__name__}.load failed: {type(exc).__name__}: {exc}") from None
    return PythonBackend(model)
