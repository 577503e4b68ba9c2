"""Weighted routes without a server: sticky keys, shares within a stated tolerance, small moves."""

from __future__ import annotations

import math

import pytest

from edgeinfer.model_config import RouteVariant
from edgeinfer.repository.routes import Route, key_point

NINETY_TEN = (RouteVariant(version="1", weight=90), RouteVariant(version="2", weight=10))


def share(route: Route, keys: list[str | None], version: str) -> float:
    return sum(route.choose(key).version == version for key in keys) / len(keys)


def tolerance(p: float, n: int) -> float:
    """Five standard deviations of a share p over n independent draws (a false alarm in ~2 million)."""
    return 5 * math.sqrt(p * (1 - p) / n)


def test_one_key_always_gets_one_variant():
    route = Route("m", NINETY_TEN)
    for key in ("alice", "bob", "camera-17", ""):
        chosen = {route.choose(key or "x").version for _ in range(1000)}
        assert len(chosen) == 1


@pytest.mark.parametrize("keyed", [True, False])
def test_weights_hold_within_five_standard_deviations(keyed: bool):
    route = Route("m", NINETY_TEN)
    n = 20_000
    keys: list[str | None] = [f"client-{index}" if keyed else None for index in range(n)]
    assert abs(share(route, keys, "2") - 0.10) < tolerance(0.10, n)


def test_raising_a_weight_moves_only_keys_onto_the_grown_variant():
    before = Route("m", NINETY_TEN)
    after = Route("m", (RouteVariant(version="1", weight=75), RouteVariant(version="2", weight=25)))
    keys = [f"k{index}" for index in range(5000)]
    moved = [key for key in keys if before.choose(key).version != after.choose(key).version]
    assert all(before.choose(key).version == "1" for key in moved), "no key leaves the candidate"
    assert abs(len(moved) / len(keys) - 0.15) < tolerance(0.15, len(keys))


def test_the_points_of_keys_are_stable_and_uniform():
    assert key_point("alice") == key_point("alice")
    points = sorted(key_point(f"key-{index}") for index in range(10_000))
    deciles = [sum(1 for point in points if low / 10 <= point < (low + 1) / 10) for low in range(10)]
    assert all(abs(count - 1000) < 5 * math.sqrt(1000 * 0.9) for count in deciles)


def test_a_route_describes_itself():
    route = Route("m", (RouteVariant(version="1", weight=3), RouteVariant(model="small", weight=1)))
    assert route.describe() == [
        {"model": "m", "weight": 3.0, "version": "1"},
        {"model": "small", "weight": 1.0},
    ]
    assert route.summary() == "v1 75%, small 25%"
    with pytest.raises(ValueError, match="at least one variant"):
        Route("m", ())
