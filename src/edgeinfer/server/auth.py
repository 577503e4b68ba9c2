"""API keys with roles, for both transports: who may call which group of routes.

Roles, each a group of routes (a key may hold several):

    infer    inference, model metadata, readiness, health, server metadata, model config
    admin    the repository API (index, load, unload), routes, shadows, canaries and statistics
    metrics  the Prometheus scrape (on the HTTP port and the metrics port)

The status page (``/ui``) is a static file anyone may load; its data (``/v2/ui/state``) takes a key
with the metrics role or the admin role, and its actions the admin role (they call the admin routes).

A key is sent as ``Authorization: Bearer <key>`` (or ``X-API-Key: <key>``) over HTTP and as the same
metadata over gRPC. No key, or one that matches no configured key, is 401 (``Unauthenticated``); a
known key without the route's role is 403 (``PermissionDenied``). Paths in ``open_paths`` (the health
probes by default) need no key.

Keys are kept as SHA-256 digests only (a key file may hold the digests, so no secret is at rest); a
presented key is hashed and compared with every configured digest in constant time, so the time taken
says nothing about which key, or how much of one, matched. Keys are random strings of at least 128
bits (``edgeinfer api-key`` makes one), which is why a plain hash, not a slow password hash, is right.
Nothing here logs or echoes a key.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import ipaddress
import os
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from edgeinfer.config import AuthConfig
from edgeinfer.errors import ConfigError, PermissionDenied, Unauthenticated

ROLES = ("infer", "admin", "metrics")
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True, slots=True)
class ApiKey:
    name: str
    digest: bytes
    roles: frozenset[str]


def digest(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).digest()


def new_key() -> tuple[str, str]:
    """A fresh random key (256 bits) and the SHA-256 hex digest to put in a key file."""
    key = "ei_" + secrets.token_urlsafe(32)
    return key, digest(key).hex()


class KeyRing:
    """The configured keys, from ``auth.keys_file`` and the ``auth.keys_env`` variable together."""

    def __init__(self, keys: Iterable[ApiKey]) -> None:
        self.keys = tuple(keys)

    @classmethod
    def load(cls, config: AuthConfig, environ: Mapping[str, str] | None = None) -> KeyRing:
        environ = os.environ if environ is None else environ
        keys: list[ApiKey] = []
        if config.keys_file is not None:
            try:
                text = Path(config.keys_file).read_text()
            except OSError as exc:
                raise ConfigError(
                    f"server.auth.keys_file: cannot read {config.keys_file}: {exc.strerror}"
                ) from None
            keys += parse_keys(text, config.keys_file)
        from_env = environ.get(config.keys_env)
        if from_env:
            keys += parse_keys(from_env, f"environment variable {config.keys_env}")
        names = [key.name for key in keys]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ConfigError(f"API key name(s) {', '.join(duplicates)} appear more than once")
        return cls(keys)

    def __bool__(self) -> bool:
        return bool(self.keys)

    def identify(self, presented: str | None) -> ApiKey:
        """The key ``presented`` matches; every digest is compared, in constant time."""
        if not presented:
            raise Unauthenticated(
                "this route needs an API key: send 'Authorization: Bearer <key>' (gRPC: the same metadata)"
            )
        wanted = digest(presented)
        found: ApiKey | None = None
        for key in self.keys:
            if hmac.compare_digest(wanted, key.digest):
                found = key
        if found is None:
            raise Unauthenticated("the API key is not valid")
        return found


def parse_keys(text: str, source: str) -> list[ApiKey]:
    """Keys from YAML: a list (or ``keys:`` holding one) of ``{name, key | sha256, roles}``."""
    try:
        document: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: API keys are not valid YAML: {exc}") from None
    if isinstance(document, dict) and set(document) == {"keys"}:
        document = document["keys"]
    if not isinstance(document, list):
        raise ConfigError(f"{source}: expected a list of API keys (name, key or sha256, roles)")
    return [_parse_key(entry, position, source) for position, entry in enumerate(document)]


def _parse_key(entry: Any, position: int, source: str) -> ApiKey:
    where = f"{source}: keys[{position}]"
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected a mapping with name, key or sha256, and roles")
    unknown = set(entry) - {"name", "key", "sha256", "roles"}
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: needs a 'name' (it names the key in logs and errors, never the key)")
    if ("key" in entry) == ("sha256" in entry):
        raise ConfigError(
            f"{where} ({name}): give exactly one of 'key' (the secret) or 'sha256' (its digest)"
        )
    if "key" in entry:
        key = entry["key"]
        if not isinstance(key, str) or len(key) < 16:
            raise ConfigError(f"{where} ({name}): 'key' must be a string of at least 16 characters")
        key_digest = digest(key)
    else:
        hex_digest = entry["sha256"]
        if (
            not isinstance(hex_digest, str)
            or len(hex_digest) != 64
            or not _HEX.issuperset(hex_digest.lower())
        ):
            raise ConfigError(
                f"{where} ({name}): 'sha256' must be 64 hex digits (edgeinfer api-key prints one)"
            )
        key_digest = bytes.fromhex(hex_digest)
    roles = entry.get("roles")
    if isinstance(roles, str):
        roles = [roles]
    if not isinstance(roles, list) or not roles or not set(roles) <= set(ROLES):
        raise ConfigError(
            f"{where} ({name}): 'roles' must be a non-empty list of {', '.join(ROLES)}; got {roles!r}"
        )
    return ApiKey(name, key_digest, frozenset(roles))


# ---- which role a gRPC method needs (HTTP routes: server/http_routes.py) ----


# gRPC methods: the role, and the HTTP path that means the same (``open_paths`` is matched against it)
GRPC_ROUTES: dict[str, tuple[str, str]] = {
    "ServerLive": ("infer", "/v2/health/live"),
    "ServerReady": ("infer", "/v2/health/ready"),
    "ModelReady": ("infer", "/v2/models/{model}/ready"),
    "ServerMetadata": ("infer", "/v2"),
    "ModelMetadata": ("infer", "/v2/models/{model}"),
    "ModelConfig": ("infer", "/v2/models/{model}/config"),
    "ModelInfer": ("infer", "/v2/models/{model}/infer"),
    "ModelStreamInfer": ("infer", "/v2/models/{model}/infer"),
    "ModelStatistics": ("admin", "/v2/models/{model}/stats"),
    "RepositoryIndex": ("admin", "/v2/repository/index"),
    "RepositoryModelLoad": ("admin", "/v2/repository/models/{model}/load"),
    "RepositoryModelUnload": ("admin", "/v2/repository/models/{model}/unload"),
    # edgeinfer.rollouts.v1.RolloutService (proto/edgeinfer_rollouts.proto)
    "ListRoutes": ("admin", "/v2/routes"),
    "SetRoute": ("admin", "/v2/routes/{model}"),
    "RemoveRoute": ("admin", "/v2/routes/{model}"),
    "ListShadows": ("admin", "/v2/shadows"),
    "SetShadow": ("admin", "/v2/shadows/{model}"),
    "RemoveShadow": ("admin", "/v2/shadows/{model}"),
    "ListCanaries": ("admin", "/v2/canaries"),
    "CanaryAction": ("admin", "/v2/canaries/{model}"),
}


class Guard:
    """Checks one request's key against the role its route needs; counts refusals by protocol and
    reason. With no keys configured it lets everything through (``enabled`` is False)."""

    def __init__(
        self,
        keys: KeyRing,
        open_paths: Iterable[str],
        on_refused: Callable[[str, str], None] = lambda protocol, reason: None,
    ) -> None:
        self.keys = keys
        self.enabled = bool(keys)
        paths = [path.rstrip("/") or "/" for path in open_paths]
        self._open = frozenset(path for path in paths if "*" not in path)
        self._open_patterns = tuple(path for path in paths if "*" in path)
        self._on_refused = on_refused

    def is_open(self, path: str) -> bool:
        path = path.rstrip("/") or "/"
        return path in self._open or any(
            fnmatch.fnmatchcase(path, pattern) for pattern in self._open_patterns
        )

    def check(self, protocol: str, path: str, role: str | tuple[str, ...], presented: str | None) -> None:
        """Raise ``Unauthenticated`` or ``PermissionDenied`` unless the key may use ``path``."""
        if not self.enabled or self.is_open(path):
            return
        try:
            key = self.keys.identify(presented)
        except Unauthenticated:
            self._on_refused(protocol, "unauthenticated")
            raise
        wanted = (role,) if isinstance(role, str) else role
        if key.roles.isdisjoint(wanted):
            self._on_refused(protocol, "forbidden")
            raise PermissionDenied(
                f"API key {key.name!r} has role(s) {', '.join(sorted(key.roles))}; {path} needs role "
                + " or ".join(repr(one) for one in wanted)
            )


def presented_key(authorization: str | None, api_key: str | None) -> str | None:
    """The key in an ``Authorization: Bearer`` value, else an ``X-API-Key`` value."""
    if authorization:
        scheme, _, value = authorization.strip().partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return api_key.strip() if api_key else None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
