"""Loading one model version: backend, batching policy, warmup.

Runs in a worker thread at startup (loading is blocking work); the result is a ``LoadedModel`` the
registry wires to a batcher on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeinfer.backends import Backend, load_backend, request_runner
from edgeinfer.backends import python as python_backend
from edgeinfer.backends.pipeline import PipelineBackend
from edgeinfer.batching.policy import BatchPolicy
from edgeinfer.config import WarmupConfig
from edgeinfer.errors import InvalidInput, ModelLoadError
from edgeinfer.protocol import json_codec
from edgeinfer.protocol.datatypes import numpy_dtype
from edgeinfer.protocol.types import TensorSpec
from edgeinfer.repository.remote import fetch_url, is_remote
from edgeinfer.repository.sources import ModelSource
from edgeinfer.validation import check_request

log = logging.getLogger(__name__)

DEFAULT_MAX_BATCH_SIZE = 8


@dataclass(frozen=True, slots=True)
class LoadedModel:
    source: ModelSource
    backend: Backend
    policy: BatchPolicy
    load_s: float
    warmup_s: float
    local_path: str


def load_model(source: ModelSource) -> LoadedModel:
    started = time.perf_counter()
    path = source.path
    if path and is_remote(path):
        path = str(fetch_url(path, source.config.sha256, Path(source.cache_dir or ".")))
    if source.instance is not None:
        backend: Backend = python_backend.from_instance(source.instance)
    elif source.config.backend == "pipeline":
        assert source.config.pipeline is not None
        backend = PipelineBackend(source.name, source.config.pipeline)
    else:
        backend = load_backend(path, source.config)
    loaded_at = time.perf_counter()
    try:
        policy = batch_policy(source, backend)
        # a pipeline's steps are warmed up as the models they are
        warm = not isinstance(backend, PipelineBackend)
        synthetic, samples = warmup(backend, policy, source.config.warmup) if warm else (0, 0)
    except ModelLoadError:
        backend.close()
        raise
    finished = time.perf_counter()
    log.info(
        "loaded model %s version %s on %s in %.0f ms (warmup %.0f ms: %d synthetic runs, %d samples), "
        "max_batch_size %d",
        source.name,
        source.version,
        backend.execution_provider,
        (loaded_at - started) * 1000,
        (finished - loaded_at) * 1000,
        synthetic,
        samples,
        policy.max_batch_size,
    )
    return LoadedModel(source, backend, policy, loaded_at - started, finished - loaded_at, path)


def can_batch(backend: Backend) -> bool:
    """Batching needs a dynamic first dimension on every input and output."""
    return all(spec.shape and spec.shape[0] == -1 for spec in (*backend.inputs, *backend.outputs))


def batch_policy(source: ModelSource, backend: Backend) -> BatchPolicy:
    config = source.config
    batchable = can_batch(backend)
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
        max_queue_delay_s=config.batch_timeout_millis / 1000,
        preferred_batch_sizes=tuple(size for size in config.preferred_batch_sizes if size <= max_batch_size),
    )


def warmup(backend: Backend, policy: BatchPolicy, config: WarmupConfig | None = None) -> tuple[int, int]:
    """Run the model before it serves, so the first request is not the slow one; failure is fatal.

    Synthetic zeros at each warmup batch size (default 1 and max_batch_size), with ``config.shapes``
    filling dimensions the model leaves dynamic (an input with dynamic dimensions and no configured
    shape is skipped, logged at DEBUG), then every sample request file as it is.
    """
    config = config or WarmupConfig()
    if not config.enabled:
        return 0, 0
    synthetic = 0
    batching = policy.max_batch_size > 0
    default_sizes = {1, policy.max_batch_size} if batching else {0}
    if config.batch_sizes is not None:  # [] means: no synthetic runs, only the samples
        batch_sizes = sorted(config.batch_sizes) if batching else ([0] if config.batch_sizes else [])
    else:
        batch_sizes = sorted(default_sizes) if batching else [0]
    for batch_size in batch_sizes:
        inputs: dict[str, np.ndarray] = {}
        for spec in backend.inputs:
            shape = _warmup_shape(spec, batch_size, config.shapes.get(spec.name))
            if shape is None:
                log.debug(
                    "no synthetic warmup: input %r has dynamic dimensions %s", spec.name, list(spec.shape)
                )
                inputs = {}
                break
            inputs[spec.name] = _zeros(spec, shape)
        if inputs:
            _run(backend, inputs, f"at batch size {batch_size}" if batching else "")
            synthetic += 1
    for sample in config.samples:
        try:
            request = json_codec.decode_request(Path(sample).read_bytes())
        except OSError as exc:
            raise ModelLoadError(f"warmup sample {sample} cannot be read: {exc.strerror}") from None
        except InvalidInput as exc:
            raise ModelLoadError(f"warmup sample {sample} is not a valid V2 request: {exc}") from None
        try:
            check_request("warmup", backend.inputs, backend.outputs, batching, request)
        except InvalidInput as exc:
            raise ModelLoadError(f"warmup sample {sample} does not fit the model: {exc}") from None
        _run(backend, request.inputs, f"on sample {sample}")
    return synthetic, len(config.samples)


def _run(backend: Backend, inputs: dict[str, np.ndarray], where: str) -> None:
    runner = request_runner(backend)
    try:
        if runner is None:
            backend.infer(inputs, None)
        else:
            run, is_async = runner
            requests = [python_backend.Request(inputs)]
            # an async model gets a loop of its own: warmup runs in a loader thread
            results = asyncio.run(run(requests)) if is_async else run(requests)
            if isinstance(results[0], BaseException):
                raise results[0]
    except Exception as exc:
        message = f"warmup failed {where}: {type(exc).__name__}: {exc}".replace("failed :", "failed:")
        raise ModelLoadError(message) from None


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
