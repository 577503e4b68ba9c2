"""``workers: N``: a supervisor process and N forked worker processes serving on the same ports.

The supervisor binds the ports, forks the workers and never serves inference itself:

* HTTP: one listening socket, created before the first fork and inherited by every worker, so the
  kernel hands each new connection to whichever worker accepts first, and connections waiting in the
  backlog are taken by the others if a worker dies (only connections that worker had accepted are
  lost). Until every worker has loaded its models the supervisor answers on it itself (live 200, ready
  503), and then leaves it to the workers.
* gRPC: each worker's grpc server binds the same port with SO_REUSEPORT (grpcio's default); the
  supervisor holds a bound, non-listening socket on it so that the port stays reserved (and port 0
  resolves once for all). Connections are spread by the kernel; a worker that dies takes the
  connections it had, and clients reconnect (gRPC channels do so by themselves).
* metrics: the supervisor serves the metrics port, merging every worker's metrics exactly.

Each worker has a socket pair to the supervisor (``ipc.Channel``). What concerns the whole server is
the supervisor's ``ClusterScope`` (``cluster.py``): a worker asks it for every ``Scope`` operation, and
it runs each on every worker's own scope. A worker that replaces one that died is brought up to date
(the changes made at run time replayed) before it serves.

Lifecycle: the server is ready when every worker is; SIGTERM or SIGINT drains every worker (requests
already received are answered) and exits 0. A worker that dies is forked again at once; one that keeps
dying soon after starting is restarted after a growing delay (0.5 s doubling to 30 s), logged and
counted in ``edgeinfer_worker_restarts_total``. A worker that fails while the server starts stops the
whole server with its exit code (1: a model could not load, 2: configuration).

Workers are forked, so models registered from code (``Server.register``) are copied into each worker
as they are, nothing is pickled, and each worker calls ``load()`` itself. The supervisor keeps no
threads (the repository poller reads the directory on its event loop) so that forking stays safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Coroutine
from typing import Any

from edgeinfer.control.scope import OPERATIONS
from edgeinfer.errors import ConfigError, ModelLoadError, startup_failure
from edgeinfer.logs import tag_worker
from edgeinfer.metrics import Metrics
from edgeinfer.repository.poller import RepositoryPoller
from edgeinfer.server.http import MetricsRoutes
from edgeinfer.server.http_errors import error_response
from edgeinfer.server.http_messages import HttpRequest, HttpResponse
from edgeinfer.server.http_protocol import HttpServer
from edgeinfer.server.security import Security
from edgeinfer.supervisor.cluster import ClusterScope, Worker
from edgeinfer.supervisor.ipc import Channel, Handler
from edgeinfer.supervisor.loop import run_with_uvloop
from edgeinfer.supervisor.sockets import bind
from edgeinfer.supervisor.worker import WorkerLink, Workload

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 30.0  # workers drain within their own 10 s limits; this is the last resort
QUICK_FAILURE_S = 10.0  # a worker that dies sooner than this after starting counts as crash-looping
MAX_BACKOFF_S = 30.0


def backoff_s(quick_failures: int) -> float:
    """Delay before restarting a worker after ``quick_failures`` failures in a row soon after start."""
    if quick_failures <= 1:
        return 0.0
    return min(MAX_BACKOFF_S, 0.5 * 2 ** (quick_failures - 2))


def describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            return f"killed by signal {signal.Signals(number).name}"
        except ValueError:
            return f"killed by signal {number}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"


class Supervisor:
    """Runs ``server`` in ``count`` worker processes (see the module docstring)."""

    def __init__(self, server: Workload, count: int) -> None:
        self._server = server
        self._count = count
        self._workers = [Worker(index) for index in range(count)]
        self._serving = False  # every worker was ready once: later deaths are restarts
        self._stopping = False
        self._exit_code = 0
        self._done: asyncio.Event | None = None
        self._http_socket: socket.socket | None = None
        self._grpc_socket: socket.socket | None = None
        self._listeners: list[socket.socket] = []
        self._startup: HttpServer | None = None
        self._metrics_http: HttpServer | None = None
        self._own = Metrics()  # the supervisor's own refusals (its metrics port, its start-up answers)
        self._security: Security | None = None
        config = server.config
        self._cluster = ClusterScope(
            self._workers, self._own, time.time(), config.canaries, config.repository.cache_path
        )
        self._inherited_only: list[int] = []  # supervisor-side descriptors a worker closes at once
        self._startup_fd = -1
        self._poller: RepositoryPoller | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def run(self) -> int:
        """Blocking: serve until SIGTERM or SIGINT; the exit code."""
        return asyncio.run(self._main())

    async def _main(self) -> int:
        config = self._server.config.server
        self._done = asyncio.Event()
        self._http_socket = bind(config.host, config.http_port)
        self._listeners.append(self._http_socket)
        if config.grpc_port is not None:
            self._grpc_socket = bind(config.host, config.grpc_port, "gRPC", reuse_port=True)
            self._listeners.append(self._grpc_socket)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self._stop)
        loop.add_signal_handler(signal.SIGCHLD, self._reap)
        loop.add_signal_handler(signal.SIGHUP, self._reload_tls)
        security = self._security = Security(config, self._own)
        security.warn_if_open()
        # Until every worker is ready, the supervisor answers on the HTTP port itself (a duplicate of the
        # socket, so that closing its server later leaves the workers' socket open).
        startup_socket = self._http_socket.dup()
        self._startup_fd = startup_socket.fileno()
        self._inherited_only.append(self._startup_fd)
        self._startup = security.http_server(_starting, error_response, 64 * 1024)
        await self._startup.start(startup_socket)
        if config.metrics_port is not None:
            metrics_socket = bind(config.host, config.metrics_port, "metrics")
            self._listeners.append(metrics_socket)
            routes = MetricsRoutes(self._exposition, security.guard)
            self._metrics_http = security.http_server(routes, error_response, 64 * 1024)
            await self._metrics_http.start(metrics_socket)
        security.watch_tls()
        log.info(
            "supervisor %d: starting %d workers, HTTP on %s:%d",
            os.getpid(),
            self._count,
            config.host,
            self.http_port,
        )
        for worker in self._workers:
            self._fork(worker)
        await self._done.wait()
        if self._poller is not None:
            await self._poller.stop()
        await self._shutdown()
        return self._exit_code

    @property
    def http_port(self) -> int:
        assert self._http_socket is not None
        port: int = self._http_socket.getsockname()[1]
        return port

    @property
    def grpc_port(self) -> int | None:
        return self._grpc_socket.getsockname()[1] if self._grpc_socket is not None else None

    # ---- workers: fork, readiness, death ----

    def _fork(self, worker: Worker) -> None:
        ours, theirs = socket.socketpair()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the worker: never returns into the supervisor's code
            ours.close()
            os._exit(self._worker_main(worker.index, theirs))
        theirs.close()
        worker.link_fd = ours.fileno()
        self._inherited_only.append(worker.link_fd)
        worker.pid, worker.started_at, worker.ready = pid, time.monotonic(), False
        worker.channel = Channel(ours, self._handlers(worker))
        self._background(worker.channel.start())

    def _worker_main(self, index: int, link: socket.socket) -> int:
        """The first code a forked worker runs; its exit code."""
        signal.set_wakeup_fd(-1)  # the supervisor's event loop is not ours
        for signum in (signal.SIGTERM, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        tag_worker(index)
        assert self._http_socket is not None
        grpc_port = self.grpc_port
        for sock in self._listeners:
            if sock is not self._http_socket:
                sock.close()
        # The supervisor's ends of the other workers' links and the start-up responder's socket. A number
        # in the list may already have been reused for one of ours (a closed link's): never close those.
        keep = {link.fileno(), self._http_socket.fileno()}
        for fd in self._inherited_only:
            if fd not in keep:
                with contextlib.suppress(OSError):
                    os.close(fd)
        try:
            run_with_uvloop(WorkerLink(self._server, index, link, self._http_socket, grpc_port).serve())
        except (ConfigError, ModelLoadError) as error:
            code, message = startup_failure(error)
            print(f"edgeinfer: worker {index}: {message}", file=sys.stderr)
            return code
        except BaseException:
            traceback.print_exc()
            return 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        return 0

    def _handlers(self, worker: Worker) -> dict[str, Handler]:
        """A worker's calls: each ``Scope`` operation, done by the whole server, and ``loaded``."""

        async def loaded() -> None:
            await self._worker_loaded(worker)

        return {"loaded": loaded, **{op: getattr(self._cluster, op) for op in OPERATIONS}}

    async def _worker_loaded(self, worker: Worker) -> None:
        """A worker has loaded its models; answer when it may serve."""
        if self._serving:  # it replaces one that died: bring it up to date first
            await self._cluster.replay(worker)
            worker.ready = True
            log.info("worker %d (pid %d) is serving again", worker.index, worker.pid)
            return
        worker.ready = True
        loop = asyncio.get_running_loop()
        worker.serve = loop.create_future()
        if all(other.ready for other in self._workers):
            await self._all_ready()
        await worker.serve

    async def _all_ready(self) -> None:
        if self._startup is not None:
            await self._startup.stop()  # connections from now on wait in the backlog for the workers
            self._startup = None
            self._inherited_only.remove(self._startup_fd)  # closed: its number may be reused
        self._serving = True
        log.info("all %d workers are ready", self._count)
        await self._cluster.start()
        for worker in self._workers:
            if worker.serve is not None and not worker.serve.done():
                worker.serve.set_result(None)
        self._poller = self._server.repository_poller(
            self._cluster.load, self._cluster.unload, in_thread=False
        )
        if self._poller is not None:
            self._poller.start()

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            worker = next((worker for worker in self._workers if worker.pid == pid), None)
            if worker is not None:
                self._worker_exited(worker, status)

    def _worker_exited(self, worker: Worker, status: int) -> None:
        worker.ready = False
        worker.pid = 0
        if worker.channel is not None:
            channel, worker.channel = worker.channel, None
            with contextlib.suppress(ValueError):
                self._inherited_only.remove(worker.link_fd)
            self._background(channel.close())
        if worker.serve is not None and not worker.serve.done():
            worker.serve.cancel()
        how = describe_status(status)
        if self._stopping:
            if self._done is not None and all(other.pid == 0 for other in self._workers):
                self._done.set()
            return
        if not self._serving:
            log.error("worker %d exited while the server was starting (%s); stopping", worker.index, how)
            code = os.waitstatus_to_exitcode(status)
            self._exit_code = 2 if code == 2 else 1  # 2: configuration; 1: a model, or anything else
            self._stop()
            return
        uptime = time.monotonic() - worker.started_at
        worker.quick_failures = worker.quick_failures + 1 if uptime < QUICK_FAILURE_S else 1
        worker.restarts += 1
        delay = backoff_s(worker.quick_failures)
        log.error(
            "worker %d died (%s) after %.1f s; restarting it%s",
            worker.index, how, uptime,
            f" in {delay:.1f} s ({worker.quick_failures} quick failures in a row)" if delay else "",
        )  # fmt: skip
        asyncio.get_running_loop().call_later(delay, self._restart, worker)

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _restart(self, worker: Worker) -> None:
        if not self._stopping and worker.pid == 0:
            self._fork(worker)

    def _reload_tls(self) -> None:
        """SIGHUP: the supervisor's listeners and every worker read the certificate files again."""
        if self._security is not None:
            self._security.reload_tls(force=True)
        for worker in self._workers:
            if worker.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.pid, signal.SIGHUP)

    def _stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        for worker in self._workers:  # a worker still waiting to serve gives up its start
            if worker.serve is not None and not worker.serve.done():
                worker.serve.cancel()
        log.info("supervisor: stopping %d workers", sum(1 for worker in self._workers if worker.pid))
        for worker in self._workers:
            if worker.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.pid, signal.SIGTERM)
        assert self._done is not None
        if all(worker.pid == 0 for worker in self._workers):
            self._done.set()
        else:
            delay = self._server.config.server.shutdown_delay_s
            asyncio.get_running_loop().call_later(STOP_TIMEOUT_S + delay, self._kill_stragglers)

    def _kill_stragglers(self) -> None:
        for worker in self._workers:
            if worker.pid:
                log.warning("worker %d did not stop within %.0f s; killing it", worker.index, STOP_TIMEOUT_S)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.pid, signal.SIGKILL)

    async def _shutdown(self) -> None:
        if self._security is not None:
            self._security.stop_watching()
        await self._cluster.stop()
        for server in (self._startup, self._metrics_http):
            if server is not None:
                await server.stop()
        for sock in self._listeners:
            sock.close()
        log.info("supervisor: stopped")

    async def _exposition(self) -> bytes:
        """The metrics port's body: the whole server's metrics."""
        return (await self._cluster.metrics()).encode()


def _starting(request: HttpRequest) -> HttpResponse:
    """The supervisor's answers while the workers load their models."""
    path = request.path.rstrip("/")
    if path == "/v2/health/live":
        return HttpResponse(200, b'{"live":true}')
    if path == "/v2/health/ready":
        return HttpResponse(503, b'{"ready":false}')
    if path == "/health":
        return HttpResponse(503, b'{"status":"not ready"}')
    return error_response(503, "the server is starting: its workers are loading the models")
