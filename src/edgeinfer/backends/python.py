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
``predict_batch(inputs) -> outputs`` instead, and rows are split back as for ONNX models. A model may
declare no inputs at all and read everything from ``request.parameters``. A BYTES output may hold
structured values (dicts, lists, numbers): each element is sent as JSON text.

Where it runs (``kind`` in the model config, Triton's instance-group word):

* ``thread`` (default): a sync ``predict`` runs in the model's worker threads, so blocking I/O in it does
  not stall the event loop or other models; the GIL is held while it runs Python code, so CPU-heavy
  Python work competes with request decoding. An ``async def predict`` runs on the event loop.
* ``process``: ``instances`` child processes each build the model and call ``load()`` themselves, and
  batches go to whichever is free, tensors travelling as pickle protocol 5 out-of-band buffers. Pure
  Python work then uses every core. The model is re-created in each child from its ``model_class`` (or,
  registered from code, by pickling the object), so its class must be importable by module name.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import pickle
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import orjson

from edgeinfer.backends import LoadContext, can_batch
from edgeinfer.config_file import split_model_class
from edgeinfer.errors import ConfigError, InferenceFailed, InvalidInput, ModelLoadError
from edgeinfer.extras import missing
from edgeinfer.protocol.datatypes import numpy_dtype
from edgeinfer.protocol.types import Parameters, TensorSpec
from edgeinfer.runners import BatchTimes, Result, Runner, RunnerSettings, Work
from edgeinfer.runners.arrays import concatenating
from edgeinfer.runners.base import Execute
from edgeinfer.runners.coroutine import AsyncRunner
from edgeinfer.runners.thread import ThreadRunner

if TYPE_CHECKING:
    from edgeinfer.model_config import ModelConfig

log = logging.getLogger(__name__)

Tensors = dict[str, np.ndarray]


class ModelError(InvalidInput):
    """Return this in place of a response to fail that request alone (the client gets a 400)."""


@dataclass
class Request:
    """One request of a batch, as ``predict`` sees it."""

    inputs: Tensors
    parameters: Parameters = field(default_factory=dict)
    id: str | None = None


class Model:
    """Base class of Python models. Declare ``inputs`` and ``outputs``; implement ``predict`` (or
    ``predict_batch``); ``parameters`` from the config are passed to the constructor."""

    inputs: ClassVar[Sequence[TensorSpec]] = ()
    outputs: ClassVar[Sequence[TensorSpec]] = ()

    def __init__(self, **parameters: Any) -> None:
        self.parameters = parameters

    def load(self) -> None:
        """Prepare the model (read weights, open files). Called once, in a worker thread or process."""

    def predict(self, requests: list[Request]) -> list[Tensors | ModelError]:
        """One response per request. The default concatenates the batch for ``predict_batch``."""
        raise NotImplementedError

    def predict_batch(self, inputs: Tensors) -> Tensors:
        """Outputs for the concatenated inputs of a batch; first dimensions must match the rows."""
        raise NotImplementedError


def _overrides(model: Model, method: str) -> bool:
    return getattr(type(model), method) is not getattr(Model, method)


class PythonBackend:
    """A loaded ``Model`` in this process: its batch functions and the runner that calls them."""

    platform = "python"
    config_platform = ""
    config_backend = "python"
    execution_provider = "python"
    warmup_applies = True
    ep_coverage: Mapping[str, float] = MappingProxyType({})  # no execution providers

    def __init__(self, model: Model, name: str = "") -> None:
        self.model = model
        self.name = name or type(model).__name__
        self.inputs = tuple(model.inputs)
        self.outputs = tuple(model.outputs)
        if not self.outputs:
            raise ModelLoadError(f"{type(model).__name__} must declare its outputs (a TensorSpec list)")
        self.per_request = _overrides(model, "predict")
        if not self.per_request and not _overrides(model, "predict_batch"):
            raise ModelLoadError(f"{type(model).__name__} must implement predict or predict_batch")
        self.is_async = self.per_request and inspect.iscoroutinefunction(model.predict)

    def runner(self, settings: RunnerSettings) -> Runner:
        settings = replace(settings, inline_max_s=0.0)  # Python code may block: never on the event loop
        if self.is_async:
            return AsyncRunner(self.execute_async, settings)
        return ThreadRunner(self.execute(settings.batching), settings)

    def execute(self, batching: bool) -> Execute:
        """The synchronous batch function (worker threads, child processes)."""
        if not self.per_request:
            return concatenating(self.name, self._predict_batch, batching)
        if self.is_async:  # in a child process: a loop of its own
            loop = asyncio.new_event_loop()
            return lambda batch, times: _timed(times, loop.run_until_complete, self._async(batch))
        return lambda batch, times: _timed(times, self._predict, _requests(batch))

    async def execute_async(self, batch: list[Work]) -> list[Result]:
        return await self._async(batch)

    def _async(self, batch: list[Work]) -> Any:
        return self._predict_async(_requests(batch))

    def _predict_batch(self, inputs: Tensors, output_names: Collection[str] | None) -> Tensors:
        return _check_outputs(self.model.predict_batch(inputs), self.outputs, "predict_batch")

    def _predict(self, requests: list[Request]) -> list[Result]:
        return self._check(self.model.predict(requests), len(requests))

    async def _predict_async(self, requests: list[Request]) -> list[Result]:
        responses = await self.model.predict(requests)  # type: ignore[misc]
        return self._check(responses, len(requests))

    def _check(self, responses: Any, count: int) -> list[Result]:
        if not isinstance(responses, list) or len(responses) != count:
            got = len(responses) if isinstance(responses, list) else type(responses).__name__
            raise InferenceFailed(
                f"{type(self.model).__name__}.predict returned {got} responses for a batch of {count} "
                "requests; it must return a list with one response (or ModelError) per request"
            )
        checked: list[Result] = []
        for response in responses:
            if isinstance(response, BaseException):
                checked.append(response)
            else:
                try:
                    checked.append(_check_outputs(response, self.outputs, "predict"))
                except InferenceFailed as error:
                    checked.append(error)
        return checked

    def inspect(self) -> dict[str, Any]:
        return {"model_class": f"{type(self.model).__module__}:{type(self.model).__qualname__}"}

    def close(self) -> None:
        close = getattr(self.model, "close", None)
        if callable(close):
            close()


def _requests(batch: list[Work]) -> list[Request]:
    return [Request(work.inputs, dict(work.parameters), work.request_id) for work in batch]


def _timed(times: BatchTimes, call: Callable[[Any], list[Result]], argument: Any) -> list[Result]:
    started = time.perf_counter_ns()
    results = call(argument)
    times.infer_ns = max(1, time.perf_counter_ns() - started)
    return results


class ProcessBackend:
    """A Python model whose ``instances`` live in child processes; this process holds no model object.

    The children are started (and each calls ``load()``) when the version loads; the tensors they
    declare come from the first child's loaded model.
    """

    platform = "python"
    config_platform = ""
    config_backend = "python"
    execution_provider = "python-process"
    warmup_applies = True
    ep_coverage: Mapping[str, float] = MappingProxyType({})  # no execution providers

    def __init__(self, factory: ModelFactory, name: str, config: ModelConfig) -> None:
        # a lazy import: multiprocessing's connections cost 2 MiB of RSS, paid only by servers that use them
        from edgeinfer.runners.process import ChildPool, ProcessRunner

        self._pool = ChildPool(ChildModel(factory, name, config.max_batch_size), name, config.instances)
        self._runner_class = ProcessRunner
        self.inputs, self.outputs = self._pool.info

    def runner(self, settings: RunnerSettings) -> Runner:
        return self._runner_class(self._pool, settings)

    def inspect(self) -> dict[str, Any]:
        return {"kind": "process"}

    def close(self) -> None:
        self._pool.close()


@dataclass(frozen=True)
class ModelFactory:
    """How a child process re-creates the model: import ``model_class`` and construct it with
    ``parameters``, or unpickle ``pickled`` (an object registered from code)."""

    model_class: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    pickled: bytes | None = None

    def build(self) -> Model:
        if self.pickled is not None:
            model: Model = pickle.loads(self.pickled)
            return model
        assert self.model_class is not None
        return import_class(self.model_class)(**self.parameters)


@dataclass(frozen=True)
class ChildModel:
    """What a child process runs (pickled to it): build and load the model, then hand back its batch
    function and declared tensors."""

    factory: ModelFactory
    name: str
    max_batch_size: int | None

    def __call__(self) -> tuple[Execute, tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]]:
        backend = from_instance(self.factory.build(), self.name)
        if self.max_batch_size is None:  # the same rule the loader applies
            batching = can_batch(backend.inputs, backend.outputs)
        else:
            batching = self.max_batch_size > 0
        return backend.execute(batching), (backend.inputs, backend.outputs)


