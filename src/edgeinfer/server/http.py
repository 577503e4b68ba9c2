"""The HTTP adapter: the Open Inference Protocol (KServe V2) REST routes over ``http_protocol``.

It only converts: the route table (``http_routes.ROUTES``) names each route's handler here, which turns
the request into a call of the data plane (``InferenceService``; inference itself in ``http_infer``) or
the control plane (``ControlPlane``) and the result into JSON; errors become statuses
(``http_errors``). Every request's API key is checked against its route's role before anything else.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from edgeinfer.control.parsing import parse_override
from edgeinfer.control.plane import ControlPlane
from edgeinfer.protocol import json_codec
from edgeinfer.server.auth import Guard
from edgeinfer.server.http_errors import (
    MethodNotAllowed,
    RouteNotFound,
    check_key,
    response_for_error,
)
from edgeinfer.server.http_infer import HttpInference
from edgeinfer.server.http_messages import Answer, HttpRequest, HttpResponse
from edgeinfer.server.http_routes import ALIASES, METRICS_PORT, ROUTES, Match, RouteTable
from edgeinfer.service import InferenceService

Handler = Callable[[HttpRequest, list[str]], Answer]


@functools.cache
def status_page() -> bytes:
    """The status page: one static file, read at its first request."""
    return (Path(__file__).parent / "status.html").read_bytes()


def metrics_response(exposition: bytes) -> HttpResponse:
    return HttpResponse(200, exposition, content_type=b"text/plain; version=0.0.4; charset=utf-8")


def _json(status: int, document: Any) -> HttpResponse:
    return HttpResponse(status, json_codec.dumps(document))


class _Dispatch:
    """A route table whose handlers are methods of ``self``, API keys checked first (``guard``)."""

    table: RouteTable
    guard: Guard

    def _handlers(self) -> dict[str, Handler]:
        """Each route's handler, by name (a route naming no method here is a start-up error)."""
        handlers: dict[str, Handler] = {}
        for route in self.table.routes:
            handler = getattr(self, route.handler, None)
            if handler is None:
                raise TypeError(f"route {route.method} {route.pattern}: no handler {route.handler!r}")
            handlers[route.handler] = handler
        return handlers

    def _match(self, request: HttpRequest) -> Match | None:
        """The request's route, its key checked against the route's role (a path without a route needs
        a key with the role ``infer``: what is not there is no one's business)."""
        match = self.table.match(request.method, request.path)
        if self.guard.enabled:
            check_key(self.guard, request, match.role if match is not None else "infer")
        return match

    def __call__(self, request: HttpRequest) -> Answer:
        try:
            match = self._match(request)
            if match is None:
                raise RouteNotFound(f"no route for {request.method} {request.path}")
            route = match.route
            if route is None:
                raise MethodNotAllowed(request.method, match.allowed)
            return self.handlers[route.handler](request, match.args)
        except Exception as error:
            return response_for_error(error)

    handlers: dict[str, Handler]


class MetricsRoutes(_Dispatch):
    """The handler of a metrics port: ``GET /metrics`` and nothing else."""

    def __init__(self, exposition: Callable[[], Awaitable[bytes]], guard: Guard) -> None:
        self.exposition = exposition
        self.guard = guard
        self.table = RouteTable(METRICS_PORT)
        self.handlers = self._handlers()

    def metrics(self, request: HttpRequest, args: list[str]) -> Answer:
        return _when_done(self.exposition(), metrics_response)


