"""``Scope``: every server-wide operation, declared once.

One process serving alone is its own scope (``LocalScope``). With ``workers: N`` the supervisor's
``ClusterScope`` runs each operation on every worker's ``LocalScope`` and merges what they answer, and
a worker reaches it through a scope that forwards each operation by name (``remote_scope``). Arguments
and results are JSON-able: they cross the supervisor link as they are.
"""

from __future__ import annotations

from typing import Any, Protocol


class Scope(Protocol):
    async def load(self, name: str, override: dict[str, Any] | None = None) -> None:
        """Load (or reload) every version of ``name`` from the repository; ``override`` replaces keys."""

    async def unload(self, name: str) -> None:
        """Stop serving ``name``; what is queued or running for it is answered first."""

    async def route(self, name: str, variants: list[dict[str, Any]] | None) -> None:
        """Set (or with None, remove) the weighted route of ``name``."""

    async def shadow(self, name: str, config: dict[str, Any] | None) -> None:
        """Set (or with None, remove) the shadow of ``name``."""

    async def canaries(self) -> dict[str, Any]:
        """Every canary's state."""

    async def canary(self, name: str, action: str) -> dict[str, Any]:
        """``start``, ``pause``, ``resume``, ``promote`` or ``abort`` the canary of ``name``."""

    async def index(self) -> list[dict[str, str]]:
        """Triton's repository index: one entry per version with its state and reason."""

    async def statistics(self, name: str | None, version: str | None) -> dict[str, Any]:
        """Triton's statistics: every version of every model, or one model (or version)."""

    async def snapshot(self) -> dict[str, Any]:
        """``{"metrics": metrics.Snapshot, "process": process figures}``."""

    async def metrics(self) -> str:
        """The Prometheus exposition (the body of ``GET /metrics``)."""

    async def overview(self) -> dict[str, Any]:
        """What the status page is made of: metrics, process figures, recent errors, workers, start."""


# the operations, in declaration order; each crosses the supervisor link under its own name
OPERATIONS: tuple[str, ...] = tuple(name for name in vars(Scope) if not name.startswith("_"))
# the operations that change what is served: a worker started later has them replayed
MUTATING: frozenset[str] = frozenset({"load", "unload", "route", "shadow"})
