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

Each worker has a socket pair to the supervisor (``ipc.Channel``). A worker asks the supervisor for
what concerns the whole server — load/unload (applied by every worker before the answer), the
repository index, statistics and metrics (merged) — and the supervisor calls the workers' ``local_*``
operations. A worker that replaces one that died is brought up to date (loads with a config override
and unloads replayed) before it serves.

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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgeinfer.batching.stats import merge_statistics
from edgeinfer.canary import Canaries, stable_version
from edgeinfer.dashboard import RECENT_ERRORS
from edgeinfer.errors import (
    ConfigError,
    EdgeInferError,
    InvalidInput,
    ModelLoadError,
    ModelNotFound,
    startup_failure,
)
from edgeinfer.exposition import exposition, sum_process_stats
from edgeinfer.logs import tag_worker
from edgeinfer.metrics import Metrics, Snapshot, WorkerGauges, merge, process_stats
from edgeinfer.server.http import MetricsRoutes, error_response
from edgeinfer.server.http_protocol import HttpRequest, HttpResponse, HttpServer
from edgeinfer.server.ipc import Channel
from edgeinfer.server.security import Security

if TYPE_CHECKING:
    from edgeinfer.repository.poller import RepositoryPoller
    from edgeinfer.server.app import Server
    from edgeinfer.service import InferenceService

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


@dataclass(eq=False)
class _Worker:
    index: int
    pid: int = 0
    channel: Channel | None = None
    started_at: float = 0.0
    ready: bool = False
    restarts: int = 0
    quick_failures: int = 0
    link_fd: int = -1  # the supervisor's end of its socket pair, as numbered when it was made
    serve: asyncio.Future[None] | None = field(default=None, repr=False)


