"""A lean HTTP/1.1 server on uvloop and httptools, knowing nothing about inference.

Why not uvicorn: an ASGI round trip costs a task, a dozen message dicts and two awaits per request, which
is most of the server's own latency for a small model. Here one ``asyncio.Protocol`` per connection feeds
bytes to httptools (the parser uvicorn uses), hands each complete request to a handler, and writes the
response in one ``transport.write``. A handler answers at once, returns a future of its answer, or a
``Deferred`` (the answer built from another future when that is done); when the client disconnects,
that future is cancelled, so a request still queued for a batch is dropped.

What it does: keep-alive and pipelining (answered in order, reading paused while a request is pending),
Content-Length and chunked bodies, ``Expect: 100-continue``, TLS (an ``ssl.SSLContext`` given to the
server), an early answer from a request's head while its body still arrives (``EarlyHandler``), a
graceful shutdown that lets in-flight requests finish, and the hard limits of ``HttpLimits``:
body size (checked on the declared length before reading and on the running total while reading),
header size and count, slow clients (the headers and the body each have a deadline: a client that
trickles bytes is answered 408 and closed), idle keep-alive connections, and open connections. Every
refusal is reported to ``on_refused`` by the limit's name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any, cast

import httptools

from edgeinfer.server.accept import Listener
from edgeinfer.server.http_messages import (
    CONTINUE,
    Deferred,
    EarlyHandler,
    ErrorResponder,
    Handler,
    HttpLimits,
    HttpRequest,
    HttpResponse,
    RefusalCounter,
    encode_response,
    split_url,
)
from edgeinfer.server.idle_poll import IdlePoll

log = logging.getLogger(__name__)

LINGER_S = 2.0
SWEEP_MAX_S = 1.0  # deadlines are checked at least this often (and four times per shortest timeout)


def _parse_failure(error: Exception) -> str:
    """What a parse failure says. A request target that is not a valid URL fails in our callback
    (``split_url``), and httptools reports a callback's failure as only "callback error", with the
    cause as its context: the client is told the cause."""
    cause = error.__context__
    return str(cause if isinstance(cause, httptools.HttpParserInvalidURLError) else error)


def _describe(request: HttpRequest | None) -> str:
    return f"{request.method} {request.path}" if request is not None else "a request"


class _Refused(Exception):
    """Raised from a parser callback to stop parsing; httptools wraps it, so the reason is kept aside."""


class ServerState:
    """Shared by every connection of one server: the handler, limits, live connections and the answers
    still pending among them (none pending: the server is idle, and ``idle_poll`` may poll a while)."""

    def __init__(
        self,
        handler: Handler,
        on_error: ErrorResponder,
        limits: HttpLimits,
        on_refused: RefusalCounter,
        idle_poll: IdlePoll | None = None,
        early: EarlyHandler | None = None,
    ) -> None:
        self.handler = handler
        self.on_error = on_error
        self.limits = limits
        self.on_refused = on_refused
        self.idle_poll = idle_poll
        self.early = early
        self.pending = 0
        self.connections: set[HttpConnection] = set()
        self.all_closed: asyncio.Event | None = None  # set by stop(); fires when the last connection closes


class HttpConnection(asyncio.Protocol):
    """One client connection: parses requests and writes responses in order."""

    def __init__(self, state: ServerState) -> None:
        self._state = state
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._header_bytes = 0
        self._header_count = 0
        self._max_header_bytes = state.limits.max_header_bytes  # read per header: kept at hand
        self._max_headers = state.limits.max_headers
        self._reading: str | None = None  # "headers" or "body" while a request is being received
        self._reading_since = 0.0
        self._began = 0.0  # when the request being read began to arrive
        self._body: list[bytes] = []
        self._body_size = 0
        self._asked_early = False  # the early handler was asked about the request being read
        self._dropping = False  # it was answered early: the rest of its body is dropped
        self._early_head: HttpRequest | None = None  # asked about early and let through: reused whole
        self._queue: deque[HttpRequest] = deque()
        self._inflight: asyncio.Future[Any] | None = None
        self._inflight_request: HttpRequest | None = None
        self._respond: Callable[[asyncio.Future[Any]], HttpResponse | None] | None = None  # a Deferred's
        self._closing = False
        self._draining = False
        self._refusal: tuple[int, str, str] | None = None  # status, message, limit
        self._reading_paused = False
        self.last_active = time.monotonic()

    # ---- asyncio.Protocol ----

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it
        state = self._state
        if len(state.connections) >= state.limits.max_connections:
            state.on_refused("connections")
            limit = state.limits.max_connections
            self._fail(503, f"too many open connections (server.limits.max_connections: {limit})")
            return
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):  # not every socket type takes it
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        state.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._state.connections.discard(self)
        if self._state.all_closed is not None and not self._state.connections:
            self._state.all_closed.set()
        self._closing = True
        self._queue.clear()
        if self._inflight is not None and not self._inflight.done():
            self._inflight.cancel()  # a queued inference is dropped, not run

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        if self._state.idle_poll is not None:
            self._state.idle_poll.arrived()
        if self._closing:
            return  # lingering after a refusal: the rest of the request is read and dropped
        try:
            self._parser.feed_data(data)
            if self._reading == "body" and not self._asked_early:
                self._answer_early()  # (a body that came with its headers was handed on whole by now)
        except httptools.HttpParserUpgrade:
            self._fail(400, "protocol upgrades are not supported")
        except (httptools.HttpParserError, _Refused) as exc:
            if self._refusal is not None:
                status, message, limit = self._refusal
                self._state.on_refused(limit)
                self._fail(status, message)
            else:
                self._fail(400, f"malformed HTTP request: {_parse_failure(exc)}")

    # ---- httptools callbacks ----

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = {}
        self._header_bytes = 0
        self._header_count = 0
        self._body = []
        self._body_size = 0
        self._asked_early = self._dropping = False
        self._early_head = None
        self._began = self.last_active  # (set as these bytes arrived: data_received)
        self._reading, self._reading_since = "headers", self._began

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._header_bytes += len(url)
        if self._header_bytes > self._max_header_bytes:
            self._headers_over()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.lower()] = value
        self._header_bytes += len(name) + len(value)
        self._header_count += 1
        if self._header_bytes > self._max_header_bytes or self._header_count > self._max_headers:
            self._headers_over()

    def on_headers_complete(self) -> None:
        self._reading, self._reading_since = "body", time.monotonic()
        declared = self._headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._state.limits.max_body_bytes:
            self._refuse(413, self._too_large_message(int(declared)), "body_size")
        if self._headers.get(b"expect", b"").lower() == b"100-continue" and self._transport is not None:
            if self._answer_early(expecting=True):
                return
            self._transport.write(CONTINUE)

    def on_body(self, body: bytes) -> None:
        self._body_size += len(body)
        if self._body_size > self._state.limits.max_body_bytes:
            if self._dropping:  # answered already: no second answer, but no endless body either
                self._state.on_refused("body_size")
                self._close()
                return
            self._refuse(413, self._too_large_message(self._body_size), "body_size")
        if not self._dropping:
            self._body.append(body)

    def on_message_complete(self) -> None:
        self._reading = None
        if self._dropping:  # answered early
            self._dropping = False
            return
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        request = self._early_head
        if request is not None:  # asked about early and let through: the same request, now whole
            self._early_head = None
            request.body = body
        else:
            path, query = split_url(self._url)
            request = HttpRequest(
                method=self._parser.get_method().decode("ascii", "replace"),
                path=path,
                query=query,
                headers=self._headers,
                body=body,
                keep_alive=self._parser.should_keep_alive(),
                received_at=self._began,
            )
        self._body = []
        if self._inflight is not None or self._queue:
            self._queue.append(request)
            self._pause_reading()
        else:
            self._dispatch(request)

    # ---- requests and responses ----

    def _answer_early(self, expecting: bool = False) -> bool:
        """Ask the early handler about the request whose body is still to come; write its answer, if
        any, and drop the body (True). Only while nothing earlier on this connection awaits its
        answer: answers go out in order. A client that expects ``100 Continue`` sends no body after
        another answer, or may not: that connection is answered and closed, as it cannot stay in step;
        so is one the client asked to close."""
        self._asked_early = True
        early = self._state.early
        if early is None or self.busy or self._closing:
            return False
        path, query = split_url(self._url)
        head = HttpRequest(
            method=self._parser.get_method().decode("ascii", "replace"),
            path=path,
            query=query,
            headers=self._headers,
            body=b"",
            keep_alive=self._parser.should_keep_alive(),
            received_at=self._began,
        )
        try:
            response = early(head)
        except Exception:  # the early handler maps every expected error itself; this is a bug
            log.exception("unhandled error answering %s early", _describe(head))
            return False
        if response is None:
            self._early_head = head
            return False
        self._dropping = True
        self._body = []
        if expecting or not head.keep_alive:
            self._fail_with(response)
        else:
            self._write(head, response)
        return True

    def _dispatch(self, request: HttpRequest) -> None:
        try:
            result = self._state.handler(request)
        except Exception:  # the handler maps every expected error itself; this is a bug
            log.exception("unhandled error for %s %s", request.method, request.path)
            result = self._state.on_error(500, "internal server error")
        if isinstance(result, HttpResponse):
            self._write(request, result)
            return
        if isinstance(result, Deferred):
            self._respond = result.respond
            if result.done_now is not None:
                result.done_now.bind(partial(self._on_inflight_done, result.future))
            result = result.future
        self._inflight = result
        self._inflight_request = request
        self._state.pending += 1
        result.add_done_callback(self._on_inflight_done)

    def _on_inflight_done(self, future: asyncio.Future[Any]) -> None:
        if future is not self._inflight:  # answered already, from ``Deferred.done_now``
            return
        self._state.pending -= 1
        request, respond = self._inflight_request, self._respond
        self._inflight = self._inflight_request = self._respond = None
        response: HttpResponse | None
        if respond is not None:
            try:
                response = respond(future)
            except Exception:  # the handler maps every expected error itself; this is a bug
                log.exception("unhandled error answering %s", _describe(request))
                response = self._state.on_error(500, "internal server error")
        elif future.cancelled():
            return
        elif (error := future.exception()) is not None:
            log.error("unhandled error for %s", _describe(request), exc_info=error)
            response = self._state.on_error(500, "internal server error")
        else:
            response = future.result()
        if response is None or self._closing or request is None:
            return
        self._write(request, response)

    def _write(self, request: HttpRequest, response: HttpResponse) -> None:
        transport = self._transport
        if transport is None or self._closing:
            return
        keep_alive = request.keep_alive and not self._draining
        transport.write(encode_response(response, keep_alive))
        self.last_active = time.monotonic()
        if not keep_alive:
            self._close()
            return
        if self._queue:
            self._dispatch(self._queue.popleft())
        if not self._queue and self._reading_paused:
            self._reading_paused = False
            self._reading_since = time.monotonic()  # a request read in part waited for us, not the client
            transport.resume_reading()
        state = self._state
        if state.idle_poll is not None and not state.pending:
            state.idle_poll.idle()

    def _fail(self, status: int, message: str) -> None:
        """Answer a request that cannot be parsed or read, then close: the stream is out of step."""
        self._fail_with(self._state.on_error(status, message))

    def _fail_with(self, response: HttpResponse) -> None:
        """Answer and close. The close lingers: the client may still be sending the body it was refused
        for, and closing at once would reset the connection before it reads the answer. So the write
        side is shut, what still arrives is dropped, and the socket closes when the client does or
        after LINGER_S.
        """
        transport = self._transport
        if transport is None or self._closing:
            return
        self._closing = True
        transport.write(encode_response(response, keep_alive=False))
        if transport.can_write_eof():
            transport.write_eof()
            asyncio.get_running_loop().call_later(LINGER_S, transport.close)
        else:
            transport.close()

    def _refuse(self, status: int, message: str, limit: str) -> None:
        self._refusal = (status, message, limit)
        raise _Refused(message)

    def _too_large_message(self, size: int) -> str:
        return (
            f"request body of {size} bytes is larger than the limit of "
            f"{self._state.limits.max_body_bytes} bytes (server.max_request_size_mb)"
        )

    def _headers_over(self) -> None:
        if self._header_bytes > self._max_header_bytes:
            limit = self._max_header_bytes
            message = f"request line and headers exceed {limit} bytes (server.limits.max_header_bytes)"
            self._refuse(431, message, "header_size")
        limit = self._max_headers
        self._refuse(431, f"more than {limit} header fields (server.limits.max_headers)", "header_count")

    def _pause_reading(self) -> None:
        if not self._reading_paused and self._transport is not None:
            self._reading_paused = True
            self._transport.pause_reading()

    def _close(self) -> None:
        self._closing = True
        if self._transport is not None:
            self._transport.close()

    # ---- server control ----

    @property
    def busy(self) -> bool:
        return self._inflight is not None or bool(self._queue)

    def shutdown(self) -> None:
        """Close now if idle; otherwise close right after the in-flight response."""
        self._draining = True
        self._queue.clear()
        if not self.busy:
            self._close()

    def abort(self) -> None:
        self._close()

    def check_deadlines(self, now: float) -> None:
        """Answer 408 to a client too slow with its headers or body; close one idle for too long."""
        if self.busy or self._closing:
            return
        limits = self._state.limits
        waited = now - self._reading_since
        if self._reading == "headers" and waited > limits.header_timeout_s:
            self._time_out("headers", "header_timeout_s", limits.header_timeout_s)
        elif self._reading == "body" and waited > limits.body_timeout_s:
            self._time_out("body", "body_timeout_s", limits.body_timeout_s)
        elif self._reading is None and now - self.last_active > limits.keepalive_timeout_s:
            self._state.on_refused("keepalive_timeout")
            self._close()

    def _time_out(self, part: str, key: str, seconds: float) -> None:
        self._state.on_refused(key.removesuffix("_s"))
        self._fail(408, f"request {part} not complete within {seconds:g} s (server.limits.{key})")


def _no_count(limit: str) -> None:
    pass


class HttpServer:
    """Listens on a bound socket and serves ``handler`` until ``stop`` (over TLS with ``ssl_context``)."""

    def __init__(
        self,
        handler: Handler,
        on_error: ErrorResponder,
        limits: HttpLimits,
        ssl_context: ssl.SSLContext | None = None,
        on_refused: RefusalCounter = _no_count,
        idle_poll: IdlePoll | None = None,
        early: EarlyHandler | None = None,
    ) -> None:
        self._state = ServerState(handler, on_error, limits, on_refused, idle_poll, early)
        self._ssl = ssl_context
        self._listener: Listener | None = None
        self._sweeper: asyncio.TimerHandle | None = None

    async def start(self, sock: socket.socket, shared: bool = False) -> None:
        """``shared``: other processes accept connections on ``sock`` too (workers): it is then
        accepted from one connection at a time (``accept.py``)."""
        self._listener = Listener(
            sock,
            lambda: HttpConnection(self._state),
            self._ssl,
            self._state.limits.header_timeout_s,
            shared,
        )
        self._listener.start()
        self._schedule_sweep()

    def _schedule_sweep(self) -> None:
        limits = self._state.limits
        shortest = min(limits.header_timeout_s, limits.body_timeout_s, limits.keepalive_timeout_s)
        self._sweeper = asyncio.get_running_loop().call_later(min(SWEEP_MAX_S, shortest / 4), self._sweep)

    def _sweep(self) -> None:
        now = time.monotonic()
        for connection in list(self._state.connections):
            connection.check_deadlines(now)
        self._schedule_sweep()

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Stop accepting, let in-flight requests finish (up to ``timeout_s``), close every connection."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._listener is not None:
            self._listener.close()
        self._state.all_closed = asyncio.Event()
        if not self._state.connections:
            self._state.all_closed.set()
        for connection in list(self._state.connections):
            connection.shutdown()
        try:
            await asyncio.wait_for(self._state.all_closed.wait(), timeout_s)
        except asyncio.TimeoutError:
            log.warning("closing %d connection(s) that did not finish in time", len(self._state.connections))
            for connection in list(self._state.connections):
                connection.abort()
