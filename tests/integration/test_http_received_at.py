"""The HTTP server tells the handler when a request began to arrive: a model's SLO counts from then."""

from __future__ import annotations

import asyncio
import time

import uvloop

from edgeinfer.server.http_messages import HttpLimits, HttpRequest, HttpResponse
from edgeinfer.server.http_protocol import HttpServer
from edgeinfer.supervisor.sockets import bind


def test_a_request_is_stamped_with_when_its_first_bytes_arrived():
    async def main() -> tuple[float, float, float]:
        seen: list[tuple[float, float]] = []

        def handler(request: HttpRequest) -> HttpResponse:
            seen.append((request.received_at, time.monotonic()))
            return HttpResponse(200, b"{}")

        server = HttpServer(
            handler, lambda status, text: HttpResponse(status, text.encode()), HttpLimits(max_body_bytes=1024)
        )
        listening = bind("127.0.0.1", 0)
        await server.start(listening)
        reader, writer = await asyncio.open_connection("127.0.0.1", listening.getsockname()[1])
        try:
            sent = time.monotonic()
            writer.write(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n")
            await asyncio.sleep(0.03)  # the body comes 30 ms after the headers (read meanwhile)
            body_sent = time.monotonic()
            writer.write(b"{}")
            await reader.readuntil(b"{}")
        finally:
            writer.close()
            await server.stop()
        [(received_at, handled)] = seen
        return sent, body_sent, received_at, handled

    sent, body_sent, received_at, handled = uvloop.run(main())
    assert sent <= received_at < body_sent, "stamped when the headers came, not the body"
    assert handled >= body_sent
