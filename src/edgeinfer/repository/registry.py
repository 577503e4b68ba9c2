"""Every model version the server knows, one record each, and the only place versions change state.

A record (``ModelVersion``) is created when a version is first seen and keeps its state for as long as
the server runs: LOADING while it loads, READY while it serves, UNLOADING while it drains, and then
UNAVAILABLE (unloaded, or failed with the reason), EVICTED (unloaded to save memory; its next request
loads it again) or DEFERRED (on demand, never loaded yet). Over the wire, EVICTED and DEFERRED are
Triton's UNAVAILABLE with the reason ``evicted``.

Reloading follows Triton's lifecycle: the new versions are loaded and warmed up while the old ones keep
serving; then new requests go to the new versions, the old ones finish what they had queued or running,
and only then are they freed. If loading fails, the old versions keep serving and the record shows the
failure and its reason.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field, replace

from edgeinfer.admission.admission import QueueLimits
from edgeinfer.admission.lag import LoopLag
from edgeinfer.backends import Backend, LoadContext
from edgeinfer.batching.batcher import Batcher, BatchSpans
from edgeinfer.batching.policy import BatchPolicy
from edgeinfer.batching.recorder import BatchRecorder
from edgeinfer.errors import ModelEvicted, ModelLoadError, ModelNotFound
from edgeinfer.metrics import Metrics, VersionGauges
from edgeinfer.model_config import ModelConfig
from edgeinfer.protocol.types import Parameters
from edgeinfer.repository.loader import LoadedModel, load_model, warm_up
from edgeinfer.repository.sources import ModelSource
from edgeinfer.runners import Runner, RunnerSettings

log = logging.getLogger(__name__)


class ModelState(str, enum.Enum):
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"
    EVICTED = "EVICTED"  # unloaded to stay within the residency limits
    DEFERRED = "DEFERRED"  # on demand: not loaded until its first request

    @property
    def wire(self) -> str:
        """The state as Triton's clients know it."""
        return "UNAVAILABLE" if self in (ModelState.EVICTED, ModelState.DEFERRED) else self.value


@dataclass(eq=False)
class Serving:
    """A loaded version wired for requests: backend, runner and batcher."""

    backend: Backend
    runner: Runner
    batcher: Batcher
    policy: BatchPolicy
    file_bytes: int
    load_s: float
    warmup_s: float
    output_parameters: dict[str, Parameters]

    async def retire(self) -> None:
        """Answer what is queued and running, then free the model."""
        await self.batcher.drain()
        await self.runner.close()
        self.backend.close()


@dataclass(eq=False)
class ModelVersion:
    """One version of one model, whatever its state. ``serving`` is set while READY or UNLOADING."""

    name: str
    version: str
    config: ModelConfig
    recorder: BatchRecorder  # statistics and metrics, cumulative over every load of this version
    state: ModelState = ModelState.LOADING
    reason: str = ""
    serving: Serving | None = field(default=None, repr=False)
    loaded_as: VersionGauges | None = None  # how it last loaded (provider, load time), for metrics

    @property
    def wire_reason(self) -> str:
        return "evicted" if self.state in (ModelState.EVICTED, ModelState.DEFERRED) else self.reason


_NONE: dict[str, ModelVersion] = {}


# Python 3.11 looks an enum member up slowly (0.2 us each here): the request path uses this tuple.
_NOT_LOADED = (ModelState.EVICTED, ModelState.DEFERRED)


def version_key(version: str) -> tuple[int, int, str]:
    """Numeric versions sort numerically and above any non-numeric ones."""
    return (1, int(version), "") if version.isdigit() else (0, 0, version)


