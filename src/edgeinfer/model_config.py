"""The settings of one model (its ``models:`` entry, or a repository directory's config), and of the
rollouts that name models (routes, shadows, canaries): frozen settings classes (``schema.py``), every
key declared once."""

from __future__ import annotations

import logging
from typing import Any, Literal

from edgeinfer.schema import Field, Settings, field_validator, model_validator

GraphOptimizationLevel = Literal["disable", "basic", "extended", "all"]
# keys renamed to the ``_ms`` / ``_s`` unit suffixes: the old spelling still works, with a log line
DEPRECATED_KEYS = {"batch_timeout_millis": "batch_timeout_ms", "queue_timeout_millis": "queue_timeout_ms"}
_BATCH_TIMEOUT_KEYS = ("batch_timeout_ms", "batch_timeout_millis", "max_batch_time", "max_queue_delay_ms")
log = logging.getLogger(__name__)


def _deprecated(old: str, new: str) -> None:
    """Each time a config naming ``old`` is read (at start-up, on a load request)."""
    log.warning("config key %s is deprecated: it is now %s (the old name still works)", old, new)


class Frozen(Settings):
    """Immutable, and an unknown key is an error (``schema.py``)."""


class OnnxRuntimeConfig(Frozen):
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


class VersionPolicy(Frozen):
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


class WarmupConfig(Frozen):
    """How a version is exercised before it is marked ready."""

    enabled: bool = True
    batch_sizes: tuple[int, ...] | None = Field(None, description="default: 1 and max_batch_size")
    shapes: dict[str, tuple[int, ...]] = Field(
        default_factory=dict, description="per input, its dimensions after the batch one, for dynamic dims"
    )
    samples: tuple[str, ...] = Field((), description="V2 JSON request bodies to run, relative to the model")


class TensorConfig(Frozen):
    """A declared tensor: a pipeline's inputs and outputs."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    source: str | None = Field(None, alias="from", description="outputs: the 'step.output' it comes from")


class PipelineStep(Frozen):
    """One step: a model, and where each of its inputs comes from (a pipeline input or 'step.output')."""

    name: str
    model: str
    version: str | None = None
    inputs: dict[str, str]
    budget_ms: float | None = Field(
        None, gt=0, description="this step's share of the pipeline's latency: longer runs are counted"
    )


class SloConfig(Frozen):
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


class FallbackConfig(Frozen):
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


class PipelineConfig(Frozen):
    inputs: tuple[TensorConfig, ...]
    outputs: tuple[TensorConfig, ...]
    steps: tuple[PipelineStep, ...]


class RouteVariant(Frozen):
    """One share of a model name's traffic: a version of it, or another model (``model``)."""

    model: str | None = Field(None, description="another model's name; default: the routed model")
    version: str | None = Field(None, description="default: the highest ready version")
    weight: float = Field(gt=0, description="relative share; the weights of a route need not add to 100")

    @field_validator("version", mode="before")
    @classmethod
    def _version_text(cls, version: Any) -> Any:
        return str(version) if isinstance(version, int) and not isinstance(version, bool) else version


class ShadowConfig(Frozen):
    """A candidate that gets a copy of a share of a model's requests (its answers are only compared)."""

    model: str | None = Field(None, description="another model's name; default: the shadowed model")
    version: str | None = Field(None, description="default: the highest ready version")
    share: float = Field(1.0, gt=0, le=1, description="the share of requests mirrored")

    @field_validator("version", mode="before")
    @classmethod
    def _version_text(cls, version: Any) -> Any:
        return str(version) if isinstance(version, int) and not isinstance(version, bool) else version


class CanaryConfig(Frozen):
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


class ModelConfig(Frozen):
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
    batch_timeout_ms: float | None = Field(
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
    queue_timeout_ms: float | None = Field(None, gt=0)
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
        """Accept ``max_batch_time`` (seconds) and ``max_queue_delay_ms`` as other servers spell it, and
        the older ``*_millis`` spellings (with a deprecation line in the log)."""
        if not isinstance(data, dict):
            return data
        given = [key for key in _BATCH_TIMEOUT_KEYS if key in data]
        if len(given) > 1:
            raise ValueError(f"give only one of {', '.join(given)}: they set the same batch timeout")
        data = dict(data)
        for old, new in DEPRECATED_KEYS.items():
            if old in data:
                if new in data:
                    raise ValueError(f"give only one of {old}, {new}: {old} is the old name of {new}")
                _deprecated(old, new)
                data[new] = data.pop(old)
        if "max_batch_time" in data:
            seconds = data.pop("max_batch_time")
            data["batch_timeout_ms"] = seconds * 1000 if isinstance(seconds, (int, float)) else seconds
        if "max_queue_delay_ms" in data:
            data["batch_timeout_ms"] = data.pop("max_queue_delay_ms")
        return data

    @property
    def adaptive_batching(self) -> bool:
        """Batching from measurements (policy.py) unless a fixed batch timeout is given without an SLO."""
        return self.slo is not None or self.batch_timeout_ms is None

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
