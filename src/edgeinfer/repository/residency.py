"""Keeping loaded models within limits on a small box: LRU eviction, loading on demand, idle unloading.

* ``resident`` models are always loaded and never evicted.
* ``lru`` models are loaded at start-up; when a load puts the server over ``max_loaded_models`` or
  ``memory_budget_mb``, the least recently used ``lru``/``on_demand`` model with nothing queued or
  running is evicted (repeatedly, until within limits).
* ``on_demand`` models load on their first request and unload after ``idle_unload_s`` without one.

An evicted model stays listed (UNAVAILABLE, reason ``evicted``) and its next request loads it again;
concurrent first requests share one load. Loading goes through the same path as the repository API.
With ``workers: N`` each worker keeps its own models within the limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from edgeinfer.config import ResidencyConfig
from edgeinfer.repository.registry import ModelVersion, Registry

log = logging.getLogger(__name__)

IDLE_CHECK_S = 1.0


class Residency:
    def __init__(
        self, registry: Registry, limits: ResidencyConfig, load: Callable[[str], Awaitable[None]]
    ) -> None:
        self.registry = registry
        self.limits = limits
        self._load = load
        self._last_used: dict[str, float] = {}
        self._loading: dict[str, asyncio.Task[None]] = {}
        self._idle_task: asyncio.Task[None] | None = None

    def touch(self, name: str) -> None:
        """``name`` was just loaded: it is the last to be evicted. (Requests are seen by the batchers.)"""
        self._last_used[name] = time.monotonic()

    def _used_at(self, entry: ModelVersion) -> float:
        """When ``entry``'s model was last used: loaded, or sent a request."""
        loaded = self._last_used.get(entry.name, 0.0)
        return max(loaded, entry.serving.batcher.last_submit) if entry.serving is not None else loaded

    def load_evicted(self, name: str) -> asyncio.Task[None]:
        """Load an evicted (or not yet loaded on-demand) model; callers at the same time share one load."""
        task = self._loading.get(name)
        if task is None or task.done():
            task = asyncio.ensure_future(self._load_within_limits(name))
            self._loading[name] = task
        return task

    async def _load_within_limits(self, name: str) -> None:
        self.touch(name)
        await self._load(name)  # the service's load, which keeps the limits

    async def enforce(self, keep: str | None = None) -> None:
        """Evict least recently used models until the limits hold (``keep`` is never chosen)."""
        while self._over_limits():
            candidates = [
                entry
                for entry in self.registry.loaded()
                if entry.config.residency != "resident" and entry.name != keep and not _busy(entry)
            ]
            if not candidates:
                log.warning("over the residency limits, but every loaded model is resident or busy")
                return
            victim = min(candidates, key=self._used_at)
            log.info(
                "evicting model %s (least recently used) to stay within the residency limits", victim.name
            )
            await self.registry.evict(victim.name)

    def _over_limits(self) -> bool:
        loaded = self.registry.loaded()
        limits = self.limits
        if (
            limits.max_loaded_models is not None
            and len({entry.name for entry in loaded}) > limits.max_loaded_models
        ):
            return True
        if limits.memory_budget_mb is not None:
            used = sum(_estimate_bytes(entry, limits.memory_factor) for entry in loaded)
            return used > limits.memory_budget_mb * 2**20
        return False

    def start(self) -> None:
        self._idle_task = asyncio.ensure_future(self._unload_idle())

    async def stop(self) -> None:
        if self._idle_task is not None:
            self._idle_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._idle_task

    async def _unload_idle(self) -> None:
        while True:
            await asyncio.sleep(IDLE_CHECK_S)
            now = time.monotonic()
            for entry in self.registry.loaded():
                idle_s = entry.config.idle_unload_s
                if entry.config.residency != "on_demand" or idle_s is None or _busy(entry):
                    continue
                if now - self._used_at(entry) >= idle_s:
                    log.info("unloading model %s after %.0f s without requests", entry.name, idle_s)
                    await self.registry.evict(entry.name)


def _busy(entry: ModelVersion) -> bool:
    return entry.serving is not None and entry.serving.batcher.outstanding > 0


def _estimate_bytes(entry: ModelVersion, factor: float) -> float:
    return (entry.serving.file_bytes if entry.serving else 0) * factor
