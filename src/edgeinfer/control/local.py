"""``LocalScope``: the server-wide operations done in this process, on its registry, router and shadows.

It is the whole server when the process serves alone, and one worker's part of it under a supervisor
(``supervisor/cluster.py`` merges the parts). Only the scope that is the whole server runs the canaries.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from edgeinfer import afterwards
from edgeinfer.canary import Canaries, stable_version
from edgeinfer.control.parsing import parse_route, parse_shadow
from edgeinfer.control.scope import Scope
from edgeinfer.dashboard import ErrorEntry, listed
from edgeinfer.errors import ConfigError, InvalidInput, ModelNotFound
from edgeinfer.metrics import Metrics, Snapshot
from edgeinfer.model_config import CanaryConfig
from edgeinfer.process_stats import process_stats
from edgeinfer.repository.registry import ModelVersion, Registry
from edgeinfer.repository.residency import Residency
from edgeinfer.repository.router import Router
from edgeinfer.repository.sources import ModelSource
from edgeinfer.shadow import Shadows


class CanaryHost:
    """The canary operations of a scope that may run the canaries (the whole server's: this process
    alone, or the supervisor), and their start and stop."""

    _canaries: Canaries | None

    async def start(self) -> None:
        """Once the models are loaded (every worker serves): resume or start the canaries."""
        if self._canaries is not None:
            await self._canaries.start()

    async def stop(self) -> None:
        if self._canaries is not None:
            await self._canaries.stop()

    async def canaries(self) -> dict[str, Any]:
        return self._canaries.states() if self._canaries is not None else {}

    async def canary(self, name: str, action: str) -> dict[str, Any]:
        if self._canaries is None:
            raise ModelNotFound(f"model {name!r} has no canary (canaries.{name} in the config)")
        return await self._canaries.act(name, action)


class LocalScope(CanaryHost):
    """``Scope`` over this process's core. ``discover(name, override)`` reads one model's versions from
    the repository (blocking I/O: run off the event loop); ``errors`` is the ring the service records
    failed requests in."""

    def __init__(
        self,
        registry: Registry,
        router: Router,
        residency: Residency,
        shadows: Shadows,
        metrics: Metrics,
        discover: Callable[[str, dict[str, Any] | None], list[ModelSource]],
        errors: deque[ErrorEntry],
        canaries: Mapping[str, CanaryConfig] | None = None,
        state_dir: Path | None = None,
    ) -> None:
        self._registry = registry
        self._router = router
        self._residency = residency
        self._shadows = shadows
        self._metrics = metrics
        self._discover = discover
        self._errors = errors
        self._started_at = time.time()
        self._canaries = canaries_acting_on(self, canaries, state_dir) if canaries else None

    async def load(self, name: str, override: dict[str, Any] | None = None) -> None:
        loop = asyncio.get_running_loop()
        try:  # reading the repository (or a remote one) is blocking I/O: off the event loop
            sources = await loop.run_in_executor(None, self._discover, name, override)
        except ConfigError as error:
            raise InvalidInput(str(error)) from None
        await self._registry.reload(name, sources)
        self._residency.touch(name)
        await self._residency.enforce(keep=name)

    async def unload(self, name: str) -> None:
        await self._registry.unload(name)

    async def route(self, name: str, variants: list[dict[str, Any]] | None) -> None:
        self._router.set_route(name, parse_route(name, variants))

    async def shadow(self, name: str, config: dict[str, Any] | None) -> None:
        self._shadows.set(name, parse_shadow(name, config))

    async def index(self) -> list[dict[str, str]]:
        index = []
        for entry in self._registry.index():
            item = {
                "name": entry.name,
                "version": entry.version,
                "state": entry.state.wire,
                "reason": entry.wire_reason,
            }
            route = self._router.route(entry.name)
            if route is not None:  # HTTP shows it; gRPC's index message has no field for it
                item["route"] = route.summary()
            index.append(item)
        return index

    async def statistics(self, name: str | None, version: str | None) -> dict[str, Any]:
        afterwards.flush()  # every request answered so far is counted
        registry = self._registry
        if name is None:
            entries = registry.index()
        elif version is None:
            if not registry.knows(name):
                raise ModelNotFound(f"unknown model {name!r}")
            entries = registry.versions(name)
        else:
            entries = [registry.get(name, version)]
        return {
            "model_stats": [
                {
                    "name": entry.name,
                    "version": entry.version,
                    **entry.recorder.stats.as_dict(),
                    **_batch_cost(entry),
                }
                for entry in entries
            ]
        }

    async def snapshot(self) -> dict[str, Any]:
        return {"metrics": self.metrics_now(), "process": process_stats()}

    async def metrics(self) -> str:
        # a lazy import of prometheus-client, at the first scrape: a box never scraped saves 4.7 MiB
        from edgeinfer.exposition import exposition

        return exposition(self.metrics_now(), process_stats()).decode()

    async def overview(self) -> dict[str, Any]:
        return {
            "metrics": self.metrics_now(),
            "process": process_stats(),
            "errors": listed(self._errors),
            "workers": 1,
            "started_at": self._started_at,
        }

    def metrics_now(self) -> Snapshot:
        """This process's metrics, every request answered so far counted."""
        afterwards.flush()
        return self._metrics.snapshot(
            self._registry.gauges(), self._router.ladder_gauges(), self._registry.loop_lag_s
        )


def canaries_acting_on(scope: Scope, configs: Mapping[str, CanaryConfig], state_dir: Path | None) -> Canaries:
    """The canary controller of the scope that is the whole server: it reads that scope's metrics and
    index and sets its routes and shadows (one decision for every worker)."""

    async def snapshot() -> Snapshot:
        metrics: Snapshot = (await scope.snapshot())["metrics"]
        return metrics

    async def apply(name: str, route: Any, shadow: Any) -> None:
        await scope.route(name, route)
        await scope.shadow(name, shadow)

    async def stable_of(name: str, candidate: str) -> str:
        return stable_version(await scope.index(), name, candidate)

    assert state_dir is not None, "canaries keep their state in a directory"
    return Canaries(configs, state_dir, snapshot, apply, stable_of, scope.load)


def _batch_cost(entry: ModelVersion) -> dict[str, Any]:
    """The learned batch time ``per_batch + per_row x rows`` (adaptive batching decides on it), beside
    Triton's statistics: clients that read only Triton's fields ignore it."""
    if entry.serving is None:
        return {}
    cost = entry.serving.runner.cost
    return {
        "batch_cost": {
            "per_batch_ns": int(cost.per_batch_s * 1e9),
            "per_row_ns": int(cost.per_row_s * 1e9),
            "batches_observed": cost.observed,
            "drain_per_row_ns": int(entry.serving.batcher.drain_s_per_row * 1e9),  # admission reads it too
            "admission_margin_ns": int(entry.serving.batcher.slo_margin_s * 1e9),  # and adds this
        }
    }
