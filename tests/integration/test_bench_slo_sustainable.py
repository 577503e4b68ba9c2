"""bench/slo.py's R*: the ramp's steps that kept up are repeated from the highest rate down until one
keeps up again, against a small server of the test's own: it answers one configuration and refuses the
other, as an overloaded server would."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from bench import slo


class _Answerer(asyncio.Protocol):
    """Answers each request (no body) 200 if its path names ``tiny_b8_w0``, else 429."""

    def __init__(self, transports: set[asyncio.BaseTransport]) -> None:
        self.transports = transports  # the fixture's, to close them all at the end

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.transports.add(transport)
        self.buffer = b""

    def connection_lost(self, exc: Exception | None) -> None:
        self.transports.discard(self.transport)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
            status = b"200 OK" if b"/tiny_b8_w0/" in head else b"429 Too Many Requests"
            self.transport.write(b"HTTP/1.1 " + status + b"\r\ncontent-length: 2\r\n\r\n{}")  # type: ignore[attr-defined]


@pytest.fixture
def port() -> Iterator[int]:
    loop = asyncio.new_event_loop()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    transports: set[asyncio.BaseTransport] = set()
    server = loop.run_until_complete(loop.create_server(lambda: _Answerer(transports), sock=sock))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def close() -> None:  # the server's side of every connection too: none left to the GC
        server.close()
        for transport in list(transports):
            transport.close()
        await server.wait_closed()
        await asyncio.sleep(0)  # the transports finish closing in the next iteration

    try:
        yield sock.getsockname()[1]
    finally:
        asyncio.run_coroutine_threadsafe(close(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def test_r_star_is_the_highest_rate_a_repeat_keeps_up_with_again(port: int):
    server = SimpleNamespace(port=port, cpu_s=time.process_time)  # measure_step reads these two
    ramp = [
        slo.RampPoint("tiny", "slo", 300.0, 300.0, 0.5, 1.0, 0, 0.0, 0, 0.1),  # kept up once: not again
        slo.RampPoint("tiny", "b8_w0", 200.0, 200.0, 0.5, 1.0, 0, 0.0, 0, 0.1),
        slo.RampPoint("tiny", "b8_w0", 100.0, 100.0, 0.5, 1.0, 0, 0.0, 0, 0.1),
        slo.RampPoint("tiny", "slo", 400.0, 100.0, 0.5, 1.0, 0, 0.0, 0, 0.1),  # did not keep up
    ]
    points = list(ramp)
    found = slo.confirm_sustainable(server, "tiny", b"", 1.0, 4.0, points)  # type: ignore[arg-type]
    assert found == 200.0
    repeats = points[len(ramp) :]
    assert [(p.config, p.confirms) for p in repeats] == [("slo", 300.0), ("b8_w0", 200.0)]
    assert [p.keeps_up() for p in repeats] == [False, True]
    assert slo.sustainable_rate(points) == 200.0
