"""The HTTP adapter: Open Inference Protocol (KServe V2) REST routes over ``http_protocol``.

It only converts: request bytes to core calls, core results to JSON bytes, core errors to status codes
(``STATUS_BY_ERROR``, looked up along the error's MRO). The work happens in ``InferenceService``.

Routes::

    GET  /v2                                       server metadata
    GET  /v2/health/live | /v2/health/ready        probes
    GET  /v2/models/{m}[/versions/{v}]             model metadata
    GET  /v2/models/{m}[/versions/{v}]/ready       model readiness
    GET  /v2/models[/{m}[/versions/{v}]]/stats     statistics (Triton's extension)
    GET  /v2/models/{m}[/versions/{v}]/config      model configuration (Triton's extension)
    GET  /v2/models/{m}[/versions/{v}]/inspect     size, providers, execution-provider coverage
    POST /v2/models/{m}[/versions/{v}]/infer       inference
    GET  /v1/models                                every model, version and state
    POST /v1/models/{m}[/versions/{v}]/predict     inference, same bodies as /infer
    GET  /health                                   200 when ready, 503 otherwise
    GET  /metrics                                  Prometheus metrics (also on the metrics port)
    POST /v2/repository/index                      every version and its state (Triton's extension)
    POST /v2/repository/models/{m}/load            load or reload a model (optional config override)
    POST /v2/repository/models/{m}/unload          stop serving a model
    GET  /v2/routes                                every weighted route (docs/rollouts.md)
    PUT  /v2/routes/{m}                            set a route: {"variants": [{version|model, weight}]}
    DELETE /v2/routes/{m}                          remove a route
    GET  /v2/shadows, PUT|DELETE /v2/shadows/{m}   shadow candidates: {"version"|"model", "share"}
    GET  /v2/canaries                              every canary's state
    POST /v2/canaries/{m}/{action}                 start, pause, resume, promote, abort
    GET  /v2/ui/state                              the server now, for a status page (dashboard.py)
    GET  /ui                                       the status page (status.html, reads /v2/ui/state)
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from edgeinfer.control.parsing import parse_override
from edgeinfer.control.plane import ControlPlane
from edgeinfer.errors import (
    EdgeInferError,
    InferenceFailed,
    InvalidInput,
    ModelLoadError,
    ModelNotFound,
    ModelNotReady,
    PayloadTooLarge,
    PermissionDenied,
    RequestCancelled,
    RequestTimeout,
    ServerBusy,
    Superseded,
    TooLarge,
    Unauthenticated,
)
from edgeinfer.errors import describe as describe_error
from edgeinfer.protocol import http_binary, json_codec, json_scan
from edgeinfer.protocol.types import InferRequest, InferResponse
from edgeinfer.server import http_compression
from edgeinfer.server.auth import Guard, http_role, presented_key
from edgeinfer.server.http_protocol import Answer, Deferred, DoneNow, HttpRequest, HttpResponse
from edgeinfer.server.offload import OffloadThread
from edgeinfer.service import InferenceCall, InferenceService, new_request_id

log = logging.getLogger(__name__)

# From this size a JSON body is decoded on a worker thread, its numbers without the GIL (json_scan.py): a
# body this large takes the loop about as long to parse as the thread hop does several times over
# (both are CPU work, so the ratio holds across machines), and every other request waits for it.
OFF_LOOP_BYTES = 256 * 1024


class MethodNotAllowed(InvalidInput):
    """The path exists but not for this HTTP method; ``allowed`` goes in the ``Allow`` header (RFC 9110)."""

    def __init__(self, method: str, allowed: str) -> None:
        super().__init__(f"method {method} is not allowed here; use {allowed}")
        self.allowed = allowed


class RouteNotFound(ModelNotFound):
    """No route matches the path."""


STATUS_BY_ERROR: dict[type[BaseException], int] = {
    MethodNotAllowed: 405,
    ModelLoadError: 400,
    PayloadTooLarge: 413,
    TooLarge: 413,
    InvalidInput: 400,
    Unauthenticated: 401,
    PermissionDenied: 403,
    ModelNotFound: 404,
    ModelNotReady: 503,
    ServerBusy: 429,
    RequestTimeout: 504,
    RequestCancelled: 499,
    Superseded: 409,
    InferenceFailed: 500,
    EdgeInferError: 500,
}


def status_for(error: BaseException) -> int:
    """Look the error's class up along its MRO, so a subclass inherits its parent's status."""
    for cls in type(error).__mro__:
        status = STATUS_BY_ERROR.get(cls)
        if status is not None:
            return status
    return 500


def error_response(status: int, message: str) -> HttpResponse:
    return HttpResponse(status, json_codec.dumps({"error": message}))


def response_for_error(error: BaseException) -> HttpResponse:
    if not isinstance(error, EdgeInferError):
        log.error("unexpected error", exc_info=error)
    response = error_response(status_for(error), describe_error(error))
    if isinstance(error, ServerBusy):
        response.headers.append((b"retry-after", str(max(1, round(error.retry_after_s))).encode()))
        # Retry-After counts whole seconds, and a refusal for the SLO often means a few milliseconds
        response.headers.append((b"retry-after-ms", str(error.retry_after_ms).encode()))
    elif isinstance(error, MethodNotAllowed):
        response.headers.append((b"allow", error.allowed.encode()))
    elif isinstance(error, Unauthenticated):
        response.headers.append((b"www-authenticate", b'Bearer realm="edgeinfer"'))
    return response


def check_key(guard: Guard, request: HttpRequest) -> None:
    """The request's API key against the role of its path."""
    authorization = request.headers.get(b"authorization")
    api_key = request.headers.get(b"x-api-key")
    presented = presented_key(
        authorization.decode("latin-1") if authorization else None,
        api_key.decode("latin-1") if api_key else None,
    )
    role = http_role(request.path)
    if role is not None:
        guard.check("http", request.path, role, presented)


