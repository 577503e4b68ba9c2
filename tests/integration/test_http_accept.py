"""Connections waiting to be accepted are all accepted when the listening socket is ready, not one
per event loop iteration (``server/accept.py``), and a stopped server accepts none."""

from __future__ import annotations

import asyncio
import socket

import pytest
import uvloop

from edgeinfer.server.http_messages import HttpLimits, HttpRequest, HttpResponse
from edgeinfer.server.http_protocol import HttpServer
from edgeinfer.supervisor.sockets import bind

WAITING = 50


def answer(request: HttpRequest) -> HttpResponse:
    return HttpResponse(200, b"ok")


def make_server() -> HttpServer:
    return HttpServer(
        answer, lambda status, text: HttpResponse(status, text.encode()), HttpLimits(max_body_bytes=1 << 20)
    )


@pytest.mark.parametrize("shared", [False, True])
def test_every_waiting_connection_is_accepted_within_a_few_loop_iterations(shared: bool):
    """A server that is the socket's only acceptor takes every connection waiting at once; on a socket
    workers share, one each time round (an idle worker takes the most)."""

    async def main() -> tuple[list[int], list[bytes]]:
        server = make_server()
        listening = bind("127.0.0.1", 0)
        await server.start(listening, shared)
        port = listening.getsockname()[1]
        # The loop is busy (this code does not yield): connections arrive and wait in the kernel's queue.
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(WAITING)]
        for client in clients:
            client.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
        accepted: list[int] = []  # connections open, after each loop iteration
        for _ in range(WAITING + 10):
            await asyncio.sleep(0)
            accepted.append(len(server._state.connections))
        loop = asyncio.get_running_loop()
        answers = []
        for client in clients:
            client.setblocking(False)
            answers.append(await asyncio.wait_for(loop.sock_recv(client, 1024), 5))
            client.close()
        await server.stop(timeout_s=1.0)
        return accepted, answers

    accepted, answers = uvloop.run(main())
    if shared:
        assert 0 < accepted[3] < 10, f"accepted after each iteration: {accepted[:10]}"
    else:
        assert accepted[3] == WAITING, f"accepted after each iteration: {accepted[:10]}"
    assert accepted[-1] == WAITING
    assert all(reply.startswith(b"HTTP/1.1 200") for reply in answers)


def test_a_stopped_server_accepts_no_more_connections():
    async def main() -> None:
        server = make_server()
        listening = bind("127.0.0.1", 0)
        await server.start(listening)
        port = listening.getsockname()[1]
        await server.stop(timeout_s=1.0)
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except ConnectionRefusedError:
            return
        writer.close()
        raise AssertionError("a connection was accepted after stop")

    uvloop.run(main())
