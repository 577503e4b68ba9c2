"""Finding model versions: a Triton/KServe-style directory plus the ``models:`` entries of the config.

Repository layout::

    REPO/<model>/config.yaml          optional, the per-model keys of the config file
    REPO/<model>/<version>/model.onnx one directory per version; versions are integers
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeinfer.config import Config, ModelConfig, parse, parse_model_config, read_yaml_mapping
from edgeinfer.errors import ConfigError, ModelNotFound

log = logging.getLogger(__name__)

MODEL_FILENAME = "model.onnx"
DEFAULT_VERSION = "1"


@dataclass(frozen=True, slots=True)
class ModelSource:
    """One version of one model, ready to be loaded."""

    name: str
    version: str
    path: str  # a local file, or an http(s) URL fetched into cache_dir when loaded
    config: ModelConfig
    cache_dir: str = ""
    instance: Any = None  # a Python model object given to Server.register, served as it is


def discover(config: Config) -> list[ModelSource]:
    """Every model version the configuration names; a name+version given twice is an error."""
    sources: list[ModelSource] = []
    if config.model_store_path is not None:
        sources.extend(scan_repository(Path(config.model_store_path)))
    for name, model in config.models.items():
        cache = str(config.repository.cache_path)
        path = model.model_path or ""  # python models have none
        sources.append(ModelSource(name, model.version or DEFAULT_VERSION, path, model, cache))
    seen: dict[tuple[str, str], str] = {}
    for source in sources:
        key = (source.name, source.version)
        if key in seen:
            raise ConfigError(
                f"model {source.name!r} version {source.version} is defined twice: "
                f"{seen[key]} and {source.path}"
            )
        seen[key] = source.path
    return sources


def scan_repository(root: Path) -> list[ModelSource]:
    sources = []
    for model_dir in sorted(
        path for path in root.iterdir() if path.is_dir() and not path.name.startswith(".")
    ):
        sources.extend(scan_model_dir(model_dir))
    return sources


def scan_model_dir(model_dir: Path, override: dict[str, Any] | None = None) -> list[ModelSource]:
    """The versions in one model directory; ``override`` replaces keys of its config.yaml."""
    config_file = model_dir / "config.yaml"
    raw = read_yaml_mapping(config_file) if config_file.is_file() else {}
    model_config = parse_model_config({**raw, **(override or {})}, str(config_file))
    found = {}
    for version_dir in sorted(model_dir.iterdir()):
        if not version_dir.is_dir():
            continue
        if not version_dir.name.isdigit():
            log.warning("ignoring %s: version directories must be integers", version_dir)
            continue
        found[int(version_dir.name)] = version_dir
    if not found:
        raise ConfigError(
            f"model directory {model_dir} has no version directories (<version>/{MODEL_FILENAME})"
        )
    policy = model_config.version_policy
    chosen = policy.select(list(found))
    if policy.kind == "specific" and len(chosen) != len(set(policy.versions)):
        missing = sorted(set(policy.versions) - set(found))
        raise ConfigError(
            f"model {model_dir.name!r}: version_policy names versions {missing} that do not exist"
        )
    versions = []
    for number in chosen:
        model_file = found[number] / MODEL_FILENAME
        if not model_file.is_file():
            raise ConfigError(f"model {model_dir.name!r} version {number}: {model_file} is missing")
        config = _with_model_dir(model_config, model_dir)
        versions.append(ModelSource(model_dir.name, str(number), str(model_file), config))
    return versions


def _with_model_dir(config: ModelConfig, model_dir: Path) -> ModelConfig:
    """Warmup sample paths in a repository model's config.yaml are relative to the model directory."""
    samples = config.warmup.samples
    if not samples:
        return config
    resolved = tuple(str((model_dir / sample).resolve()) for sample in samples)
    return config.model_copy(update={"warmup": config.warmup.model_copy(update={"samples": resolved})})


def discover_model(config: Config, name: str, override: dict[str, Any] | None = None) -> list[ModelSource]:
    """The versions of one model as the configuration and repository say now (for load requests)."""
    if override and ("model_path" in override or "version" in override):
        raise ConfigError("a load request may override batching and backend keys, not model_path or version")
    entry = config.models.get(name)
    if entry is not None:
        path = entry.model_path or ""
        if override:
            merged = {**entry.model_dump(exclude_unset=True), **override}
            entry = parse(ModelConfig, merged, f"load override for {name!r}")
        return [
            ModelSource(
                name, entry.version or DEFAULT_VERSION, path, entry, str(config.repository.cache_path)
            )
        ]
    if config.model_store_path is not None:
        model_dir = Path(config.model_store_path) / name
        if model_dir.is_dir() and "/" not in name and not name.startswith("."):
            return scan_model_dir(model_dir, override)
    raise ModelNotFound(f"no model named {name!r} in the repository or the configuration")