class V2Routes(_Dispatch):
    """The request handler given to ``HttpServer``; ``early`` its early handler (``http_protocol``)."""

    def __init__(
        self,
        service: InferenceService,
        control: ControlPlane,
        max_body_bytes: int,
        compress_min_bytes: int,
        guard: Guard,
        max_json_depth: int = json_codec.MAX_DEPTH,
    ) -> None:
        self.service = service
        self.control = control
        self.guard = guard
        self.inference = HttpInference(service, max_body_bytes, compress_min_bytes, max_json_depth)
        self.table = RouteTable(ROUTES + ALIASES)
        self.handlers = self._handlers()

    def early(self, head: HttpRequest) -> HttpResponse | None:
        """The refusal of a request whose body is still arriving: one without the right API key, or an
        inference request that would miss its model's SLO whatever the body says; None for anything
        else, answered once it has arrived (nor should a client without a key get to upload)."""
        try:
            match = self._match(head)
        except Exception as error:
            return response_for_error(error)
        if match is None or match.route is None or not match.route.inference:
            return None
        args = match.args
        return self.inference.early(head, args[0], args[1] if len(args) > 1 else None)

    # ---- the data plane ----

    def infer(self, request: HttpRequest, args: list[str]) -> Answer:
        return self.inference.infer(request, args[0], args[1] if len(args) > 1 else None)

    def server_metadata(self, request: HttpRequest, args: list[str]) -> Answer:
        return _json(200, self.service.models.server())

    def live(self, request: HttpRequest, args: list[str]) -> Answer:
        return _json(200, {"live": self.service.live()})

    def ready(self, request: HttpRequest, args: list[str]) -> Answer:
        ready = self.service.ready()
        return _json(200 if ready else 503, {"ready": ready})

    def health(self, request: HttpRequest, args: list[str]) -> Answer:
        ready = self.service.ready()
        return _json(200 if ready else 503, {"status": "ready" if ready else "not ready"})

    def model_metadata(self, request: HttpRequest, args: list[str]) -> Answer:
        return _json(200, self.service.models.metadata(*_model(args)))

    def model_ready(self, request: HttpRequest, args: list[str]) -> Answer:
        name, version = _model(args)
        ready = self.service.models.ready(name, version)
        return _json(200 if ready else 503, {"name": name, "ready": ready})

    def model_config(self, request: HttpRequest, args: list[str]) -> Answer:
        return _json(200, self.service.models.config(*_model(args)))

    def model_inspect(self, request: HttpRequest, args: list[str]) -> Answer:
        return _json(200, self.service.models.inspect(*_model(args)))

    def status_page(self, request: HttpRequest, args: list[str]) -> Answer:
        return HttpResponse(200, status_page(), content_type=b"text/html; charset=utf-8")

    # ---- the control plane ----

    def statistics(self, request: HttpRequest, args: list[str]) -> Answer:
        name, version = _model(args) if args else (None, None)
        return _when_done(self.control.model_statistics(name, version), lambda stats: _json(200, stats))

    def model_index(self, request: HttpRequest, args: list[str]) -> Answer:
        return _when_done(self.control.model_index(), lambda models: _json(200, {"models": models}))

    def metrics(self, request: HttpRequest, args: list[str]) -> Answer:
        return _when_done(self.control.metrics_exposition(), metrics_response)

    def overview(self, request: HttpRequest, args: list[str]) -> Answer:
        return _when_done(self.control.overview(), lambda state: _json(200, state))

    def repository_index(self, request: HttpRequest, args: list[str]) -> Answer:
        ready_only = _optional_body(request).get("ready") is True
        return _when_done(self.control.repository_index(ready_only), lambda index: _json(200, index))

    def load(self, request: HttpRequest, args: list[str]) -> Answer:
        parameters = _optional_body(request).get("parameters") or {}
        override = parse_override(parameters.get("config") if isinstance(parameters, dict) else None)
        return _when_done(self.control.load_model(args[0], override), lambda _: _json(200, {}))

    def unload(self, request: HttpRequest, args: list[str]) -> Answer:
        _optional_body(request)  # a body, if any, must be JSON
        return _when_done(self.control.unload_model(args[0]), lambda _: _json(200, {}))

    def routes(self, request: HttpRequest, args: list[str]) -> Answer:
        return _json(200, {"routes": self.control.routes()})

    def set_route(self, request: HttpRequest, args: list[str]) -> Answer:
        variants = json_codec.loads_object(request.body, "request body").get("variants")
        work = self.control.set_route(args[0], variants)
        return _when_done(work, lambda _: _json(200, {"routes": self.control.routes()}))

    def remove_route(self, request: HttpRequest, args: list[str]) -> Answer:
        return _when_done(self.control.set_route(args[0], None), lambda _: _json(200, {}))

    def shadows(self, request: HttpRequest, args: list[str]) -> Answer:
        return _json(200, {"shadows": self.control.shadow_configs()})

    def set_shadow(self, request: HttpRequest, args: list[str]) -> Answer:
        config = json_codec.loads_object(request.body, "request body")
        work = self.control.set_shadow(args[0], config)
        return _when_done(work, lambda _: _json(200, {"shadows": self.control.shadow_configs()}))

    def remove_shadow(self, request: HttpRequest, args: list[str]) -> Answer:
        return _when_done(self.control.set_shadow(args[0], None), lambda _: _json(200, {}))

    def canaries(self, request: HttpRequest, args: list[str]) -> Answer:
        return _when_done(self.control.canary_states(), lambda states: _json(200, {"canaries": states}))

    def canary(self, request: HttpRequest, args: list[str]) -> Answer:
        return _when_done(self.control.canary_action(args[0], args[1]), lambda state: _json(200, state))


def _model(args: list[str]) -> tuple[str, str | None]:
    """The model and version of a model route's ``{model}[/versions/{version}]``."""
    return args[0], args[1] if len(args) > 1 else None


def _optional_body(request: HttpRequest) -> dict[str, Any]:
    """A repository request's JSON body; none is an empty one."""
    return json_codec.loads_object(request.body, "request body") if request.body.strip() else {}


def _when_done(work: Awaitable[Any], answer: Callable[[Any], HttpResponse]) -> asyncio.Future[HttpResponse]:
    """An HTTP answer for core work that takes a while: ``answer(result)``, or the error's status."""
    task = asyncio.ensure_future(work)
    reply: asyncio.Future[HttpResponse] = asyncio.get_running_loop().create_future()

    def finished(_: asyncio.Future[Any]) -> None:
        if reply.done():
            return
        if task.cancelled():
            reply.cancel()
            return
        error = task.exception()
        reply.set_result(response_for_error(error) if error is not None else answer(task.result()))

    task.add_done_callback(finished)
    return reply