@functools.cache
def status_page() -> bytes:
    """The status page: one static file, read at its first request."""
    return (Path(__file__).parent / "status.html").read_bytes()


def metrics_response(exposition: bytes) -> HttpResponse:
    return HttpResponse(200, exposition, content_type=b"text/plain; version=0.0.4; charset=utf-8")


def _json(status: int, document: Any) -> HttpResponse:
    return HttpResponse(status, json_codec.dumps(document))


def _allow(request: HttpRequest, method: str) -> None:
    if request.method != method:
        raise MethodNotAllowed(request.method, method)


class MetricsRoutes:
    """The handler of a metrics port: ``GET /metrics`` and nothing else."""

    def __init__(self, exposition: Callable[[], Awaitable[bytes]], guard: Guard) -> None:
        self.exposition = exposition
        self.guard = guard

    def __call__(self, request: HttpRequest) -> HttpResponse | asyncio.Future[HttpResponse]:
        try:
            check_key(self.guard, request)
        except Exception as error:
            return response_for_error(error)
        if request.path.rstrip("/") != "/metrics":
            return error_response(404, f"no route for {request.method} {request.path}; try GET /metrics")
        if request.method != "GET":
            return response_for_error(MethodNotAllowed(request.method, "GET"))
        return _when_done(self.exposition(), metrics_response)


