"""The composition root: builds the registry, router, core service and transports, and runs them.

``Server`` is used by the CLI and is the programmatic way to run edgeinfer::

    server = Server(load_config("config.yaml"))
    server.run()                      # blocking, until SIGINT/SIGTERM (workers: N forks N processes)

    await server.start(); ...; await server.stop()   # embedded in an event loop (one process)

With ``server.workers`` above one, ``run`` hands over to ``supervisor.Supervisor``, which forks worker
processes that each run ``serve(worker=...)``: the same server, given the listening socket it inherited
and the whole server's scope (its link to the supervisor) for what concerns the whole server.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer.admission.lag import LoopLag
from edgeinfer.backends import LoadContext
from edgeinfer.canary import held_versions
from edgeinfer.config import Config, ServerConfig, TracingConfig
from edgeinfer.config_file import parse
from edgeinfer.control.local import LocalScope
from edgeinfer.control.plane import ControlPlane
from edgeinfer.control.scope import Scope
from edgeinfer.dashboard import recent_errors
from edgeinfer.errors import ConfigError
from edgeinfer.extras import missing
from edgeinfer.logs import AccessLog, setup_logging
from edgeinfer.metrics import Metrics
from edgeinfer.model_config import ModelConfig
from edgeinfer.repository.poller import RepositoryPoller
from edgeinfer.repository.registry import Registry
from edgeinfer.repository.remote import S3Mirror, is_remote
from edgeinfer.repository.residency import Residency
from edgeinfer.repository.router import Router
from edgeinfer.repository.sources import ModelSource, discover, discover_model
from edgeinfer.server.http import MetricsRoutes, V2Routes
from edgeinfer.server.http_errors import error_response
from edgeinfer.server.http_protocol import HttpServer
from edgeinfer.server.idle_poll import IdlePoll
from edgeinfer.server.security import Security
from edgeinfer.service import InferenceService
from edgeinfer.shadow import Shadows
from edgeinfer.supervisor.loop import run_with_uvloop
from edgeinfer.supervisor.sockets import bind
from edgeinfer.supervisor.supervisor import Supervisor
from edgeinfer.supervisor.worker import WorkerRole
from edgeinfer.validation import RequestLimits

if TYPE_CHECKING:
    from edgeinfer.server.grpc import GrpcServer
    from edgeinfer.tracing import Tracing

log = logging.getLogger(__name__)

GRPC_DRAIN_S = 10.0  # calls in flight when the server stops get this long to finish (as HTTP requests do)


class Server:
    def __init__(self, config: Config | None = None) -> None:
        config = config or Config()
        self._mirror: S3Mirror | None = None
        store = config.model_store_path
        if store is not None and is_remote(store):
            # An s3:// repository is mirrored into the cache directory; everything else reads the mirror.
            self._mirror = S3Mirror(store, config.repository.cache_path, config.repository.s3_endpoint_url)
            self._mirror.sync()
            config = config.model_copy(update={"model_store_path": str(self._mirror.local)})
        self.config = config
        for folder in config.python_path:  # where the config's Python models live
            if folder not in sys.path:
                sys.path.insert(0, folder)
        # a configuration error shows now, before anything listens
        self._discovered = discover(config, self._held())
        Security.check(config.server)
        self._registered: list[ModelSource] = []
        self.service: InferenceService | None = None
        self.control: ControlPlane | None = None
        self._local: LocalScope | None = None  # this process's part of the server-wide operations
        self._http: HttpServer | None = None
        self._metrics_http: HttpServer | None = None
        self._grpc: GrpcServer | None = None
        self._grpc_stopping: asyncio.Future[None] | None = None
        self._poller: RepositoryPoller | None = None
        self._security: Security | None = None
        self._http_socket: socket.socket | None = None
        self._started = False
        self._tracing: Tracing | None = None

    def register(self, model: Any, name: str, version: str = "1", **settings: Any) -> None:
        """Serve a Python model: an ``edgeinfer.Model`` object, or its class or a factory that builds one
        (then each worker process builds its own). ``settings`` are per-model config keys
        (``max_batch_size``, ``max_batch_time``, ``kind``, ``instances``, ...). Call before ``start`` or
        ``run``."""
        if self._started:
            raise ConfigError("register models before the server starts")
        cls = model if isinstance(model, type) else type(model)
        model_class = f"{cls.__module__}:{cls.__qualname__}"
        config = parse(
            ModelConfig, {"backend": "python", "model_class": model_class, **settings}, f"{name!r}"
        )
        self._registered.append(ModelSource(name, version, "", config, instance=model))

    def _discover(self, name: str, override: dict[str, Any] | None) -> list[ModelSource]:
        """The versions of one model now (for load requests), refreshing a remote mirror first."""
        if self._mirror is not None:
            self._mirror.sync()
        return discover_model(self.config, name, override, self._held().get(name))

    def _held(self) -> dict[str, str]:
        """Canary candidates that load besides what their model's version policy chooses."""
        return held_versions(self.config.canaries, self.config.repository.cache_path)

    @property
    def local_scope(self) -> LocalScope | None:
        """This process's scope once the core is built (a worker answers its supervisor with it)."""
        return self._local

    def _build(self, whole: Scope | None) -> tuple[InferenceService, ControlPlane]:
        """Wire one process's core: metrics, registry, router, residency, the data plane's service and
        the control plane over ``whole``, the whole server's scope (None: this process is the whole
        server, and runs the canaries)."""
        config = self.config
        metrics = Metrics()
        service: InferenceService | None = None
        local: LocalScope | None = None

        # the registry and residency are built before what they call back (a pipeline's steps, the
        # loading of an evicted model): these bind late
        async def run_step(model: str, version: str | None, request: Any, step: str, span: object) -> Any:
            assert service is not None
            return await service.run_step(model, version, request, step, span)

        async def load_here(name: str) -> None:
            assert local is not None
            await local.load(name)

        tracing = self._tracing = start_tracing(config.tracing)
        registry = Registry(
            metrics,
            LoopLag(),  # one per event loop: every batcher's admission reads it
            LoadContext(run_step=run_step, observe_step=metrics.observe_step),
            tracing.batches if tracing is not None else None,
        )
        router = Router(registry, config.routes)
        residency = Residency(registry, config.residency, load_here)
        shadows = Shadows(registry, router, metrics, config.shadows)
        errors = recent_errors()
        local = self._local = LocalScope(
            registry,
            router,
            residency,
            shadows,
            metrics,
            self._discover,
            errors,
            config.canaries if whole is None else None,  # with workers the supervisor runs them
            config.repository.cache_path,
        )
        access_log = AccessLog(config.logging.access_log, config.logging.access_log_sample_rate)
        limits = config.server.limits
        request_limits = RequestLimits(limits.max_tensor_elements, limits.max_rows, limits.max_bytes_element)
        service = InferenceService(
            registry, router, residency, shadows, metrics, access_log, errors, request_limits, tracing
        )
        control = ControlPlane(whole or local, router, shadows, service.ready, config.residency.memory_factor)
        return service, control

    @property
    def http_port(self) -> int:
        """The bound HTTP port (useful when the config asked for port 0)."""
        assert self._http_socket is not None, "the server is not started"
        port: int = self._http_socket.getsockname()[1]
        return port

    async def start(self, worker: WorkerRole | None = None) -> None:
        """Bind the HTTP port (liveness answers at once), load and warm up every model, then report ready.

        A worker process listens only once every worker is loaded (the supervisor answers probes until
        then), leaves the metrics port and repository polling to the supervisor, and shares the gRPC port.
        """
        started = time.perf_counter()
        self._started = True
        server_config = self.config.server
        service, control = self._build(worker.scope if worker else None)
        self.service, self.control = service, control
        security = self._security = Security(server_config, service.metrics)
        if worker is None:
            security.warn_if_open()
            await self._listen(bind(server_config.host, server_config.http_port), server_config.grpc_port)
            if server_config.metrics_port is not None:
                metrics_socket = bind(server_config.host, server_config.metrics_port, "metrics")
                metrics_routes = MetricsRoutes(control.metrics_exposition, security.guard)
                self._metrics_http = security.http_server(metrics_routes, error_response, 64 * 1024)
                await self._metrics_http.start(metrics_socket)
        # a worker reads the repository again: one forked to replace another starts from what is there now
        discovered = discover(self.config, self._held()) if worker is not None else self._discovered
        sources = [*discovered, *self._registered]
        on_demand = [source for source in sources if source.config.residency == "on_demand"]
        service.registry.defer(on_demand)
        try:
            await service.registry.load(source for source in sources if source not in on_demand)
            await service.residency.enforce()
        except BaseException:
            await self.stop()
            raise
        service.residency.start()
        if self._local is not None:
            await self._local.start()
        if worker is None:
            self._start_poller()
        else:
            await worker.serving()
            await self._listen(worker.http_socket, worker.grpc_port, shared=True)
        security.watch_tls()
        # Models, sessions and module state live for the whole run: move them out of the collector's
        # reach so that garbage collections triggered by request traffic stay short (tail latency).
        gc.freeze()
        _return_freed_memory()
        service.set_ready(True)
        log.info(
            "%sready in %.0f ms: %d model version(s), HTTP on %s:%d, gRPC on %s",
            f"worker {worker.index} " if worker else "",
            (time.perf_counter() - started) * 1000,
            len(sources),
            server_config.host,
            self.http_port,
            self.grpc_port or "(off)",
        )

    async def _listen(self, http_socket: socket.socket, grpc_port: int | None, shared: bool = False) -> None:
        """``shared``: the workers' one HTTP socket (``HttpServer.start``)."""
        assert self.service is not None
        assert self._security is not None
        server_config = self.config.server
        self._http_socket = http_socket
        assert self.control is not None
        routes = V2Routes(
            self.service,
            self.control,
            server_config.max_request_bytes,
            server_config.compress_min_bytes,
            self._security.guard,
            server_config.limits.max_json_depth,
        )
        idle_poll = IdlePoll(self.service.registry.working) if server_config.idle_poll else None
        self._http = self._security.http_server(
            routes, error_response, server_config.max_request_bytes, idle_poll, routes.early
        )
        await self._http.start(http_socket, shared)
        if grpc_port is not None:
            await self._start_grpc(server_config.host, grpc_port, server_config.max_request_bytes)

    def _start_poller(self) -> None:
        assert self._local is not None
        self._poller = self.repository_poller(self._local.load, self._local.unload)
        if self._poller is not None:
            self._poller.start()

    def repository_poller(
        self,
        load: Callable[[str], Awaitable[None]],
        unload: Callable[[str], Awaitable[None]],
        in_thread: bool = True,
    ) -> RepositoryPoller | None:
        """A poller of the model repository calling ``load`` and ``unload`` on changes, if configured
        (the supervisor runs it with workers, without threads: see ``workers``)."""
        interval = self.config.repository.poll_interval_s
        if interval is None or self.config.model_store_path is None:
            return None
        refresh = self._mirror.sync if self._mirror is not None else None
        root = Path(self.config.model_store_path)
        return RepositoryPoller(root, interval, load, unload, refresh, in_thread=in_thread)

    async def _start_grpc(self, host: str, port: int, max_message_bytes: int) -> None:
        # grpcio costs memory and start-up time; it is imported only when the gRPC port is on.
        from edgeinfer.server.grpc import GrpcServer

        assert self.service is not None
        assert self.control is not None
        assert self._security is not None
        self._grpc = GrpcServer(
            self.service,
            self.control,
            max_message_bytes,
            self._security.guard,
            self.config.server.limits.max_grpc_streams,
            self._security.grpc_credentials(),
        )
        try:
            await self._grpc.start(host, port)
        except OSError as exc:
            self._grpc = None
            await self.stop()
            raise ConfigError(str(exc)) from None

    @property
    def grpc_port(self) -> int | None:
        return self._grpc.port if self._grpc is not None else None

    async def stop(self) -> None:
        """Stop taking connections, answer what is queued, free the models."""
        service = self.service
        if service is not None:
            service.set_ready(False)
        if self._security is not None:
            self._security.stop_watching()
        if self._local is not None:
            await self._local.stop()
        if self._poller is not None:
            await self._poller.stop()
            self._poller = None
        if service is not None:
            await service.residency.stop()
        if self._grpc is not None:
            await (self._grpc_stopping or self._grpc.stop(GRPC_DRAIN_S))
            self._grpc = self._grpc_stopping = None
        for http in (self._http, self._metrics_http):
            if http is not None:
                await http.stop()
        self._http = self._metrics_http = None
        if service is not None:
            await service.registry.close()
        if self._tracing is not None:
            await asyncio.to_thread(self._tracing.close)  # exports what is left
            self._tracing = None

    async def serve(self, worker: WorkerRole | None = None) -> None:
        """Start, wait for SIGINT or SIGTERM, stop. A signal while the models load stops at once.
        SIGHUP reads the TLS certificate files again."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        loop.add_signal_handler(signal.SIGHUP, self._reload_tls)
        starting = asyncio.ensure_future(self.start(worker))
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
        else:
            starting.result()  # a start-up error ends here
            await stopping
            await self._delay_shutdown(worker)
        stopping.cancel()
        log.info("%sshutting down", f"worker {worker.index} " if worker else "")
        await self.stop()

    def _reload_tls(self) -> None:
        if self._security is not None:
            self._security.reload_tls(force=True)

    async def _delay_shutdown(self, worker: WorkerRole | None) -> None:
        """Readiness fails at once, serving goes on for ``shutdown_delay_s``: load balancers that probe
        readiness (a Kubernetes Service's endpoints, nginx Plus, Envoy) stop sending before the listeners
        close, so no client meets a refused connection."""
        delay = self.config.server.shutdown_delay_s
        if delay > 0 and self.service is not None:
            self.service.set_ready(False)
            if self._grpc is not None:  # GOAWAY now: gRPC clients and proxies send new calls elsewhere
                self._grpc_stopping = asyncio.ensure_future(self._grpc.stop(delay + GRPC_DRAIN_S))
            log.info(
                "%snot ready; serving %.1f s more before draining",
                f"worker {worker.index} " if worker else "",
                delay,
            )
            await asyncio.sleep(delay)

    def run(self, **server_settings: Any) -> None:
        """Blocking: serve until SIGINT or SIGTERM. ``server_settings`` override ``server:`` keys, e.g.
        ``run(http_port=8080, grpc_port=None, workers=2)``."""
        if server_settings:
            merged = {**self.config.server.model_dump(), **server_settings}
            server = parse(ServerConfig, merged, "Server.run")
            self.config = self.config.model_copy(update={"server": server})
        if not logging.getLogger().handlers:  # used from code: log as `edgeinfer serve` does
            setup_logging(self.config.logging.level, self.config.logging.format)
        workers = self.config.server.worker_count
        if workers > 1:
            code = Supervisor(self, workers).run()
            if code:
                raise SystemExit(code)
            return
        run_with_uvloop(self.serve())


def _return_freed_memory() -> None:
    """Give the heap pages freed during start-up (config, model parsing, warm-up) back to the system.

    glibc keeps freed memory for reuse and returns it only when asked (``malloc_trim``): about a
    megabyte of idle RSS on the example repository (bench/footprint.py). Other C libraries: nothing.
    """
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


def start_tracing(config: TracingConfig) -> Tracing | None:
    """OpenTelemetry tracing when the config turns it on (imported only then: the SDK costs memory)."""
    if not config.enabled or os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    try:  # the optional OpenTelemetry SDK
        from edgeinfer import tracing
    except ImportError as exc:
        raise missing(exc, "tracing.enabled") or ConfigError(
            f"tracing.enabled needs the OpenTelemetry SDK, which does not import ({exc}): "
            "pip install 'edgeinfer[otel]'"
        ) from None
    return tracing.setup(config)
