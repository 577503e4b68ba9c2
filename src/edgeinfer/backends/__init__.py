"""Backends run a loaded model on a batch of numpy arrays.

A backend knows nothing about requests, batching or transports: it gets one dict of concatenated input
arrays and returns one dict of output arrays. Each backend lives in its own module, imported only when a
model uses it, so a server without ONNX models never pays for importing ONNX Runtime.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from edgeinfer.config import ModelConfig
from edgeinfer.protocol.types import TensorSpec


class Backend(Protocol):
    """A loaded model.

    Threading: ``infer`` is called from worker threads, never on the event loop, and at most
    ``max_concurrent_batches`` calls run at once; it may block and should release the GIL while it
    computes. ``close`` is called once, after the last ``infer`` has returned.

    Ownership: input arrays belong to the caller and are only read during the call; returned arrays
    belong to the caller. BYTES tensors are numpy object arrays of ``bytes`` both ways.
    """

    platform: str
    execution_provider: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def infer(
        self, inputs: dict[str, np.ndarray], output_names: Sequence[str] | None
    ) -> dict[str, np.ndarray]:
        """Run the model; ``output_names`` None means every output."""
        ...

    def close(self) -> None:
        """Free the model's memory."""
        ...


_BACKEND_MODULES = {
    "onnxruntime": "edgeinfer.backends.onnxruntime",
    "python": "edgeinfer.backends.python",
    "pipeline": "edgeinfer.backends.pipeline",
}


RunRequests = Callable[[list[Any]], Any]


def request_runner(backend: Backend) -> tuple[RunRequests, bool] | None:
    """The per-request path of a backend that has one, and whether it is a coroutine function.

    Python models that implement ``predict`` and pipelines take whole requests (``infer_requests`` /
    ``infer_requests_async``) instead of concatenated arrays; every other backend returns None here.
    """
    if not getattr(backend, "per_request", False):
        return None
    if getattr(backend, "is_async", False):
        return backend.infer_requests_async, True  # type: ignore[attr-defined]
    return backend.infer_requests, False  # type: ignore[attr-defined]


def load_backend(path: str, config: ModelConfig) -> Backend:
    """Load the model file at ``path`` with the backend ``config.backend`` names."""
    module = importlib.import_module(_BACKEND_MODULES[config.backend])
    backend: Backend = module.load(path, config)
    return backend
