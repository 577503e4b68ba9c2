"""``ControlPlane``: the one object the admin routes of both transports call.

It checks what the client sent, asks the scope that is the whole server (this process's, or the
supervisor's through the worker link) and shapes the answer; the listings of routes and shadows read
this process's router, which every worker keeps the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from edgeinfer import SERVER_NAME, __version__
from edgeinfer.control.parsing import parse_route, parse_shadow
from edgeinfer.control.scope import Scope
from edgeinfer.dashboard import Window, overview
from edgeinfer.repository.router import Router
from edgeinfer.shadow import Shadows


class ControlPlane:
    """``ready`` says whether the server is ready (the service's flag); ``memory_factor`` is the
    residency's estimate of a model's memory per byte of its file, for the status page."""

    def __init__(
        self,
        scope: Scope,
        router: Router,
        shadows: Shadows,
        ready: Callable[[], bool],
        memory_factor: float,
    ) -> None:
        self.scope = scope
        self._router = router
        self._shadows = shadows
        self._ready = ready
        self._memory_factor = memory_factor
        self._window = Window()

    async def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Triton's repository index, every version or (``ready_only``) the ready ones."""
        index = await self.scope.index()
        return [entry for entry in index if not ready_only or entry["state"] == "READY"]

    async def model_index(self) -> list[dict[str, Any]]:
        """Every model with each version's state (the ``/v1/models`` listing)."""
        models: dict[str, list[dict[str, str]]] = {}
        for entry in await self.scope.index():
            models.setdefault(entry["name"], []).append(
                {"version": entry["version"], "state": entry["state"], "reason": entry["reason"]}
            )
        return [{"name": name, "versions": versions} for name, versions in models.items()]

    async def load_model(self, name: str, override: dict[str, Any] | None = None) -> None:
        """Load (or reload) every version of ``name``: the versions serving now keep serving until the
        new ones are warmed up, and if loading fails they keep serving and the index shows why. With
        workers, every worker has done so when this returns."""
        await self.scope.load(name, override)

    async def unload_model(self, name: str) -> None:
        await self.scope.unload(name)

    async def model_statistics(self, name: str | None, version: str | None) -> dict[str, Any]:
        return await self.scope.statistics(name, version)

    async def metrics_exposition(self) -> bytes:
        """The body of ``GET /metrics``."""
        return (await self.scope.metrics()).encode()

    async def set_route(self, name: str, variants: Any) -> None:
        """Replace (or with None or [], remove) the weighted route of ``name`` until restart (the
        config's comes back then). ``variants`` as the client sent them: anything else than a list of
        variants is refused before any worker sees it."""
        parse_route(name, variants)
        await self.scope.route(name, variants)

    def routes(self) -> dict[str, Any]:
        return {name: route.describe() for name, route in self._router.routes().items()}

    async def set_shadow(self, name: str, config: dict[str, Any] | None) -> None:
        """Replace (or with None, remove) the shadow of ``name``."""
        parse_shadow(name, config)
        await self.scope.shadow(name, config)

    def shadow_configs(self) -> dict[str, Any]:
        return {
            name: config.model_dump(exclude_none=True) for name, config in self._shadows.configs().items()
        }

    async def canary_states(self) -> dict[str, Any]:
        return await self.scope.canaries()

    async def canary_action(self, name: str, action: str) -> dict[str, Any]:
        return await self.scope.canary(name, action)

    async def overview(self) -> dict[str, Any]:
        """``GET /v2/ui/state``: the whole server now (``dashboard.py``)."""
        data = await self.scope.overview()
        rollouts = {
            "routes": self.routes(),
            "shadows": self.shadow_configs(),
            "canaries": await self.scope.canaries(),
        }
        server = {
            "name": SERVER_NAME,
            "version": __version__,
            "ready": self._ready(),
            "uptime_s": time.time() - data["started_at"],
            "workers": data["workers"],
        }
        return overview(
            time.monotonic(),
            data["metrics"],
            data["process"],
            self._window,
            await self.repository_index(),
            server,
            data["errors"],
            rollouts,
            self._memory_factor * data["workers"],
        )
