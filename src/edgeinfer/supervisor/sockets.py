"""Listening sockets, bound before anything serves (and before workers are forked, so that they share
them)."""

from __future__ import annotations

import socket

from edgeinfer.errors import ConfigError


def bind(host: str, port: int, what: str = "HTTP", reuse_port: bool = False) -> socket.socket:
    """A listening socket (``reuse_port``: bound only, to reserve a port that processes share)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port} for {what}: {exc.strerror}") from None
    if not reuse_port:
        sock.listen(2048)
    sock.setblocking(False)
    return sock
