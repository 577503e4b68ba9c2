"""TLS for every port from ``server.tls``: one certificate, reloaded without dropping a connection.

The HTTP and metrics ports get an ``ssl.SSLContext``; gRPC gets grpcio's dynamic credentials. Both
read the files again when ``reload`` finds them changed (polled, and on SIGHUP): connections that are
open keep the certificate they started with, new handshakes get the new one.

How HTTP switches: asyncio fixes a server's context when it starts listening, so the listening context
only chooses. Its SNI callback (OpenSSL calls it for every ClientHello, with or without a server name)
hands each new connection the current context, certificate, key and client CAs included; a CA removed
from ``ca_file`` stops being trusted at the next handshake. A reload that fails (a half-written file, a
key that does not match) keeps the old material and logs why.

TLS 1.2 is the oldest version offered (both transports); client certificates are checked against
``ca_file`` when ``client_auth`` is ``require`` (or ``optional``: checked if sent, HTTP only; grpcio can
only require them or not ask, so ``optional`` does not ask on the gRPC port).
"""

from __future__ import annotations

import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edgeinfer.config import TlsConfig
from edgeinfer.errors import ConfigError

if TYPE_CHECKING:
    import grpc

log = logging.getLogger(__name__)

_VERIFY_MODE = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "require": ssl.CERT_REQUIRED}


@dataclass(frozen=True, slots=True)
class _Material:
    """The files' contents as read at one moment (what gRPC is given)."""

    cert_chain: bytes
    key: bytes
    ca: bytes | None
    stamp: tuple[tuple[int, int], ...]  # (mtime_ns, size) of each file: a change shows here


class TlsFiles:
    """The certificate, key and CA of ``server.tls``, read now and again when they change."""

    def __init__(self, config: TlsConfig) -> None:
        self.config = config
        self.generation = 0  # counts successful reloads; gRPC's fetcher compares it
        self._material = self._read()
        self._context = self._context_for(self._material)
        self._listening: ssl.SSLContext | None = None

    def _paths(self) -> list[str]:
        config = self.config
        return [config.cert_file, config.key_file, *([config.ca_file] if config.ca_file else [])]

    def _stamp(self) -> tuple[tuple[int, int], ...]:
        stamps = []
        for path in self._paths():
            try:
                info = os.stat(path)
            except OSError as exc:
                raise ConfigError(f"server.tls: cannot read {path}: {exc.strerror}") from None
            stamps.append((info.st_mtime_ns, info.st_size))
        return tuple(stamps)

    def _read(self) -> _Material:
        stamp = self._stamp()
        try:
            cert = Path(self.config.cert_file).read_bytes()
            key = Path(self.config.key_file).read_bytes()
            ca = Path(self.config.ca_file).read_bytes() if self.config.ca_file else None
        except OSError as exc:
            raise ConfigError(f"server.tls: cannot read {exc.filename}: {exc.strerror}") from None
        return _Material(cert, key, ca, stamp)

    def _context_for(self, material: _Material) -> ssl.SSLContext:
        context = _server_context(self.config.client_auth)
        try:
            context.load_cert_chain(self.config.cert_file, self.config.key_file)
            if material.ca is not None:
                context.load_verify_locations(cadata=material.ca.decode("ascii", "replace"))
        except (ssl.SSLError, ValueError, OSError) as exc:
            raise ConfigError(
                f"server.tls: the certificate, key or CA cannot be used ({self.config.cert_file}, "
                f"{self.config.key_file}, {self.config.ca_file}): {exc}"
            ) from None
        return context

    # ---- HTTP ----

    def http_context(self) -> ssl.SSLContext:
        """The context to listen with: it passes each new connection the current material."""
        if self._listening is None:
            listening = _server_context(self.config.client_auth)
            listening.load_cert_chain(self.config.cert_file, self.config.key_file)  # replaced per handshake
            listening.sni_callback = self._choose
            self._listening = listening
        return self._listening

    def _choose(self, connection: ssl.SSLObject, server_name: str | None, _: ssl.SSLContext) -> None:
        connection.context = self._context

    # ---- gRPC ----

    def grpc_credentials(self) -> grpc.ServerCredentials:
        import grpc

        served = [self.generation]

        def configuration(material: _Material) -> grpc.ServerCertificateConfiguration:
            return grpc.ssl_server_certificate_configuration(
                [(material.key, material.cert_chain)], root_certificates=material.ca
            )

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            """Called by grpcio on each new connection: new material once, then None (unchanged)."""
            if served[0] == self.generation:
                return None
            served[0] = self.generation
            return configuration(self._material)

        return grpc.dynamic_ssl_server_credentials(
            configuration(self._material),
            fetch,
            require_client_authentication=self.config.client_auth == "require",
        )

    # ---- reloading ----

    def reload(self, force: bool = False) -> bool:
        """Read the files again if they changed (or ``force``); True when new material is in use."""
        try:
            if not force and self._stamp() == self._material.stamp:
                return False
            material = self._read()
            context = self._context_for(material)
        except ConfigError as exc:
            log.error("TLS material not reloaded, the old certificate stays in use: %s", exc)
            return False
        self._material, self._context = material, context
        self.generation += 1
        log.info("TLS certificate reloaded from %s", self.config.cert_file)
        return True


def _server_context(client_auth: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_mode = _VERIFY_MODE[client_auth]
    context.set_alpn_protocols(["http/1.1"])
    return context
