"""What every listener of one process shares: TLS material, the API key guard and the hard limits.

Built once per process from ``server:`` (a worker builds its own), it makes the HTTP servers (TLS and
limits applied, refusals counted in ``metrics``), gives gRPC its credentials, watches the certificate
files for change and warns when the server is open to the network without keys.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from edgeinfer.config import ServerConfig
from edgeinfer.metrics import Metrics
from edgeinfer.server.auth import Guard, KeyRing, is_loopback
from edgeinfer.server.http_messages import EarlyHandler, ErrorResponder, Handler, HttpLimits
from edgeinfer.server.http_protocol import HttpServer
from edgeinfer.server.idle_poll import IdlePoll
from edgeinfer.server.tls import TlsFiles

if TYPE_CHECKING:
    import grpc

log = logging.getLogger(__name__)


class Security:
    def __init__(self, config: ServerConfig, metrics: Metrics) -> None:
        self.config = config
        self.tls = TlsFiles(config.tls) if config.tls is not None else None
        self.guard = Guard(KeyRing.load(config.auth), config.auth.open_paths, metrics.auth_refused)
        self._metrics = metrics
        self._watcher: asyncio.TimerHandle | None = None

    @staticmethod
    def check(config: ServerConfig) -> None:
        """Read the key file, the environment and the TLS files once, so that their errors show before
        any model loads."""
        KeyRing.load(config.auth)
        if config.tls is not None:
            TlsFiles(config.tls)

    def http_server(
        self,
        handler: Handler,
        on_error: ErrorResponder,
        max_body_bytes: int,
        idle_poll: IdlePoll | None = None,
        early: EarlyHandler | None = None,
    ) -> HttpServer:
        limits = self.config.limits
        return HttpServer(
            handler,
            on_error,
            HttpLimits(
                max_body_bytes=max_body_bytes,
                max_header_bytes=limits.max_header_bytes,
                max_headers=limits.max_headers,
                header_timeout_s=limits.header_timeout_s,
                body_timeout_s=limits.body_timeout_s,
                keepalive_timeout_s=limits.keepalive_timeout_s,
                max_connections=limits.max_connections,
            ),
            ssl_context=self.tls.http_context() if self.tls is not None else None,
            on_refused=self._metrics.limit_refused,
            idle_poll=idle_poll,
            early=early,
        )

    def grpc_credentials(self) -> grpc.ServerCredentials | None:
        return self.tls.grpc_credentials() if self.tls is not None else None

    def warn_if_open(self) -> None:
        """A loud warning for a server reachable from the network by anyone."""
        host = self.config.host
        if self.guard.enabled or is_loopback(host):
            return
        log.warning(
            "API key auth is OFF and the server listens on %s, not only on loopback: anyone who can reach "
            "it can run inference, load and unload models and read metrics. Configure keys "
            "(server.auth.keys_file or $%s; see docs/security.md) or listen on 127.0.0.1.",
            host,
            self.config.auth.keys_env,
        )

    # ---- certificate reloading ----

    def reload_tls(self, force: bool = False) -> None:
        if self.tls is not None:
            self.tls.reload(force)

    def watch_tls(self) -> None:
        """Check the certificate files every ``tls.reload_interval_s`` (0: only on SIGHUP)."""
        if self.tls is None or self.tls.config.reload_interval_s <= 0:
            return
        interval = self.tls.config.reload_interval_s

        def check() -> None:
            self.reload_tls()
            self._watcher = asyncio.get_running_loop().call_later(interval, check)

        self._watcher = asyncio.get_running_loop().call_later(interval, check)

    def stop_watching(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
