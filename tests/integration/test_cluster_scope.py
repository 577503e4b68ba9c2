"""The whole server as one scope over workers: ``ClusterScope`` over real links (``ipc.Channel`` on
socket pairs) to real cores (``LocalScope`` over ONNX Runtime sessions), in one process and event loop.
The fan-out, the merge rule of each reading operation, the replay log a later worker is brought up to
date from, and a worker's ``remote_scope`` forwarding each operation by name."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.control.scope import OPERATIONS
from edgeinfer.errors import ModelNotFound
from edgeinfer.head import RequestHead
from edgeinfer.metrics import Metrics
from edgeinfer.model_config import ModelConfig
from edgeinfer.protocol.types import InferRequest
from edgeinfer.repository.sources import ModelSource
from edgeinfer.supervisor.cluster import ClusterScope, Worker, merge_indexes
from edgeinfer.supervisor.ipc import Channel
from edgeinfer.supervisor.worker import remote_scope
from tests.core import Core, build_core
from tests.support import matmul_model


class Linked:
    """Workers, each a core answering the supervisor's calls with its own scope over a socket pair."""

    def __init__(self, sources: dict[str, list[ModelSource]]) -> None:
        self.sources = sources
        self.workers: list[Worker] = []
        self.cores: list[Core] = []
        self.cluster = ClusterScope(self.workers, Metrics(), 1000.0)
        self._worker_ends: list[Channel] = []

    async def add(self, ready: bool = True) -> Core:
        core = build_core(lambda name, override: self._discovered(name, override))
        ours, theirs = socket.socketpair()
        worker_end = Channel(theirs, {op: getattr(core.scope, op) for op in OPERATIONS})
        await worker_end.start()
        self._worker_ends.append(worker_end)
        channel = Channel(ours, {op: getattr(self.cluster, op) for op in OPERATIONS})
        await channel.start()
        self.workers.append(Worker(len(self.workers), channel=channel, ready=ready))
        self.cores.append(core)
        return core

    def _discovered(self, name: str, override: dict | None) -> list[ModelSource]:
        if name not in self.sources:
            raise ModelNotFound(f"no model named {name!r} in the repository")
        keys = override or {}
        return [
            ModelSource(s.name, s.version, s.path, s.config.model_copy(update=keys))
            for s in self.sources[name]
        ]

    async def close(self) -> None:
        for worker in self.workers:
            assert worker.channel is not None
            await worker.channel.close()
        for end in self._worker_ends:
            await end.close()
        for core in self.cores:
            await core.service.registry.close()


def run(scenario) -> None:
    asyncio.run(scenario())


def linked_run(sources: dict[str, list[ModelSource]], scenario) -> None:
    async def main() -> None:
        linked = Linked(sources)
        try:
            await scenario(linked)
        finally:
            await linked.close()

    asyncio.run(main())


def test_a_load_reaches_every_worker_and_readings_are_merged(tmp_path: Path):
    path = matmul_model(tmp_path / "m.onnx")

    async def scenario() -> None:
        linked = Linked({"m": [ModelSource("m", "1", str(path), ModelConfig(max_batch_size=4))]})
        first, second = await linked.add(), await linked.add()
        await linked.cluster.load("m")
        assert [core.service.router.pick("m").version for core in (first, second)] == ["1", "1"]
        for core, rows in ((first, 1), (second, 3)):
            call = core.service.call(RequestHead("test", "m", None))
            await call.submit(InferRequest({"X": np.ones((rows, 16), np.float32)}))
            call.respond(lambda response: None)
        [stats] = (await linked.cluster.statistics("m", "1"))["model_stats"]
        assert (stats["inference_count"], stats["execution_count"]) == (4, 2), "summed over workers"
        snapshot = (await linked.cluster.snapshot())["metrics"]
        assert snapshot["models"]["m\x001"]["requests"] == [["test", "success", 2]]
        overview = await linked.cluster.overview()
        assert (overview["workers"], overview["started_at"]) == (2, 1000.0)
        text = await linked.cluster.metrics()
        assert 'edgeinfer_worker_ready{worker="1"} 1.0' in text
        await linked.cluster.unload("m")
        [entry] = await linked.cluster.index()
        assert (entry["state"], entry["reason"]) == ("UNAVAILABLE", "unloaded")
        with pytest.raises(ModelNotFound, match="unknown model 'nope'"):
            await linked.cluster.statistics("nope", None)  # a worker's error, raised as itself
        await linked.close()

    run(scenario)


