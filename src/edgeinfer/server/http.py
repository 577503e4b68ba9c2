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
    POST /v2/models/{m}[/versions/{v}]/infer       inference
    GET  /v1/models                                every model, version and state
    POST /v1/models/{m}[/versions/{v}]/predict     inference, same bodies as /infer
    GET  /health                                   200 when ready, 503 otherwise
    GET  /metrics                                  Prometheus metrics (also on the metrics port)
    POST /v2/repository/index                      every version and its state (Triton's extension)
    POST /v2/repository/models/{m}/load            load or reload a model (optional config override)
    POST /v2/repository/models/{m}/unload          stop serving a model
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from edgeinfer.errors import (
    EdgeInferError,
    InferenceFailed,
    InvalidInput,
    ModelEvicted,
    ModelLoadError,
    ModelNotFound,
    ModelNotReady,
    PayloadTooLarge,
    RequestCancelled,
    RequestTimeout,
    ServerBusy,
)
from edgeinfer.metrics import Metrics
from edgeinfer.protocol import http_binary, json_codec
from edgeinfer.server import http_compression
from edgeinfer.server.http_protocol import HttpRequest, HttpResponse
from edgeinfer.service import InferenceService, Outcome, PendingInference, new_request_id, parse_override

log = logging.getLogger(__name__)


class MethodNotAllowed(InvalidInput):
    """The path exists but not for this HTTP method."""


class RouteNotFound(ModelNotFound):
    """No route matches the path."""


STATUS_BY_ERROR: dict[type[BaseException], int] = {
    MethodNotAllowed: 405,
    ModelLoadError: 400,
    PayloadTooLarge: 413,
    InvalidInput: 400,
    ModelNotFound: 404,
    ModelNotReady: 503,
    ServerBusy: 429,
    RequestTimeout: 504,
    RequestCancelled: 499,
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
        return error_response(500, f"internal server error: {type(error).__name__}: {error}")
    response = error_response(status_for(error), error.message)
    if isinstance(error, ServerBusy):
        response.headers.append((b"retry-after", str(max(1, round(error.retry_after_s))).encode()))
    return response


def metrics_response(exposition: bytes) -> HttpResponse:
    return HttpResponse(200, exposition, content_type=b"text/plain; version=0.0.4; charset=utf-8")


def _json(status: int, document: Any) -> HttpResponse:
    return HttpResponse(status, json_codec.dumps(document))


def _allow(request: HttpRequest, method: str) -> None:
    if request.method != method:
        raise MethodNotAllowed(f"method {request.method} is not allowed here; use {method}")


class MetricsRoutes:
    """The handler of the metrics port: ``GET /metrics`` and nothing else."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.rstrip("/") != "/metrics":
            return error_response(404, f"no route for {request.method} {request.path}; try GET /metrics")
        if request.method != "GET":
            return error_response(405, f"method {request.method} is not allowed here; use GET")
        return metrics_response(self.metrics.exposition())


class V2Routes:
    """The request handler given to ``HttpServer``.

    ``max_body_bytes`` bounds decompressed bodies too; responses of at least ``compress_min_bytes`` are
    compressed when the client sends ``Accept-Encoding: gzip`` or ``deflate``.
    """

    def __init__(self, service: InferenceService, max_body_bytes: int, compress_min_bytes: int) -> None:
        self.service = service
        self.max_body_bytes = max_body_bytes
        self.compress_min_bytes = compress_min_bytes

    def __call__(self, request: HttpRequest) -> HttpResponse | asyncio.Future[HttpResponse]:
        try:
            return self._route(request)
        except Exception as error:
            return response_for_error(error)

    def _route(self, request: HttpRequest) -> HttpResponse | asyncio.Future[HttpResponse]:
        parts = request.path.strip("/").split("/")
        service = self.service
        head = parts[0]
        if head == "v2":
            if len(parts) >= 3 and parts[1] == "repository":
                return self._repository(request, parts)
            if len(parts) >= 3 and parts[1] == "models":
                return self._model_route(request, parts)
            if parts == ["v2"]:
                _allow(request, "GET")
                return _json(200, service.server_metadata())
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
                return _json(200, {"models": service.model_index()})
            if len(parts) == 4 and parts[3] == "predict":
                _allow(request, "POST")
                return self._infer(request, parts[2], None)
            if len(parts) == 6 and parts[3] == "versions" and parts[5] == "predict":
                _allow(request, "POST")
                return self._infer(request, parts[2], parts[4])
        elif parts == ["metrics"]:
            _allow(request, "GET")
            return metrics_response(service.metrics.exposition())
        elif parts == ["health"]:
            _allow(request, "GET")
            ready = service.ready()
            return _json(200 if ready else 503, {"status": "ready" if ready else "not ready"})
        raise RouteNotFound(f"no route for {request.method} {request.path}")

    def _repository(
        self, request: HttpRequest, parts: list[str]
    ) -> asyncio.Future[HttpResponse] | HttpResponse:
        _allow(request, "POST")
        service = self.service
        document = json_codec.loads_object(request.body, "request body") if request.body.strip() else {}
        if parts == ["v2", "repository", "index"]:
            return _json(200, service.repository_index(ready_only=document.get("ready") is True))
        if len(parts) == 5 and parts[2] == "models" and parts[4] in ("load", "unload"):
            name = parts[3]
            if parts[4] == "load":
                parameters = document.get("parameters") or {}
                override = parse_override(parameters.get("config") if isinstance(parameters, dict) else None)
                work = service.load_model(name, override)
            else:
                work = service.unload_model(name)
            return _when_done(asyncio.ensure_future(work))
        raise RouteNotFound(f"no route for {request.method} {request.path}")

    def _model_route(
        self, request: HttpRequest, parts: list[str]
    ) -> HttpResponse | asyncio.Future[HttpResponse]:
        service = self.service
        if parts == ["v2", "models", "stats"]:
            _allow(request, "GET")
            return _json(200, service.model_statistics(None, None))
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
            return _json(200, service.model_statistics(name, version))
        if action == "config":
            _allow(request, "GET")
            return _json(200, service.model_config(name, version))
        if action == "":
            _allow(request, "GET")
            return _json(200, service.model_metadata(name, version))
        raise RouteNotFound(f"no route for {request.method} {request.path}")

    def _infer(
        self, request: HttpRequest, name: str, version: str | None
    ) -> HttpResponse | asyncio.Future[HttpResponse]:
        outcome = Outcome("http", name, version)
        given_id = request.headers.get(b"x-request-id")
        try:
            decoded = http_binary.decode_request(self._body(request), _header_length(request))
            request.body = b""  # a queued request holds only its tensors, not the body too
            outcome.decode_s = time.perf_counter() - outcome.started
            outcome.request_id = given_id.decode("latin-1") if given_id else decoded.id or new_request_id()
            pending = self.service.submit(name, version, decoded, trace=outcome.trace)
        except ModelEvicted:  # the rare slow path: load the model, then answer
            work = self.service.submit_loading(name, version, decoded, trace=outcome.trace)
            return self._after(asyncio.ensure_future(work), request, outcome)
        except Exception as error:
            outcome.request_id = outcome.request_id or (given_id or b"").decode("latin-1") or new_request_id()
            return self._finish(outcome, response_for_error(error), error)
        return self._answer_when_done(pending, request, outcome)

    def _after(
        self, submitting: asyncio.Future[PendingInference], request: HttpRequest, outcome: Outcome
    ) -> asyncio.Future[HttpResponse]:
        """Answer once ``submitting`` (a model load, then the submit) and then the inference are done."""
        answer: asyncio.Future[HttpResponse] = asyncio.get_running_loop().create_future()

        def submitted(_: asyncio.Future[PendingInference]) -> None:
            if answer.done():
                return
            error = submitting.exception() if not submitting.cancelled() else RequestCancelled("cancelled")
            if error is not None:
                answer.set_result(self._finish(outcome, response_for_error(error), error))
                return
            inner = self._answer_when_done(submitting.result(), request, outcome)
            if isinstance(inner, HttpResponse):
                answer.set_result(inner)
            else:
                inner.add_done_callback(lambda _: None if answer.done() else _copy(inner, answer))
                answer.add_done_callback(lambda _: inner.cancel() if answer.cancelled() else None)

        submitting.add_done_callback(submitted)
        return answer

    def _answer_when_done(
        self, pending: PendingInference, request: HttpRequest, outcome: Outcome
    ) -> HttpResponse | asyncio.Future[HttpResponse]:
        outcome.rows, outcome.metrics = pending.rows, pending.metrics
        encoding = http_compression.choose_encoding(request.headers.get(b"accept-encoding"))
        if pending.outputs.done():  # a fast model ran inline: answer without another loop iteration
            return self._response(pending, encoding, outcome)
        answer: asyncio.Future[HttpResponse] = asyncio.get_running_loop().create_future()
        pending.outputs.add_done_callback(lambda _: self._answer(pending, encoding, outcome, answer))
        answer.add_done_callback(lambda _: pending.outputs.cancel() if answer.cancelled() else None)
        return answer

    def _finish(self, outcome: Outcome, reply: HttpResponse, error: BaseException | None) -> HttpResponse:
        outcome.error = error
        self.service.record(outcome)
        reply.headers.append((b"x-request-id", outcome.request_id.encode("latin-1", "replace")))
        return reply

    def _body(self, request: HttpRequest) -> bytes:
        encoding = request.headers.get(b"content-encoding")
        if encoding is None:
            return request.body
        return http_compression.decompress(request.body, encoding, self.max_body_bytes)

    def _answer(
        self,
        pending: PendingInference,
        encoding: bytes | None,
        outcome: Outcome,
        answer: asyncio.Future[HttpResponse],
    ) -> None:
        """Turn the finished inference into the HTTP response (runs as a future callback on the loop)."""
        if pending.outputs.cancelled():  # the client went away; the request was dropped or discarded
            outcome.error = RequestCancelled("the client disconnected before the response was ready")
            self.service.record(outcome)
            answer.cancel()
        elif not answer.done():
            answer.set_result(self._response(pending, encoding, outcome))

    def _response(self, pending: PendingInference, encoding: bytes | None, outcome: Outcome) -> HttpResponse:
        error = pending.outputs.exception()
        if error is not None:
            return self._finish(outcome, response_for_error(error), error)
        encode_started = time.perf_counter()
        try:
            response = pending.response()
            binary = http_binary.binary_outputs(response, pending.request.parameters)
            body, header_length = http_binary.encode_response(response, binary)
        except Exception as encode_error:
            return self._finish(outcome, response_for_error(encode_error), encode_error)
        outcome.encode_s = time.perf_counter() - encode_started
        reply = HttpResponse(200, body)
        if header_length is not None:
            reply.content_type = b"application/octet-stream"
            reply.headers.append((b"inference-header-content-length", str(header_length).encode()))
        if encoding is not None and len(body) >= self.compress_min_bytes:
            reply.body = http_compression.compress(body, encoding)
            reply.headers.append((b"content-encoding", encoding))
        return self._finish(outcome, reply, None)


def _copy(source: asyncio.Future[HttpResponse], target: asyncio.Future[HttpResponse]) -> None:
    if source.cancelled():
        target.cancel()
    else:
        target.set_result(source.result())


def _when_done(work: asyncio.Future[None]) -> asyncio.Future[HttpResponse]:
    """An HTTP answer for a control operation: 200 with an empty object, or the error's status."""
    answer: asyncio.Future[HttpResponse] = asyncio.get_running_loop().create_future()

    def finished(_: asyncio.Future[None]) -> None:
        if answer.done():
            return
        if work.cancelled():
            answer.cancel()
            return
        error = work.exception()
        answer.set_result(response_for_error(error) if error is not None else _json(200, {}))

    work.add_done_callback(finished)
    return answer


def _header_length(request: HttpRequest) -> int | None:
    value = request.headers.get(b"inference-header-content-length")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        shown = value.decode(errors="replace")
        raise InvalidInput(f"Inference-Header-Content-Length {shown!r} is not a number") from None
