"""The configuration: frozen settings classes (``schema.py``) loaded from YAML, with a few CLI overrides.

Every key is declared once, here. Unknown keys and wrong types are startup errors that name the key (and
the file); ``load_config`` turns the validation errors into one readable ``ConfigError``.

Relative paths in a config file are resolved against the directory of that file, so a config can be
moved together with its models and used from anywhere.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from edgeinfer.errors import ConfigError
from edgeinfer.schema import Field, Settings, ValidationError, field_validator, model_validator

GraphOptimizationLevel = Literal["disable", "basic", "extended", "all"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
ModelT = TypeVar("ModelT", bound=Settings)


class _Frozen(Settings):
    """Immutable, and an unknown key is an error (``schema.py``)."""


class OnnxRuntimeConfig(_Frozen):
    """``backend_config`` of an ONNX model: run by ONNX Runtime (``backend: onnxruntime``) or OpenVINO
    (``backend: openvino``); each reads its own keys and the thread count."""

    execution_providers: tuple[str, ...] = ("CPUExecutionProvider",)
    provider_options: dict[str, dict[str, str | int | float | bool]] = Field(
        default_factory=dict,
        description="ONNX Runtime: options per execution provider, e.g. TensorrtExecutionProvider: "
        "{trt_fp16_enable: true, trt_engine_cache_enable: true, trt_engine_cache_path: /var/cache/trt}",
    )
    intra_op_num_threads: int = Field(0, ge=0, description="0 lets the runtime choose")
    inter_op_num_threads: int = Field(0, ge=0, description="0 lets ONNX Runtime choose")
    graph_optimization_level: GraphOptimizationLevel = "all"
    device: str = Field("CPU", description="OpenVINO: the device that compiles the model (CPU, GPU, NPU)")
    performance_hint: Literal["LATENCY", "THROUGHPUT"] = Field("LATENCY", description="OpenVINO")
    precision: str | None = Field(
        None,
        description="OpenVINO: INFERENCE_PRECISION_HINT (unset: f32 on CPU, else the device's default)",
    )
    cache_dir: str | None = Field(None, description="OpenVINO: keep compiled models here for the next load")


class VersionPolicy(_Frozen):
    """Which version directories of a repository model are served.

    Written as ``{latest: N}``, ``all`` or ``{specific: [1, 3]}`` (Triton's three policies).
    """

    kind: Literal["latest", "all", "specific"] = "latest"
    latest: int = Field(1, ge=1)
    versions: tuple[int, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _short_forms(cls, data: Any) -> Any:
        if data == "all" or data == {"all": None} or data == {"all": {}}:
            return {"kind": "all"}
        if isinstance(data, dict) and set(data) == {"latest"}:
            return {"kind": "latest", "latest": data["latest"]}
        if isinstance(data, dict) and set(data) == {"specific"}:
            return {"kind": "specific", "versions": data["specific"]}
        if isinstance(data, dict) and (not data or "kind" in data):
            return data
        raise ValueError("write version_policy as {latest: N}, all, or {specific: [versions]}")

    def select(self, versions: list[int]) -> list[int]:
        if self.kind == "all":
            return sorted(versions)
        if self.kind == "latest":
            return sorted(versions)[-self.latest :]
        return sorted(set(self.versions) & set(versions))


class WarmupConfig(_Frozen):
    """How a version is exercised before it is marked ready."""

    enabled: bool = True
    batch_sizes: tuple[int, ...] | None = Field(None, description="default: 1 and max_batch_size")
    shapes: dict[str, tuple[int, ...]] = Field(
        default_factory=dict, description="per input, its dimensions after the batch one, for dynamic dims"
    )
    samples: tuple[str, ...] = Field((), description="V2 JSON request bodies to run, relative to the model")


class TensorConfig(_Frozen):
    """A declared tensor: a pipeline's inputs and outputs."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    source: str | None = Field(None, alias="from", description="outputs: the 'step.output' it comes from")


class PipelineStep(_Frozen):
    """One step: a model, and where each of its inputs comes from (a pipeline input or 'step.output')."""

    name: str
    model: str
    version: str | None = None
    inputs: dict[str, str]
    budget_ms: float | None = Field(
        None, gt=0, description="this step's share of the pipeline's latency: longer runs are counted"
    )


class SloConfig(_Frozen):
    """A latency objective: adaptive batching aims for it and admission control refuses what would miss it."""

    p99_ms: float | None = Field(None, gt=0)
    p95_ms: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _one_given(self) -> SloConfig:
        if self.p99_ms is None and self.p95_ms is None:
            raise ValueError("slo needs p99_ms or p95_ms")
        return self

    @property
    def target_s(self) -> float:
        """The time a request may take: the p99 objective if given (a p95 one otherwise)."""
        return (self.p99_ms if self.p99_ms is not None else self.p95_ms or 0.0) / 1000

    @property
    def quantile(self) -> float:
        """The share of requests ``target_s`` is for: 0.99 for a p99 objective, 0.95 for a p95 one."""
        return 0.99 if self.p99_ms is not None else 0.95


class FallbackConfig(_Frozen):
    """The degradation ladder: while the model's sliding-window p95 stays above ``enter_p95_ms`` for
    ``enter_after_s``, requests that name no version go to ``model``; they come back once it has stayed
    below ``exit_p95_ms`` for ``exit_after_s`` (two levels and two dwell times: no flapping)."""

    model: str = Field(min_length=1, description="the cheaper model that answers while this one is over")
    enter_p95_ms: float = Field(gt=0)
    exit_p95_ms: float = Field(gt=0)
    enter_after_s: float = Field(5.0, ge=0)
    exit_after_s: float = Field(30.0, ge=0)
    window_s: float = Field(5.0, gt=0, description="the p95 is over the requests of the last window_s")

    @model_validator(mode="after")
    def _exit_below_enter(self) -> FallbackConfig:
        if self.exit_p95_ms >= self.enter_p95_ms:
            raise ValueError(
                f"fallback: exit_p95_ms ({self.exit_p95_ms:g}) must be below enter_p95_ms "
                f"({self.enter_p95_ms:g}), or the ladder would switch back and forth"
            )
        return self


class PipelineConfig(_Frozen):
    inputs: tuple[TensorConfig, ...]
    outputs: tuple[TensorConfig, ...]
    steps: tuple[PipelineStep, ...]


class RouteVariant(_Frozen):
    """One share of a model name's traffic: a version of it, or another model (``model``)."""

    model: str | None = Field(None, description="another model's name; default: the routed model")
    version: str | None = Field(None, description="default: the highest ready version")
    weight: float = Field(gt=0, description="relative share; the weights of a route need not add to 100")

    @field_validator("version", mode="before")
    @classmethod
    def _version_text(cls, version: Any) -> Any:
        return str(version) if isinstance(version, int) and not isinstance(version, bool) else version


class ShadowConfig(_Frozen):
    """A candidate that gets a copy of a share of a model's requests (its answers are only compared)."""

    model: str | None = Field(None, description="another model's name; default: the shadowed model")
    version: str | None = Field(None, description="default: the highest ready version")
    share: float = Field(1.0, gt=0, le=1, description="the share of requests mirrored")

    @field_validator("version", mode="before")
    @classmethod
    def _version_text(cls, version: Any) -> Any:
        return str(version) if isinstance(version, int) and not isinstance(version, bool) else version


class CanaryConfig(_Frozen):
    """A candidate version that takes a growing share of a model's traffic while it stays healthy."""

    version: str = Field(description="the candidate version")
    stable: str | None = Field(None, description="default: the highest ready other version at start")
    steps: tuple[float, ...] = Field((5, 25, 50, 100), description="the candidate's share (%) step by step")
    interval_s: float = Field(60.0, gt=0, description="the least time at each step")
    min_requests: int = Field(200, ge=1, description="candidate requests a step needs before it advances")
    max_error_rate: float = Field(0.01, ge=0, le=1)
    max_p99_ms: float | None = Field(None, gt=0)
    max_disagreement: float | None = Field(
        None, ge=0, le=1, description="share of rows whose label differs from the stable's (shadowed)"
    )
    shadow_share: float = Field(1.0, gt=0, le=1, description="stable requests mirrored to the candidate")

    @field_validator("version", "stable", mode="before")
    @classmethod
    def _version_text(cls, version: Any) -> Any:
        return str(version) if isinstance(version, int) and not isinstance(version, bool) else version

    @field_validator("steps")
    @classmethod
    def _rising_steps(cls, steps: tuple[float, ...]) -> tuple[float, ...]:
        if not steps or any(not 0 < step <= 100 for step in steps) or list(steps) != sorted(set(steps)):
            raise ValueError("steps must be rising shares in (0, 100], e.g. [5, 25, 50, 100]")
        return steps


class ModelConfig(_Frozen):
    """One model: where it is, how it runs, and how its requests are batched and queued."""

    model_path: str | None = None
    sha256: str | None = Field(None, pattern=r"^[0-9a-fA-F]{64}$", description="checks an http(s) model_path")
    backend: Literal["onnxruntime", "openvino", "python", "pipeline"] = "onnxruntime"
    pipeline: PipelineConfig | None = None
    model_class: str | None = Field(None, description="python backend: 'package.module:ClassName'")
    parameters: dict[str, Any] = Field(default_factory=dict, description="python backend: constructor kwargs")
    version: str | None = None
    backend_config: OnnxRuntimeConfig = OnnxRuntimeConfig()
    version_policy: VersionPolicy = VersionPolicy()
    warmup: WarmupConfig = WarmupConfig()
    min_ep_coverage: float | None = Field(
        None,
        ge=0,
        le=1,
        description="ONNX models: the least share of nodes that must run on the first execution provider "
        "asked for, else the load fails naming the operators that fall back",
    )

    max_batch_size: int | None = Field(
        None, ge=0, description="rows per batch; 0 disables batching; unset: 8 if the model allows it"
    )
    batch_timeout_millis: float | None = Field(
        None, ge=0, description="fixed batching: longest wait of the oldest request; unset: adaptive batching"
    )
    slo: SloConfig | None = Field(None, description="latency objective: adaptive batching and admission")
    fallback: FallbackConfig | None = Field(None, description="a cheaper model to route to while over p95")
    preferred_batch_sizes: tuple[int, ...] = ()
    max_concurrent_batches: int = Field(1, ge=1)
    prefetch_batches: int | None = Field(
        None,
        ge=0,
        description="batches formed ahead, waiting in the runner for a compute slot; unset: 1 with adaptive "
        "batching (used while merging does not pay), 0 with a fixed batch timeout",
    )
    max_queue_size: int = Field(512, ge=1, description="queued requests (not rows) before 429")
    queue_timeout_millis: float | None = Field(None, gt=0)
    default_priority_level: int = Field(1, ge=1)
    residency: Literal["resident", "lru", "on_demand"] = Field(
        "resident", description="resident: always loaded; lru: may be evicted; on_demand: loaded on first use"
    )
    idle_unload_s: float | None = Field(None, gt=0, description="on_demand: unload after this long unused")
    inline_max_us: float | None = Field(
        None,
        ge=0,
        description="batches predicted faster than this run on the event loop; unset: than the measured "
        "hop to a worker thread; 0: never",
    )
    kind: Literal["thread", "process"] = Field(
        "thread", description="python backend: predict in worker threads or in child processes"
    )
    instances: int = Field(1, ge=1, description="kind: process: child processes, each with its own model")

    @model_validator(mode="before")
    @classmethod
    def _batch_timeout_aliases(cls, data: Any) -> Any:
        """Accept ``max_batch_time`` (seconds) and ``max_queue_delay_ms`` as other servers spell it."""
        if not isinstance(data, dict):
            return data
        given = [
            key for key in ("batch_timeout_millis", "max_batch_time", "max_queue_delay_ms") if key in data
        ]
        if len(given) > 1:
            raise ValueError(f"give only one of {', '.join(given)}: they set the same batch timeout")
        data = dict(data)
        if "max_batch_time" in data:
            seconds = data.pop("max_batch_time")
            data["batch_timeout_millis"] = seconds * 1000 if isinstance(seconds, (int, float)) else seconds
        if "max_queue_delay_ms" in data:
            data["batch_timeout_millis"] = data.pop("max_queue_delay_ms")
        return data

    @property
    def adaptive_batching(self) -> bool:
        """Batching from measurements (policy.py) unless a fixed batch timeout is given without an SLO."""
        return self.slo is not None or self.batch_timeout_millis is None

    @property
    def batches_ahead(self) -> int:
        """``prefetch_batches``, or its default: adaptive batching forms the next batch ahead whenever
        merging does not pay (``policy.forms_ahead``), so the model does not wait for the event loop
        between batches."""
        if self.prefetch_batches is not None:
            return self.prefetch_batches
        return 1 if self.adaptive_batching else 0

    @model_validator(mode="after")
    def _instances_need_processes(self) -> ModelConfig:
        if self.kind == "process" and self.backend != "python":
            raise ValueError("kind: process is for backend: python (ONNX Runtime already runs off the GIL)")
        if self.instances > 1 and self.kind != "process":
            raise ValueError(
                "instances > 1 needs kind: process; in threads, max_concurrent_batches sets how many "
                "batches run at once"
            )
        return self

    @field_validator("preferred_batch_sizes")
    @classmethod
    def _positive_sizes(cls, sizes: tuple[int, ...]) -> tuple[int, ...]:
        if any(size < 1 for size in sizes):
            raise ValueError("preferred batch sizes must be positive")
        return tuple(sorted(set(sizes)))

    @field_validator("version")
    @classmethod
    def _plain_version(cls, version: str | None) -> str | None:
        if version is not None and (not version or "/" in version):
            raise ValueError("a version must be a non-empty string without '/'")
        return version


class TlsConfig(_Frozen):
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


class AuthConfig(_Frozen):
    """API keys with roles. Auth is on when any key is configured (in ``keys_file`` or ``keys_env``)."""

    keys_file: str | None = Field(None, description="YAML file of keys: name, key or sha256, roles")
    keys_env: str = Field("EDGEINFER_API_KEYS", description="environment variable holding the same YAML")
    open_paths: tuple[str, ...] = Field(
        ("/v2/health/live", "/v2/health/ready"), description="routes that need no key (probes)"
    )
    allow_code_overrides: bool = Field(
        False, description="let admin load requests override model_class, python_path, model_path"
    )


class LimitsConfig(_Frozen):
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


class ServerConfig(_Frozen):
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


class LoggingConfig(_Frozen):
    level: LogLevel = "INFO"
    format: Literal["auto", "json", "text"] = "auto"
    access_log: bool = True
    access_log_sample_rate: float = Field(1.0, ge=0, le=1, description="share of successes logged")

    @field_validator("level", mode="before")
    @classmethod
    def _upper(cls, level: Any) -> Any:
        return level.upper() if isinstance(level, str) else level


class TracingConfig(_Frozen):
    """OpenTelemetry traces of inference requests (``tracing.py``, docs/observability.md); they need the
    ``edgeinfer[otel]`` extra. Where spans go is set by the standard ``OTEL_*`` environment variables."""

    enabled: bool = False
    sampling_ratio: float = Field(
        1.0,
        ge=0,
        le=1,
        description="share of new traces recorded (a traceparent decides for the traces it continues)",
    )


class RepositoryConfig(_Frozen):
    poll_interval_s: float | None = Field(
        None, gt=0, description="look for new, changed and removed models this often; off when unset"
    )
    cache_dir: str = Field("~/.cache/edgeinfer", description="where remote models are copied")
    s3_endpoint_url: str | None = Field(None, description="for MinIO-style or local S3-compatible stores")

    @property
    def cache_path(self) -> Path:
        return Path(self.cache_dir).expanduser()


class ResidencyConfig(_Frozen):
    """Limits on loaded models; when over, the least recently used ``lru``/``on_demand`` model is evicted.

    Memory is estimated as each version's model file size times ``memory_factor`` (ONNX Runtime's
    working memory is roughly proportional to the weights); it is predictable, unlike RSS growth, which
    other loads and requests disturb.
    """

    max_loaded_models: int | None = Field(None, ge=1)
    memory_budget_mb: float | None = Field(None, gt=0)
    memory_factor: float = Field(2.0, gt=0)


class Config(_Frozen):
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


def split_model_class(target: str) -> tuple[str, str] | None:
    """``package.module:ClassName`` as (module, class name); None for anything of another form."""
    module, _, class_name = target.partition(":")
    return (module, class_name) if module and class_name else None


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


def load_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> Config:
    """Read, override, validate and resolve a configuration. Raises ConfigError, never a traceback.

    ``overrides`` maps dotted keys (``server.http_port``) to values that replace the file's.
    """
    raw: dict[str, Any] = {}
    base_dir = Path.cwd()
    source = "command line"
    if path is not None:
        path = Path(path)
        source = str(path)
        raw = read_yaml_mapping(path)
        base_dir = path.resolve().parent
    for dotted, value in (overrides or {}).items():
        _set_dotted(raw, dotted, value)
    config = parse(Config, raw, source)
    return _resolve_paths(config, base_dir, source)


def parse_model_config(raw: dict[str, Any], source: str) -> ModelConfig:
    """Validate a per-model ``config.yaml`` of a model repository."""
    for key in ("model_path", "version"):
        if key in raw:
            raise ConfigError(
                f"{source}: '{key}' has no place in a repository model's config.yaml; "
                "the model file is <model>/<version>/model.onnx"
            )
    return parse(ModelConfig, raw, source)


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys, not {type(raw).__name__}")
    return raw


def parse(model: type[ModelT], raw: dict[str, Any], source: str) -> ModelT:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, source)) from None


