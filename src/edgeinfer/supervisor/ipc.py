"""Calls in both directions over one stream socket, between the supervisor and a worker process.

A frame is a 4-byte big-endian length and an orjson document. ``{"id": n, "op": name, "args": {...}}`` asks
the other side to run its handler for ``op``; it answers ``{"id": n, "result": ...}`` or ``{"id": n,
"error": {"type": "ModelNotFound", "message": "..."}}``, and the caller gets the result or the same
error class (from ``errors.BY_NAME``) with the same message. Handlers run as tasks, so a long one (a
model load) never blocks the reading of other frames, and each side may call the other while it is
answering.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from edgeinfer.errors import BY_NAME, EdgeInferError

log = logging.getLogger(__name__)

Handler = Callable[..., Awaitable[Any]]
_LENGTH = struct.Struct(">I")


class ChannelClosed(EdgeInferError):
    """The other side went away (its process ended)."""


class Channel:
    def __init__(self, sock: socket.socket, handlers: dict[str, Handler]) -> None:
        self._sock = sock
        self._handlers = handlers
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._reading: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.closed = asyncio.Event()

    async def start(self) -> None:
        reader, self._writer = await asyncio.open_connection(sock=self._sock)
        self._reading = asyncio.ensure_future(self._read(reader))

    async def call(self, op: str, **args: Any) -> Any:
        if self._writer is None or self.closed.is_set():
            raise ChannelClosed(f"cannot send {op!r}: the other process is gone")
        number = next(self._ids)
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[number] = answer
        try:
            self._send({"id": number, "op": op, "args": args})
            return await answer
        finally:
            self._waiting.pop(number, None)

    def _send(self, message: dict[str, Any]) -> None:
        assert self._writer is not None
        data = orjson.dumps(message)
        self._writer.write(_LENGTH.pack(len(data)) + data)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                length = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))[0]
                message = orjson.loads(await reader.readexactly(length))
                if "op" in message:
                    task = asyncio.ensure_future(self._answer(message))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                else:
                    self._settle(message)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            self._lost()

    def _settle(self, message: dict[str, Any]) -> None:
        answer = self._waiting.get(message["id"])
        if answer is None or answer.done():
            return
        error = message.get("error")
        if error is None:
            answer.set_result(message.get("result"))
        else:
            answer.set_exception(BY_NAME.get(error["type"], EdgeInferError)(error["message"]))

    async def _answer(self, message: dict[str, Any]) -> None:
        number, op = message["id"], message["op"]
        try:
            result = await self._handlers[op](**message.get("args", {}))
            reply: dict[str, Any] = {"id": number, "result": result}
        except Exception as error:
            if not isinstance(error, EdgeInferError):
                log.error("unexpected error answering %s", op, exc_info=error)
            reply = {"id": number, "error": {"type": type(error).__name__, "message": str(error)}}
        if not self.closed.is_set():
            with contextlib.suppress(ConnectionError, OSError):
                self._send(reply)

    def _lost(self) -> None:
        self.closed.set()
        for answer in self._waiting.values():
            if not answer.done():
                answer.set_exception(ChannelClosed("the other process went away before answering"))

    async def close(self) -> None:
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reading
        for task in list(self._tasks):
            task.cancel()
        if self._writer is not None:
            self._writer.close()
        self._lost()
