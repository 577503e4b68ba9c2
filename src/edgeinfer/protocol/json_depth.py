"""How deep a JSON body nests, bounded (``server.limits.max_json_depth``): a cheap count first, the walk
only when the count allows more (orjson alone stops at 1024 levels)."""

from __future__ import annotations

from typing import Any

from edgeinfer.errors import LimitExceeded


def may_nest_deeper(raw: bytes | bytearray | memoryview, limit: int) -> bool:
    """Whether ``raw`` has more opening brackets than ``limit``: if not, no nesting can exceed it and
    the walk is skipped (a C-speed count, a fifth of what walking a small request costs)."""
    data = raw if not isinstance(raw, memoryview) else raw.tobytes()
    return data.count(b"[") + data.count(b"{") > limit


def check_depth(document: dict[str, Any], limit: int) -> None:
    """Refuse a document nested deeper than ``limit`` (orjson alone stops at 1024 levels).

    Everything but tensor data is walked (headers and parameters are small). Tensor data is followed
    down its first elements only: deeper nesting anywhere else in it fails the shape check later.
    """
    for key, value in document.items():
        if key == "inputs" and isinstance(value, list):
            for tensor in value:
                if isinstance(tensor, dict):
                    for field, item in tensor.items():
                        if field == "data":
                            if (depth := 3 + _first_depth(item)) > limit:
                                _too_deep(f"{depth} levels", limit)
                        elif _depth(item, limit - 3) + 3 > limit:
                            _too_deep(f"at least {limit + 1} levels", limit)
                elif _depth(tensor, limit - 2) + 2 > limit:
                    _too_deep(f"at least {limit + 1} levels", limit)
        elif _depth(value, limit - 1) + 1 > limit:
            _too_deep(f"at least {limit + 1} levels", limit)


def _depth(value: Any, budget: int) -> int:
    """Levels of containers in ``value`` (a scalar has 0), stopping once it is over ``budget``."""
    if isinstance(value, dict):
        items: Any = value.values()
    elif isinstance(value, list):
        items = value
    else:
        return 0
    if budget <= 0:
        return 1
    deepest = 0
    for item in items:
        if isinstance(item, (dict, list)):
            deepest = max(deepest, _depth(item, budget - 1))
            if deepest >= budget:
                break
    return 1 + deepest


def _first_depth(data: Any) -> int:
    depth = 0
    while isinstance(data, list):
        depth += 1
        data = data[0] if data else None
    return depth


def _too_deep(depth: str, limit: int) -> None:
    raise LimitExceeded(
        f"the JSON body is nested {depth} deep; the limit is {limit} (server.limits.max_json_depth)",
        "json_depth",
    )