class Supervisor:
    """Runs ``server`` in ``count`` worker processes (see the module docstring)."""

    def __init__(self, server: Server, count: int) -> None:
        self._server = server
        self._count = count
        self._workers = [_Worker(index) for index in range(count)]
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
        self._started_at = time.time()
        self._security: Security | None = None
        self._applied: dict[str, tuple[str, dict[str, Any] | None]] = {}  # replayed to new workers
        self._routes: dict[str, list[dict[str, Any]] | None] = {}  # routes set at run time, replayed too
        self._shadows: dict[str, dict[str, Any] | None] = {}  # shadows set at run time, replayed too
        self._canaries: Canaries | None = None  # one controller for all workers: one decision
        self._inherited_only: list[int] = []  # supervisor-side descriptors a worker closes at once
        self._startup_fd = -1
        self._poller: RepositoryPoller | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def run(self) -> int:
        """Blocking: serve until SIGTERM or SIGINT; the exit code."""
        return asyncio.run(self._main())

    async def _main(self) -> int:
        from edgeinfer.server.app import bind

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
            routes = MetricsRoutes(self.metrics, security.guard)
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

    def _fork(self, worker: _Worker) -> None:
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
            from edgeinfer.server.app import run_with_uvloop

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

    def _handlers(self, worker: _Worker) -> dict[str, Any]:
        async def loaded() -> None:
            await self._worker_loaded(worker)

        return {
            "loaded": loaded,
            "load": self.load,
            "unload": self.unload,
            "route": self.route,
            "shadow": self.shadow,
            "canaries": self.canaries,
            "canary": self.canary,
            "index": self.index,
            "statistics": self.statistics,
            "metrics": self.metrics_text,
            "overview": self.overview,
        }

    async def _worker_loaded(self, worker: _Worker) -> None:
        """A worker has loaded its models; answer when it may serve."""
        if self._serving:  # it replaces one that died: bring it up to date first
            assert worker.channel is not None
            for name, (action, override) in list(self._applied.items()):
                with contextlib.suppress(EdgeInferError):
                    if action == "load":
                        await worker.channel.call("local_load", name=name, override=override)
                    else:
                        await worker.channel.call("local_unload", name=name)
            for name, variants in list(self._routes.items()):
                await worker.channel.call("local_route", name=name, variants=variants)
            for name, config in list(self._shadows.items()):
                await worker.channel.call("local_shadow", name=name, config=config)
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
        config = self._server.config
        if config.canaries:
            self._canaries = Canaries(
                config.canaries,
                config.repository.cache_path,
                self.snapshot,
                self._apply,
                self._stable_of,
                self.load,
            )
            await self._canaries.start()
        for worker in self._workers:
            if worker.serve is not None and not worker.serve.done():
                worker.serve.set_result(None)
        self._poller = self._server.repository_poller(self.load, self.unload, in_thread=False)
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

    def _worker_exited(self, worker: _Worker, status: int) -> None:
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

    def _restart(self, worker: _Worker) -> None:
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
        if self._canaries is not None:
            await self._canaries.stop()
        for server in (self._startup, self._metrics_http):
            if server is not None:
                await server.stop()
        for sock in self._listeners:
            sock.close()
        log.info("supervisor: stopped")

    # ---- what concerns the whole server ----

    def _serving_workers(self) -> list[_Worker]:
        return [worker for worker in self._workers if worker.ready and worker.channel is not None]

    async def _answers(self, op: str) -> list[tuple[_Worker, Any]]:
        """``op`` asked of every serving worker at once: (worker, answer) for each that answered (one
        that died meanwhile is left out: the rest of the server is still shown)."""
        workers = self._serving_workers()
        answers = await asyncio.gather(
            *(worker.channel.call(op) for worker in workers if worker.channel is not None),
            return_exceptions=True,
        )
        return [
            (worker, answer)
            for worker, answer in zip(workers, answers, strict=True)
            if not isinstance(answer, BaseException)
        ]

    async def _on_all(self, op: str, **args: Any) -> list[Any]:
        """``op`` on every serving worker at once; raises the first error any of them had."""
        workers = self._serving_workers()
        results = await asyncio.gather(
            *(worker.channel.call(op, **args) for worker in workers if worker.channel is not None),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results

    async def load(self, name: str, override: dict[str, Any] | None = None) -> None:
        self._applied[name] = ("load", override)
        if override is None:  # a worker started later reads the same repository by itself
            self._applied.pop(name)
        await self._on_all("local_load", name=name, override=override)

    async def unload(self, name: str) -> None:
        self._applied[name] = ("unload", None)
        await self._on_all("local_unload", name=name)

    async def route(self, name: str, variants: list[dict[str, Any]] | None) -> None:
        self._routes[name] = variants  # None: removed (a replacement worker must drop the config's too)
        await self._on_all("local_route", name=name, variants=variants)

    async def shadow(self, name: str, config: dict[str, Any] | None) -> None:
        self._shadows[name] = config
        await self._on_all("local_shadow", name=name, config=config)

    async def canaries(self) -> dict[str, Any]:
        return self._canaries.states() if self._canaries is not None else {}

    async def canary(self, name: str, action: str) -> dict[str, Any]:
        if self._canaries is None:
            raise ModelNotFound(f"model {name!r} has no canary (canaries.{name} in the config)")
        return await self._canaries.act(name, action)

    async def _apply(
        self, name: str, route: list[dict[str, Any]] | None, shadow: dict[str, Any] | None
    ) -> None:
        await self.route(name, route)
        await self.shadow(name, shadow)

    async def _stable_of(self, name: str, candidate: str) -> str:
        return stable_version(await self.index(), name, candidate)

    async def index(self) -> list[dict[str, str]]:
        return merge_indexes(await self._on_all("local_index"))

    async def statistics(self, name: str | None, version: str | None) -> dict[str, Any]:
        answers = await self._on_all("local_statistics", name=name, version=version)
        per_version: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for answer in answers:
            for entry in answer["model_stats"]:
                per_version.setdefault((entry["name"], entry["version"]), []).append(entry)
        return {
            "model_stats": [
                {"name": name, "version": version, **merge_statistics(entries)}
                for (name, version), entries in per_version.items()
            ]
        }

    async def snapshot(self) -> Snapshot:
        """The whole server's metrics as data (what the canaries decide on)."""
        answers = await self._answers("snapshot")
        return merge([self._own.snapshot(()), *(answer["metrics"] for _, answer in answers)])

    async def metrics(self) -> bytes:
        snapshots, processes, by_worker = [self._own.snapshot(())], [process_stats()], {}
        for worker, answer in await self._answers("snapshot"):
            snapshots.append(answer["metrics"])
            processes.append(answer["process"])
            by_worker[worker.index] = answer["process"]
        gauges = [
            WorkerGauges(
                worker=worker.index,
                ready=worker.ready,
                restarts=worker.restarts,
                resident_memory_bytes=by_worker.get(worker.index, {}).get(
                    "process_resident_memory_bytes", 0.0
                ),
                cpu_seconds=by_worker.get(worker.index, {}).get("process_cpu_seconds_total", 0.0),
            )
            for worker in self._workers
        ]
        return exposition(merge(snapshots), sum_process_stats(processes), gauges)

    async def metrics_text(self) -> str:
        return (await self.metrics()).decode()

    async def overview(self) -> dict[str, Any]:
        """The whole server for the status page (``dashboard.py``): metrics merged, process figures
        summed, every worker's recent errors, oldest first."""
        snapshots, processes, errors = [self._own.snapshot(())], [process_stats()], []
        for _, answer in await self._answers("local_overview"):
            snapshots.append(answer["metrics"])
            processes.append(answer["process"])
            errors += answer["errors"]
        errors.sort(key=lambda error: error["time"])
        return {
            "metrics": merge(snapshots),
            "process": sum_process_stats(processes),
            "errors": errors[-RECENT_ERRORS:],
            "workers": len(self._workers),
            "started_at": self._started_at,
        }


def merge_indexes(indexes: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """The repository index of the whole server from each worker's: a version that serves on some
    workers and not on others is READY, its reason naming where it does not."""
    merged: dict[tuple[str, str], list[tuple[int, dict[str, str]]]] = {}
    for worker, index in enumerate(indexes):
        for entry in index:
            merged.setdefault((entry["name"], entry["version"]), []).append((worker, entry))
    result = []
    for (name, version), seen in merged.items():
        states = {entry["state"] for _, entry in seen}
        first = seen[0][1]
        if len(states) == 1 and len({entry["reason"] for _, entry in seen}) == 1:
            result.append(first)
            continue
        elsewhere = "; ".join(
            f"worker {worker}: {entry['state']}" + (f" ({entry['reason']})" if entry["reason"] else "")
            for worker, entry in seen
            if entry["state"] != "READY"
        )
        state = "READY" if "READY" in states else first["state"]
        result.append({"name": name, "version": version, "state": state, "reason": elsewhere})
    return result


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


class WorkerLink:
    """A worker's side of the supervisor link: the ``Cluster`` its service asks for server-wide
    operations, and the handlers that answer the supervisor's calls."""

    def __init__(
        self,
        server: Server,
        index: int,
        link: socket.socket,
        http_socket: socket.socket,
        grpc_port: int | None,
    ) -> None:
        self._server = server
        self._index = index
        self._http_socket = http_socket
        self._grpc_port = grpc_port
        self._channel = Channel(
            link,
            {
                "local_load": self._local_load,
                "local_unload": self._local_unload,
                "local_route": self._local_route,
                "local_shadow": self._local_shadow,
                "local_index": self._local_index,
                "local_statistics": self._local_statistics,
                "snapshot": self._snapshot,
                "local_overview": self._local_overview,
            },
        )

    async def serve(self) -> None:
        from edgeinfer.server.app import WorkerRole

        await self._channel.start()
        role = WorkerRole(self._index, self._http_socket, self._grpc_port, self, self._serving)
        await self._server.serve(worker=role)

    async def _serving(self) -> None:
        await self._channel.call("loaded")

    def _local(self) -> InferenceService:
        service = self._server.service
        if service is None:
            raise InvalidInput(f"worker {self._index} is still starting")
        return service

    # Cluster: what the service asks the whole server for
    async def load(self, name: str, override: dict[str, Any] | None) -> None:
        await self._channel.call("load", name=name, override=override)

    async def unload(self, name: str) -> None:
        await self._channel.call("unload", name=name)

    async def route(self, name: str, variants: list[dict[str, Any]] | None) -> None:
        await self._channel.call("route", name=name, variants=variants)

    async def shadow(self, name: str, config: dict[str, Any] | None) -> None:
        await self._channel.call("shadow", name=name, config=config)

    async def canaries(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._channel.call("canaries")
        return result

    async def canary(self, name: str, action: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._channel.call("canary", name=name, action=action)
        return result

    async def index(self) -> list[dict[str, str]]:
        result: list[dict[str, str]] = await self._channel.call("index")
        return result

    async def statistics(self, name: str | None, version: str | None) -> dict[str, Any]:
        result: dict[str, Any] = await self._channel.call("statistics", name=name, version=version)
        return result

    async def metrics(self) -> bytes:
        text: str = await self._channel.call("metrics")
        return text.encode()

    async def overview(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._channel.call("overview")
        return result

    # what the supervisor asks this worker for
    async def _local_load(self, name: str, override: dict[str, Any] | None) -> None:
        await self._local().local_load(name, override)

    async def _local_unload(self, name: str) -> None:
        await self._local().local_unload(name)

    async def _local_route(self, name: str, variants: list[dict[str, Any]] | None) -> None:
        self._local().local_route(name, variants)

    async def _local_shadow(self, name: str, config: dict[str, Any] | None) -> None:
        self._local().local_shadow(name, config)

    async def _local_index(self) -> list[dict[str, str]]:
        return self._local().local_index()

    async def _local_statistics(self, name: str | None, version: str | None) -> dict[str, Any]:
        return self._local().local_statistics(name, version)

    async def _snapshot(self) -> dict[str, Any]:
        return {"metrics": self._local().local_metrics(), "process": process_stats()}

    async def _local_overview(self) -> dict[str, Any]:
        return self._local().local_overview()  # the snapshot's parts and the recent errors
