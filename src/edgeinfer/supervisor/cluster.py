"""``ClusterScope``: the whole server under a supervisor, as one ``Scope`` over its worker processes.

Every operation goes to each serving worker at once, over its link, under its own name (``_on_all``); a
reading operation's answers are merged by its own rule (``merge_indexes``, ``merge_statistics_answers``,
``merge_snapshots``), and a mutating one is kept in one replay log that a worker forked later (to
replace one that died) is brought up to date from before it serves. The canaries run here, on this
scope: one decision for every worker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeinfer.batching.stats import merge_statistics
from edgeinfer.control.local import CanaryHost, canaries_acting_on
from edgeinfer.control.scope import MUTATING
from edgeinfer.dashboard import RECENT_ERRORS
from edgeinfer.errors import EdgeInferError
from edgeinfer.exposition import exposition, sum_process_stats
from edgeinfer.metrics import Metrics, WorkerGauges, merge
from edgeinfer.model_config import CanaryConfig
from edgeinfer.process_stats import process_stats
from edgeinfer.supervisor.ipc import Channel

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Worker:
    """One worker process as the supervisor keeps it (``supervisor.py`` forks, watches and replaces it)."""

    index: int
    pid: int = 0
    channel: Channel | None = None
    started_at: float = 0.0
    ready: bool = False
    restarts: int = 0
    quick_failures: int = 0
    link_fd: int = -1  # the supervisor's end of its socket pair, as numbered when it was made
    serve: asyncio.Future[None] | None = field(default=None, repr=False)


class ClusterScope(CanaryHost):
    """``Scope`` over ``workers`` (the supervisor's list, read as it changes). ``own``: the supervisor's
    own metrics (its metrics port's and start-up responder's refusals), merged into every snapshot."""

    def __init__(
        self,
        workers: Sequence[Worker],
        own: Metrics,
        started_at: float,
        canaries: Mapping[str, CanaryConfig] | None = None,
        state_dir: Path | None = None,
    ) -> None:
        self._workers = workers
        self._own = own
        self._started_at = started_at
        # (family, model) -> (operation, arguments), in the order they were last done
        self._replay: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
        self._canaries = canaries_acting_on(self, canaries, state_dir) if canaries else None

    # ---- the fan-out ----

    def _serving(self) -> list[Worker]:
        return [worker for worker in self._workers if worker.ready and worker.channel is not None]

    async def _on_all(self, op: str, **args: Any) -> list[Any]:
        """``op`` on every serving worker at once; raises the first error any of them had."""
        results = await asyncio.gather(
            *(worker.channel.call(op, **args) for worker in self._serving() if worker.channel is not None),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results

    async def _answers(self, op: str) -> list[tuple[Worker, Any]]:
        """``op`` asked of every serving worker at once: (worker, answer) for each that answered (one
        that died meanwhile is left out: the rest of the server is still shown)."""
        workers = self._serving()
        answers = await asyncio.gather(
            *(worker.channel.call(op) for worker in workers if worker.channel is not None),
            return_exceptions=True,
        )
        return [
            (worker, answer)
            for worker, answer in zip(workers, answers, strict=True)
            if not isinstance(answer, BaseException)
        ]

    async def _change(self, op: str, name: str, **args: Any) -> None:
        """A mutating ``op`` on every serving worker, kept for the workers started later."""
        assert op in MUTATING
        family = "model" if op in ("load", "unload") else op
        self._replay.pop((family, name), None)  # the latest change goes last
        if not (op == "load" and args.get("override") is None):  # else a new worker reads it itself
            self._replay[(family, name)] = (op, {"name": name, **args})
        await self._on_all(op, name=name, **args)

    async def replay(self, worker: Worker) -> None:
        """Bring a worker that replaces one that died up to date, before it serves."""
        for op, args in list(self._replay.values()):
            await self._replay_one(worker, op, args)

    @staticmethod
    async def _replay_one(worker: Worker, op: str, args: dict[str, Any]) -> None:
        assert worker.channel is not None
        try:
            await worker.channel.call(op, **args)
        except EdgeInferError as error:  # as a worker that was there would have: the index shows it
            log.warning("worker %d: replaying %s of %s failed: %s", worker.index, op, args["name"], error)

    # ---- Scope ----

    async def load(self, name: str, override: dict[str, Any] | None = None) -> None:
        await self._change("load", name, override=override)

    async def unload(self, name: str) -> None:
        await self._change("unload", name)

    async def route(self, name: str, variants: list[dict[str, Any]] | None) -> None:
        await self._change("route", name, variants=variants)  # None: removed, the config's one too

    async def shadow(self, name: str, config: dict[str, Any] | None) -> None:
        await self._change("shadow", name, config=config)

    async def index(self) -> list[dict[str, str]]:
        return merge_indexes(await self._on_all("index"))

    async def statistics(self, name: str | None, version: str | None) -> dict[str, Any]:
        return merge_statistics_answers(await self._on_all("statistics", name=name, version=version))

    async def snapshot(self) -> dict[str, Any]:
        answers = [answer for _, answer in await self._answers("snapshot")]
        return merge_snapshots([{"metrics": self._own.snapshot(()), "process": process_stats()}, *answers])

    async def metrics(self) -> str:
        answers = await self._answers("snapshot")
        merged = merge_snapshots(
            [{"metrics": self._own.snapshot(()), "process": process_stats()}, *(a for _, a in answers)]
        )
        by_worker = {worker.index: answer["process"] for worker, answer in answers}
        gauges = [
            WorkerGauges(
                worker=worker.index,
                ready=worker.ready,
                restarts=worker.restarts,
                resident_memory_bytes=by_worker.get(worker.index, {}).get(
                    "process_resident_memory_bytes", 0.0
                ),
                cpu_seconds=by_worker.get(worker.index, {}).get("process_cpu_seconds_total", 0.0),
            )
            for worker in self._workers
        ]
        return exposition(merged["metrics"], merged["process"], gauges).decode()

    async def overview(self) -> dict[str, Any]:
        """Metrics merged, process figures summed, every worker's recent errors, oldest first."""
        answers = [answer for _, answer in await self._answers("overview")]
        merged = merge_snapshots([{"metrics": self._own.snapshot(()), "process": process_stats()}, *answers])
        errors = sorted((error for answer in answers for error in answer["errors"]), key=lambda e: e["time"])
        return {
            **merged,
            "errors": errors[-RECENT_ERRORS:],
            "workers": len(self._workers),
            "started_at": self._started_at,
        }


def merge_snapshots(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """``snapshot`` answers as one: metrics merged (``metrics.merge``), process figures summed."""
    return {
        "metrics": merge([answer["metrics"] for answer in answers]),
        "process": sum_process_stats([answer["process"] for answer in answers]),
    }


def merge_statistics_answers(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """``statistics`` answers as one: each version's statistics merged across workers."""
    per_version: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for answer in answers:
        for entry in answer["model_stats"]:
            per_version.setdefault((entry["name"], entry["version"]), []).append(entry)
    return {
        "model_stats": [
            {"name": name, "version": version, **merge_statistics(entries)}
            for (name, version), entries in per_version.items()
        ]
    }


def merge_indexes(indexes: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """The repository index of the whole server from each worker's: a version that serves on some
    workers and not on others is READY, its reason naming where it does not."""
    merged: dict[tuple[str, str], list[tuple[int, dict[str, str]]]] = {}
    for worker, index in enumerate(indexes):
        for entry in index:
            merged.setdefault((entry["name"], entry["version"]), []).append((worker, entry))
    result = []
    for (name, version), seen in merged.items():
        states = {entry["state"] for _, entry in seen}
        first = seen[0][1]
        if len(states) == 1 and len({entry["reason"] for _, entry in seen}) == 1:
            result.append(first)
            continue
        elsewhere = "; ".join(
            f"worker {worker}: {entry['state']}" + (f" ({entry['reason']})" if entry["reason"] else "")
            for worker, entry in seen
            if entry["state"] != "READY"
        )
        state = "READY" if "READY" in states else first["state"]
        result.append({"name": name, "version": version, "state": state, "reason": elsewhere})
    return result
