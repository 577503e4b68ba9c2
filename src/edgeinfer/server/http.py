"""The HTTP adapter: a plain ASGI app served by uvicorn with httptools and uvloop.

No web framework: routing is a split of the path, bodies are read with a size limit, and every
response is bytes from orjson. The adapter only converts wire format to core calls and core errors to
status codes (``STATUS_BY_ERROR``); the work happens in ``InferenceService``.

Routes (KServe V2 / Open Inference Protocol, plus the simple v1 style)::

    GET  /v2                                       server metadata
    GET  /v2/health/live | /v2/health/ready        probes
    GET  /v2/models/{m}[/versions/{v}]             model metadata
    GET  /v2/models/{m}[/versions/{v}]/ready       model readiness
    GET  /v2/models[/{m}[/versions/{v}]]/stats     statistics (Triton's extension)
    POST /v2/models/{m}[/versions/{v}]/infer       inference
    GET  /v1/models                                every model, version and state
    POST /v1/models/{m}[/versions/{v}]/predict     inference, same bodies as /infer
    GET  /health                                   200 when ready, 503 otherwise
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from edgeinfer.errors import (
    EdgeInferError,
    InferenceFailed,
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
    PayloadTooLarge,
    RequestCancelled,
    RequestTimeout,
    ServerBusy,
)
from edgeinfer.protocol import json_codec
from edgeinfer.service import InferenceService

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

STATUS_BY_ERROR: dict[type[BaseException], int] = {
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

_JSON_HEADERS = [(b"content-type", b"application/json")]


def status_for(error: BaseException) -> int:
    """Look the error's class up along its MRO, so subclasses inherit their parent's status."""
    for cls in type(error).__mro__:
        status = STATUS_BY_ERROR.get(cls)
        if status is not None:
            return status
    return 500


class HttpApp:
    """The ASGI application. ``max_body_bytes`` caps every request body (413 past it)."""

    def __init__(self, service: InferenceService, max_body_bytes: int) -> None:
        self.service = service
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        try:
            await self._route(scope, receive, send)
        except EdgeInferError as error:
            await _send_error(send, error)
        except Exception as error:
            log.exception("unexpected error on %s %s", scope["method"], scope["path"])
            await _send_json(send, 500, {"error": f"internal server error: {type(error).__name__}: {error}"})

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        method: str = scope["method"]
        parts = scope["path"].strip("/").split("/")
        service = self.service

        if parts[0] == "v2":
            if parts == ["v2", "models", "stats"]:
                _allow(method, "GET")
                await _send_json(send, 200, service.model_statistics(None, None))
                return
            if len(parts) >= 3 and parts[1] == "models":
                name = parts[2]
                version = None
                rest = parts[3:]
                if len(rest) >= 2 and rest[0] == "versions":
                    version = rest[1]
                    rest = rest[2:]
                action = rest[0] if len(rest) == 1 else ("" if not rest else None)
                if action == "infer":
                    _allow(method, "POST")
                    await self._infer(name, version, receive, send, scope)
                    return
                if action == "ready":
                    _allow(method, "GET")
                    ready = service.model_ready(name, version)
                    await _send_json(send, 200 if ready else 503, {"name": name, "ready": ready})
                    return
                if action == "stats":
                    _allow(method, "GET")
                    await _send_json(send, 200, service.model_statistics(name, version))
                    return
                if action == "":
                    _allow(method, "GET")
                    await _send_json(send, 200, service.model_metadata(name, version))
                    return
            elif parts == ["v2"]:
                _allow(method, "GET")
                await _send_json(send, 200, service.server_metadata())
                return
            elif parts == ["v2", "health", "live"]:
                _allow(method, "GET")
                await _send_json(send, 200, {"live": service.live()})
                return
            elif parts == ["v2", "health", "ready"]:
                _allow(method, "GET")
                ready = service.ready()
                await _send_json(send, 200 if ready else 503, {"ready": ready})
                return
        elif parts[0] == "v1" and len(parts) >= 2 and parts[1] == "models":
            if len(parts) == 2:
                _allow(method, "GET")
                await _send_json(send, 200, {"models": service.model_index()})
                return
            if len(parts) == 4 and parts[3] == "predict":
                _allow(method, "POST")
                await self._infer(parts[2], None, receive, send, scope)
                return
            if len(parts) == 6 and parts[3] == "versions" and parts[5] == "predict":
                _allow(method, "POST")
                await self._infer(parts[2], parts[4], receive, send, scope)
                return
        elif parts == ["health"]:
            _allow(method, "GET")
            ready = service.ready()
            await _send_json(send, 200 if ready else 503, {"status": "ready" if ready else "not ready"})
            return
        await _send_json(send, 404, {"error": f"no route for {method} {scope['path']}"})

    async def _infer(
        self, name: str, version: str | None, receive: Receive, send: Send, scope: Scope
    ) -> None:
        body = await self._read_body(scope, receive)
        request = json_codec.decode_request(body)
        infer = asyncio.ensure_future(self.service.infer(name, version, request))
        if not infer.done():
            await _await_unless_disconnected(infer, receive)
        response = infer.result()
        await _send_bytes(send, 200, json_codec.encode_response(response))

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        limit = self.max_body_bytes
        for key, value in scope["headers"]:
            if key == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    raise InvalidInput(f"Content-Length {value!r} is not a number") from None
                if declared > limit:
                    raise PayloadTooLarge(_too_large(declared, limit))
                break
        message = await receive()
        body: bytes = message.get("body", b"")
        if not message.get("more_body", False):
            return body
        chunks = [body]
        size = len(body)
        while message.get("more_body", False):
            message = await receive()
            if message["type"] == "http.disconnect":
                raise RequestCancelled("client disconnected while sending the body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(_too_large(size, limit))
            chunks.append(chunk)
        return b"".join(chunks)


async def _await_unless_disconnected(infer: asyncio.Future[Any], receive: Receive) -> None:
    """Wait for the inference; if the client disconnects first, cancel it (a queued request is dropped)."""
    disconnect = asyncio.ensure_future(receive())
    try:
        await asyncio.wait((infer, disconnect), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not infer.done():
            infer.cancel()
            raise RequestCancelled("client disconnected before the response was ready")
        disconnect.cancel()


def _allow(method: str, allowed: str) -> None:
    if method != allowed:
        raise _MethodNotAllowed(f"method {method} is not allowed here; use {allowed}")


class _MethodNotAllowed(InvalidInput):
    pass


STATUS_BY_ERROR[_MethodNotAllowed] = 405


def _too_large(size: int, limit: int) -> str:
    return (
        f"request body of {size} bytes is larger than the limit of {limit} bytes (server.max_request_size_mb)"
    )


async def _send_error(send: Send, error: EdgeInferError) -> None:
    status = status_for(error)
    headers = list(_JSON_HEADERS)
    if isinstance(error, ServerBusy):
        headers.append((b"retry-after", str(max(1, round(error.retry_after_s))).encode()))
    if isinstance(error, RequestCancelled):
        return  # nobody is listening
    await _send_bytes(send, status, json_codec.dumps({"error": error.message}), headers)


async def _send_json(send: Send, status: int, document: Any) -> None:
    await _send_bytes(send, status, json_codec.dumps(document))


async def _send_bytes(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*(headers or _JSON_HEADERS), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
