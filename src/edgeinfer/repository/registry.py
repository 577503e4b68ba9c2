"""The loaded model versions, each with its state and batcher; requests are routed through here."""

from __future__ import annotations

import asyncio
import enum
import logging
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from edgeinfer.backends import Backend, request_runner
from edgeinfer.backends.pipeline import PipelineBackend, StepRunner
from edgeinfer.batching.batcher import Batcher, QueueLimits
from edgeinfer.batching.policy import BatchPolicy
from edgeinfer.config import ModelConfig
from edgeinfer.errors import ModelEvicted, ModelLoadError, ModelNotFound, ModelNotReady
from edgeinfer.metrics import Metrics
from edgeinfer.repository.loader import LoadedModel, load_model
from edgeinfer.repository.sources import ModelSource

log = logging.getLogger(__name__)


class ModelState(str, enum.Enum):
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass(eq=False, slots=True)
class ModelVersion:
    """One servable version. ``backend`` and ``batcher`` are set while it is READY."""

    name: str
    version: str
    config: ModelConfig
    state: ModelState
    backend: Backend
    batcher: Batcher
    policy: BatchPolicy
    executor: ThreadPoolExecutor
    file_bytes: int = 0
    reason: str = ""

    def close(self) -> None:
        """Free the model; called once its batcher has drained."""
        self.backend.close()
        self.executor.shutdown(wait=False)


