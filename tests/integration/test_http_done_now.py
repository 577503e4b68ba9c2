"""A ``Deferred`` answer written through ``done_now`` goes out in the call that completes its future,
not a loop iteration later when the future's callbacks run; once, and the connection goes on."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import uvloop

from edgeinfer.server.http_messages import Answer, Deferred, DoneNow, HttpLimits, HttpRequest, HttpResponse
from edgeinfer.server.http_protocol import HttpServer
from edgeinfer.server.idle_poll import IdlePoll
from edgeinfer.supervisor.sockets import bind


class Slow:
    """Answers ``/slow`` with a Deferred the test completes; anything else at once."""

    def __init__(self) -> None:
        self.future: asyncio.Future[bytes] | None = None
        self.done_now: DoneNow | None = None
        self.responded = 0

    def handle(self, request: HttpRequest) -> Answer:
        if request.path != "/slow":
            return HttpResponse(200, b"fast")
        self.future = asyncio.get_running_loop().create_future()
        self.done_now = DoneNow()

        def respond(future: asyncio.Future[Any]) -> HttpResponse | None:
            self.responded += 1
            return None if future.cancelled() else HttpResponse(200, future.result())

        return Deferred(self.future, respond, self.done_now)


class CountingIdle(IdlePoll):
    """Counts the times the server went idle (no answer pending), without polling."""

    idles = 0

    def idle(self) -> None:
        self.idles += 1


def request(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()


async def response(reader: asyncio.StreamReader) -> bytes:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return await reader.readexactly(length)


Scenario = Callable[[asyncio.StreamReader, asyncio.StreamWriter, Slow, CountingIdle], Awaitable[Any]]


def serve(scenario: Scenario) -> Any:
    """Run ``scenario`` against a server answering with ``Slow``, on one client connection."""

    async def main() -> Any:
        slow, idle = Slow(), CountingIdle()
        server = HttpServer(
            slow.handle,
            lambda status, text: HttpResponse(status, text.encode()),
            HttpLimits(1024),
            idle_poll=idle,
        )
        listening = bind("127.0.0.1", 0)
        await server.start(listening)
        reader, writer = await asyncio.open_connection("127.0.0.1", listening.getsockname()[1])
        try:
            return await scenario(reader, writer, slow, idle)
        finally:
            writer.close()
            await server.stop(timeout_s=1.0)

    return uvloop.run(main())


async def handed_slow(slow: Slow) -> asyncio.Future[bytes]:
    """The future of the ``/slow`` request, once the handler has it."""
    while slow.future is None:
        await asyncio.sleep(0.001)
    return slow.future


def test_done_now_answers_at_once_and_only_once_and_the_next_pipelined_request_follows():
    async def scenario(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slow: Slow, idle: CountingIdle
    ) -> tuple[list[bytes], list[int], int, bytes, int]:
        writer.write(request("/slow") + request("/fast"))  # pipelined: the second waits its turn
        future = await handed_slow(slow)
        assert slow.done_now is not None
        future.set_result(b"slow")
        slow.done_now()  # what the batcher does in the pass that completed the future
        responded_at_once = slow.responded
        slow.done_now()  # a second call does nothing
        bodies = [await response(reader), await response(reader)]
        await asyncio.sleep(0.01)  # the future's own callback has run by now: it must not answer again
        idles = idle.idles
        writer.write(request("/fast"))
        last = await response(reader)
        return bodies, [responded_at_once], slow.responded, last, idle.idles - idles

    bodies, at_once, responded, last, idled = serve(scenario)
    assert bodies == [b"slow", b"fast"]
    assert at_once == [1], "written in the call that completed the future"
    assert responded == 1
    assert last == b"fast"
    assert idled == 1, "nothing pending once the last answer is written (the late callback counted nothing)"


def test_without_done_now_the_futures_callback_answers():
    async def scenario(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slow: Slow, _: CountingIdle
    ) -> bytes:
        writer.write(request("/slow"))
        future = await handed_slow(slow)
        future.set_result(b"late")  # nobody calls done_now (an expired or superseded request)
        return await response(reader)

    assert serve(scenario) == b"late"