class V2Routes:
    """The request handler given to ``HttpServer``.

    ``max_body_bytes`` bounds decompressed bodies too; responses of at least ``compress_min_bytes`` are
    compressed when the client sends ``Accept-Encoding: gzip`` or ``deflate``. ``guard`` checks API keys
    before anything else; ``max_json_depth`` bounds the nesting of JSON bodies.
    """

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
        self.max_body_bytes = max_body_bytes
        self.compress_min_bytes = compress_min_bytes
        self.guard = guard
        self.max_json_depth = max_json_depth
        self._refusal_body: tuple[ServerBusy, HttpResponse] | None = None  # the last refusal's (``_refused``)
        self._json_thread = OffloadThread("edgeinfer-json")  # below the loop (offload.py)

    def __call__(self, request: HttpRequest) -> Answer:
        try:
            if self.guard.enabled:
                check_key(self.guard, request)
            return self._route(request)
        except Exception as error:
            return response_for_error(error)

    def _route(self, request: HttpRequest) -> Answer:
        parts = request.path.strip("/").split("/")
        service, control = self.service, self.control
        head = parts[0]
        if head == "v2":
            second = parts[1] if len(parts) > 1 else ""
            if second == "models" and len(parts) >= 3:  # inference: checked first
                return self._model_route(request, parts)
            if second == "repository" and len(parts) >= 3:
                return self._repository(request, parts)
            if second == "routes" and len(parts) <= 3:
                return self._routes(request, parts)
            if second == "shadows" and len(parts) <= 3:
                return self._shadows(request, parts)
            if second == "canaries":
                return self._canaries(request, parts)
            if parts == ["v2"]:
                _allow(request, "GET")
                return _json(200, service.server_metadata())
            if parts == ["v2", "ui", "state"]:
                _allow(request, "GET")
                return _when_done(control.overview(), lambda state: _json(200, state))
            if parts == ["v2", "health", "live"]:
                _allow(request, "GET")
                return _json(200, {"live": service.live()})
            if parts == ["v2", "health", "ready"]:
                _allow(request, "GET")
                ready = service.ready()
                return _json(200 if ready else 503, {"ready": ready})
        elif head == "v1" and len(parts) >= 2 and parts[1] == "models":
            if len(parts) == 2:
                _allow(request, "GET")
                return _when_done(control.model_index(), lambda models: _json(200, {"models": models}))
            if len(parts) == 4 and parts[3] == "predict":
                _allow(request, "POST")
                return self._infer(request, parts[2], None)
            if len(parts) == 6 and parts[3] == "versions" and parts[5] == "predict":
                _allow(request, "POST")
                return self._infer(request, parts[2], parts[4])
        elif parts == ["metrics"]:
            _allow(request, "GET")
            return _when_done(control.metrics_exposition(), metrics_response)
        elif parts == ["ui"]:
            _allow(request, "GET")
            return HttpResponse(200, status_page(), content_type=b"text/html; charset=utf-8")
        elif parts == ["health"]:
            _allow(request, "GET")
            ready = service.ready()
            return _json(200 if ready else 503, {"status": "ready" if ready else "not ready"})
        raise RouteNotFound(f"no route for {request.method} {request.path}")

    def _repository(
        self, request: HttpRequest, parts: list[str]
    ) -> asyncio.Future[HttpResponse] | HttpResponse:
        _allow(request, "POST")
        control = self.control
        document = json_codec.loads_object(request.body, "request body") if request.body.strip() else {}
        if parts == ["v2", "repository", "index"]:
            ready_only = document.get("ready") is True
            return _when_done(control.repository_index(ready_only), lambda index: _json(200, index))
        if len(parts) == 5 and parts[2] == "models" and parts[4] in ("load", "unload"):
            name = parts[3]
            if parts[4] == "load":
                parameters = document.get("parameters") or {}
                override = parse_override(parameters.get("config") if isinstance(parameters, dict) else None)
                work = control.load_model(name, override)
            else:
                work = control.unload_model(name)
            return _when_done(work, lambda _: _json(200, {}))
        raise RouteNotFound(f"no route for {request.method} {request.path}")

    def _routes(self, request: HttpRequest, parts: list[str]) -> HttpResponse | asyncio.Future[HttpResponse]:
        """``/v2/routes[/{m}]``: the body's ``variants``."""
        control = self.control

        def set_route(name: str, body: dict[str, Any] | None) -> Awaitable[None]:
            return control.set_route(name, None if body is None else body.get("variants"))

        return _per_model_setting(request, parts, "routes", control.routes, set_route)

    def _shadows(self, request: HttpRequest, parts: list[str]) -> HttpResponse | asyncio.Future[HttpResponse]:
        """``/v2/shadows[/{m}]``: the body is the shadow's config."""
        control = self.control
        return _per_model_setting(request, parts, "shadows", control.shadow_configs, control.set_shadow)

    def _canaries(
        self, request: HttpRequest, parts: list[str]
    ) -> HttpResponse | asyncio.Future[HttpResponse]:
        control = self.control
        if len(parts) == 2:
            _allow(request, "GET")
            return _when_done(control.canary_states(), lambda states: _json(200, {"canaries": states}))
        if len(parts) == 4:
            _allow(request, "POST")
            return _when_done(control.canary_action(parts[2], parts[3]), lambda state: _json(200, state))
        raise RouteNotFound(f"no route for {request.method} {request.path}")

    def _model_route(self, request: HttpRequest, parts: list[str]) -> Answer:
        service, control = self.service, self.control
        if parts == ["v2", "models", "stats"]:
            _allow(request, "GET")
            return _when_done(control.model_statistics(None, None), lambda stats: _json(200, stats))
        name = parts[2]
        version = None
        rest = parts[3:]
        if len(rest) >= 2 and rest[0] == "versions":
            version, rest = rest[1], rest[2:]
        action = rest[0] if len(rest) == 1 else ("" if not rest else None)
        if action == "infer":
            _allow(request, "POST")
            return self._infer(request, name, version)
        if action == "ready":
            _allow(request, "GET")
            ready = service.model_ready(name, version)
            return _json(200 if ready else 503, {"name": name, "ready": ready})
        if action == "stats":
            _allow(request, "GET")
            return _when_done(control.model_statistics(name, version), lambda stats: _json(200, stats))
        if action == "config":
            _allow(request, "GET")
            return _json(200, service.model_config(name, version))
        if action == "inspect":
            _allow(request, "GET")
            return _json(200, service.model_inspect(name, version))
        if action == "":
            _allow(request, "GET")
            return _json(200, service.model_metadata(name, version))
        raise RouteNotFound(f"no route for {request.method} {request.path}")

    def early(self, head: HttpRequest) -> HttpResponse | None:
        """The refusal of a request whose body is still arriving: one without the right API key, or an
        inference request that would miss its model's SLO whatever the body says
        (``InferenceCall.shed``); None for anything else, which is answered once it has arrived. A
        large body takes the loop many reads to arrive on a busy server, and a refusal that waits for
        all of them is neither immediate nor cheap (nor should a client without a key get to upload)."""
        if self.guard.enabled:
            try:
                check_key(self.guard, head)
            except EdgeInferError as error:
                return response_for_error(error)
        if head.method != "POST":
            return None
        route = _inference_route(head.path)
        if route is None:
            return None
        again = self._refused_again(head, *route)
        if again is not None:
            return again
        call = self._call(head, *route)
        refusal = call.shed()
        return None if refusal is None else self._refused(refusal, call.outcome.request_id)

    def _call(self, request: HttpRequest, name: str, version: str | None) -> InferenceCall:
        return self.service.call(
            "http",
            name,
            version,
            _given_id(request),
            _trace_headers(request.headers) if self.service.traced else None,
            received_at=request.received_at,
        )

    def _refused_again(self, request: HttpRequest, name: str, version: str | None) -> HttpResponse | None:
        """The refusal of a request whose loop iteration already refused one for its model before
        decoding, counted with that one (``InferenceService.refused_again``); None for the rest."""
        refusal = self.service.refused_again("http", name, version)
        if refusal is None:
            return None
        return self._refused(refusal, _given_id(request) or new_request_id())

    def _infer(self, request: HttpRequest, name: str, version: str | None) -> Answer:
        headers = request.headers
        again = self._refused_again(request, name, version)
        if again is not None:
            return again
        call = self._call(request, name, version)
        refusal = call.shed()
        if refusal is not None:
            return self._refused(refusal, call.outcome.request_id)
        if len(request.body) >= OFF_LOOP_BYTES and json_scan.available() and _all_json(headers):
            call.defer()
            return asyncio.ensure_future(self._infer_scanned(call, request))
        done_now = DoneNow()
        try:
            decoded = call.decode(self._decode, request)
            outputs = call.submit(decoded, on_done=done_now)
        except Exception as error:
            call.fail(error)
            return _with_id(response_for_error(error), call.outcome.request_id)
        encoding = _response_encoding(headers)
        if outputs.done():  # a fast model ran inline: answer without another loop iteration
            return self._reply(call, decoded, encoding)

        def finished(_: asyncio.Future[Any]) -> HttpResponse | None:
            if outputs.cancelled():  # the client went away; the request was dropped or discarded
                call.fail(RequestCancelled("the client disconnected before the response was ready"))
                return None
            return self._reply(call, decoded, encoding)

        return Deferred(outputs, finished, done_now)

    async def _infer_scanned(self, call: InferenceCall, request: HttpRequest) -> HttpResponse:
        """``_infer`` for a large JSON body: decompressed and its numbers parsed on a worker thread
        without the GIL (``json_scan``), the rest decoded here. Meanwhile the loop reads, answers and
        refuses other requests; under overload the refusals would otherwise wait behind these decodes
        (milliseconds each for a JSON image)."""
        outputs: asyncio.Future[Any] | None = None
        try:
            try:
                scanned = await self._json_thread.run(functools.partial(self._scan, request))
                decoded = call.decode(functools.partial(self._decode, scanned=scanned), request)
                outputs = call.submit(decoded)
            except Exception as error:
                call.fail(error)
                return _with_id(response_for_error(error), call.outcome.request_id)
            await asyncio.wait((outputs,))  # its error, if any, is the model's answer (``_reply``)
            if outputs.cancelled():
                raise asyncio.CancelledError
        except asyncio.CancelledError:  # the client went away: a queued request is dropped
            if outputs is not None:
                outputs.cancel()
            call.fail(RequestCancelled("the client disconnected before the response was ready"))
            raise
        return self._reply(call, decoded, _response_encoding(request.headers))

    def _scan(self, request: HttpRequest) -> tuple[bytes, json_scan.NumericArrays | None]:
        """On the JSON thread: the body, decompressed, and its long numeric arrays (neither holds the GIL
        for long: zlib releases it too)."""
        body = self._body(request)
        return body, json_scan.float32_arrays(body)

    def _refused(self, refusal: ServerBusy, request_id: str) -> HttpResponse:
        """The answer to a request refused before it was read. Under overload most requests get one,
        and the refusals of one loop iteration share one error (``Batcher.refuse_unread``), so its
        body is encoded once for all of them."""
        body = self._refusal_body
        if body is None or body[0] is not refusal:
            body = self._refusal_body = (refusal, response_for_error(refusal))
        shared = body[1]
        return _with_id(HttpResponse(shared.status, shared.body, list(shared.headers)), request_id)

    def _decode(
        self, request: HttpRequest, scanned: tuple[bytes, json_scan.NumericArrays | None] | None = None
    ) -> InferRequest:
        """``scanned``: the body already decompressed and its numbers parsed (``_infer_scanned``)."""
        headers = request.headers  # most requests have neither header: no call to look for them
        if scanned is not None:
            decoded = json_codec.decode_request(scanned[0], self.max_json_depth, scanned[1])
        else:
            body = self._body(request) if b"content-encoding" in headers else request.body
            length = _header_length(request) if b"inference-header-content-length" in headers else None
            decoded = http_binary.decode_request(body, length, self.max_json_depth)
        request.body = b""  # a queued request holds only its tensors, not the body too
        routing_key = request.headers.get(b"x-routing-key")
        if routing_key is not None:  # a route keeps one key on one variant (the body's wins)
            decoded.parameters.setdefault("routing_key", routing_key.decode("latin-1"))
        return decoded

    def _body(self, request: HttpRequest) -> bytes:
        encoding = request.headers.get(b"content-encoding")
        if encoding is None:
            return request.body
        return http_compression.decompress(request.body, encoding, self.max_body_bytes)

    def _reply(self, call: InferenceCall, decoded: InferRequest, encoding: bytes | None) -> HttpResponse:
        """The HTTP response of a finished inference (the model's error, or the encoded outputs)."""

        def encode(response: InferResponse) -> tuple[bytes, int | None]:
            return http_binary.encode_response(
                response, http_binary.binary_outputs(response, decoded.parameters)
            )

        try:
            body, header_length = call.respond(encode)
        except Exception as error:
            return _with_id(response_for_error(error), call.outcome.request_id)
        reply = HttpResponse(200, body)
        if header_length is not None:
            reply.content_type = b"application/octet-stream"
            reply.headers.append((b"inference-header-content-length", str(header_length).encode()))
        if encoding is not None and len(body) >= self.compress_min_bytes:
            reply.body = http_compression.compress(body, encoding)
            reply.headers.append((b"content-encoding", encoding))
        return _with_id(reply, call.outcome.request_id)


