"""``Registry``: the records of model versions and the only place their states change. Real ONNX Runtime
models (``tests.support.matmul_model``); what tests/integration/test_service.py already walks through
(the states of one load, reload, eviction and unload) is not asserted again here."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from edgeinfer.errors import ModelEvicted, ModelLoadError, ModelNotFound, ModelNotReady
from edgeinfer.model_config import ModelConfig
from edgeinfer.repository.registry import ModelState, Registry, version_key
from edgeinfer.repository.sources import ModelSource
from edgeinfer.runners import Work
from tests.core import build_core
from tests.support import matmul_model

T = TypeVar("T")


def run(test: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(test())


def source(path: Path, name: str = "m", version: str = "1", **config: object) -> ModelSource:
    return ModelSource(name, version, str(path), ModelConfig(**config))


def registry() -> Registry:
    return build_core().service.registry


def broken(tmp_path: Path) -> Path:
    path = tmp_path / "broken.onnx"
    path.write_bytes(b"not a model")
    return path


def test_a_failed_start_up_load_names_every_failing_version_and_installs_the_rest(tmp_path: Path):
    good, bad = matmul_model(tmp_path / "good.onnx"), broken(tmp_path)

    async def main() -> None:
        models = registry()
        with pytest.raises(ModelLoadError, match="cannot load every model") as raised:
            await models.load([source(good, "a"), source(bad, "b"), source(bad, "c", version="3")])
        message = str(raised.value)
        assert "model 'b' version 1" in message
        assert "model 'c' version 3" in message
        assert str(bad) in message, "the failing file is named"
        assert "'a'" not in message
        states = {(e.name, e.version): e.state for e in models.index()}
        assert states == {
            ("a", "1"): ModelState.READY,
            ("b", "1"): ModelState.UNAVAILABLE,
            ("c", "3"): ModelState.UNAVAILABLE,
        }
        await models.close()

    run(main)


def test_a_failed_reload_keeps_the_very_serving_objects_of_the_versions_already_serving(tmp_path: Path):
    good, bad = matmul_model(tmp_path / "good.onnx"), broken(tmp_path)

    async def main() -> None:
        models = registry()
        await models.load([source(good)])
        [entry] = models.versions("m")
        serving = entry.serving
        with pytest.raises(ModelLoadError, match=r"cannot load model 'm'"):
            await models.reload("m", [source(good), source(bad, version="2")])
        assert entry.serving is serving, "all or nothing: the reloaded version 1 was not installed"
        assert entry.state is ModelState.READY
        assert models.get("m", "1") is entry
        assert models.get("m", "2").state is ModelState.UNAVAILABLE
        assert "broken.onnx" in models.get("m", "2").reason
        outputs = await serving.batcher.submit(Work({"X": np.ones((1, 16), np.float32)}, 1), "g")
        assert outputs["Y"].shape == (1, 16), "the kept version still serves"
        await models.close()

    run(main)


def test_reloading_a_serving_version_swaps_in_a_new_load_and_retires_the_old_one(tmp_path: Path):
    first = matmul_model(tmp_path / "first.onnx", seed=1)
    second = matmul_model(tmp_path / "second.onnx", seed=2)

    async def main() -> None:
        models = registry()
        await models.load([source(first)])
        entry = models.get("m", "1")
        old, recorder = entry.serving, entry.recorder
        await models.reload("m", [source(second, max_batch_size=4)])
        assert models.get("m", "1") is entry, "one record per version for as long as the server runs"
        assert entry.recorder is recorder, "statistics are cumulative over every load"
        assert entry.serving is not None
        assert entry.serving is not old
        assert entry.serving.policy.max_batch_size == 4, "the new config is in use"
        assert entry.config.max_batch_size == 4
        assert old is not None
        with pytest.raises(ModelNotReady, match="unloading"):
            old.batcher.submit(Work({"X": np.ones((1, 16), np.float32)}, 1), "g")
        await models.close()

    run(main)


def test_a_reload_retires_the_versions_it_no_longer_names(tmp_path: Path):
    path = matmul_model(tmp_path / "m.onnx")

    async def main() -> None:
        models = registry()
        await models.load([source(path, version="1"), source(path, version="2")])
        await models.reload("m", [source(path, version="2"), source(path, version="3")])
        states = [(e.version, e.state, e.reason) for e in models.versions("m")]
        assert states == [
            ("1", ModelState.UNAVAILABLE, "unloaded"),
            ("2", ModelState.READY, ""),
            ("3", ModelState.READY, ""),
        ]
        assert models.get("m", "1").serving is None, "a retired version holds no model"
        await models.close()

    run(main)


def test_versions_sort_numerically_above_named_ones_and_the_index_by_model_name(tmp_path: Path):
    assert sorted(["10", "b", "2", "a", "1"], key=version_key) == ["a", "b", "1", "2", "10"]
    path = matmul_model(tmp_path / "m.onnx")

    async def main() -> None:
        models = registry()
        models.defer([source(path, "z", "10"), source(path, "z", "9"), source(path, "a", "1")])
        assert models.names() == ["a", "z"]
        assert [(e.name, e.version) for e in models.index()] == [("a", "1"), ("z", "9"), ("z", "10")]
        assert models.knows("z")
        assert not models.knows("nope")
        assert list(models.entries("nope")) == []
        assert models.versions("nope") == []

    run(main)


def test_a_deferred_version_is_known_unloaded_and_shown_as_evicted(tmp_path: Path):
    path = matmul_model(tmp_path / "m.onnx")

    async def main() -> None:
        models = registry()
        models.defer([source(path, residency="on_demand")])
        [entry] = models.index()
        assert (entry.state, entry.serving) == (ModelState.DEFERRED, None)
        assert (entry.state.wire, entry.wire_reason) == ("UNAVAILABLE", "evicted")
        with pytest.raises(ModelEvicted, match="version 1 was evicted"):
            models.get("m", "1")
        assert models.gauges() == [], "a version that never loaded has no gauges"
        assert models.loaded() == []
        await models.load([source(path, residency="on_demand")])
        assert models.get("m", "1").state is ModelState.READY
        await models.close()

    run(main)


def test_get_names_the_known_versions_when_asked_for_another(tmp_path: Path):
    path = matmul_model(tmp_path / "m.onnx")

    async def main() -> None:
        models = registry()
        await models.load([source(path, version="2"), source(path, version="10")])
        with pytest.raises(ModelNotFound, match="has no version '3'; its versions are: 2, 10"):
            models.get("m", "3")
        with pytest.raises(ModelNotFound, match="unknown model 'other'"):
            models.get("other", "1")
        await models.close()

    run(main)


def test_eviction_frees_only_ready_versions_and_unknown_names_are_no_error(tmp_path: Path):
    good, bad = matmul_model(tmp_path / "good.onnx"), broken(tmp_path)

    async def main() -> None:
        models = registry()
        with pytest.raises(ModelLoadError):
            await models.load([source(good, version="1"), source(bad, version="2")])
        reason = models.get("m", "2").reason
        await models.evict("m")
        await models.evict("never-seen")
        assert [(e.version, e.state) for e in models.index()] == [
            ("1", ModelState.EVICTED),
            ("2", ModelState.UNAVAILABLE),
        ]
        assert models.get("m", "2").reason == reason, "a failure keeps its reason"
        assert models.loaded() == []

    run(main)


def test_gauges_describe_how_a_version_loaded_and_whether_it_serves_now(tmp_path: Path):
    path = matmul_model(tmp_path / "m.onnx")

    async def main() -> None:
        models = registry()
        await models.load([source(path)])
        [loaded] = models.gauges()
        assert (loaded.name, loaded.version, loaded.ready) == ("m", "1", True)
        assert loaded.file_bytes == os.path.getsize(path)
        assert loaded.backend == "onnxruntime"
        assert loaded.execution_provider == "CPUExecutionProvider"
        assert loaded.load_s >= loaded.warmup_s > 0, "the load time includes the warm-up"
        assert (loaded.queue_length, loaded.inflight) == (0, 0)
        await models.evict("m")
        [evicted] = models.gauges()
        assert (evicted.ready, evicted.file_bytes, evicted.load_s) == (False, 0, loaded.load_s)

    run(main)


def test_close_frees_every_loaded_version_with_the_reason_server_stopped(tmp_path: Path):
    path = matmul_model(tmp_path / "m.onnx")

    async def main() -> None:
        models = registry()
        await models.load([source(path, "a"), source(path, "b", "1"), source(path, "b", "2")])
        assert not models.working(), "nothing queued or running"
        await models.close()
        assert {(e.state, e.reason) for e in models.index()} == {(ModelState.UNAVAILABLE, "server stopped")}
        assert all(e.serving is None for e in models.index())

    run(main)