class Registry:
    """Each version gets its own runner (worker threads, child processes) created when it loads, so a
    slow model cannot take the threads of a fast one. ``batch_spans(name, version)``, when tracing is
    on, gives each version's batcher where its batches become spans."""

    def __init__(
        self,
        metrics: Metrics,
        lag: LoopLag,
        context: LoadContext | None = None,
        batch_spans: Callable[[str, str], BatchSpans] | None = None,
    ) -> None:
        self._metrics = metrics
        self.lag = lag  # the event loop's, shared by every batcher (admission and batching read it)
        self._context = context or LoadContext()
        self._batch_spans = batch_spans
        self._models: dict[str, dict[str, ModelVersion]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    @property
    def loop_lag_s(self) -> float:
        """How far behind the event loop runs (measured while requests come; 0 when idle)."""
        return self.lag.lag_s

    # ---- changing state ----

    def defer(self, sources: Iterable[ModelSource]) -> None:
        """List models that load on their first request (residency: on_demand) without loading them."""
        for source in sources:
            self._record(source.name, source.version, source.config).state = ModelState.DEFERRED

    async def load(self, sources: Iterable[ModelSource]) -> None:
        """Start-up: load and warm up every source concurrently; any failure fails the whole call."""
        sources = list(sources)
        failures = await self._load_all(sources, replacing=False)
        if failures:
            raise ModelLoadError("cannot load every model:\n  " + "\n  ".join(failures))

    async def reload(self, name: str, sources: list[ModelSource]) -> None:
        """Serve exactly ``sources`` for model ``name``: load them, switch over, retire what they replace.

        Raises ModelLoadError (after recording it in the index) if any source fails; then nothing
        changes for the versions already serving.
        """
        async with self._lock(name):
            failures = await self._load_all(sources, replacing=True)
            if failures:
                raise ModelLoadError(f"cannot load model {name!r}:\n  " + "\n  ".join(failures))
            keep = {source.version for source in sources}
            leaving = [
                entry
                for entry in self._models.get(name, {}).values()
                if entry.version not in keep and entry.state is ModelState.READY
            ]
            await asyncio.gather(
                *(self._retire(entry, ModelState.UNAVAILABLE, "unloaded") for entry in leaving)
            )

    async def unload(self, name: str) -> None:
        """Stop serving every version of ``name``; queued and running requests are answered first."""
        async with self._lock(name):
            versions = self._models.get(name)
            if not versions:
                raise ModelNotFound(f"unknown model {name!r}")
            ready = [entry for entry in versions.values() if entry.state is ModelState.READY]
            await asyncio.gather(
                *(self._retire(entry, ModelState.UNAVAILABLE, "unloaded") for entry in ready)
            )

    async def evict(self, name: str) -> None:
        """Unload every version of ``name`` to free memory; it loads again on its next request."""
        async with self._lock(name):
            ready = [
                entry for entry in self._models.get(name, {}).values() if entry.state is ModelState.READY
            ]
            await asyncio.gather(*(self._retire(entry, ModelState.EVICTED, "evicted") for entry in ready))

    async def close(self) -> None:
        """Answer what is queued, then free every model."""
        await asyncio.gather(
            *(self._retire(entry, ModelState.UNAVAILABLE, "server stopped") for entry in self.loaded())
        )

    def _lock(self, name: str) -> asyncio.Lock:
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = asyncio.Lock()
        return lock

    def _record(self, name: str, version: str, config: ModelConfig) -> ModelVersion:
        versions = self._models.setdefault(name, {})
        entry = versions.get(version)
        if entry is None:
            recorder = BatchRecorder(self._metrics.model(name, version))
            entry = versions[version] = ModelVersion(name, version, config, recorder)
        return entry

    async def _load_all(self, sources: list[ModelSource], replacing: bool) -> list[str]:
        """Load ``sources`` concurrently and install what loaded; one reason per version that did not.

        With ``replacing``, nothing is installed unless every source loaded (a reload is all or nothing).
        """
        for source in sources:
            entry = self._record(source.name, source.version, source.config)
            # an evicted version stays EVICTED while it loads, so its requests wait for this load
            if entry.state not in (ModelState.READY, ModelState.EVICTED, ModelState.DEFERRED):
                entry.state, entry.reason = ModelState.LOADING, ""
        results = await asyncio.gather(*(self._prepare(source) for source in sources), return_exceptions=True)
        failures: list[str] = []
        for source, result in zip(sources, results, strict=True):
            if isinstance(result, BaseException):
                where = f" ({source.path})" if source.path else ""
                reason = f"model {source.name!r} version {source.version}{where}: {result}"
                failures.append(reason)
                entry = self._models[source.name][source.version]
                if entry.state is not ModelState.READY:
                    entry.state, entry.reason = ModelState.UNAVAILABLE, reason
        prepared = [(s, r) for s, r in zip(sources, results, strict=True) if isinstance(r, Serving)]
        if failures and replacing:
            await asyncio.gather(*(serving.retire() for _, serving in prepared))
            return failures
        replaced: list[Serving] = []
        for source, serving in prepared:
            entry = self._models[source.name][source.version]
            if entry.serving is not None and entry.state is ModelState.READY:
                log.info(
                    "model %s version %s replaced; the old one finishes its queue",
                    source.name,
                    source.version,
                )
                replaced.append(entry.serving)
            entry.config, entry.serving = source.config, serving
            entry.state, entry.reason = ModelState.READY, ""
            entry.loaded_as = VersionGauges(
                name=source.name,
                version=source.version,
                ready=True,
                load_s=serving.load_s + serving.warmup_s,
                warmup_s=serving.warmup_s,
                backend=source.config.backend,
                execution_provider=serving.backend.execution_provider,
                ep_coverage=tuple(serving.backend.ep_coverage.items()),
            )
        await asyncio.gather(*(serving.retire() for serving in replaced))
        return failures

    async def _prepare(self, source: ModelSource) -> Serving:
        """Load (in a worker thread), wire and warm up one version, without installing it."""
        loaded = await asyncio.get_running_loop().run_in_executor(None, load_model, source, self._context)
        serving = self._wire(loaded, self._models[source.name][source.version].recorder)
        try:
            report = await warm_up(
                serving.runner, loaded.backend, loaded.policy, source.config.warmup, source.name
            )
        except BaseException:
            await serving.retire()
            raise
        serving.warmup_s = report.seconds
        coverage = loaded.backend.ep_coverage
        log.info(
            "loaded model %s version %s on %s in %.0f ms (warmup %.0f ms: %d synthetic runs%s, %d samples), "
            "max_batch_size %d%s",
            source.name, source.version, loaded.backend.execution_provider, loaded.load_s * 1000,
            report.seconds * 1000, report.synthetic, f" of which {report.unwarmed} failed" if report.unwarmed
            else "", report.samples, loaded.policy.max_batch_size,
            "; nodes by provider: " + ", ".join(f"{p} {share:.0%}" for p, share in coverage.items())
            if coverage else "",
        )  # fmt: skip
        return serving

    def _wire(self, loaded: LoadedModel, recorder: BatchRecorder) -> Serving:
        source, config, backend = loaded.source, loaded.source.config, loaded.backend
        settings = RunnerSettings(
            name=f"{source.name}-{source.version}",
            concurrency=config.max_concurrent_batches,
            prefetch=config.batches_ahead,
            inline_max_s=config.inline_max_us / 1e6 if config.inline_max_us is not None else None,
            batching=loaded.policy.max_batch_size > 0,
        )
        runner = backend.runner(settings)
        limits = QueueLimits(
            max_queue_size=config.max_queue_size,
            queue_timeout_s=config.queue_timeout_ms / 1000 if config.queue_timeout_ms else None,
            slo_s=config.slo.target_s if config.slo is not None else None,
            slo_quantile=config.slo.quantile if config.slo is not None else 0.99,
        )
        batcher = Batcher(
            f"{source.name!r} version {source.version}",
            runner,
            loaded.policy,
            limits,
            recorder,
            self.lag,
            self._batch_spans(source.name, source.version) if self._batch_spans is not None else None,
        )
        return Serving(
            backend=backend,
            runner=runner,
            batcher=batcher,
            policy=loaded.policy,
            file_bytes=os.path.getsize(loaded.local_path) if loaded.local_path else 0,
            load_s=loaded.load_s,
            warmup_s=0.0,
            output_parameters={
                spec.name: {"content_type": spec.content_type}
                for spec in backend.outputs
                if spec.content_type
            },
        )

    async def _retire(self, entry: ModelVersion, state: ModelState, reason: str) -> None:
        serving = entry.serving
        entry.state = ModelState.UNLOADING
        if serving is not None:
            await serving.retire()
        entry.serving = None
        entry.state, entry.reason = state, reason

    # ---- reading ----

    def get(self, name: str, version: str) -> ModelVersion:
        """One named version, whatever its state. Raises if unknown, or evicted (so it loads again)."""
        versions = self._models.get(name)
        if not versions:
            raise ModelNotFound(f"unknown model {name!r}")
        entry = versions.get(version)
        if entry is None:
            known = ", ".join(sorted(versions, key=version_key))
            raise ModelNotFound(f"model {name!r} has no version {version!r}; its versions are: {known}")
        if entry.state in _NOT_LOADED:
            raise ModelEvicted(f"model {name!r} version {version} was evicted to save memory")
        return entry

    def knows(self, name: str) -> bool:
        return name in self._models

    def names(self) -> list[str]:
        return sorted(self._models)

    def entries(self, name: str) -> Collection[ModelVersion]:
        """The versions of ``name`` in no particular order (the request path's cheap view)."""
        return self._models.get(name, _NONE).values()

    def versions(self, name: str) -> list[ModelVersion]:
        return sorted(self._models.get(name, {}).values(), key=lambda entry: version_key(entry.version))

    def working(self) -> bool:
        """Whether any version has requests queued or running (in a worker thread, say)."""
        for versions in self._models.values():
            for entry in versions.values():
                serving = entry.serving
                if serving is not None and serving.batcher.outstanding:
                    return True
        return False

    def loaded(self) -> list[ModelVersion]:
        return [
            entry
            for versions in self._models.values()
            for entry in versions.values()
            if entry.state is ModelState.READY
        ]

    def index(self) -> list[ModelVersion]:
        """Every version known, sorted by name and version."""
        return [entry for name in self.names() for entry in self.versions(name)]

    def gauges(self) -> list[VersionGauges]:
        """The live state of every version that ever loaded, for a metrics scrape."""
        gauges = []
        for entry in self.index():
            if entry.loaded_as is None:
                continue
            serving = entry.serving
            gauges.append(
                replace(
                    entry.loaded_as,
                    ready=entry.state is ModelState.READY,
                    queue_length=serving.batcher.queue_length if serving else 0,
                    inflight=serving.batcher.outstanding if serving else 0,
                    cost_per_row_s=serving.runner.cost.per_row_s if serving else 0.0,
                    cost_per_batch_s=serving.runner.cost.per_batch_s if serving else 0.0,
                    drain_per_row_s=serving.batcher.drain_s_per_row if serving else 0.0,
                    admission_margin_s=serving.batcher.slo_margin_s if serving else 0.0,
                    file_bytes=serving.file_bytes if serving else 0,
                )
            )
        return gauges
