"""Inference over HTTP: a request's head, its judgement before the body is read, the decode (on the
loop, or for a large JSON body on the JSON thread), the submission and the encoded answer."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from edgeinfer.errors import InvalidInput, RequestCancelled, ServerBusy
from edgeinfer.head import RequestHead, TraceHeaders
from edgeinfer.protocol import http_binary, json_codec, json_scan
from edgeinfer.protocol.types import InferRequest, InferResponse
from edgeinfer.server import http_compression
from edgeinfer.server.http_errors import response_for_error
from edgeinfer.server.http_messages import Answer, Deferred, DoneNow, HttpRequest, HttpResponse
from edgeinfer.server.offload import OffloadThread
from edgeinfer.service import InferenceCall, InferenceService, new_request_id

# From this size a JSON body is decoded on a worker thread, its numbers without the GIL (json_scan.py):
# such a body takes the loop several thread hops' time to parse (docs/design/json-scan.md).
OFF_LOOP_BYTES = 256 * 1024


class HttpInference:
    """``max_body_bytes`` bounds decompressed bodies too; answers of at least ``compress_min_bytes``
    are compressed when the client accepts gzip or deflate; ``max_json_depth`` bounds JSON nesting."""

    def __init__(
        self, service: InferenceService, max_body_bytes: int, compress_min_bytes: int, max_json_depth: int
    ) -> None:
        self.service = service
        self.max_body_bytes = max_body_bytes
        self.compress_min_bytes = compress_min_bytes
        self.max_json_depth = max_json_depth
        self._refusal_body: tuple[ServerBusy, HttpResponse] | None = None  # the last refusal's
        self._json_thread = OffloadThread("edgeinfer-json")  # below the loop (offload.py)

    def early(self, request: HttpRequest, name: str, version: str | None) -> HttpResponse | None:
        """Judge an inference request whose body is still arriving: its refusal, or None, and then the
        call judged stays with the request (``HttpRequest.context``) for ``infer``: judged once."""
        judged = self._judged(request, name, version)
        if isinstance(judged, HttpResponse):
            return judged
        request.context = judged
        return None

    def _judged(self, request: HttpRequest, name: str, version: str | None) -> InferenceCall | HttpResponse:
        """The request's call, judged before its body is decoded, or the answer to its refusal."""
        again = self._refused_again(request, name, version)
        if again is not None:
            return again
        call = self.service.call(self._head(request, name, version))
        refusal = call.shed()
        if refusal is not None:
            return self._refused(refusal, call.outcome.request_id)
        return call

    def infer(self, request: HttpRequest, name: str, version: str | None) -> Answer:
        call = request.context
        if not isinstance(call, InferenceCall):  # not judged while its body arrived
            judged = self._judged(request, name, version)
            if isinstance(judged, HttpResponse):
                return judged
            call = judged
        else:
            call.body_arrived()
        headers = request.headers
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

    def _head(self, request: HttpRequest, name: str, version: str | None) -> RequestHead:
        headers = request.headers
        given = headers.get(b"x-request-id")
        key = headers.get(b"x-routing-key")
        return RequestHead(
            "http",
            name,
            version,
            given.decode("latin-1") if given else None,
            _trace_headers(headers) if self.service.traced else None,
            key.decode("latin-1") if key is not None else None,
            received_at=request.received_at,
        )

    def _refused_again(self, request: HttpRequest, name: str, version: str | None) -> HttpResponse | None:
        """The refusal of a request whose loop iteration already refused one for its model before
        decoding, counted with that one (``InferenceService.refused_again``); None for the rest."""
        refusal = self.service.refused_again("http", name, version)
        if refusal is None:
            return None
        given = request.headers.get(b"x-request-id")
        return self._refused(refusal, given.decode("latin-1") if given else new_request_id())

    def _refused(self, refusal: ServerBusy, request_id: str) -> HttpResponse:
        """The answer to a request refused before it was read. The refusals of one loop iteration
        share one error, so its body is encoded once for all of them."""
        body = self._refusal_body
        if body is None or body[0] is not refusal:
            body = self._refusal_body = (refusal, response_for_error(refusal))
        shared = body[1]
        return _with_id(HttpResponse(shared.status, shared.body, list(shared.headers)), request_id)

    async def _infer_scanned(self, call: InferenceCall, request: HttpRequest) -> HttpResponse:
        """``infer`` for a large JSON body: decompressed and its numbers parsed on the JSON thread
        without the GIL (``json_scan``), the rest decoded here; meanwhile the loop serves others."""
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


def _response_encoding(headers: dict[bytes, bytes]) -> bytes | None:
    """The compression the client accepts for the response (most name none: then nothing to parse)."""
    accepted = headers.get(b"accept-encoding")
    return http_compression.choose_encoding(accepted) if accepted else None


def _all_json(headers: dict[bytes, bytes]) -> bool:
    """Whether a request's body is JSON throughout (not Triton's binary tensors after a JSON header)."""
    return b"inference-header-content-length" not in headers


def _trace_headers(headers: dict[bytes, bytes]) -> TraceHeaders | None:
    """The W3C trace context a client sent (``traceparent``, ``tracestate``), for tracing."""
    parent = headers.get(b"traceparent")
    if parent is None:
        return None
    state = headers.get(b"tracestate")
    return parent.decode("latin-1"), state.decode("latin-1") if state is not None else None


def _with_id(reply: HttpResponse, request_id: str) -> HttpResponse:
    reply.headers.append((b"x-request-id", request_id.encode("latin-1", "replace")))
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
