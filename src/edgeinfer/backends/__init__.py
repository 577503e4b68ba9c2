"""Backends run a loaded model; each one says how it is to be executed by returning its runner.

A backend knows nothing about requests queues, batching decisions or transports. Array backends (ONNX
Runtime, ``predict_batch``) compute one dict of concatenated input arrays into one dict of outputs;
Python models that implement ``predict`` and pipelines take the requests of a batch one by one. That
difference is the backend's own business: ``runner()`` hands the batcher a runner that executes batches
the right way (``edgeinfer.runners``), so nothing above needs to ask what kind of backend it holds.

Each backend lives in its own module, imported only when a model uses it, so a server without ONNX
models never pays for importing ONNX Runtime.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from edgeinfer.errors import ModelLoadError
from edgeinfer.extras import missing
from edgeinfer.protocol.types import InferRequest, TensorSpec
from edgeinfer.runners import Runner, RunnerSettings, Tensors

if TYPE_CHECKING:
    from edgeinfer.model_config import ModelConfig


class Backend(Protocol):
    """A loaded model.

    ``platform`` is the framework name of the V2 model metadata (``onnx_onnxv1``); ``config_platform``
    and ``config_backend`` are what Triton's model configuration reports (``onnxruntime_onnx`` and
    ``onnxruntime``; ``""`` and ``python`` for Python models; ``ensemble`` and ``""`` for pipelines).

    Threading and ownership are the runner's contract (``runners.base.Runner``): the backend's runner
    calls the model with at most ``settings.concurrency`` batches at once and never on the event loop
    unless the backend allows it. Input arrays belong to the caller and are only read; returned arrays
    belong to the caller. BYTES tensors are numpy object arrays of ``bytes`` both ways. ``close`` is
    called once, after the runner has closed.
    """

    platform: str
    config_platform: str
    config_backend: str
    execution_provider: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    warmup_applies: bool  # False: synthetic warmup means nothing (a pipeline's steps warm up themselves)
    ep_coverage: Mapping[str, float]  # provider -> share of nodes it runs (ONNX models; empty otherwise)

    def inspect(self) -> dict[str, Any]:
        """What only this backend knows about the model (size, graph, where its nodes run), for
        ``GET /v2/models/{m}/inspect``; the common metadata is added by the caller."""
        ...

    def runner(self, settings: RunnerSettings) -> Runner:
        """The runner that executes this model's batches (called once per loaded version)."""
        ...

    def close(self) -> None:
        """Free the model's memory."""
        ...


# Runs one request on another model, through its queue: (model, version, request, step name, the
# pipeline request's trace span or None) -> outputs.
StepRunner = Callable[[str, "str | None", InferRequest, str, "object | None"], Awaitable[Tensors]]
# Counts one pipeline step: (pipeline, step, model, seconds, over its budget_ms)
StepObserver = Callable[[str, str, str, float, bool], None]


def ignore_step(pipeline: str, step: str, model: str, seconds: float, over_budget: bool) -> None:
    pass


@dataclass(frozen=True, slots=True)
class LoadContext:
    """What the server lends backends when they load (given by the composition root)."""

    run_step: StepRunner | None = None  # how a pipeline's steps reach their models
    observe_step: StepObserver = ignore_step  # where a pipeline's step times go (metrics)


_BACKEND_MODULES = {
    "onnxruntime": "edgeinfer.backends.onnxruntime",
    "openvino": "edgeinfer.backends.openvino",
    "python": "edgeinfer.backends.python",
    "pipeline": "edgeinfer.backends.pipeline",
}


def load_backend(path: str, config: ModelConfig, name: str, context: LoadContext) -> Backend:
    """Load the model at ``path`` (none for Python models and pipelines) with ``config.backend``."""
    try:
        module = importlib.import_module(_BACKEND_MODULES[config.backend])
    except ImportError as exc:
        extra = missing(exc, f"the {config.backend} backend")
        if extra is None:
            raise
        raise ModelLoadError(str(extra)) from None
    backend: Backend = module.load(path, config, name, context)
    return backend


def can_batch(inputs: Iterable[TensorSpec], outputs: Iterable[TensorSpec]) -> bool:
    """Batching needs a dynamic first dimension on every input and output."""
    return all(spec.shape and spec.shape[0] == -1 for spec in (*inputs, *outputs))
