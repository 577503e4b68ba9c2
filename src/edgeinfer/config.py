"""The server's configuration: frozen settings classes (``schema.py``) for what is server-wide, and
``Config``, the whole file (its models' settings: ``model_config.py``; reading it: ``config_file.py``).

Every key is declared once. Unknown keys and wrong types are start-up errors that name the key (and the
file).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Literal

from edgeinfer.model_config import (
    CanaryConfig,
    Frozen,
    ModelConfig,
    RouteVariant,
    ShadowConfig,
)
from edgeinfer.schema import Field, field_validator, model_validator

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


class TlsConfig(Frozen):
    """TLS on the HTTP, gRPC and metrics ports (the same ports: with ``tls`` set they speak TLS only)."""

    cert_file: str = Field(description="PEM certificate chain, the server's certificate first")
    key_file: str = Field(description="PEM private key of the certificate")
    ca_file: str | None = Field(None, description="PEM CA bundle that client certificates must chain to")
    client_auth: Literal["none", "optional", "require"] = "none"
    reload_interval_s: float = Field(
        10.0, ge=0, description="how often the files are checked for change (0: on SIGHUP only)"
    )

    @model_validator(mode="after")
    def _ca_for_client_auth(self) -> TlsConfig:
        if self.client_auth != "none" and self.ca_file is None:
            raise ValueError(
                f"client_auth: {self.client_auth} needs ca_file (the CA client certificates chain to)"
            )
        return self


class AuthConfig(Frozen):
    """API keys with roles. Auth is on when any key is configured (in ``keys_file`` or ``keys_env``)."""

    keys_file: str | None = Field(None, description="YAML file of keys: name, key or sha256, roles")
    keys_env: str = Field("EDGEINFER_API_KEYS", description="environment variable holding the same YAML")
    open_paths: tuple[str, ...] = Field(
        ("/v2/health/live", "/v2/health/ready"), description="routes that need no key (probes)"
    )
    allow_code_overrides: bool = Field(
        False, description="let admin load requests override model_class, python_path, model_path"
    )


class LimitsConfig(Frozen):
    """Hard limits on what one client may send or hold; each refusal is counted by name."""

    max_connections: int = Field(1024, ge=1, description="open HTTP connections per process")
    max_header_bytes: int = Field(64 * 1024, ge=1024, description="request line and headers")
    max_headers: int = Field(100, ge=1, description="header fields per request")
    header_timeout_s: float = Field(10.0, gt=0, description="from a request's first byte to its last header")
    body_timeout_s: float = Field(60.0, gt=0, description="from the last header to the body's last byte")
    keepalive_timeout_s: float = Field(60.0, gt=0, description="an idle connection is closed after this")
    max_tensor_elements: int = Field(64 * 1024 * 1024, ge=1, description="elements of all inputs together")
    max_rows: int = Field(4096, ge=1, description="rows (first dimension) of one request")
    max_json_depth: int = Field(
        32, ge=4, description="nesting of JSON objects and arrays outside tensor data"
    )
    max_bytes_element: int = Field(16 * 1024 * 1024, ge=1, description="bytes of one BYTES (string) element")
    max_grpc_streams: int = Field(
        1024, ge=1, description="concurrent gRPC calls (HTTP/2 streams) per process"
    )


class ServerConfig(Frozen):
    host: str = "0.0.0.0"
    http_port: int = Field(8080, ge=0, le=65535)
    grpc_port: int | None = Field(8081, ge=0, le=65535)
    metrics_port: int | None = Field(8082, ge=0, le=65535)
    workers: int | Literal["auto"] = Field(
        1, description="serving processes on the same ports; 0 or auto: one per available CPU"
    )
    max_request_size_mb: float = Field(64.0, gt=0)
    compress_min_bytes: int = Field(1024, ge=0, description="compress responses at least this large")
    idle_poll: bool = Field(
        True,
        description="after answering, poll the sockets a while (as long as requests keep coming back that "
        "fast, at most as long as the answers took) instead of sleeping: saves the CPU's wake per request",
    )
    shutdown_delay_s: float = Field(
        0.0,
        ge=0,
        description="after SIGTERM, answer readiness 503 but keep serving this long before draining",
    )
    tls: TlsConfig | None = Field(None, description="serve TLS (and check client certificates)")
    auth: AuthConfig = AuthConfig()
    limits: LimitsConfig = LimitsConfig()

    @field_validator("workers")
    @classmethod
    def _workers(cls, workers: int | str) -> int | str:
        if isinstance(workers, int) and workers < 0:
            raise ValueError("workers must be 0 or auto (one per CPU) or a positive number")
        return workers

    @property
    def worker_count(self) -> int:
        """``workers`` resolved: ``0``/``auto`` become the CPUs this process may use."""
        if self.workers == "auto" or self.workers == 0:
            return available_cpus()
        assert isinstance(self.workers, int)
        return self.workers

    @property
    def max_request_bytes(self) -> int:
        return int(self.max_request_size_mb * 1024 * 1024)


class LoggingConfig(Frozen):
    level: LogLevel = "INFO"
    format: Literal["auto", "json", "text"] = "auto"
    access_log: bool = True
    access_log_sample_rate: float = Field(1.0, ge=0, le=1, description="share of successes logged")

    @field_validator("level", mode="before")
    @classmethod
    def _upper(cls, level: Any) -> Any:
        return level.upper() if isinstance(level, str) else level


class TracingConfig(Frozen):
    """OpenTelemetry traces of inference requests (``tracing.py``, docs/observability.md); they need the
    ``edgeinfer[otel]`` extra. Where spans go is set by the standard ``OTEL_*`` environment variables."""

    enabled: bool = False
    sampling_ratio: float = Field(
        1.0,
        ge=0,
        le=1,
        description="share of new traces recorded (a traceparent decides for the traces it continues)",
    )


class RepositoryConfig(Frozen):
    poll_interval_s: float | None = Field(
        None, gt=0, description="look for new, changed and removed models this often; off when unset"
    )
    cache_dir: str = Field("~/.cache/edgeinfer", description="where remote models are copied")
    s3_endpoint_url: str | None = Field(None, description="for MinIO-style or local S3-compatible stores")

    @property
    def cache_path(self) -> Path:
        return Path(self.cache_dir).expanduser()


class ResidencyConfig(Frozen):
    """Limits on loaded models; when over, the least recently used ``lru``/``on_demand`` model is evicted.

    Memory is estimated as each version's model file size times ``memory_factor`` (ONNX Runtime's
    working memory is roughly proportional to the weights); it is predictable, unlike RSS growth, which
    other loads and requests disturb.
    """

    max_loaded_models: int | None = Field(None, ge=1)
    memory_budget_mb: float | None = Field(None, gt=0)
    memory_factor: float = Field(2.0, gt=0)


class Config(Frozen):
    model_store_path: str | None = None
    python_path: tuple[str, ...] = Field((), description="directories added to sys.path for Python models")
    repository: RepositoryConfig = RepositoryConfig()
    residency: ResidencyConfig = ResidencyConfig()
    models: dict[str, ModelConfig] = {}
    routes: dict[str, tuple[RouteVariant, ...]] = Field(
        default_factory=dict, description="weighted splits of a model name's traffic (docs/rollouts.md)"
    )
    shadows: dict[str, ShadowConfig] = Field(
        default_factory=dict,
        description="candidates that get a copy of a model's requests (docs/rollouts.md)",
    )
    canaries: dict[str, CanaryConfig] = Field(
        default_factory=dict, description="candidates rolled forward or back by health (docs/rollouts.md)"
    )
    server: ServerConfig = ServerConfig()
    logging: LoggingConfig = LoggingConfig()
    tracing: TracingConfig = TracingConfig()

    @field_validator("routes")
    @classmethod
    def _routes(cls, routes: dict[str, tuple[RouteVariant, ...]]) -> dict[str, tuple[RouteVariant, ...]]:
        for name, variants in routes.items():
            if not variants:
                raise ValueError(f"route {name!r} needs at least one variant")
        return routes

    @field_validator("models")
    @classmethod
    def _model_names(cls, models: dict[str, ModelConfig]) -> dict[str, ModelConfig]:
        for name in models:
            if not name or "/" in name:
                raise ValueError(f"model name {name!r} must be non-empty and contain no '/'")
            fallback = models[name].fallback
            if fallback is not None and fallback.model == name:
                raise ValueError(f"model {name!r} names itself as its fallback")
        return models


def available_cpus(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup v2 CPU quota (containers;
    ``cgroup``: where the process's cgroup files are)."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        count = os.cpu_count() or 1
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return count
    if quota == "max":
        return count
    return max(1, min(count, math.ceil(int(quota) / int(period))))
