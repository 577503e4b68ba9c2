"""Watching a model repository directory for new, changed and removed models.

Every ``interval_s`` the poller takes a fingerprint of each model directory (its config.yaml and every
version's model file: size and modification time) and compares it with the last one. A new or changed
model is handed to ``load`` and a removed one to ``unload`` (a remote repository's local mirror is
refreshed first, by ``refresh``) — the same calls the repository API makes,
so a reload swaps versions without failing requests either way. A failed load is logged and retried
only when the directory changes again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from edgeinfer.errors import EdgeInferError

log = logging.getLogger(__name__)

T = TypeVar("T")
Fingerprint = tuple[tuple[str, int, int], ...]


def fingerprint(model_dir: Path) -> Fingerprint:
    """What identifies a model directory's content, cheaply: names, sizes and mtimes of its files."""
    entries = []
    for path in sorted(model_dir.rglob("*")):
        if path.is_file():
            stat = path.stat()
            entries.append((str(path.relative_to(model_dir)), stat.st_size, stat.st_mtime_ns))
    return tuple(entries)


def snapshot(root: Path) -> dict[str, Fingerprint]:
    return {
        path.name: fingerprint(path)
        for path in sorted(root.iterdir())
        if path.is_dir() and not path.name.startswith(".")
    }


class RepositoryPoller:
    def __init__(
        self,
        root: Path,
        interval_s: float,
        load: Callable[[str], Awaitable[None]],
        unload: Callable[[str], Awaitable[None]],
        refresh: Callable[[], None] | None = None,
        in_thread: bool = True,
    ) -> None:
        """``in_thread`` False reads the repository on the event loop (a process that must stay free of
        threads, the supervisor of forked workers; a directory scan takes milliseconds)."""
        self.root = root
        self._in_thread = in_thread
        self._refresh = refresh
        self.interval_s = interval_s
        self._load = load
        self._unload = unload
        self._known: dict[str, Fingerprint] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Begin polling; what is in the repository now counts as already loaded."""
        self._known = snapshot(self.root)
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.poll_once()
            except OSError as exc:
                log.warning("cannot read the model repository %s: %s", self.root, exc)

    async def poll_once(self) -> None:
        if self._refresh is not None:  # a remote repository: bring the local mirror up to date first
            try:
                await self._blocking(self._refresh)
            except EdgeInferError as error:
                log.warning("repository: %s", error)
                return
        current = await self._blocking(lambda: snapshot(self.root))
        for name, print_now in current.items():
            if self._known.get(name) != print_now:
                log.info("repository: model %s is new or changed; loading it", name)
                await self._apply(self._load, name)
        for name in self._known.keys() - current.keys():
            log.info("repository: model %s was removed; unloading it", name)
            await self._apply(self._unload, name)
        self._known = current

    async def _blocking(self, work: Callable[[], T]) -> T:
        if self._in_thread:
            return await asyncio.get_running_loop().run_in_executor(None, work)
        return work()

    async def _apply(self, action: Callable[[str], Awaitable[None]], name: str) -> None:
        try:
            await action(name)
        except EdgeInferError as error:
            log.error("repository: %s", error)