def _per_model_setting(
    request: HttpRequest,
    parts: list[str],
    key: str,
    listing: Callable[[], dict[str, Any]],
    setter: Callable[[str, Any], Awaitable[None]],
) -> HttpResponse | asyncio.Future[HttpResponse]:
    """``GET /v2/<key>`` lists; ``PUT /v2/<key>/{m}`` sets from the JSON body; ``DELETE`` removes."""
    if len(parts) == 2:
        _allow(request, "GET")
        return _json(200, {key: listing()})
    if request.method == "DELETE":
        return _when_done(setter(parts[2], None), lambda _: _json(200, {}))
    if request.method not in ("PUT", "POST"):
        raise MethodNotAllowed(request.method, "PUT, DELETE")
    document = json_codec.loads_object(request.body, "request body")
    return _when_done(setter(parts[2], document), lambda _: _json(200, {key: listing()}))


def _response_encoding(headers: dict[bytes, bytes]) -> bytes | None:
    """The compression the client accepts for the response (most name none: then nothing to parse)."""
    accepted = headers.get(b"accept-encoding")
    return http_compression.choose_encoding(accepted) if accepted else None


def _all_json(headers: dict[bytes, bytes]) -> bool:
    """Whether a request's body is JSON throughout (not Triton's binary tensors after a JSON header)."""
    return b"inference-header-content-length" not in headers


