"""The transport-neutral core: live / ready / metadata / infer, and the record of every request.

HTTP and gRPC adapters call these methods with decoded requests and map the errors they raise to
status codes; nothing in here knows about either transport. Each adapter hands every finished
inference request to ``record`` (an ``Outcome``), which counts it in the metrics and writes the access
log line, so both transports are measured the same way.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import yaml

from edgeinfer import __version__
from edgeinfer.batching.batcher import RequestTrace
from edgeinfer.config import ResidencyConfig
from edgeinfer.errors import (
    ConfigError,
    InvalidInput,
    ModelEvicted,
    ModelNotFound,
    ModelNotReady,
    RequestTimeout,
)
from edgeinfer.logs import AccessLog
from edgeinfer.metrics import UNKNOWN_MODEL, Metrics, ModelMetrics, status_label
from edgeinfer.protocol.types import InferRequest, InferResponse, TensorSpec
from edgeinfer.repository.registry import ModelState, Registry
from edgeinfer.repository.residency import Residency
from edgeinfer.repository.sources import ModelSource
from edgeinfer.validation import check_request, parse_priority, parse_timeout_s

SERVER_NAME = "edgeinfer"
EXTENSIONS: tuple[str, ...] = ("binary_tensor_data", "statistics", "model_configuration", "model_repository")


@dataclass(slots=True)
class Outcome:
    """One inference request as a transport saw it, for metrics and the access log."""

    protocol: str
    model: str
    version: str | None
    started: float = field(default_factory=time.perf_counter)
    request_id: str = ""
    error: BaseException | None = None
    decode_s: float | None = None
    encode_s: float | None = None
    rows: int = 0
    trace: RequestTrace = field(default_factory=RequestTrace)
    metrics: ModelMetrics | None = None  # known once the request reached its model version


def parse_override(text: Any) -> dict[str, Any] | None:
    """The ``config`` parameter of a load request: per-model keys as JSON (Triton's clients) or YAML."""
    if text is None or text == "":
        return None
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        raise InvalidInput("the 'config' parameter of a load request must be a JSON object in a string")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidInput(f"the 'config' parameter is not valid JSON or YAML: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidInput("the 'config' parameter must be a mapping of model keys")
    return value


_REQUEST_PREFIX = os.urandom(4).hex()
_request_numbers = itertools.count(1)


def new_request_id() -> str:
    """Unique within this run of the server: a random prefix and a counter (no syscall per request)."""
    return f"{_REQUEST_PREFIX}-{next(_request_numbers):x}"


class InferenceService:
    def __init__(
        self,
        registry: Registry,
        metrics: Metrics,
        access_log: AccessLog,
        discover: Callable[[str, dict[str, Any] | None], list[ModelSource]],
        residency: ResidencyConfig | None = None,
    ) -> None:
        self.registry = registry
        self.registry.step_runner = self._run_step
        self.residency = Residency(registry, residency or ResidencyConfig(), self.load_model)
        self._discover = discover
        self.metrics = metrics
        self.access_log = access_log
        self._ready = False

    def set_ready(self, ready: bool) -> None:
        """Called by the server once every model is loaded and warmed up (and False on shutdown)."""
        self._ready = ready

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        """Every model given at start-up was loaded and warmed up, and the server is not stopping.

        Models unloaded or failing to reload later do not make the server unready (each has its own
        readiness); that would take a healthy server out of a load balancer.
        """
        return self._ready

    def server_metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": __version__, "extensions": list(EXTENSIONS)}

    def model_metadata(self, name: str, version: str | None) -> dict[str, Any]:
        entry = self.registry.get(name, version)
        return {
            "name": name,
            "versions": [other.version for other in self.registry.versions(name)],
            "platform": entry.backend.platform,
            "inputs": [spec.as_metadata() for spec in entry.backend.inputs],
            "outputs": [spec.as_metadata() for spec in entry.backend.outputs],
        }

    def model_config(self, name: str, version: str | None) -> dict[str, Any]:
        """Triton's model configuration layout (what tritonclient's ``get_model_config`` reads).

        As in Triton, ``dims`` leave out the batch dimension when the model batches.
        """
        entry = self.registry.get(name, version)
        batching = entry.policy.max_batch_size > 0

        def tensors(specs: tuple[TensorSpec, ...]) -> list[dict[str, Any]]:
            return [
                {
                    "name": spec.name,
                    "data_type": "TYPE_STRING" if spec.datatype == "BYTES" else f"TYPE_{spec.datatype}",
                    "dims": list(spec.shape[1:] if batching else spec.shape),
                }
                for spec in specs
            ]

        config: dict[str, Any] = {
            "name": name,
            "platform": "onnxruntime_onnx",
            "backend": entry.config.backend,
            "max_batch_size": entry.policy.max_batch_size,
            "input": tensors(entry.backend.inputs),
            "output": tensors(entry.backend.outputs),
        }
        if batching:
            config["dynamic_batching"] = {
                "preferred_batch_size": list(entry.policy.preferred_batch_sizes),
                "max_queue_delay_microseconds": int(entry.policy.max_queue_delay_s * 1_000_000),
                "default_priority_level": entry.config.default_priority_level,
            }
        return config

    def model_ready(self, name: str, version: str | None) -> bool:
        try:
            entry = self.registry.get(name, version)
        except ModelNotReady:
            return False
        return entry.state is ModelState.READY

    def model_index(self) -> list[dict[str, Any]]:
        """Every model with each version's state (the ``/v1/models`` listing)."""
        models: dict[str, list[dict[str, str]]] = {}
        for entry in self.registry.index():
            models.setdefault(entry.name, []).append(
                {"version": entry.version, "state": entry.state.value, "reason": entry.reason}
            )
        return [{"name": name, "versions": versions} for name, versions in models.items()]

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Triton's repository index: one entry per version with its state and reason."""
        return [
            {"name": entry.name, "version": entry.version, "state": entry.state.value, "reason": entry.reason}
            for entry in self.registry.index()
            if not ready_only or entry.state is ModelState.READY
        ]

    async def load_model(self, name: str, override: dict[str, Any] | None = None) -> None:
        """Load (or reload) every version of ``name`` from the repository; ``override`` replaces config keys.

        The versions serving now keep serving until the new ones are warmed up; if loading fails they
        keep serving and the index shows why.
        """
        loop = asyncio.get_running_loop()
        try:  # reading the repository (or a remote one) is blocking I/O: off the event loop
            sources = await loop.run_in_executor(None, self._discover, name, override)
        except ConfigError as error:
            raise InvalidInput(str(error)) from None
        await self.registry.reload(name, sources)
        self.registry.last_used.setdefault(name, time.monotonic())

    async def unload_model(self, name: str) -> None:
        """Stop serving ``name``; what is queued or running for it is answered first."""
        await self.registry.unload(name)

    def model_statistics(self, name: str | None, version: str | None) -> dict[str, Any]:
        """Triton's statistics extension: every version of every model, or one model (or version)."""
        if name is None:
            entries = [entry for model in self.registry.names() for entry in self.registry.versions(model)]
        elif version is None:
            self.registry.get(name)  # raises for unknown models
            entries = self.registry.versions(name)
        else:
            entries = [self.registry.get(name, version)]
        return {
            "model_stats": [
                {"name": entry.name, "version": entry.version, **entry.batcher.stats.as_dict()}
                for entry in entries
            ]
        }

    def record(self, outcome: Outcome) -> None:
        """Count a finished request and log it; requests for unknown models are counted as one model."""
        total_s = time.perf_counter() - outcome.started
        status = status_label(outcome.error)
        metrics = outcome.metrics
        if metrics is None:  # it failed before reaching a model version
            name, version = outcome.model, outcome.version
            try:
                version = self.registry.get(name, version).version
            except ModelNotFound:
                name, version = UNKNOWN_MODEL, ""
            except ModelNotReady:
                version = version or ""
            metrics = self.metrics.model(name, version)
        metrics.request_done(outcome.protocol, status, total_s, outcome.decode_s, outcome.encode_s)
        self.access_log.write(outcome, metrics.name, metrics.version, status, total_s)

    def submit(
        self,
        name: str,
        version: str | None,
        request: InferRequest,
        deadline_s: float | None = None,
        trace: RequestTrace | None = None,
    ) -> PendingInference:
        """Validate and queue a request; the returned object's ``outputs`` future resolves when it ran.

        Transports that answer from callbacks (HTTP) use this directly; cancelling ``outputs`` takes
        the request out of the queue if it has not started. ``deadline_s`` is the transport's own
        deadline (a gRPC client's), in seconds from now; the request's ``timeout`` parameter also counts.
        """
        entry = self.registry.get(name, version)
        if entry.state is not ModelState.READY:
            raise ModelNotReady(f"model {name!r} version {entry.version} is {entry.state.value.lower()}")
        self.registry.last_used[name] = time.monotonic()
        backend = entry.backend
        checked = check_request(
            name, backend.inputs, backend.outputs, entry.policy.max_batch_size > 0, request
        )
        outputs = entry.batcher.submit(
            request.inputs,
            checked.rows,
            checked.group,
            output_names=checked.output_names,
            priority=parse_priority(request.parameters, entry.config.default_priority_level),
            timeout_s=_earliest(parse_timeout_s(request.parameters), deadline_s),
            trace=trace,
            parameters=request.parameters,
        )
        return PendingInference(name, entry.version, request, outputs, checked.rows, entry.batcher.metrics)

    async def load_evicted(self, name: str, timeout_s: float | None) -> None:
        """Load a model evicted for memory (or on demand), waiting at most ``timeout_s``.

        Concurrent callers share one load; a caller that gives up does not cancel it for the others.
        """
        load = self.residency.load_evicted(name)
        try:
            await asyncio.wait_for(asyncio.shield(load), timeout_s)
        except asyncio.TimeoutError:
            raise RequestTimeout(
                f"model {name!r} is still loading after {timeout_s:.3f} s, the request's timeout"
            ) from None

    async def submit_loading(
        self,
        name: str,
        version: str | None,
        request: InferRequest,
        deadline_s: float | None = None,
        trace: RequestTrace | None = None,
    ) -> PendingInference:
        """``submit``, first loading the model if it was evicted (bounded by the request's deadline)."""
        try:
            return self.submit(name, version, request, deadline_s, trace)
        except ModelEvicted:
            started = time.monotonic()
            timeout_s = _earliest(parse_timeout_s(request.parameters), deadline_s)
            await self.load_evicted(name, timeout_s)
            left = None if timeout_s is None else max(0.0, timeout_s - (time.monotonic() - started))
            request.parameters.pop("timeout", None)  # what is left of it is in ``left``
            return self.submit(name, version, request, left, trace)

    async def _run_step(self, name: str, version: str | None, request: InferRequest) -> dict[str, np.ndarray]:
        """A pipeline step: an ordinary request to the step's model, through its queue and batcher."""
        pending = await self.submit_loading(name, version, request)
        await pending.outputs
        return pending.response().outputs

    async def infer(self, name: str, version: str | None, request: InferRequest) -> InferResponse:
        pending = await self.submit_loading(name, version, request)
        await pending.outputs
        return pending.response()


def _earliest(*timeouts_s: float | None) -> float | None:
    given = [timeout for timeout in timeouts_s if timeout is not None]
    return min(given) if given else None


@dataclass(slots=True)
class PendingInference:
    model_name: str
    model_version: str
    request: InferRequest
    outputs: asyncio.Future[dict[str, np.ndarray]]
    rows: int
    metrics: ModelMetrics

    def response(self) -> InferResponse:
        """The response, once ``outputs`` holds a result: only the requested outputs, in request order."""
        outputs = self.outputs.result()
        if self.request.outputs is not None:
            outputs = {wanted.name: outputs[wanted.name] for wanted in self.request.outputs}
        return InferResponse(
            model_name=self.model_name,
            model_version=self.model_version,
            outputs=outputs,
            id=self.request.id,
            requested=self.request.outputs,
        )
