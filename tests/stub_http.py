"""A small HTTP/1.1 server of the tests' own, on its own event loop in a thread, for the load generator's
tests: each request (headers only, no body) gets the bytes ``answer(head)`` returns, ``delay_s`` later.
At the end it closes its side of every connection before stopping its loop: a transport left closing
when the loop stops is collected later, in some other test, as an unclosed-transport warning."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable, Iterator

Answer = Callable[[bytes], bytes]


class _Stub(asyncio.Protocol):
    def __init__(self, transports: set[asyncio.BaseTransport], answer: Answer, delay_s: float) -> None:
        self.transports = transports  # the server's, to close them all at the end
        self.answer = answer
        self.delay_s = delay_s

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
            response = self.answer(head)
            if self.delay_s:
                asyncio.get_running_loop().call_later(self.delay_s, self._write, response)
            else:
                self._write(response)

    def _write(self, response: bytes) -> None:
        self.transport.write(response)  # type: ignore[attr-defined]


@contextlib.contextmanager
def stub_server(answer: Answer, delay_s: float = 0.0) -> Iterator[int]:
    """The stub serving on a free port (yielded) until the block ends."""
    loop = asyncio.new_event_loop()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    transports: set[asyncio.BaseTransport] = set()
    serving = loop.create_server(lambda: _Stub(transports, answer, delay_s), sock=sock)
    server = loop.run_until_complete(serving)
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def close() -> None:
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
