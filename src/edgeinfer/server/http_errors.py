"""Errors as HTTP answers: the status of each error class (``STATUS_BY_ERROR``, looked up along the
error's MRO), its JSON body, and the headers some statuses carry (Retry-After, Allow, WWW-Authenticate);
and the API-key check of a request."""

from __future__ import annotations

import logging

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
from edgeinfer.protocol import json_codec
from edgeinfer.server.auth import Guard, presented_key
from edgeinfer.server.http_messages import HttpRequest, HttpResponse
from edgeinfer.server.http_routes import OPEN, Role

log = logging.getLogger(__name__)


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


def check_key(guard: Guard, request: HttpRequest, role: Role) -> None:
    """The request's API key against ``role``, the role of its route (raises)."""
    if role == OPEN:
        return
    authorization = request.headers.get(b"authorization")
    api_key = request.headers.get(b"x-api-key")
    presented = presented_key(
        authorization.decode("latin-1") if authorization else None,
        api_key.decode("latin-1") if api_key else None,
    )
    guard.check("http", request.path, role, presented)