def _check_outputs(response: Any, outputs: tuple[TensorSpec, ...], where: str) -> Tensors:
    if not isinstance(response, dict):
        raise InferenceFailed(f"{where} must return a dict of output arrays, not {type(response).__name__}")
    missing = [spec.name for spec in outputs if spec.name not in response]
    if missing:
        raise InferenceFailed(f"{where} returned no {', '.join(map(repr, missing))}")
    result: Tensors = {}
    for spec in outputs:
        value = response[spec.name]
        result[spec.name] = (
            _bytes_array(value, spec.name) if spec.datatype == "BYTES" else _numbers(value, spec, where)
        )
    return result


def _numbers(value: Any, spec: TensorSpec, where: str) -> np.ndarray:
    """The output as the declared datatype: a list of Python floats (float64) becomes FP32 and the like,
    but nothing of another kind is converted (a float for an integer output, complex numbers, objects)."""
    array = np.asarray(value)
    target = numpy_dtype(spec.datatype)
    if array.dtype == target:
        return array
    if array.dtype.kind not in "biuf" or not np.can_cast(array.dtype, target, casting="same_kind"):
        raise InferenceFailed(
            f"{where} returned output {spec.name!r} as {array.dtype} values, but the model declares it "
            f"{spec.datatype}"
        )
    return array.astype(target)


