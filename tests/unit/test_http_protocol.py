"""``HttpConnection`` fed bytes through a transport that only records what is written (as
bench/request_cost.py drives it): no sockets. Pipelining, chunked bodies, ``Expect: 100-continue``,
refusals, and the early handler asked while a body arrives. tests/integration/test_http_*.py do the
same over real sockets for what only a socket shows."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import uvloop

from edgeinfer.server.http_messages import CONTINUE, HttpLimits, HttpRequest, HttpResponse, encode_response
from edgeinfer.server.http_protocol import HttpConnection, ServerState

T = TypeVar("T")


class RecordingTransport(asyncio.Transport):
    """Keeps every write, and whether reading is paused and the transport closed."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.paused = False
        self.closed = False
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))
        for count, waiter in self._waiters:
            if len(self.writes) >= count and not waiter.done():
                waiter.set_result(None)

    async def written(self, count: int) -> list[bytes]:
        """Once ``count`` writes were made (at most five seconds): every write."""
        if len(self.writes) < count:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append((count, waiter))
            await asyncio.wait_for(waiter, 5)
        return self.writes

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def can_write_eof(self) -> bool:
        return False

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


class Site:
    """The handler and early handler of one connection, recording what they were given."""

    def __init__(self, max_body_bytes: int = 1 << 20) -> None:
        self.handled: list[HttpRequest] = []
        self.asked: list[HttpRequest] = []
        self.refused: list[str] = []
        self.answers: list[HttpResponse | asyncio.Future[HttpResponse]] = []  # next answers, in order
        self.transport = RecordingTransport()
        state = ServerState(
            self.handle, lambda status, text: HttpResponse(status, text.encode()),
            HttpLimits(max_body_bytes=max_body_bytes), self.refused.append, early=self.early,
        )  # fmt: skip
        self.connection = HttpConnection(state)
        self.connection.connection_made(self.transport)

    def handle(self, request: HttpRequest) -> HttpResponse | asyncio.Future[HttpResponse]:
        self.handled.append(request)
        if self.answers:
            return self.answers.pop(0)
        if request.path == "/raise":
            raise RuntimeError("a bug in the handler")
        return HttpResponse(200, request.body)

    def early(self, head: HttpRequest) -> HttpResponse | None:
        head.context = f"judged {head.path} with {len(head.body)} body bytes"
        self.asked.append(head)
        return None

    def feed(self, *chunks: bytes) -> None:
        for chunk in chunks:
            self.connection.data_received(chunk)


