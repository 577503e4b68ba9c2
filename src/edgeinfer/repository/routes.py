"""Weighted splits of one model name's traffic across its versions or other models (A/B, gradual release).

A route is a list of variants with weights. Each request that names no version lands on one variant:

* with a routing key (``X-Routing-Key``, gRPC metadata ``x-routing-key``, or ``parameters.routing_key``)
  the key is hashed (CRC-32, then an integer mixer so that similar keys land far apart) to a point in
  [0, 1), the same in every process, and the variant whose share covers that
  point answers: the same key always gets the same variant while the route is unchanged, and changing
  one weight moves only the keys on the boundary that moved;
* without one, the point is random, so the weights hold on average.

Pure: no clock, no registry. The router (``router.py``) asks ``choose`` and then makes sure the chosen
variant can serve.
"""

from __future__ import annotations

import random
import zlib
from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate

from edgeinfer.model_config import RouteVariant

_SCALE = float(2**32)


@dataclass(frozen=True, slots=True)
class Variant:
    model: str
    version: str | None  # None: the model's highest ready version
    weight: float

    def describe(self) -> dict[str, str | float]:
        shown: dict[str, str | float] = {"model": self.model, "weight": self.weight}
        if self.version is not None:
            shown["version"] = self.version
        return shown


class Route:
    def __init__(self, name: str, variants: tuple[RouteVariant, ...]) -> None:
        if not variants:
            raise ValueError(f"route {name!r} needs at least one variant")
        self.name = name
        self.variants = tuple(Variant(v.model or name, v.version, v.weight) for v in variants)
        total = sum(variant.weight for variant in self.variants)
        # the upper end of each variant's share of [0, 1); the last is 1 exactly
        self._bounds = [bound / total for bound in accumulate(v.weight for v in self.variants)][:-1]

    def choose(self, key: str | None) -> Variant:
        point = key_point(key) if key else random.random()
        return self.variants[bisect_right(self._bounds, point)]

    def describe(self) -> list[dict[str, str | float]]:
        return [variant.describe() for variant in self.variants]

    def summary(self) -> str:
        """One line: ``v1 90%, v2 10%`` (another model's variant by its name)."""
        total = sum(variant.weight for variant in self.variants)
        parts = []
        for variant in self.variants:
            where = variant.model if variant.model != self.name else ""
            if variant.version is not None:
                where += ("/" if where else "v") + variant.version
            parts.append(f"{where or 'latest'} {100 * variant.weight / total:g}%")
        return ", ".join(parts)


_POINTS: dict[str, float] = {}  # recent keys' points: a client sends its key again and again
_POINTS_KEPT = 4096


def key_point(key: str) -> float:
    """A routing key's fixed place in [0, 1): the same in every process (unlike ``hash``), and cheap
    (CRC-32 and a 32-bit integer mixer: a third of what a cryptographic hash costs here; routing needs
    spread, not secrecy)."""
    point = _POINTS.get(key)
    if point is None:
        mixed = zlib.crc32(key.encode("utf-8", "surrogatepass"))
        mixed = ((mixed ^ (mixed >> 16)) * 0x45D9F3B) & 0xFFFFFFFF
        mixed = ((mixed ^ (mixed >> 16)) * 0x45D9F3B) & 0xFFFFFFFF
        point = (mixed ^ (mixed >> 16)) / _SCALE
        if len(_POINTS) >= _POINTS_KEPT:  # bounded: many distinct keys only cost the hash again
            _POINTS.clear()
        _POINTS[key] = point
    return point
