"""Errors as gRPC statuses: the code of each error class (``CODE_BY_ERROR``, looked up along the MRO,
with the same messages as HTTP), and the retry pushback a refusal for load sends (gRFC A6)."""

from __future__ import annotations

import grpc

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

CODE_BY_ERROR: dict[type[BaseException], grpc.StatusCode] = {
    ModelLoadError: grpc.StatusCode.INVALID_ARGUMENT,
    PayloadTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    TooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    InvalidInput: grpc.StatusCode.INVALID_ARGUMENT,
    Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    ModelNotFound: grpc.StatusCode.NOT_FOUND,
    ModelNotReady: grpc.StatusCode.UNAVAILABLE,
    ServerBusy: grpc.StatusCode.RESOURCE_EXHAUSTED,
    RequestTimeout: grpc.StatusCode.DEADLINE_EXCEEDED,
    RequestCancelled: grpc.StatusCode.CANCELLED,
    Superseded: grpc.StatusCode.ABORTED,
    InferenceFailed: grpc.StatusCode.INTERNAL,
    EdgeInferError: grpc.StatusCode.INTERNAL,
}


def code_for(error: BaseException) -> grpc.StatusCode:
    for cls in type(error).__mro__:
        code = CODE_BY_ERROR.get(cls)
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


PUSHBACK = "grpc-retry-pushback-ms"


def retry_pushback(error: BaseException, code: grpc.StatusCode) -> str | None:
    """The ``grpc-retry-pushback-ms`` trailer for a RESOURCE_EXHAUSTED answer (gRFC A6, which gRPC clients
    with a retry policy obey): a refusal for load says when the work ahead should be done, as HTTP's
    Retry-After does; one for the request's size says not to retry (-1), as the same request would be
    refused again. None for any other answer."""
    if isinstance(error, ServerBusy):
        return str(error.retry_after_ms)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return "-1"
    return None


async def abort(context: grpc.aio.ServicerContext, error: BaseException) -> None:
    """End the call with the error's status and message, and the retry pushback where there is one
    (added to the trailing metadata already set, such as the request id)."""
    code = code_for(error)
    pushback = retry_pushback(error, code)
    if pushback is None:
        await context.abort(code, describe_error(error))
    else:
        trailing = (*(context.trailing_metadata() or ()), (PUSHBACK, pushback))
        await context.abort(code, describe_error(error), trailing)