def test_a_worker_started_later_gets_the_changes_replayed_in_their_order(tmp_path: Path):
    path = matmul_model(tmp_path / "m.onnx")

    async def scenario(linked: Linked) -> None:
        await linked.add()
        await linked.cluster.load("m", {"max_batch_size": 4})
        await linked.cluster.route("m", [{"version": "1", "weight": 1}])
        await linked.cluster.shadow("m", {"version": "1", "share": 0.5})
        await linked.cluster.shadow("m", None)  # removed: the latest change is what a new worker gets
        late = await linked.add(ready=False)
        with pytest.raises(ModelNotFound):
            late.service.router.pick("m")
        await linked.cluster.replay(linked.workers[-1])
        entry = late.service.router.pick("m")
        assert entry.serving is not None
        assert entry.serving.policy.max_batch_size == 4, "the override too"
        assert late.control.routes() == linked.cores[0].control.routes() != {}
        assert late.control.shadow_configs() == {}

    linked_run({"m": [ModelSource("m", "1", str(path), ModelConfig())]}, scenario)


def test_a_load_without_an_override_replays_nothing_not_even_an_unload_before_it(tmp_path: Path):
    path = matmul_model(tmp_path / "m.onnx")
    sources = [ModelSource("m", "1", str(path), ModelConfig())]

    async def scenario(linked: Linked) -> None:
        await linked.add()
        await linked.cluster.load("m", {"max_batch_size": 4})
        await linked.cluster.unload("m")
        await linked.cluster.load("m")  # what the repository says: a new worker reads it itself
        late = await linked.add(ready=False)
        await late.service.registry.load(sources)  # as its start-up does
        await linked.cluster.replay(linked.workers[-1])
        entry = late.service.router.pick("m")
        assert entry.serving is not None, "not unloaded"
        assert entry.serving.policy.max_batch_size != 4, "no override"
        with pytest.raises(ModelNotFound, match="no model named 'gone'"):
            await linked.cluster.load("gone")

    linked_run({"m": sources}, scenario)


def test_a_workers_remote_scope_forwards_each_operation_by_name(tmp_path: Path):
    path = matmul_model(tmp_path / "m.onnx")

    async def scenario() -> None:
        linked = Linked({"m": [ModelSource("m", "1", str(path), ModelConfig())]})
        await linked.add()
        await linked.add()
        # a worker's view of the whole server: its link to the supervisor, whose handlers are the cluster's
        ours, theirs = socket.socketpair()
        supervisor_end = Channel(theirs, {op: getattr(linked.cluster, op) for op in OPERATIONS})
        worker_end = Channel(ours, {})
        await supervisor_end.start()
        await worker_end.start()
        remote = remote_scope(worker_end)
        await remote.load("m")  # positional arguments are sent by their names
        assert [entry["state"] for entry in await remote.index()] == ["READY"]
        assert all(core.service.router.pick("m").version == "1" for core in linked.cores)
        assert await remote.canaries() == {}
        with pytest.raises(ModelNotFound, match="has no canary"):
            await remote.canary("m", "start")
        await worker_end.close()
        await supervisor_end.close()
        await linked.close()

    run(scenario)


@pytest.mark.parametrize(
    ("indexes", "merged"),
    [
        (
            [[{"name": "m", "version": "1", "state": "READY", "reason": ""}]] * 2,
            [{"name": "m", "version": "1", "state": "READY", "reason": ""}],
        ),
        (
            [
                [{"name": "m", "version": "1", "state": "READY", "reason": ""}],
                [{"name": "m", "version": "1", "state": "UNAVAILABLE", "reason": "evicted"}],
            ],
            [{"name": "m", "version": "1", "state": "READY", "reason": "worker 1: UNAVAILABLE (evicted)"}],
        ),
        (
            [
                [{"name": "m", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}],
                [{"name": "m", "version": "1", "state": "UNAVAILABLE", "reason": "evicted"}],
            ],
            [
                {
                    "name": "m",
                    "version": "1",
                    "state": "UNAVAILABLE",
                    "reason": "worker 0: UNAVAILABLE (unloaded); worker 1: UNAVAILABLE (evicted)",
                }
            ],
        ),
    ],
)
def test_a_version_serving_somewhere_is_ready_with_where_it_is_not(indexes, merged):
    assert merge_indexes(indexes) == merged
