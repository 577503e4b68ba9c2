"""A small HTTP/1.1 server of the tests' own, on its own event loop in a thread, for the load generator's
tests: each request gets the bytes ``answer(head)`` returns, ``delay_s`` after its headers came. A body
(``Content-Length``) is dropped; with ``drop_after_s`` the server, like one that refuses a large body
from its headers, waits that long before it reads on (then drops the body).
At the end it closes its side of every connection before stopping its loop: a transport left closing
when the loop stops is collected later, in some other test, as an unclosed-transport warning."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import threading
from collections.abc import Callable, Iterator

Answer = Callable[[bytes], bytes]
_LENGTH = re.compile(rb"content-length:\s*(\d+)", re.IGNORECASE)


class _Stub(asyncio.Protocol):
    def __init__(
        self, transports: set[asyncio.BaseTransport], answer: Answer, delay_s: float, drop_after_s: float
    ) -> None:
        self.transports = transports  # the server's, to close them all at the end
        self.answer = answer
        self.delay_s = delay_s
        self.drop_after_s = drop_after_s
        self.body_left = 0  # bytes of the current request's body still to drop

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.transports.add(transport)
        self.buffer = b""

    def connection_lost(self, exc: Exception | None) -> None:
        self.transports.discard(self.transport)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._consume()

    def _consume(self) -> None:
        """Answer the requests in the buffer and drop their bodies, until reading pauses or it runs out."""
        while True:
            if self.body_left:
                dropped = min(self.body_left, len(self.buffer))
                self.buffer = self.buffer[dropped:]
                self.body_left -= dropped
                if self.body_left:
                    return
            if b"\r\n\r\n" not in self.buffer:
                return
            head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
            length = _LENGTH.search(head)
            self.body_left = int(length.group(1)) if length else 0
            response = self.answer(head)
            if self.delay_s:
                asyncio.get_running_loop().call_later(self.delay_s, self._write, response)
            else:
                self._write(response)
            if self.body_left and self.drop_after_s:
                self.transport.pause_reading()  # type: ignore[attr-defined]
                asyncio.get_running_loop().call_later(self.drop_after_s, self._read_on)
                return  # what came with the headers stays in the buffer until then

    def _read_on(self) -> None:
        if not self.transport.is_closing():
            self.transport.resume_reading()  # type: ignore[attr-defined]
            self._consume()

    def _write(self, response: bytes) -> None:
        self.transport.write(response)  # type: ignore[attr-defined]


@contextlib.contextmanager
def stub_server(answer: Answer, delay_s: float = 0.0, drop_after_s: float = 0.0) -> Iterator[int]:
    """The stub serving on a free port (yielded) until the block ends."""
    loop = asyncio.new_event_loop()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    transports: set[asyncio.BaseTransport] = set()
    serving = loop.create_server(lambda: _Stub(transports, answer, delay_s, drop_after_s), sock=sock)
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
