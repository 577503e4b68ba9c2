"""What the HTTP server hands its handlers and writes back: a request as read (``HttpRequest``), a
response (``HttpResponse``), an answer that comes later (``Deferred``, ``DoneNow``), their bytes on the
wire (``encode_response``), and the limits a client is held to (``HttpLimits``). Plain classes with
``__slots__`` and their own ``__init__``: one of each is made per request (docs/design/mypyc.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, TypeAlias

import httptools


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """What one client may send or hold (``server.limits`` and ``server.max_request_size_mb``)."""

    max_body_bytes: int
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    keepalive_timeout_s: float = 60.0
    max_connections: int = 1024


class HttpRequest:
    """One request as read (a plain class, not a dataclass, like every object made per request:
    ``setup.py``)."""

    __slots__ = ("body", "context", "headers", "keep_alive", "method", "path", "query", "received_at")

    def __init__(
        self,
        method: str,
        path: str,
        query: bytes,
        headers: dict[bytes, bytes],  # lower-cased names; a repeated header keeps its last value
        body: bytes,
        keep_alive: bool,
        received_at: float,  # time.monotonic() when its first bytes arrived
    ) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.received_at = received_at
        # what the early handler made of the request while its body arrived (None: not asked), for the
        # handler to go on from (the same object reaches it, its body read)
        self.context: object = None


class HttpResponse:
    __slots__ = ("body", "content_type", "headers", "status")

    def __init__(
        self,
        status: int,
        body: bytes,
        headers: list[tuple[bytes, bytes]] | None = None,
        content_type: bytes = b"application/json",
    ) -> None:
        self.status = status
        self.body = body
        self.headers: list[tuple[bytes, bytes]] = [] if headers is None else headers
        self.content_type = content_type


class Deferred:
    """An answer that is ``respond(future)`` once ``future`` is done, built in the future's own callback,
    or sooner through ``done_now``.

    A handler could return a future of the response instead, set from a callback of ``future``; but each
    future hands its result on in the next loop iteration, so that answer would be written an iteration
    later, and under load an iteration is milliseconds of reading other requests. The future's own
    callbacks run in the iteration after the one it was done in, too: whoever completes it can call
    ``done_now`` right then, and the answer is written in that iteration (the callback then finds it
    answered). ``respond`` is called for a cancelled ``future`` too (the client went away: nothing is
    written), returning None."""

    __slots__ = ("done_now", "future", "respond")

    def __init__(
        self,
        future: asyncio.Future[Any],
        respond: Callable[[asyncio.Future[Any]], HttpResponse | None],
        done_now: DoneNow | None = None,
    ) -> None:
        self.future = future
        self.respond = respond
        self.done_now = done_now


class DoneNow:
    """Called by whoever completes a ``Deferred``'s future, once it is done; answers at most once."""

    __slots__ = ("_answer",)

    def __init__(self) -> None:
        self._answer: Callable[[], None] | None = None

    def bind(self, answer: Callable[[], None]) -> None:
        self._answer = answer

    def __call__(self) -> None:
        answer, self._answer = self._answer, None
        if answer is not None:
            answer()


Answer: TypeAlias = "HttpResponse | asyncio.Future[HttpResponse] | Deferred"
Handler = Callable[[HttpRequest], Answer]
EarlyHandler = Callable[[HttpRequest], HttpResponse | None]
"""Asked about a request whose body is still arriving, given its head (``body`` empty): a response
refuses it now, and the rest of its body is read and dropped; None lets it arrive and go to the
handler. A server refusing work it cannot do in time answers a large upload when its headers come,
not after the whole body has been read (and the client of ``Expect: 100-continue`` then sends none)."""
ErrorResponder = Callable[[int, str], HttpResponse]
RefusalCounter = Callable[[str], None]


def _status_lines() -> dict[int, bytes]:
    return {status.value: f"HTTP/1.1 {status.value} {status.phrase}\r\n".encode() for status in HTTPStatus}


_STATUS_LINES = _status_lines()
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def encode_response(response: HttpResponse, keep_alive: bool) -> bytes:
    status_line = _STATUS_LINES.get(response.status) or f"HTTP/1.1 {response.status} \r\n".encode()
    head = [
        status_line,
        b"content-type: ",
        response.content_type,
        b"\r\ncontent-length: ",
        str(len(response.body)).encode(),
        b"\r\n",
    ]
    for name, value in response.headers:
        head += [name, b": ", value, b"\r\n"]
    if not keep_alive:
        head.append(b"connection: close\r\n")
    head.append(b"\r\n")
    head.append(response.body)
    return b"".join(head)


URLS_KEPT = 64  # request targets whose split is kept; a server sees a few of them over and over
_urls_split: dict[bytes, tuple[str, bytes]] = {}


def split_url(url: bytes) -> tuple[str, bytes]:
    """(path, query) of a request target. Clients send the same few targets again and again (a model's
    infer path), and parsing one took 1.1 us compiled on the 2-core VM, a lookup 0.08 us; under overload
    every request refused pays it. So the last ``URLS_KEPT`` distinct targets are kept (all of them
    dropped when one more comes: a client sending new targets costs a parse each, never memory)."""
    kept = _urls_split
    split = kept.get(url)
    if split is not None:
        return split
    # Any: its query is None when the target has none, where httptools' stubs say bytes (and compiled
    # code checks the types it is told)
    parsed: Any = httptools.parse_url(url) if url else None
    split = ("/", b"") if parsed is None else (parsed.path.decode("utf-8", "replace"), parsed.query or b"")
    if len(kept) >= URLS_KEPT:
        kept.clear()
    kept[url] = split
    return split
