"""One process's core wired as the composition root wires it, without transports, for integration
tests of the data plane and the control plane."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgeinfer.admission.lag import LoopLag
from edgeinfer.backends import LoadContext
from edgeinfer.config import ResidencyConfig
from edgeinfer.control.local import LocalScope
from edgeinfer.control.plane import ControlPlane
from edgeinfer.dashboard import recent_errors
from edgeinfer.logs import AccessLog
from edgeinfer.metrics import Metrics
from edgeinfer.repository.registry import Registry
from edgeinfer.repository.residency import Residency
from edgeinfer.repository.router import Router
from edgeinfer.repository.sources import ModelSource
from edgeinfer.service import InferenceService
from edgeinfer.shadow import Shadows


@dataclass
class Core:
    service: InferenceService
    scope: LocalScope
    control: ControlPlane


def build_core(
    discover: Callable[[str, dict | None], list[ModelSource]] = lambda name, override: [],
    tracing: Any = None,
) -> Core:
    metrics = Metrics()
    holder: dict[str, Any] = {}

    async def run_step(model: str, version: str | None, request: Any, step: str, span: object) -> Any:
        return await holder["service"].run_step(model, version, request, step, span)

    registry = Registry(
        metrics, LoopLag(), LoadContext(run_step=run_step), tracing.batches if tracing is not None else None
    )
    router = Router(registry)
    residency = Residency(registry, ResidencyConfig(), lambda name: holder["scope"].load(name))
    shadows = Shadows(registry, router, metrics, {})
    errors = recent_errors()
    scope = LocalScope(registry, router, residency, shadows, metrics, discover, errors)
    service = InferenceService(
        registry, router, residency, shadows, metrics, AccessLog(), errors, tracing=tracing
    )
    holder.update(service=service, scope=scope)
    return Core(service, scope, ControlPlane(scope, router, shadows, service.ready, 1.0))