def run(test: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return uvloop.run(test())


def post(path: str, body: bytes, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: x", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def chunked(path: str, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: x", "Transfer-Encoding: chunked", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def status(written: bytes) -> int:
    return int(written[9:12])


def body(written: bytes) -> bytes:
    return written.split(b"\r\n\r\n", 1)[1]


def test_pipelined_requests_are_answered_in_order_with_reading_paused_while_one_is_pending():
    async def main() -> Site:
        site = Site()
        slow: asyncio.Future[HttpResponse] = asyncio.get_running_loop().create_future()
        site.answers.append(slow)
        site.feed(post("/first", b"1") + post("/second", b"22") + post("/third", b"333"))
        assert [r.path for r in site.handled] == ["/first"], "the next waits for the answer owed"
        assert site.transport.paused
        assert site.transport.writes == []
        slow.set_result(HttpResponse(201, b"slow"))
        await site.transport.written(3)
        return site

    site = run(main)
    assert [status(w) for w in site.transport.writes] == [201, 200, 200]
    assert [body(w) for w in site.transport.writes] == [b"slow", b"22", b"333"]
    assert not site.transport.paused, "reading resumes once the queue is empty"
    assert not site.transport.closed


def test_a_chunked_body_arriving_in_pieces_reaches_the_handler_whole():
    async def main() -> Site:
        site = Site()
        site.feed(chunked("/c"), b"5\r\nhello\r\n", b"6\r\n wor", b"ld\r\n", b"0\r\n\r\n")
        return site

    site = run(main)
    [request] = site.handled
    assert request.body == b"hello world"
    assert request.headers[b"transfer-encoding"] == b"chunked", "header names lower-cased"
    assert body(site.transport.writes[0]) == b"hello world"


def test_expect_100_continue_gets_the_interim_answer_before_the_body_is_sent():
    async def main() -> Site:
        site = Site()
        site.feed(
            post("/up", b"", "Expect: 100-continue").replace(b"Content-Length: 0", b"Content-Length: 4")
        )
        assert site.transport.writes == [CONTINUE], "asked to go on, nothing handled yet"
        assert site.handled == []
        site.feed(b"data")
        return site

    site = run(main)
    assert [status(w) for w in site.transport.writes] == [100, 200]
    assert body(site.transport.writes[1]) == b"data"


def test_a_malformed_request_is_answered_400_and_the_connection_closed():
    async def main() -> Site:
        site = Site()
        site.feed(b"NOT HTTP AT ALL\r\n\r\n", post("/after", b"x"))
        return site

    site = run(main)
    [answer] = site.transport.writes
    assert status(answer) == 400
    assert b"malformed HTTP request" in body(answer)
    assert b"connection: close" in answer
    assert site.transport.closed
    assert site.handled == [], "nothing after the malformed bytes is read"


def test_a_declared_length_over_the_limit_is_answered_413_before_the_body_arrives():
    async def main() -> Site:
        site = Site(max_body_bytes=10)
        site.feed(post("/big", b"").replace(b"Content-Length: 0", b"Content-Length: 11"))
        return site

    site = run(main)
    [answer] = site.transport.writes
    assert status(answer) == 413
    assert (
        body(answer)
        == b"request body of 11 bytes is larger than the limit of 10 bytes (server.max_request_size_mb)"
    )
    assert site.refused == ["body_size"]
    assert site.transport.closed
    assert site.handled == []
    assert site.asked == []


def test_a_chunked_body_growing_over_the_limit_is_answered_413_once_it_does():
    async def main() -> Site:
        site = Site(max_body_bytes=10)
        site.feed(chunked("/big"), b"8\r\n12345678\r\n")
        assert site.transport.writes == [], "within the limit so far"
        site.feed(b"8\r\n12345678\r\n", b"0\r\n\r\n")
        return site

    site = run(main)
    [answer] = site.transport.writes
    assert status(answer) == 413
    assert b"request body of 16 bytes" in body(answer)
    assert site.refused == ["body_size"]
    assert site.handled == []


def test_the_early_handler_is_asked_once_while_the_body_arrives_and_its_request_is_the_one_handled():
    async def main() -> Site:
        site = Site()
        site.feed(post("/infer", b"0123456789")[:-8], b"2345", b"6789")
        return site

    site = run(main)
    [asked] = site.asked
    [handled] = site.handled
    assert handled is asked, "the same request object"
    assert handled.body == b"0123456789"
    assert handled.context == "judged /infer with 0 body bytes", "asked with the head alone"
    assert body(site.transport.writes[0]) == b"0123456789"


def test_a_request_that_arrives_whole_is_not_asked_about_early_and_carries_no_context():
    async def main() -> Site:
        site = Site()
        site.feed(post("/whole", b"abc") + post("/next", b"de")[:-1])
        site.feed(b"e")
        return site

    site = run(main)
    assert [r.path for r in site.asked] == ["/next"]
    first, second = site.handled
    assert first.context is None
    assert second is site.asked[0]
    assert second.body == b"de"


def test_a_handler_that_raises_is_answered_500_and_the_connection_goes_on():
    async def main() -> Site:
        site = Site()
        site.feed(post("/raise", b"") + post("/ok", b"fine"))
        return site

    site = run(main)
    assert [status(w) for w in site.transport.writes] == [500, 200]
    assert body(site.transport.writes[0]) == b"internal server error"
    assert not site.transport.closed


def test_connection_close_is_honoured_after_the_answer():
    async def main() -> Site:
        site = Site()
        site.feed(post("/bye", b"x", "Connection: close"))
        return site

    site = run(main)
    assert site.transport.writes == [encode_response(HttpResponse(200, b"x"), keep_alive=False)]
    assert site.transport.closed


def test_a_client_gone_cancels_the_answer_it_was_waiting_for_and_drops_the_queue():
    async def main() -> tuple[Site, asyncio.Future[HttpResponse]]:
        site = Site()
        pending: asyncio.Future[HttpResponse] = asyncio.get_running_loop().create_future()
        site.answers.append(pending)
        site.feed(post("/wait", b"") + post("/queued", b""))
        site.connection.connection_lost(None)
        return site, pending

    site, pending = run(main)
    assert pending.cancelled()
    assert [r.path for r in site.handled] == ["/wait"], "the queued request is never handled"
    assert site.transport.writes == []
