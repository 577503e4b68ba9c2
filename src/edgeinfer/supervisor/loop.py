"""The event loop a serving process runs on: uvloop where it is built (not on every platform)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

try:
    import uvloop
except ImportError:  # uvloop is not built for every platform (Windows)
    uvloop = None  # type: ignore[assignment]


def run_with_uvloop(coroutine: Coroutine[Any, Any, None]) -> None:
    """Run ``coroutine`` to its end on a new uvloop event loop (asyncio's where there is no uvloop)."""
    if uvloop is None:
        asyncio.run(coroutine)
        return
    uvloop.run(coroutine)