def _bytes_array(value: Any, name: str) -> np.ndarray:
    """BYTES elements as ``bytes``: text is UTF-8 encoded, structured values (dicts, lists, numbers) become
    JSON text."""
    if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        array = np.empty(len(value), dtype=object)
        array[:] = value  # one element per dict (numpy would otherwise try to look inside)
    else:
        array = np.asarray(value, dtype=object)
    flat = array.reshape(-1)
    if all(isinstance(element, bytes) for element in flat):
        return array
    out = np.empty(flat.shape[0], dtype=object)
    for index, element in enumerate(flat):
        if isinstance(element, bytes):
            out[index] = element
        elif isinstance(element, str):
            out[index] = element.encode("utf-8")
        else:
            try:
                out[index] = orjson.dumps(element, option=orjson.OPT_SERIALIZE_NUMPY)
            except TypeError as exc:
                raise InferenceFailed(
                    f"output {name!r}: element {index} ({type(element).__name__}) is neither bytes, text "
                    f"nor a JSON value: {exc}"
                ) from None
    return out.reshape(array.shape)


def import_class(target: str) -> type[Model]:
    """``package.module:ClassName`` to the class."""
    parts = split_model_class(target)
    if parts is None:  # (a registered or overridden class: the config file's were checked when read)
        raise ConfigError(f"model_class {target!r} must look like 'package.module:ClassName'")
    module_name, class_name = parts
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        extra = missing(exc, f"model_class {target!r}")
        raise ModelLoadError(
            str(extra) if extra else f"cannot import {module_name!r} for model_class {target!r}: {exc}"
        ) from None
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Model)):
        raise ModelLoadError(f"model_class {target!r} is not a subclass of edgeinfer.Model")
    return cls


def load(path: str, config: ModelConfig, name: str, context: LoadContext) -> PythonBackend | ProcessBackend:
    """Build the model from ``config.model_class`` and ``config.parameters``, then call its ``load``
    (here, or in each child process with ``kind: process``)."""
    if not config.model_class:
        raise ModelLoadError("a python model needs model_class: 'package.module:ClassName'")
    if config.kind == "process":
        factory = ModelFactory(model_class=config.model_class, parameters=dict(config.parameters))
        return ProcessBackend(factory, name or config.model_class, config)
    model = import_class(config.model_class)(**config.parameters)
    return from_instance(model, name)


def from_registered(model: Any, config: ModelConfig, name: str) -> PythonBackend | ProcessBackend:
    """A model given to ``Server.register``: an instance, a ``Model`` subclass, or a factory callable."""
    if config.kind == "process":
        return ProcessBackend(_factory_of(model, name), name, config)
    if not isinstance(model, Model):
        model = model()
        if not isinstance(model, Model):
            raise ModelLoadError(f"the factory registered as {name!r} did not return an edgeinfer.Model")
    return from_instance(model, name)


def _factory_of(model: Any, name: str) -> ModelFactory:
    cls = model if isinstance(model, type) else type(model)
    if cls.__module__ == "__main__":
        raise ModelLoadError(
            f"model {name!r}: {cls.__qualname__} is defined in the script being run (__main__); with "
            "kind: process each child imports the class by module name, so move it into a module"
        )
    instance = model if isinstance(model, Model) else model()
    try:
        return ModelFactory(pickled=pickle.dumps(instance, protocol=5))
    except Exception as exc:
        raise ModelLoadError(
            f"model {name!r}: kind: process sends the model object to its child processes, but it cannot "
            f"be pickled: {type(exc).__name__}: {exc}"
        ) from None


def from_instance(model: Model, name: str = "") -> PythonBackend:
    try:
        model.load()
    except Exception as exc:
        raise ModelLoadError(f"{type(model).__name__}.load failed: {type(exc).__name__}: {exc}") from None
    return PythonBackend(model, name)
