"""Which model version a request goes to.

The rule: the version the request names, else the highest READY version; and for a model with a
``fallback`` whose ladder has stepped down (``ladder.py``), a request that names no version goes to the
fallback model's highest READY version instead (while it has one). The router is the one place these
rules live, so weighted splits or canaries become rules here and nothing else changes. It raises the
errors the transports map: unknown model or version, evicted (load it first), nothing ready.
"""

from __future__ import annotations

import time

from edgeinfer.errors import EdgeInferError, ModelEvicted, ModelNotFound, ModelNotReady
from edgeinfer.metrics import LadderGauges
from edgeinfer.protocol.types import InferRequest
from edgeinfer.repository.ladder import Ladder
from edgeinfer.repository.registry import ModelState, ModelVersion, Registry, version_key

_NOT_LOADED = (ModelState.EVICTED, ModelState.DEFERRED)


class Router:
    def __init__(self, registry: Registry) -> None:
        self._registry = registry
        self._ladders: dict[str, Ladder] = {}

    def pick(
        self, name: str, version: str | None = None, request: InferRequest | None = None
    ) -> ModelVersion:
        """The version to serve ``request`` (or to describe, without one)."""
        if version is not None:
            return self._registry.get(name, version)
        best = self._highest_ready(name)
        if request is None:
            return best
        fallback = best.config.fallback
        if fallback is None:
            if self._ladders:  # a reload may have removed the fallback: its ladder goes too
                self._ladders.pop(name, None)
            return best
        ladder = self._ladders.get(name)
        if ladder is None or ladder.config is not fallback:  # first request, or the model was reloaded
            ladder = self._ladders[name] = Ladder(name, fallback)
        if not ladder.degraded(time.monotonic()):
            return best
        try:
            return self._highest_ready(ladder.fallback)
        except EdgeInferError:  # the fallback is not there (unknown, unloaded): the model itself answers
            return best

    def observe(self, name: str, seconds: float) -> None:
        """A request for ``name`` (by the name it asked for) was answered in ``seconds`` (``math.inf``:
        refused or timed out for load). Only models with a fallback keep it."""
        ladder = self._ladders.get(name)
        if ladder is not None:
            ladder.observe(time.monotonic(), seconds)

    def ladder_gauges(self) -> list[LadderGauges]:
        """Each ladder's state at scrape time (asking brings a ladder up to date without traffic)."""
        now = time.monotonic()
        gauges = []
        for name, ladder in self._ladders.items():
            degraded = ladder.degraded(now)
            gauges.append(
                LadderGauges(name, ladder.fallback, degraded, ladder.entered, ladder.exited, ladder.p95_s)
            )
        return gauges

    def _highest_ready(self, name: str) -> ModelVersion:
        versions = self._registry.entries(name)
        if not versions:
            raise ModelNotFound(f"unknown model {name!r}")
        best: ModelVersion | None = None
        for entry in versions:
            if entry.state is ModelState.READY and (
                best is None or version_key(entry.version) > version_key(best.version)
            ):
                best = entry
        if best is not None:
            return best
        if all(entry.state is ModelState.DEFERRED for entry in versions):
            raise ModelEvicted(f"model {name!r} is loaded on demand and not loaded yet")
        if all(entry.state in _NOT_LOADED for entry in versions):
            raise ModelEvicted(f"model {name!r} was evicted to save memory")
        raise ModelNotReady(f"model {name!r} has no version ready to serve")
