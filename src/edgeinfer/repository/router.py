"""Which model version a request goes to.

The rules, in order: the version the request names always wins; for a model with a ``fallback`` whose
ladder has stepped down (``ladder.py``), the fallback model's highest READY version (while it has one);
for a model name with a route (``routes.py``), the variant its routing key (or chance) picks, when that
variant can serve; else the highest READY version. The router is the one place these rules live. It
raises the errors the transports map: unknown model or version, evicted (load it first), nothing ready.
"""

from __future__ import annotations

import time

from edgeinfer.errors import EdgeInferError, ModelEvicted, ModelNotFound, ModelNotReady
from edgeinfer.metrics import LadderGauges
from edgeinfer.model_config import RouteVariant
from edgeinfer.repository.ladder import Ladder
from edgeinfer.repository.registry import ModelState, ModelVersion, Registry, version_key
from edgeinfer.repository.routes import Route

_NOT_LOADED = (ModelState.EVICTED, ModelState.DEFERRED)
# Python 3.11 looks an enum member up slowly (0.2 us each here): the request path uses plain names.
_READY, _DEFERRED = ModelState.READY, ModelState.DEFERRED


class Router:
    def __init__(self, registry: Registry, routes: dict[str, tuple[RouteVariant, ...]] | None = None) -> None:
        self._registry = registry
        self._ladders: dict[str, Ladder] = {}
        self._routes = {name: Route(name, variants) for name, variants in (routes or {}).items()}

    def set_route(self, name: str, variants: tuple[RouteVariant, ...] | None) -> None:
        """Replace (or with None, remove) the route of ``name``; effective for the next request."""
        if variants:
            self._routes[name] = Route(name, variants)
        else:
            self._routes.pop(name, None)

    def route(self, name: str) -> Route | None:
        return self._routes.get(name)

    def routes(self) -> dict[str, Route]:
        return dict(self._routes)

    def is_fallback(self, name: str, other: str) -> bool:
        """Whether ``other`` answers for ``name`` because ``name``'s ladder stepped down (else: a route)."""
        ladder = self._ladders.get(name)
        return ladder is not None and ladder.fallback == other and ladder.stepped_down

    def pick(self, name: str, version: str | None = None) -> ModelVersion:
        """The version a request for ``name`` (and ``version``) is described by: the one named, else
        the highest READY one."""
        if version is not None:
            return self._registry.get(name, version)
        return self._highest_ready(name)

    def serve(self, name: str, version: str | None, key: str | None) -> ModelVersion:
        """The version to serve a request: the one it names; else the fallback while the model's
        ladder is stepped down, else its route's variant for routing ``key``, else the highest READY."""
        if version is not None:
            return self._registry.get(name, version)
        best = self._highest_ready(name)
        fallback = best.config.fallback
        if fallback is None:
            self._forget_ladder(name)
            return self._routed(name, best, key) if self._routes else best
        ladder = self._ladders.get(name)
        if ladder is None or ladder.config is not fallback:  # first request, or the model was reloaded
            ladder = self._ladders[name] = Ladder(name, fallback)
        if not ladder.degraded(time.monotonic()):
            return self._routed(name, best, key) if self._routes else best
        try:
            return self._highest_ready(ladder.fallback)
        except EdgeInferError:  # the fallback is not there (unknown, unloaded): the model itself answers
            return best

    def settled(self, name: str, version: str | None = None) -> ModelVersion | None:
        """The version a request for ``name`` goes to whatever its body says: the version it names, or
        the highest READY one of a model with neither a route nor a fallback; None when its routing key
        or the ladder may send it elsewhere. Lets a request be judged before its body is decoded
        (``InferenceService.shed_unread``), and picked once."""
        if version is None and name in self._routes:
            return None
        entry = self.pick(name, version)
        if version is None:
            if entry.config.fallback is not None:
                return None
            self._forget_ladder(name)
        return entry

    def _forget_ladder(self, name: str) -> None:
        """A reload may have removed the model's fallback: its ladder goes too."""
        if self._ladders:
            self._ladders.pop(name, None)

    def _routed(self, name: str, best: ModelVersion, key: str | None) -> ModelVersion:
        """The variant of ``name``'s route for this request, or ``best`` when there is no route or the
        variant cannot serve now (not loaded, not ready): a route never fails a request."""
        route = self._routes.get(name)
        if route is None:
            return best
        variant = route.choose(key)
        if variant.model == name and variant.version in (None, best.version):
            return best
        try:
            if variant.version is None:
                return self._highest_ready(variant.model)
            entry = self._registry.get(variant.model, variant.version)
        except EdgeInferError:
            return best
        return entry if entry.state is _READY else best

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
            if entry.state is _READY and (
                best is None or version_key(entry.version) > version_key(best.version)
            ):
                best = entry
        if best is not None:
            return best
        if all(entry.state is _DEFERRED for entry in versions):
            raise ModelEvicted(f"model {name!r} is loaded on demand and not loaded yet")
        if all(entry.state in _NOT_LOADED for entry in versions):
            raise ModelEvicted(f"model {name!r} was evicted to save memory")
        raise ModelNotReady(f"model {name!r} has no version ready to serve")
