"""A worker process's side of the supervisor link.

The worker asks the whole server (the supervisor's ``ClusterScope``) through ``remote_scope``, which
forwards each ``Scope`` operation by name, and answers the supervisor's calls of the same names with
its own ``LocalScope``.
"""

from __future__ import annotations

import inspect
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from edgeinfer.control.scope import OPERATIONS, Scope
from edgeinfer.errors import InvalidInput
from edgeinfer.supervisor.ipc import Channel, Handler

if TYPE_CHECKING:
    from edgeinfer.config import Config
    from edgeinfer.repository.poller import RepositoryPoller


@dataclass
class WorkerRole:
    """What a worker process gets from its supervisor: the listening HTTP socket it inherited, the gRPC
    port to share, and the whole server's scope. ``serving`` returns once every worker has loaded its
    models (at once for a worker that replaces one that died)."""

    index: int
    http_socket: socket.socket
    grpc_port: int | None
    scope: Scope
    serving: Callable[[], Awaitable[None]]


class Workload(Protocol):
    """What the supervisor runs in each worker (the composition root's ``Server``)."""

    @property
    def config(self) -> Config: ...

    @property
    def local_scope(self) -> Scope | None:
        """This process's scope, once its core is built."""

    async def serve(self, worker: WorkerRole | None = None) -> None: ...

    def repository_poller(
        self,
        load: Callable[[str], Awaitable[None]],
        unload: Callable[[str], Awaitable[None]],
        in_thread: bool = True,
    ) -> RepositoryPoller | None: ...


class _Forwarder:
    def __init__(self, channel: Channel) -> None:
        self._channel = channel


def _forward(op: str) -> Callable[..., Awaitable[Any]]:
    signature = inspect.signature(getattr(Scope, op))

    async def forward(self: _Forwarder, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        del arguments["self"]
        return await self._channel.call(op, **arguments)

    forward.__name__ = op
    return forward


for _op in OPERATIONS:
    setattr(_Forwarder, _op, _forward(_op))


def remote_scope(channel: Channel) -> Scope:
    """The whole server as a worker sees it: every operation sent to the supervisor under its name."""
    return cast(Scope, _Forwarder(channel))


class WorkerLink:
    """Runs ``server`` in this worker, linked to the supervisor by ``link``."""

    def __init__(
        self,
        server: Workload,
        index: int,
        link: socket.socket,
        http_socket: socket.socket,
        grpc_port: int | None,
    ) -> None:
        self._server = server
        self._index = index
        self._http_socket = http_socket
        self._grpc_port = grpc_port
        self._channel = Channel(link, {op: self._answer(op) for op in OPERATIONS})

    async def serve(self) -> None:
        await self._channel.start()
        scope = remote_scope(self._channel)
        await self._server.serve(
            WorkerRole(self._index, self._http_socket, self._grpc_port, scope, self._serving)
        )

    async def _serving(self) -> None:
        await self._channel.call("loaded")

    def _answer(self, op: str) -> Handler:
        """The supervisor's call of ``op``: done by this worker's own scope."""

        async def answer(**args: Any) -> Any:
            scope = self._server.local_scope
            if scope is None:
                raise InvalidInput(f"worker {self._index} is still starting")
            return await getattr(scope, op)(**args)

        return answer
