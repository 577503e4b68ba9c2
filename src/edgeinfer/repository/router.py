"""Which model version a request goes to.

Today's rule: the version the request names, else the highest READY version. The router is the one
place that rule lives, so weighted splits, canaries or fallbacks become rules here and nothing else
changes. It raises the errors the transports map: unknown model or version, evicted (load it first),
nothing ready.
"""

from __future__ import annotations

from edgeinfer.errors import ModelEvicted, ModelNotFound, ModelNotReady
from edgeinfer.protocol.types import InferRequest
from edgeinfer.repository.registry import ModelState, ModelVersion, Registry, version_key

_NOT_LOADED = (ModelState.EVICTED, ModelState.DEFERRED)


class Router:
    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    def pick(
        self, name: str, version: str | None = None, request: InferRequest | None = None
    ) -> ModelVersion:
        """The version to serve ``request`` (or to describe, without one)."""
        if version is not None:
            return self._registry.get(name, version)
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