def _inference_route(path: str) -> tuple[str, str | None] | None:
    """(model, version) of an inference path (``/v2/models/{m}[/versions/{v}]/infer``, ``/v1/models/
    {m}[/versions/{v}]/predict``), else None."""
    parts = path.strip("/").split("/")
    if len(parts) == 4 and (parts[0], parts[1], parts[3]) in _INFERENCE:
        return parts[2], None
    if len(parts) == 6 and parts[3] == "versions" and (parts[0], parts[1], parts[5]) in _INFERENCE:
        return parts[2], parts[4]
    return None


_INFERENCE = {("v2", "models", "infer"), ("v1", "models", "predict")}


def _trace_headers(headers: dict[bytes, bytes]) -> tuple[str, str | None] | None:
    """The W3C trace context a client sent (``traceparent``, ``tracestate``), for tracing."""
    parent = headers.get(b"traceparent")
    if parent is None:
        return None
    state = headers.get(b"tracestate")
    return parent.decode("latin-1"), state.decode("latin-1") if state is not None else None


def _given_id(request: HttpRequest) -> str | None:
    """The client's request id (``x-request-id``), if it sent one."""
    given = request.headers.get(b"x-request-id")
    return given.decode("latin-1") if given else None


def _with_id(reply: HttpResponse, request_id: str) -> HttpResponse:
    reply.headers.append((b"x-request-id", request_id.encode("latin-1", "replace")))
    return reply


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


def _header_length(request: HttpRequest) -> int | None:
    value = request.headers.get(b"inference-header-content-length")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        shown = value.decode(errors="replace")
        raise InvalidInput(f"Inference-Header-Content-Length {shown!r} is not a number") from None
