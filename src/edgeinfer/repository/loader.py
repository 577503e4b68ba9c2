"""Loading one model version (backend and batching policy) and warming it up through its runner.

``load_model`` is blocking work and runs in a worker thread; ``warm_up`` runs on the event loop and
sends its requests through the version's own runner, so a model is exercised exactly where it will serve
(its worker threads, the loop for async models, its child processes) and the runner's cost model starts
from real measurements.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeinfer.backends import Backend, LoadContext, can_batch, load_backend, python
from edgeinfer.batching.policy import BatchPolicy
from edgeinfer.errors import InvalidInput, ModelLoadError, RowsMismatch, RuntimeRejected
from edgeinfer.model_config import WarmupConfig
from edgeinfer.protocol import json_codec
from edgeinfer.protocol.datatypes import numpy_dtype
from edgeinfer.protocol.types import TensorSpec
from edgeinfer.repository.remote import fetch_url, is_remote
from edgeinfer.repository.sources import ModelSource
from edgeinfer.runners import BatchResult, Runner, Tensors, Work
from edgeinfer.validation import check_request

log = logging.getLogger(__name__)

DEFAULT_MAX_BATCH_SIZE = 8


@dataclass(frozen=True, slots=True)
class LoadedModel:
    source: ModelSource
    backend: Backend
    policy: BatchPolicy
    load_s: float
    local_path: str


def load_model(source: ModelSource, context: LoadContext) -> LoadedModel:
    started = time.perf_counter()
    path = source.path
    if path and is_remote(path):
        path = str(fetch_url(path, source.config.sha256, Path(source.cache_dir or ".")))
    if source.instance is not None:  # given to Server.register: a Python model object or factory
        backend: Backend = python.from_registered(source.instance, source.config, source.name)
    else:
        backend = load_backend(path, source.config, source.name, context)
    try:
        policy = batch_policy(source, backend)
    except ModelLoadError:
        backend.close()
        raise
    return LoadedModel(source, backend, policy, time.perf_counter() - started, path)


def batch_policy(source: ModelSource, backend: Backend) -> BatchPolicy:
    config = source.config
    batchable = can_batch(backend.inputs, backend.outputs)
    max_batch_size = config.max_batch_size
    if max_batch_size is None:
        max_batch_size = DEFAULT_MAX_BATCH_SIZE if batchable else 0
    elif max_batch_size > 0 and not batchable:
        fixed = [
            f"{spec.name} {list(spec.shape)}"
            for spec in (*backend.inputs, *backend.outputs)
            if not spec.shape or spec.shape[0] != -1
        ]
        raise ModelLoadError(
            f"model {source.name!r}: max_batch_size {max_batch_size} needs a dynamic first dimension on "
            f"every input and output, but these have none: {', '.join(fixed)}; set max_batch_size: 0"
        )
    return BatchPolicy(
        max_batch_size=max_batch_size,
        max_queue_delay_s=(config.batch_timeout_ms or 0.0) / 1000,
        adaptive=config.adaptive_batching,
        preferred_batch_sizes=tuple(size for size in config.preferred_batch_sizes if size <= max_batch_size),
    )


@dataclass(frozen=True, slots=True)
class WarmupReport:
    synthetic: int
    samples: int
    seconds: float
    unwarmed: int = 0  # synthetic runs the model failed: it serves without them


async def warm_up(
    runner: Runner,
    backend: Backend,
    policy: BatchPolicy,
    config: WarmupConfig | None = None,
    name: str = "",
) -> WarmupReport:
    """Run the model before it serves, so the first request is not the slow one.

    Synthetic zeros at each warmup batch size (default 1 and max_batch_size), with ``config.shapes``
    filling dimensions the model leaves dynamic (an input with dynamic dimensions and no configured
    shape is skipped, logged at DEBUG), then every sample request file as it is.

    The zeros are our guess at an input, not the user's: a model that refuses them as a bad request
    (``ModelError``) has shown that it runs, and one whose runtime fails on them (``RuntimeRejected``:
    ONNX Runtime rejecting the values, as for a BYTES input its graph casts to numbers) is served
    unwarmed; both with a WARNING naming the model and the reason. What fails the load: any failure of
    a sample the user gave, and every other failure (an exception of a Python model's own code or
    outputs it cannot give, a process instance that died: the model or its runner is broken).
    """
    started = time.perf_counter()
    config = config or WarmupConfig()
    if not config.enabled or not backend.warmup_applies:
        return WarmupReport(0, 0, 0.0)
    synthetic = unwarmed = 0
    batching = policy.max_batch_size > 0
    for batch_size in _batch_sizes(config, policy, bool(backend.inputs)):
        inputs: Tensors = {}
        for spec in backend.inputs:
            shape = _warmup_shape(spec, batch_size, config.shapes.get(spec.name))
            if shape is None:
                log.debug(
                    "no synthetic warmup: input %r has dynamic dimensions %s", spec.name, list(spec.shape)
                )
                break
            inputs[spec.name] = _zeros(spec, shape)
        else:
            where = f" at batch size {batch_size}" if batching else ""
            error = await _run(runner, inputs, max(1, batch_size))
            if isinstance(error, (InvalidInput, RowsMismatch)):
                log.warning("model %r: warmup%s: the model answered the zeros with %s: %s; it runs",
                            name, where, type(error).__name__, error)  # fmt: skip
            elif isinstance(error, RuntimeRejected):
                log.warning(
                    "model %r: the synthetic warmup%s failed, so the model serves unwarmed (its first "
                    "requests may be slower; warmup.samples warms it with inputs of yours): %s",
                    name, where, error,
                )  # fmt: skip
                unwarmed += 1
            elif error is not None:
                raise ModelLoadError(f"warmup failed{where}: {type(error).__name__}: {error}")
            synthetic += 1
    for sample in config.samples:
        try:
            request = json_codec.decode_request(Path(sample).read_bytes())
        except OSError as exc:
            raise ModelLoadError(f"warmup sample {sample} cannot be read: {exc.strerror}") from None
        except InvalidInput as exc:
            raise ModelLoadError(f"warmup sample {sample} is not a valid V2 request: {exc}") from None
        try:
            checked = check_request("warmup", backend.inputs, backend.outputs, batching, request)
        except InvalidInput as exc:
            raise ModelLoadError(f"warmup sample {sample} does not fit the model: {exc}") from None
        error = await _run(runner, request.inputs, checked.rows, request.parameters)
        if error is not None:
            raise ModelLoadError(f"warmup failed on sample {sample}: {type(error).__name__}: {error}")
    return WarmupReport(synthetic, len(config.samples), time.perf_counter() - started, unwarmed)


def _batch_sizes(config: WarmupConfig, policy: BatchPolicy, has_inputs: bool) -> list[int]:
    batching = policy.max_batch_size > 0
    if not has_inputs:  # parameters only: one run says all there is to say
        return [1] if config.batch_sizes != () and batching else ([0] if config.batch_sizes != () else [])
    if config.batch_sizes is not None:  # [] means: no synthetic runs, only the samples
        return sorted(config.batch_sizes) if batching else ([0] if config.batch_sizes else [])
    return sorted({1, policy.max_batch_size}) if batching else [0]


async def _run(
    runner: Runner, inputs: Tensors, rows: int, parameters: dict[str, object] | None = None
) -> Exception | None:
    """Run one warmup request: None when it succeeded, else what it raised (or, for a request of the
    batch, failed with)."""
    try:
        done = runner.run([Work(inputs, rows, parameters=dict(parameters or {}))])
        result = (done if isinstance(done, BatchResult) else await done).results[0]
    except Exception as exc:
        return exc
    return result if isinstance(result, Exception) else None


def _warmup_shape(
    spec: TensorSpec, batch_size: int, configured: tuple[int, ...] | None
) -> tuple[int, ...] | None:
    if configured is not None:
        dims = [batch_size, *configured] if batch_size > 0 else list(configured)
        if len(dims) != len(spec.shape):
            raise ModelLoadError(
                f"warmup shape {list(configured)} for input {spec.name!r} does not fit its shape "
                f"{list(spec.shape)}"
            )
    else:
        dims = list(spec.shape)
        if batch_size > 0:
            dims[0] = batch_size
    if any(dim < 0 for dim in dims):
        return None
    return tuple(dims)


def _zeros(spec: TensorSpec, shape: tuple[int, ...]) -> np.ndarray:
    if spec.datatype == "BYTES":
        return np.full(shape, b"", dtype=object)
    return np.zeros(shape, dtype=numpy_dtype(spec.datatype))
