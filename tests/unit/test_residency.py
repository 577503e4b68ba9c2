"""``Residency``: least recently used eviction over ``max_loaded_models`` and ``memory_budget_mb``,
resident and busy models kept, one load shared by concurrent callers. The core is wired as the
composition root wires it (``build_core``), loading through the repository API's own path
(``LocalScope.load``); tests/e2e/test_residency.py covers the same through a server process."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

import edgeinfer
from edgeinfer.config import ResidencyConfig
from edgeinfer.head import RequestHead
from edgeinfer.model_config import ModelConfig
from edgeinfer.protocol.types import InferRequest
from edgeinfer.repository.registry import ModelState
from edgeinfer.repository.sources import ModelSource
from tests.core import Core, build_core
from tests.support import matmul_model

T = TypeVar("T")


class Gated(edgeinfer.Model):
    """y = x, answered once ``gate`` is set (zeros, the warm-up's, at once): a request that stays
    running for as long as the test wants."""

    inputs = [edgeinfer.TensorSpec("x", "FP32", (-1, 4))]
    outputs = [edgeinfer.TensorSpec("y", "FP32", (-1, 4))]

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def predict(self, requests: list[Any]) -> list[dict[str, np.ndarray]]:
        if any(request.inputs["x"].any() for request in requests):
            await self.gate.wait()
        return [{"y": request.inputs["x"]} for request in requests]


class Repository:
    """What ``discover`` finds: one ONNX version per name, ``lru`` unless configured otherwise (or a
    given source), counting every look."""

    def __init__(self, tmp_path: Path, **configs: dict[str, Any]) -> None:
        self.path = matmul_model(tmp_path / "m.onnx")
        self.configs = configs
        self.given: dict[str, ModelSource] = {}
        self.looked: list[str] = []

    def discover(self, name: str, override: dict | None) -> list[ModelSource]:
        self.looked.append(name)
        if name in self.given:
            return [self.given[name]]
        config = ModelConfig(**{"residency": "lru", **self.configs.get(name, {})})
        return [ModelSource(name, "1", str(self.path), config)]


def run(test: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(test())


def core(repository: Repository, **limits: Any) -> Core:
    built = build_core(repository.discover)
    built.service.residency.limits = ResidencyConfig(**limits)
    return built


def loaded(built: Core) -> list[str]:
    return sorted({entry.name for entry in built.service.registry.loaded()})


def states(built: Core) -> dict[str, ModelState]:
    return {entry.name: entry.state for entry in built.service.registry.index()}


async def infer(built: Core, name: str) -> None:
    call = built.service.call(RequestHead("test", name, None))
    await call.submit(InferRequest({"X": np.ones((1, 16), np.float32)}))
    call.respond(lambda response: response)


def test_loading_past_max_loaded_models_evicts_the_least_recently_used(tmp_path: Path):
    repository = Repository(tmp_path)

    async def main() -> None:
        built = core(repository, max_loaded_models=2)
        for name in ("a", "b", "c"):
            await built.scope.load(name)
        assert loaded(built) == ["b", "c"]
        assert states(built)["a"] is ModelState.EVICTED
        await infer(built, "b")  # b is used after c loaded: c is now the least recently used
        await infer(built, "a")  # evicted: loads again on its request, and evicts c
        assert loaded(built) == ["a", "b"]
        assert states(built)["c"] is ModelState.EVICTED
        assert repository.looked == ["a", "b", "c", "a"]
        await built.service.registry.close()

    run(main)


def test_the_memory_budget_counts_model_files_times_the_memory_factor(tmp_path: Path):
    repository = Repository(tmp_path)
    two_models_mb = 2.5 * 2 * os.path.getsize(repository.path) / 2**20  # memory_factor 2: room for two

    async def main() -> None:
        built = core(repository, memory_budget_mb=two_models_mb)
        for name in ("a", "b", "c"):
            await built.scope.load(name)
        assert loaded(built) == ["b", "c"]
        built.service.residency.limits = ResidencyConfig(memory_budget_mb=two_models_mb, memory_factor=1)
        await built.scope.load("a")
        assert loaded(built) == ["a", "b", "c"], "at factor 1, three fit in the same budget"
        await built.service.registry.close()

    run(main)


def test_a_resident_model_is_never_evicted_even_over_the_limits(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    repository = Repository(tmp_path, a={"residency": "resident"})

    async def main() -> None:
        built = core(repository, max_loaded_models=1)
        with caplog.at_level(logging.WARNING, logger="edgeinfer.repository.residency"):
            await built.scope.load("a")
            await built.scope.load("b")  # over the limit: a is resident, b was just loaded (kept)
        assert loaded(built) == ["a", "b"]
        assert "every loaded model is resident or busy" in caplog.text
        await built.scope.load("c")
        assert loaded(built) == ["a", "c"], "the one lru model that is not the new one goes"
        assert states(built)["b"] is ModelState.EVICTED
        await built.service.registry.close()

    run(main)


def test_a_model_with_a_request_running_is_not_evicted_however_long_unused(tmp_path: Path):
    repository = Repository(tmp_path)
    model = Gated()
    config = ModelConfig(backend="python", model_class="tests.unit.test_residency:Gated", residency="lru")
    repository.given["busy"] = ModelSource("busy", "1", "", config, instance=model)

    async def main() -> None:
        built = core(repository, max_loaded_models=2)
        await built.scope.load("busy")
        call = built.service.call(RequestHead("test", "busy", None))
        running = call.submit(InferRequest({"x": np.ones((1, 4), np.float32)}))
        await built.scope.load("a")
        await built.scope.load("b")  # busy is the least recently used, but its request still runs
        assert loaded(built) == ["b", "busy"]
        assert states(built)["a"] is ModelState.EVICTED
        assert not running.done()
        model.gate.set()
        outputs = await running
        np.testing.assert_array_equal(outputs["y"], np.ones((1, 4), np.float32))
        call.respond(lambda response: response)
        await built.service.residency.enforce()
        assert loaded(built) == ["b", "busy"], "within the limits again: nothing more goes"
        await built.scope.load("c")
        assert loaded(built) == ["b", "c"], "no longer busy, and now the least recently used"
        await built.service.registry.close()

    run(main)


def test_callers_loading_the_same_evicted_model_at_once_share_one_load(tmp_path: Path):
    repository = Repository(tmp_path)

    async def main() -> None:
        built = core(repository, max_loaded_models=1)
        residency = built.service.residency
        await built.scope.load("a")
        await built.scope.load("b")
        assert states(built)["a"] is ModelState.EVICTED
        first, second = residency.load_evicted("a"), residency.load_evicted("a")
        assert first is second
        await asyncio.gather(*(infer(built, "a") for _ in range(5)), first)
        assert repository.looked == ["a", "b", "a"], "one load for every caller"
        assert loaded(built) == ["a"]
        again = residency.load_evicted("b")
        assert again is not first, "a finished load is not shared with later callers"
        await again
        assert repository.looked == ["a", "b", "a", "b"]
        await built.service.registry.close()

    run(main)
