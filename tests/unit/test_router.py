"""``Router``: which version a request goes to. The named version wins; then the fallback while the
ladder is stepped down; then the route's variant for the routing key; else the highest READY version.
Real ONNX Runtime models in a real ``Registry``; routes' hashing alone is tests/unit/test_routes.py's."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from edgeinfer.errors import ModelEvicted
from edgeinfer.model_config import ModelConfig, RouteVariant
from edgeinfer.repository.registry import Registry
from edgeinfer.repository.router import Router
from edgeinfer.repository.routes import Route
from edgeinfer.repository.sources import ModelSource
from tests.core import build_core
from tests.support import matmul_model, wait_for

T = TypeVar("T")
HALVES = (RouteVariant(version="1", weight=1), RouteVariant(version="2", weight=1))
LADDER = {"model": "small", "enter_p95_ms": 50, "exit_p95_ms": 20, "enter_after_s": 0, "window_s": 60}


def run(test: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(test())


def source(path: Path, name: str = "m", version: str = "1", **config: object) -> ModelSource:
    return ModelSource(name, version, str(path), ModelConfig(**config))


def parts() -> tuple[Registry, Router]:
    service = build_core().service
    return service.registry, service.router


def key_for(route: Route, version: str | None, model: str = "m") -> str:
    """A routing key that the route sends to ``model`` version ``version``."""
    for index in range(10_000):
        chosen = route.choose(f"key-{index}")
        if (chosen.model, chosen.version) == (model, version):
            return f"key-{index}"
    raise AssertionError(f"no key chooses {model} version {version}")


def test_a_routing_key_always_gets_its_variant_and_a_named_version_overrides_the_route(tmp_path: Path):
    path = matmul_model(tmp_path / "m.onnx")

    async def main() -> None:
        registry, router = parts()
        await registry.load([source(path, version="1"), source(path, version="2")])
        router.set_route("m", HALVES)
        route = router.route("m")
        assert route is not None
        to_one, to_two = key_for(route, "1"), key_for(route, "2")
        assert {router.serve("m", None, to_one).version for _ in range(50)} == {"1"}
        assert {router.serve("m", None, to_two).version for _ in range(50)} == {"2"}
        assert router.serve("m", "2", to_one).version == "2", "the version the request names wins"
        assert router.pick("m").version == "2", "pick describes the model: no route"
        router.set_route("m", None)
        assert router.route("m") is None
        assert router.serve("m", None, to_one).version == "2", "no route: the highest ready version"
        await registry.close()

    run(main)


def test_without_a_routing_key_a_weighted_route_splits_requests_by_its_weights(tmp_path: Path):
    path = matmul_model(tmp_path / "m.onnx")

    async def main() -> list[str]:
        registry, router = parts()
        await registry.load([source(path, version="1"), source(path, version="2")])
        router.set_route("m", (RouteVariant(version="1", weight=3), RouteVariant(version="2", weight=1)))
        served = [router.serve("m", None, None).version for _ in range(4000)]
        await registry.close()
        return served

    served = run(main)
    share = served.count("1") / len(served)
    assert abs(share - 0.75) < 5 * math.sqrt(0.75 * 0.25 / len(served)), share  # five deviations
    assert set(served) == {"1", "2"}


def test_a_route_to_another_model_serves_it_and_a_variant_that_cannot_serve_gives_the_best(tmp_path: Path):
    path = matmul_model(tmp_path / "m.onnx")

    async def main() -> None:
        registry, router = parts()
        await registry.load([source(path, version="1"), source(path, name="other", version="7")])
        variants = (RouteVariant(weight=1), RouteVariant(model="other", weight=1))
        router.set_route("m", variants)
        route = router.route("m")
        assert route is not None
        elsewhere = key_for(route, None, model="other")
        served = router.serve("m", None, elsewhere)
        assert (served.name, served.version) == ("other", "7")
        await registry.evict("other")
        assert router.serve("m", None, elsewhere).name == "m", "an evicted variant: the model itself"
        router.set_route("m", (RouteVariant(weight=1), RouteVariant(model="gone", weight=1)))
        missing = router.route("m")
        assert missing is not None
        to_gone = key_for(missing, None, model="gone")
        assert router.serve("m", None, to_gone).name == "m", "an unknown variant: the model itself"
        router.set_route("m", (RouteVariant(version="1", weight=1), RouteVariant(version="9", weight=1)))
        versions = router.route("m")
        assert versions is not None
        assert router.serve("m", None, key_for(versions, "9")).version == "1", "no version 9: the best"
        await registry.close()

    run(main)


def test_settled_is_the_picked_version_unless_a_route_or_a_ladder_may_move_the_request(tmp_path: Path):
    path = matmul_model(tmp_path / "m.onnx")

    async def main() -> None:
        registry, router = parts()
        await registry.load([source(path, version="1"), source(path, name="other")])
        assert router.settled("m") is router.serve("m", None, None)
        router.set_route("other", HALVES)
        assert router.settled("m") is not None, "another model's route does not unsettle this one"
        assert router.settled("other") is None
        await registry.evict("m")
        with pytest.raises(ModelEvicted):
            router.settled("m")
        await registry.close()

    run(main)


def degrade(router: Router, name: str) -> None:
    """Requests for ``name`` answered far above its ladder's enter level (a refusal counts as infinitely
    slow) until the ladder, asked at its own pace, steps down."""
    router.serve(name, None, None)  # the first request sets up the ladder
    for seconds in (1.0, 2.0, math.inf):
        router.observe(name, seconds)
    gauges = router.ladder_gauges
    wait_for(lambda: all(gauge.degraded for gauge in gauges()), what=f"{name}'s ladder stepped down")


def test_a_stepped_down_ladder_sends_requests_to_the_fallback_and_says_so(tmp_path: Path):
    path = matmul_model(tmp_path / "m.onnx")

    async def main() -> None:
        registry, router = parts()
        await registry.load(
            [
                source(path, name="big", version="1", fallback=LADDER),
                source(path, name="small", version="1"),
                source(path, name="small", version="2"),
            ]
        )
        assert router.serve("big", None, None).name == "big", "fast enough: the model itself"
        degrade(router, "big")
        served = router.serve("big", None, None)
        assert (served.name, served.version) == ("small", "2"), "the fallback's highest ready version"
        assert router.is_fallback("big", "small")
        assert not router.is_fallback("big", "big")
        assert not router.is_fallback("small", "big")
        assert router.serve("big", "1", None).name == "big", "a named version is never moved"
        [gauge] = router.ladder_gauges()
        assert (gauge.name, gauge.fallback, gauge.degraded) == ("big", "small", True)
        await registry.unload("small")
        assert router.serve("big", None, None).name == "big", "no fallback to serve: the model itself"
        await registry.close()

    run(main)


def test_a_reload_without_the_fallback_drops_the_ladder(tmp_path: Path):
    path = matmul_model(tmp_path / "m.onnx")

    async def main() -> None:
        registry, router = parts()
        await registry.load([source(path, name="big", fallback=LADDER), source(path, name="small")])
        degrade(router, "big")
        assert router.serve("big", None, None).name == "small"
        await registry.reload("big", [source(path, name="big")])
        assert router.serve("big", None, None).name == "big"
        assert router.ladder_gauges() == []
        assert not router.is_fallback("big", "small")
        await registry.reload("big", [source(path, name="big", fallback=LADDER)])
        assert router.serve("big", None, None).name == "big", "a new ladder starts stepped up"
        await registry.close()

    run(main)


def test_an_answer_routed_to_the_fallback_model_while_the_ladder_is_up_is_not_called_a_fallback(
    tmp_path: Path,
):
    """``is_fallback`` tells the service whether another model answered because the ladder stepped down
    (the response says ``fallback_from``) or because of a route (``routed_from``). Here the ladder has
    not stepped down and the route sent the request to the model that is also the fallback."""
    path = matmul_model(tmp_path / "m.onnx")

    async def main() -> None:
        registry, router = parts()
        await registry.load([source(path, name="big", fallback=LADDER), source(path, name="small")])
        router.set_route("big", (RouteVariant(weight=1), RouteVariant(model="small", weight=1)))
        route = router.route("big")
        assert route is not None
        served = router.serve("big", None, key_for(route, None, model="small"))
        assert served.name == "small", "the route sent it there"
        assert not any(gauge.degraded for gauge in router.ladder_gauges()), "the ladder is up"
        try:
            assert not router.is_fallback("big", "small"), "a routed answer, not the ladder's"
        finally:
            await registry.close()

    run(main)