def version_key(version: str) -> tuple[int, int, str]:
    """Numeric versions sort numerically and above any non-numeric ones."""
    return (1, int(version), "") if version.isdigit() else (0, 0, version)


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One line of the repository index (Triton's layout)."""

    name: str
    version: str
    state: ModelState
    reason: str


class Registry:
    """Every model version the server knows, and the only place versions are added, swapped or retired.

    Each version gets its own worker threads (``max_concurrent_batches + prefetch_batches``, created on
    first use), so a slow model cannot take the threads of a fast one.

    Reloading follows Triton's lifecycle: the new versions are loaded and warmed up while the old ones
    keep serving; then new requests go to the new versions, the old ones finish what they had queued or
    running, and only then are they freed. If loading fails, the old versions keep serving and the
    index shows the failure and its reason.
    """

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._models: dict[str, dict[str, ModelVersion]] = {}
        self._failures: dict[tuple[str, str], str] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._deferred: dict[str, list[ModelSource]] = {}  # on_demand models never loaded yet
        self._loading: set[tuple[str, str]] = set()  # versions being loaded by a reload, for the index
        self.last_used: dict[str, float] = {}
        self.step_runner: StepRunner | None = None  # set by the service: how pipeline steps reach models

    def defer(self, sources: Iterable[ModelSource]) -> None:
        """List models that load on their first request (residency: on_demand) without loading them."""
        for source in sources:
            self._deferred.setdefault(source.name, []).append(source)

    def is_evicted(self, name: str) -> bool:
        """No version serves because of residency (evicted, or on demand and never loaded)."""
        versions = self._models.get(name)
        if not versions:
            return name in self._deferred
        return all(
            entry.state is ModelState.UNAVAILABLE and entry.reason == "evicted" for entry in versions.values()
        )

    async def evict(self, name: str) -> None:
        """Unload every version of ``name`` to free memory; it loads again on its next request."""
        async with self._lock(name):
            ready = [
                entry for entry in self._models.get(name, {}).values() if entry.state is ModelState.READY
            ]
            await asyncio.gather(*(self._retire(entry, "evicted") for entry in ready))

    def loaded(self) -> list[ModelVersion]:
        return [
            entry
            for versions in self._models.values()
            for entry in versions.values()
            if entry.state is ModelState.READY
        ]

    async def load(self, sources: Iterable[ModelSource]) -> None:
        """Start-up: load and warm up every source concurrently; any failure fails the whole call."""
        loaded, failures = await _load_all(list(sources))
        for model in loaded:
            self._install(self._make_entry(model))
        if failures:
            raise ModelLoadError("cannot load every model:\n  " + "\n  ".join(failures.values()))

    async def reload(self, name: str, sources: list[ModelSource]) -> None:
        """Serve exactly ``sources`` for model ``name``: load them, switch over, retire what they replace.

        Raises ModelLoadError (after recording it in the index) if any source fails; then nothing
        changes for the versions already serving.
        """
        async with self._lock(name):
            loading = {(source.name, source.version) for source in sources}
            self._loading |= loading
            try:
                loaded, failures = await _load_all(sources)
            finally:
                self._loading -= loading
            if failures:
                for model in loaded:
                    model.backend.close()
                for (model_name, version), reason in failures.items():
                    self._failures[model_name, version] = reason
                raise ModelLoadError(f"cannot load model {name!r}:\n  " + "\n  ".join(failures.values()))
            old = dict(self._models.get(name, {}))
            self._deferred.pop(name, None)
            for model in loaded:
                self._failures.pop((name, model.source.version), None)
                self._install(self._make_entry(model))
            keep = {model.source.version for model in loaded}
            retiring = [entry for version, entry in old.items() if entry.state is ModelState.READY]
            for entry in retiring:
                if entry.version in keep:
                    log.info(
                        "model %s version %s replaced; the old one finishes its queue", name, entry.version
                    )
                else:
                    self._models[name][entry.version] = entry  # stays listed while it drains
            await asyncio.gather(*(self._retire(entry, "unloaded") for entry in retiring))

    async def unload(self, name: str) -> None:
        """Stop serving every version of ``name``; queued and running requests are answered first."""
        async with self._lock(name):
            versions = self._models.get(name)
            if not versions:
                raise ModelNotFound(f"unknown model {name!r}")
            ready = [entry for entry in versions.values() if entry.state is ModelState.READY]
            await asyncio.gather(*(self._retire(entry, "unloaded") for entry in ready))

    def _lock(self, name: str) -> asyncio.Lock:
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = asyncio.Lock()
        return lock

    async def _retire(self, entry: ModelVersion, reason: str) -> None:
        entry.state = ModelState.UNLOADING
        entry.batcher.metrics.ready = False
        await entry.batcher.drain()
        entry.close()
        entry.state = ModelState.UNAVAILABLE
        entry.reason = reason

    def _install(self, entry: ModelVersion) -> None:
        self._models.setdefault(entry.name, {})[entry.version] = entry
        entry.batcher.metrics.ready = True

    def _make_entry(self, loaded: LoadedModel) -> ModelVersion:
        source = loaded.source
        config = source.config
        metrics = self._metrics.model(source.name, source.version)
        metrics.backend = config.backend
        metrics.execution_provider = loaded.backend.execution_provider
        metrics.load_s = loaded.load_s + loaded.warmup_s
        metrics.warmup_s = loaded.warmup_s
        limits = QueueLimits(
            max_queue_size=config.max_queue_size,
            max_concurrent_batches=config.max_concurrent_batches,
            prefetch_batches=config.prefetch_batches,
            queue_timeout_s=config.queue_timeout_millis / 1000 if config.queue_timeout_millis else None,
            # Python code may block: it never runs on the event loop
            inline_max_s=config.inline_max_us / 1e6 if config.backend == "onnxruntime" else 0.0,
        )
        executor = ThreadPoolExecutor(
            max_workers=min(64, limits.max_concurrent_batches + limits.prefetch_batches),
            thread_name_prefix=f"edgeinfer-{source.name}-{source.version}",
        )
        backend = loaded.backend
        if isinstance(backend, PipelineBackend):
            # a pipeline request mostly waits for its steps: many run at once, on the event loop
            limits = QueueLimits(
                max_queue_size=config.max_queue_size,
                max_concurrent_batches=max(config.max_concurrent_batches, 1024),
                queue_timeout_s=limits.queue_timeout_s,
            )
            if self.step_runner is not None:
                backend.bind(self.step_runner)
        runner = request_runner(backend)
        batcher = Batcher(
            name=f"{source.name!r} version {source.version}",
            run=backend.infer,
            policy=loaded.policy,
            limits=limits,
            executor=executor,
            metrics=metrics,
            run_requests=runner[0] if runner else None,
            async_requests=runner is not None and runner[1],
        )
        return ModelVersion(
            name=source.name,
            version=source.version,
            config=config,
            state=ModelState.READY,
            backend=loaded.backend,
            batcher=batcher,
            policy=loaded.policy,
            executor=executor,
            file_bytes=os.path.getsize(loaded.local_path) if loaded.local_path else 0,
        )

    def get(self, name: str, version: str | None = None) -> ModelVersion:
        """The version to serve: the named one, or the highest READY one. Raises if none can serve."""
        versions = self._models.get(name)
        if not versions:
            if name in self._deferred:
                raise ModelEvicted(f"model {name!r} is loaded on demand and not loaded yet")
            raise ModelNotFound(f"unknown model {name!r}")
        if version is None:
            ready = [entry for entry in versions.values() if entry.state is ModelState.READY]
            if not ready:
                if self.is_evicted(name):
                    raise ModelEvicted(f"model {name!r} was evicted to save memory")
                raise ModelNotReady(f"model {name!r} has no version ready to serve")
            return max(ready, key=lambda entry: version_key(entry.version))
        entry = versions.get(version)
        if entry is None:
            known = ", ".join(sorted(versions, key=version_key))
            raise ModelNotFound(f"model {name!r} has no version {version!r}; its versions are: {known}")
        if entry.state is ModelState.UNAVAILABLE and entry.reason == "evicted":
            raise ModelEvicted(f"model {name!r} version {version} was evicted to save memory")
        return entry

    def names(self) -> list[str]:
        return sorted(self._models)

    def versions(self, name: str) -> list[ModelVersion]:
        return sorted(self._models.get(name, {}).values(), key=lambda entry: version_key(entry.version))

    def index(self) -> list[IndexEntry]:
        """Every version known, with its state; failed loads appear as UNAVAILABLE with the reason."""
        entries = [
            IndexEntry(entry.name, entry.version, entry.state, entry.reason)
            for versions in self._models.values()
            for entry in versions.values()
        ]
        entries += [
            IndexEntry(source.name, source.version, ModelState.UNAVAILABLE, "evicted")
            for sources in self._deferred.values()
            for source in sources
        ]
        known = {(entry.name, entry.version) for entry in entries}
        entries += [
            IndexEntry(name, version, ModelState.LOADING, "")
            for name, version in self._loading
            if (name, version) not in known
        ]
        known |= self._loading
        entries += [
            IndexEntry(name, version, ModelState.UNAVAILABLE, reason)
            for (name, version), reason in self._failures.items()
            if (name, version) not in known
        ]
        return sorted(entries, key=lambda entry: (entry.name, version_key(entry.version)))

    async def close(self) -> None:
        """Answer what is queued, then free every model."""
        entries = [
            entry
            for versions in self._models.values()
            for entry in versions.values()
            if entry.state is ModelState.READY
        ]
        await asyncio.gather(*(self._retire(entry, "server stopped") for entry in entries))


async def _load_all(sources: list[ModelSource]) -> tuple[list[LoadedModel], dict[tuple[str, str], str]]:
    """Load sources concurrently in worker threads: (what loaded, reason per version that did not)."""
    loop = asyncio.get_running_loop()
    results = await asyncio.gather(
        *(loop.run_in_executor(None, load_model, source) for source in sources), return_exceptions=True
    )
    loaded: list[LoadedModel] = []
    failures: dict[tuple[str, str], str] = {}
    for source, result in zip(sources, results, strict=True):
        if isinstance(result, BaseException):
            failures[source.name, source.version] = (
                f"model {source.name!r} version {source.version} ({source.path}): {result}"
            )
        else:
            loaded.append(result)
    return loaded, failures
