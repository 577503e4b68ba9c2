"""Accepting TCP connections: every connection waiting, each time the listening socket is ready.

Every connection waiting is accepted when the socket is ready, as asyncio's own event loop does, up to
``ACCEPT_AT_ONCE`` (the socket is level-triggered: the rest come in the next iteration, after the
requests read meanwhile). Not on the one listening socket that workers share (docs/deployment.md):
there each worker accepts one connection each time round, so that an idle worker, whose loop comes
round sooner, takes most of a burst.

Why not ``loop.create_server``: libuv, the core of uvloop, accepts one connection per event loop
iteration, so under load a burst of new connections waits in the kernel's accept queue, out of
admission's sight (docs/design/accept-and-idle-poll.md).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import socket
import ssl
from collections.abc import Callable

log = logging.getLogger(__name__)

BACKLOG = 2048  # connections the kernel keeps waiting to be accepted
ACCEPT_AT_ONCE = 64  # at most this many each time the socket is ready
RETRY_AFTER_S = 1.0  # out of file descriptors or memory: accepting again after this (as asyncio does)
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class Listener:
    """Accepts connections on a bound socket and makes each a transport of ``protocol_factory``'s
    protocol (over TLS with ``ssl_context``), until ``close``."""

    def __init__(
        self,
        sock: socket.socket,
        protocol_factory: Callable[[], asyncio.Protocol],
        ssl_context: ssl.SSLContext | None = None,
        ssl_handshake_timeout_s: float | None = None,
        shared: bool = False,
    ) -> None:
        self._sock = sock
        self._at_once = 1 if shared else ACCEPT_AT_ONCE  # shared: other processes accept on it (workers)
        self._protocol_factory = protocol_factory
        self._ssl = ssl_context
        self._handshake_timeout_s = ssl_handshake_timeout_s if ssl_context is not None else None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connecting: set[asyncio.Task[object]] = set()  # accepted, transport not made yet (TLS)
        self._retry: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._sock.listen(BACKLOG)  # a socket bound for workers (SO_REUSEPORT) is not listening yet
        self._sock.setblocking(False)
        self._loop.add_reader(self._sock.fileno(), self._accept_waiting)

    def _accept_waiting(self) -> None:
        loop = self._loop
        assert loop is not None
        for _ in range(self._at_once):
            try:
                connection, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return  # none left (or one reset before it was accepted)
            except OSError as error:
                if error.errno not in _OUT_OF_RESOURCES:
                    raise
                # the connection stays queued and the socket ready: retrying now would spin
                log.error("cannot accept a connection (%s); accepting again in %g s", error, RETRY_AFTER_S)
                loop.remove_reader(self._sock.fileno())
                self._retry = loop.call_later(RETRY_AFTER_S, self._resume)
                return
            connection.setblocking(False)
            task = loop.create_task(
                loop.connect_accepted_socket(
                    self._protocol_factory,
                    connection,
                    ssl=self._ssl,
                    ssl_handshake_timeout=self._handshake_timeout_s,
                )
            )
            self._connecting.add(task)
            task.add_done_callback(functools.partial(self._connected, connection))

    def _connected(self, connection: socket.socket, task: asyncio.Task[object]) -> None:
        self._connecting.discard(task)
        if not task.cancelled() and task.exception() is None:
            return  # the transport owns the socket now
        # Closed here if no transport took it; one that did detached it when it closed (uvloop), and
        # closing a detached socket does nothing.
        connection.close()
        error = None if task.cancelled() else task.exception()
        if error is not None and not isinstance(error, (OSError, ssl.SSLError, asyncio.TimeoutError)):
            log.error("could not set up an accepted connection", exc_info=error)
        # (a client that went away or failed its TLS handshake: nothing to serve, nothing to report)

    def _resume(self) -> None:
        self._retry = None
        if self._loop is not None and self._sock.fileno() != -1:
            self._loop.add_reader(self._sock.fileno(), self._accept_waiting)

    def close(self) -> None:
        """Stop accepting and close the socket; connections being set up (TLS handshakes) are dropped."""
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._loop is not None and self._sock.fileno() != -1:
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        for task in list(self._connecting):
            task.cancel()
