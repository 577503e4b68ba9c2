"""The HTTP server asks the early handler about a request whose body is still arriving: a refusal goes
out at once, the rest of the body is dropped, and the connection stays in step."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import uvloop

from edgeinfer.server.http_messages import HttpLimits, HttpRequest, HttpResponse
from edgeinfer.server.http_protocol import HttpServer
from edgeinfer.supervisor.sockets import bind

REFUSAL = HttpResponse(429, b'{"error": "busy"}', [(b"retry-after", b"1")])


class Recorder:
    """A handler that answers with the body it got, an early handler that refuses ``/busy`` paths."""

    def __init__(self) -> None:
        self.handled: list[tuple[str, bytes]] = []
        self.asked: list[tuple[str, bytes]] = []
        self.pending: asyncio.Future[HttpResponse] | None = None  # set: the next answer waits on it

    def handle(self, request: HttpRequest) -> HttpResponse | asyncio.Future[HttpResponse]:
        self.handled.append((request.path, request.body))
        if self.pending is not None:
            return self.pending
        return HttpResponse(200, request.body)

    def early(self, head: HttpRequest) -> HttpResponse | None:
        self.asked.append((head.path, head.body))
        return REFUSAL if head.path.startswith("/busy") else None


Scenario = Callable[[asyncio.StreamReader, asyncio.StreamWriter, Recorder], Awaitable[Any]]


def serve(scenario: Scenario, make: type[Recorder] = Recorder) -> tuple[Any, Recorder]:
    async def main() -> tuple[Any, Recorder]:
        recorder = make()
        server = HttpServer(
            recorder.handle,
            lambda status, text: HttpResponse(status, text.encode()),
            HttpLimits(max_body_bytes=1 << 20),
            early=recorder.early,
        )
        listening = bind("127.0.0.1", 0)
        await server.start(listening)
        reader, writer = await asyncio.open_connection("127.0.0.1", listening.getsockname()[1])
        try:
            return await scenario(reader, writer, recorder), recorder
        finally:
            writer.close()
            await server.stop(timeout_s=1.0)

    return uvloop.run(main())


async def response(reader: asyncio.StreamReader) -> tuple[int, bytes, bytes]:
    """(status, head, body) of the next response."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return int(head[9:12]), head, await reader.readexactly(length)


def head(path: str, length: int, *extra: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: x", f"Content-Length: {length}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_a_request_refused_early_is_answered_before_its_body_and_the_connection_goes_on():
    async def scenario(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: Recorder) -> Any:
        writer.write(head("/busy", 10) + b"01234")
        refused = await response(reader)  # while the client still owes five bytes
        writer.write(b"56789" + head("/echo", 2) + b"ok")
        return refused, await response(reader)

    (refused, answered), recorder = serve(scenario)
    assert refused[0] == 429
    assert b"retry-after: 1" in refused[1]
    assert answered[0] == 200
    assert answered[2] == b"ok"
    assert recorder.handled == [("/echo", b"ok")], "the refused request never reached the handler"
    assert recorder.asked == [("/busy", b"")], "asked with the head only; a body that came whole is not"


def test_a_request_not_refused_early_arrives_whole_at_the_handler():
    async def scenario(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: Recorder) -> Any:
        writer.write(head("/echo", 10) + b"01234")
        await asyncio.sleep(0.05)
        writer.write(b"56789")
        return await response(reader)

    answered, recorder = serve(scenario)
    assert answered[0] == 200
    assert answered[2] == b"0123456789"
    assert recorder.asked == [("/echo", b"")]
    assert recorder.handled == [("/echo", b"0123456789")]


def test_expect_100_continue_gets_the_refusal_instead_of_the_interim_answer_and_a_close():
    async def scenario(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: Recorder) -> Any:
        writer.write(head("/busy", 10, "Expect: 100-continue"))
        refused = await response(reader)
        return refused, await asyncio.wait_for(reader.read(), 5)  # then the server closes

    (refused, rest), recorder = serve(scenario)
    assert refused[0] == 429
    assert b"100 Continue" not in refused[1]
    assert b"connection: close" in refused[1]
    assert rest == b""
    assert recorder.handled == []


def test_expect_100_continue_not_refused_gets_the_interim_answer():
    async def scenario(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: Recorder) -> Any:
        writer.write(head("/echo", 2, "Expect: 100-continue"))
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        writer.write(b"ok")
        return interim, await response(reader)

    (interim, answered), _ = serve(scenario)
    assert interim.startswith(b"HTTP/1.1 100 Continue")
    assert answered[2] == b"ok"


def test_no_early_answer_jumps_ahead_of_an_answer_still_owed_on_the_connection():
    async def scenario(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, recorder: Recorder) -> Any:
        recorder.pending = asyncio.get_running_loop().create_future()
        writer.write(head("/echo", 5) + b"first" + head("/busy", 10) + b"01234")
        await asyncio.sleep(0.05)
        asked = list(recorder.asked)
        pending, recorder.pending = recorder.pending, None
        pending.set_result(HttpResponse(200, b"first"))
        writer.write(b"56789")
        return asked, await response(reader), await response(reader)

    (asked, first, second), _recorder = serve(scenario)
    assert asked == [], "not asked while the first answer was owed"
    assert first[2] == b"first"
    assert second[0] == 200
    assert second[2] == b"0123456789", "it went the ordinary way"


def test_a_dropped_body_is_still_held_to_the_size_limit():
    """Refused early, a chunked body that goes on past ``max_body_bytes`` gets no second answer: the
    connection is closed."""

    async def scenario(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: Recorder) -> Any:
        writer.write(b"POST /busy HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n01234\r\n")
        refused = await response(reader)
        chunk = b"%x\r\n" % (64 * 1024) + b"x" * (64 * 1024) + b"\r\n"
        try:
            for _ in range(20):  # 1.25 MB, over the 1 MB limit
                writer.write(chunk)
                await writer.drain()
            rest = await asyncio.wait_for(reader.read(), 5)
        except ConnectionError:
            rest = b""  # closed while still sending: reset
        return refused, rest

    (refused, rest), recorder = serve(scenario)
    assert refused[0] == 429
    assert rest == b"", "closed without another answer"
    assert recorder.handled == []


def test_a_request_let_through_early_reaches_the_handler_as_the_same_object_with_its_body():
    """What the early handler made of a request (``context``: the judged inference call) goes on with it:
    the request is judged once, not again when its body has arrived."""
    seen: list[HttpRequest] = []
    asked = asyncio.Event()

    class Carrying(Recorder):
        def early(self, head: HttpRequest) -> HttpResponse | None:
            head.context = ("judged", head.path)
            seen.append(head)
            asked.set()
            return None

        def handle(self, request: HttpRequest) -> HttpResponse | asyncio.Future[HttpResponse]:
            seen.append(request)
            return HttpResponse(200, repr(request.context).encode())

    async def scenario(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: Recorder) -> Any:
        writer.write(head("/echo", 10) + b"01234")
        await asyncio.wait_for(asked.wait(), 5)  # asked as the first part of the body is read
        writer.write(b"56789")
        return await response(reader)

    (status, _, body), _ = serve(scenario, Carrying)
    assert status == 200
    assert body == b"('judged', '/echo')"
    early, handled = seen
    assert early is handled, "the head asked about early is the request handled"
    assert handled.body == b"0123456789"
