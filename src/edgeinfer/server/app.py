"""The composition root: builds the registry, the core service and the transports, and runs them.

``Server`` is used by the CLI and is the programmatic way to run edgeinfer::

    server = Server(load_config("config.yaml"))
    server.run()                      # blocking, until SIGINT/SIGTERM

    await server.start(); ...; await server.stop()   # embedded in an event loop
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer.backends.python import Model
from edgeinfer.config import Config, ModelConfig, ServerConfig, parse
from edgeinfer.errors import ConfigError
from edgeinfer.logs import AccessLog
from edgeinfer.metrics import Metrics
from edgeinfer.repository.poller import RepositoryPoller
from edgeinfer.repository.registry import Registry
from edgeinfer.repository.remote import S3Mirror, is_remote
from edgeinfer.repository.sources import ModelSource, discover, discover_model
from edgeinfer.server.http import MetricsRoutes, V2Routes, error_response
from edgeinfer.server.http_protocol import HttpServer
from edgeinfer.service import InferenceService

if TYPE_CHECKING:
    from edgeinfer.server.grpc import GrpcServer

log = logging.getLogger(__name__)


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
        self._sources = discover(config)
        self.metrics = Metrics()
        self.registry = Registry(self.metrics)
        access_log = AccessLog(config.logging.access_log, config.logging.access_log_sample_rate)
        self.service = InferenceService(
            self.registry, self.metrics, access_log, self._discover, config.residency
        )
        self._http: HttpServer | None = None
        self._metrics_http: HttpServer | None = None
        self._grpc: GrpcServer | None = None
        self._poller: RepositoryPoller | None = None
        self._http_socket: socket.socket | None = None

    def register(self, model: Model, name: str, version: str = "1", **settings: Any) -> None:
        """Serve a Python model object; ``settings`` are per-model config keys (``max_batch_size``,
        ``max_batch_time``, ``max_queue_size``, ...). Call before ``start``/``run``."""
        if self._http is not None:
            raise ConfigError("register models before the server starts")
        model_class = f"{type(model).__module__}:{type(model).__qualname__}"
        config = parse(
            ModelConfig, {"backend": "python", "model_class": model_class, **settings}, f"{name!r}"
        )
        self._sources.append(ModelSource(name, version, "", config, instance=model))

    def _discover(self, name: str, override: dict[str, Any] | None) -> list[ModelSource]:
        """The versions of one model now (for load requests), refreshing a remote mirror first."""
        if self._mirror is not None:
            self._mirror.sync()
        return discover_model(self.config, name, override)

    @property
    def http_port(self) -> int:
        """The bound HTTP port (useful when the config asked for port 0)."""
        assert self._http_socket is not None, "the server is not started"
        port: int = self._http_socket.getsockname()[1]
        return port

    async def start(self) -> None:
        """Bind the HTTP port (liveness answers at once), load and warm up every model, then report ready."""
        started = time.perf_counter()
        server_config = self.config.server
        self._http_socket = _bind(server_config.host, server_config.http_port)
        routes = V2Routes(self.service, server_config.max_request_bytes, server_config.compress_min_bytes)
        self._http = HttpServer(routes, error_response, server_config.max_request_bytes)
        await self._http.start(self._http_socket)
        if server_config.metrics_port is not None:
            metrics_socket = _bind(server_config.host, server_config.metrics_port, "metrics")
            self._metrics_http = HttpServer(MetricsRoutes(self.metrics), error_response, 64 * 1024)
            await self._metrics_http.start(metrics_socket)
        if server_config.grpc_port is not None:
            await self._start_grpc(
                server_config.host, server_config.grpc_port, server_config.max_request_bytes
            )
        on_demand = [source for source in self._sources if source.config.residency == "on_demand"]
        self.registry.defer(on_demand)
        try:
            await self.registry.load(source for source in self._sources if source not in on_demand)
            await self.service.residency.enforce()
        except BaseException:
            await self.stop()
            raise
        self.service.residency.start()
        interval = self.config.repository.poll_interval_s
        if interval is not None and self.config.model_store_path is not None:
            root = Path(self.config.model_store_path)
            refresh = self._mirror.sync if self._mirror is not None else None
            self._poller = RepositoryPoller(
                root, interval, self.service.load_model, self.service.unload_model, refresh
            )
            self._poller.start()
        # Models, sessions and module state live for the whole run: move them out of the collector's
        # reach so that garbage collections triggered by request traffic stay short (tail latency).
        gc.freeze()
        self.service.set_ready(True)
        log.info(
            "ready in %.0f ms: %d model version(s), HTTP on %s:%d, gRPC on %s",
            (time.perf_counter() - started) * 1000,
            len(self._sources),
            server_config.host,
            self.http_port,
            self.grpc_port or "(off)",
        )

    async def _start_grpc(self, host: str, port: int, max_message_bytes: int) -> None:
        # grpcio costs memory and start-up time; it is imported only when the gRPC port is on.
        from edgeinfer.server.grpc import GrpcServer

        self._grpc = GrpcServer(self.service, max_message_bytes)
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
        self.service.set_ready(False)
        if self._poller is not None:
            await self._poller.stop()
            self._poller = None
        await self.service.residency.stop()
        if self._grpc is not None:
            await self._grpc.stop()
            self._grpc = None
        for http in (self._http, self._metrics_http):
            if http is not None:
                await http.stop()
        self._http = self._metrics_http = None
        await self.registry.close()

    async def serve(self) -> None:
        """Start, wait for SIGINT or SIGTERM, stop."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await self.start()
        await stop.wait()
        log.info("shutting down")
        await self.stop()

    def run(self, **server_settings: Any) -> None:
        """Blocking: serve on uvloop until SIGINT or SIGTERM. ``server_settings`` override ``server:``
        keys, e.g. ``run(http_port=8080, grpc_port=None)``."""
        if server_settings:
            merged = {**self.config.server.model_dump(), **server_settings}
            server = parse(ServerConfig, merged, "Server.run")
            self.config = self.config.model_copy(update={"server": server})
        run_with_uvloop(self.serve())


def run_with_uvloop(coroutine: object) -> None:
    try:
        import uvloop
    except ImportError:  # uvloop is not built for every platform (Windows)
        asyncio.run(coroutine)  # type: ignore[arg-type]
        return
    uvloop.run(coroutine)  # type: ignore[arg-type]


def _bind(host: str, port: int, what: str = "HTTP") -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port} for {what}: {exc.strerror}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock
