"""The loaded model versions, each with its state and batcher; requests are routed through here."""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Iterable
from concurrent.futures import Executor
from dataclasses import dataclass

from edgeinfer.backends import Backend
from edgeinfer.batching.batcher import Batcher, QueueLimits
from edgeinfer.batching.policy import BatchPolicy
from edgeinfer.config import ModelConfig
from edgeinfer.errors import ModelLoadError, ModelNotFound, ModelNotReady
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
    reason: str = ""


def version_key(version: str) -> tuple[int, int, str]:
    """Numeric versions sort numerically and above any non-numeric ones."""
    return (1, int(version), "") if version.isdigit() else (0, 0, version)


class Registry:
    def __init__(self, inference_executor: Executor, metrics: Metrics) -> None:
        self._executor = inference_executor
        self._metrics = metrics
        self._models: dict[str, dict[str, ModelVersion]] = {}

    async def load(self, sources: Iterable[ModelSource]) -> None:
        """Load and warm up every source concurrently; any failure fails the whole call."""
        loop = asyncio.get_running_loop()
        sources = list(sources)
        results = await asyncio.gather(
            *(loop.run_in_executor(None, load_model, source) for source in sources), return_exceptions=True
        )
        failures = []
        for source, result in zip(sources, results, strict=True):
            if isinstance(result, BaseException):
                failures.append(f"model {source.name!r} version {source.version} ({source.path}): {result}")
            else:
                self._add(result)
        if failures:
            raise ModelLoadError("cannot load every model:\n  " + "\n  ".join(failures))

    def _add(self, loaded: LoadedModel) -> None:
        source = loaded.source
        config = source.config
        metrics = self._metrics.model(source.name, source.version)
        metrics.backend = config.backend
        metrics.execution_provider = loaded.backend.execution_provider
        metrics.load_s = loaded.load_s + loaded.warmup_s
        metrics.ready = True
        batcher = Batcher(
            name=f"{source.name!r} version {source.version}",
            run=loaded.backend.infer,
            policy=loaded.policy,
            limits=QueueLimits(
                max_queue_size=config.max_queue_size,
                max_concurrent_batches=config.max_concurrent_batches,
                prefetch_batches=config.prefetch_batches,
                queue_timeout_s=config.queue_timeout_millis / 1000 if config.queue_timeout_millis else None,
                inline_max_s=config.inline_max_us / 1e6,
            ),
            executor=self._executor,
            metrics=metrics,
        )
        self._models.setdefault(source.name, {})[source.version] = ModelVersion(
            name=source.name,
            version=source.version,
            config=config,
            state=ModelState.READY,
            backend=loaded.backend,
            batcher=batcher,
            policy=loaded.policy,
        )

    def get(self, name: str, version: str | None = None) -> ModelVersion:
        """The version to serve: the named one, or the highest READY one. Raises if none can serve."""
        versions = self._models.get(name)
        if not versions:
            raise ModelNotFound(f"unknown model {name!r}")
        if version is None:
            ready = [entry for entry in versions.values() if entry.state is ModelState.READY]
            if not ready:
                raise ModelNotReady(f"model {name!r} has no version ready to serve")
            return max(ready, key=lambda entry: version_key(entry.version))
        entry = versions.get(version)
        if entry is None:
            known = ", ".join(sorted(versions, key=version_key))
            raise ModelNotFound(f"model {name!r} has no version {version!r}; its versions are: {known}")
        return entry

    def names(self) -> list[str]:
        return sorted(self._models)

    def versions(self, name: str) -> list[ModelVersion]:
        return sorted(self._models.get(name, {}).values(), key=lambda entry: version_key(entry.version))

    def all_ready(self) -> bool:
        return all(
            entry.state is ModelState.READY
            for versions in self._models.values()
            for entry in versions.values()
        )

    async def close(self) -> None:
        """Answer what is queued, then free every model."""
        entries = [entry for versions in self._models.values() for entry in versions.values()]
        for entry in entries:
            entry.state = ModelState.UNLOADING
        await asyncio.gather(*(entry.batcher.drain() for entry in entries))
        for entry in entries:
            entry.backend.close()
            entry.state = ModelState.UNAVAILABLE
            entry.reason = "server stopped"
            entry.batcher.metrics.ready = False