def describe_validation_error(exc: ValidationError, source: str) -> str:
    """One line per problem: the dotted key, then what is wrong with it."""
    lines = [f"{source}: invalid configuration"]
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"]) or "(top level)"
        if error["type"] == "extra_forbidden":
            lines.append(f"  {key}: unknown key")
        elif error["type"] == "missing":
            lines.append(f"  {key}: required key is missing")
        else:
            message = error["msg"].removeprefix("Value error, ")
            lines.append(f"  {key}: {message} (got {error.get('input')!r})")
    return "\n".join(lines)


def _set_dotted(raw: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = raw
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[leaf] = value


def _resolve_paths(config: Config, base_dir: Path, source: str) -> Config:
    models = {}
    for name, model in config.models.items():
        if model.warmup.samples:  # sample request files are relative to the config file too
            samples = tuple(str((base_dir / sample).resolve()) for sample in model.warmup.samples)
            model = model.model_copy(update={"warmup": model.warmup.model_copy(update={"samples": samples})})
        if model.backend == "python":
            if not model.model_class:
                raise ConfigError(f"{source}: models.{name}.model_class: required for backend: python")
            if split_model_class(model.model_class) is None:
                raise ConfigError(
                    f"{source}: models.{name}.model_class: {model.model_class!r} must look like "
                    "'package.module:ClassName'"
                )
            models[name] = model
            continue
        if model.backend == "pipeline":
            if model.pipeline is None:
                raise ConfigError(f"{source}: models.{name}.pipeline: required for backend: pipeline")
            models[name] = model
            continue
        if model.model_path is None:
            raise ConfigError(f"{source}: models.{name}.model_path: required key is missing")
        if model.model_path.startswith(("http://", "https://")):
            models[name] = model  # fetched (and checked against sha256) when it is loaded
            continue
        if "://" in model.model_path:
            raise ConfigError(
                f"{source}: models.{name}.model_path: only local paths and http(s):// URLs are supported"
            )
        path = (base_dir / model.model_path).resolve()
        if not path.is_file():
            raise ConfigError(f"{source}: models.{name}.model_path: model file {path} does not exist")
        models[name] = model.model_copy(update={"model_path": str(path)})
    store = config.model_store_path
    if store is not None and "://" in store:
        if not store.startswith("s3://"):
            raise ConfigError(f"{source}: model_store_path: remote repositories must be s3:// URLs")
    elif store is not None:
        resolved = (base_dir / store).resolve()
        if not resolved.is_dir():
            raise ConfigError(f"{source}: model_store_path: directory {resolved} does not exist")
        store = str(resolved)
    python_path = tuple(str((base_dir / folder).resolve()) for folder in config.python_path)
    server = _resolve_server_paths(config.server, base_dir)
    return config.model_copy(
        update={"models": models, "model_store_path": store, "python_path": python_path, "server": server}
    )


def _resolve_server_paths(server: ServerConfig, base_dir: Path) -> ServerConfig:
    """Certificate, key, CA and API key files relative to the config file, as model paths are."""
    update: dict[str, Any] = {}
    if server.tls is not None:
        files = {
            key: str((base_dir / value).resolve())
            for key in ("cert_file", "key_file", "ca_file")
            if (value := getattr(server.tls, key)) is not None
        }
        update["tls"] = server.tls.model_copy(update=files)
    if server.auth.keys_file is not None:
        keys_file = str((base_dir / server.auth.keys_file).resolve())
        update["auth"] = server.auth.model_copy(update={"keys_file": keys_file})
    return server.model_copy(update=update) if update else server
