"""What a weighted route costs per request: the router's decision, measured in-process on `tiny`.

    python bench/routing.py [--picks 200000]

Two versions of `tiny` are loaded into a real registry; the router picks a version for a request
(no route; a 90/10 route with the routing keys of 1,000 clients; with a new key on every
request, the worst case; without a key) and the time per
pick is the mean over ``--picks`` picks, best of 5 rounds. The difference to "no route" is the cost
of routing on the request path; everything else the request does is the same with or without it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.models import tiny
from edgeinfer.admission.lag import LoopLag
from edgeinfer.backends import LoadContext
from edgeinfer.metrics import Metrics
from edgeinfer.model_config import ModelConfig, RouteVariant
from edgeinfer.repository.registry import Registry
from edgeinfer.repository.router import Router
from edgeinfer.repository.sources import ModelSource

ROUTE = (RouteVariant(version="1", weight=90), RouteVariant(version="2", weight=10))


def per_pick_us(router: Router, keys: list[str | None], rounds: int = 5) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for key in keys:
            router.serve("tiny", None, key)
        best = min(best, (time.perf_counter() - started) / len(keys))
    return best * 1e6


async def measure(picks: int, folder: Path) -> dict[str, float]:
    async def no_steps(model: str, version: str | None, request: object) -> object:
        raise AssertionError("no pipelines here")

    registry = Registry(Metrics(), LoopLag(), LoadContext(run_step=no_steps))
    sources = [
        ModelSource("tiny", version, str(tiny(folder / version / "model.onnx")), ModelConfig())
        for version in ("1", "2")
    ]
    await registry.load(sources)
    try:
        clients: list[str | None] = [f"client-{i % 1000}" for i in range(picks)]
        fresh: list[str | None] = [f"key-{i}" for i in range(picks)]
        plain: list[str | None] = [None] * picks
        unrouted, routed = Router(registry), Router(registry, {"tiny": ROUTE})
        base = per_pick_us(unrouted, plain)
        return {
            "no route": base,
            "route, 1,000 client keys": per_pick_us(routed, clients),
            "route, every key new": per_pick_us(routed, fresh),
            "route, no key": per_pick_us(routed, plain),
        }
    finally:
        await registry.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--picks", type=int, default=200_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        results = asyncio.run(measure(args.picks, Path(folder)))
    base = results["no route"]
    print(f"router pick per request on tiny ({args.picks:,} picks, best of 5 rounds):")
    for case, microseconds in results.items():
        extra = "" if case == "no route" else f"   routing adds {microseconds - base:.2f} us"
        print(f"  {case:<26} {microseconds:6.2f} us{extra}")


if __name__ == "__main__":
    main()
