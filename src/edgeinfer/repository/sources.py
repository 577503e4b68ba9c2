"""Finding model versions: a Triton/KServe-style directory plus the ``models:`` entries of the config.

Repository layout::

    REPO/<model>/config.yaml          optional, the per-model keys of the config file
    REPO/<model>/<version>/model.onnx one directory per version; versions are integers

A model's ``version_policy`` chooses which versions load. A version being rolled out (a canary's
candidate, ``held``) loads besides them, and the policy chooses among the others: with ``latest: 1``
the stable version keeps serving next to the candidate until the candidate is promoted; then the
policy applies to all versions again and retires the stable one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeinfer.config import Config
from edgeinfer.config_file import parse, parse_model_config, read_yaml_mapping
from edgeinfer.errors import ConfigError, InvalidInput, ModelNotFound, PermissionDenied
from edgeinfer.model_config import ModelConfig

log = logging.getLogger(__name__)

MODEL_FILENAME = "model.onnx"
DEFAULT_VERSION = "1"
# Keys that choose what code runs or which file loads: a load request may not override them unless
# server.auth.allow_code_overrides says so (then only admin keys can send load requests anyway).
CODE_KEYS = ("model_class", "model_path", "python_path")


@dataclass(frozen=True, slots=True)
class ModelSource:
    """One version of one model, ready to be loaded."""

    name: str
    version: str
    path: str  # a local file, or an http(s) URL fetched into cache_dir when loaded
    config: ModelConfig
    cache_dir: str = ""
    instance: Any = None  # a Python model object given to Server.register, served as it is


def discover(config: Config, held: Mapping[str, str] | None = None) -> list[ModelSource]:
    """Every model version the configuration names; a name+version given twice is an error.
    ``held``: per model, a version that loads whatever the version policy says (a canary's)."""
    sources: list[ModelSource] = []
    if config.model_store_path is not None:
        sources.extend(scan_repository(Path(config.model_store_path), held or {}))
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


def scan_repository(root: Path, held: Mapping[str, str]) -> list[ModelSource]:
    sources = []
    for model_dir in sorted(
        path for path in root.iterdir() if path.is_dir() and not path.name.startswith(".")
    ):
        sources.extend(scan_model_dir(model_dir, root, held=held.get(model_dir.name)))
    return sources


def _inside(path: Path, root: Path, what: str) -> None:
    """Nothing the repository serves may resolve (through ``..`` or symlinks) outside its root."""
    resolved, top = path.resolve(), root.resolve()
    if not resolved.is_relative_to(top):
        raise ConfigError(
            f"{what} {path} resolves to {resolved}, outside the model repository {top}; files outside "
            "it are not served (name such a model under models: in the config instead)"
        )


def scan_model_dir(
    model_dir: Path, root: Path, override: dict[str, Any] | None = None, held: str | None = None
) -> list[ModelSource]:
    """The versions in one model directory; ``override`` replaces keys of its config.yaml; ``held``: a
    version that loads besides what the version policy chooses among the others."""
    _inside(model_dir, root, "model directory")
    config_file = model_dir / "config.yaml"
    if config_file.exists():
        _inside(config_file, root, "model config")
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
    if held is not None and held.isdigit() and int(held) in found:
        others = [number for number in found if number != int(held)]
        chosen = sorted({*policy.select(others), int(held)})
    versions = []
    for number in chosen:
        model_file = found[number] / MODEL_FILENAME
        if not model_file.is_file():
            raise ConfigError(f"model {model_dir.name!r} version {number}: {model_file} is missing")
        _inside(model_file, root, "model file")
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


def discover_model(
    config: Config, name: str, override: dict[str, Any] | None = None, held: str | None = None
) -> list[ModelSource]:
    """The versions of one model as the configuration and repository say now (for load requests);
    ``held`` as for ``scan_model_dir``.

    The name comes from a client: it must name a directory right under the repository root (no ``/``,
    no leading ``.``, nothing resolving outside). An override may not touch ``CODE_KEYS`` unless the
    server allows it.
    """
    _check_override(config, override)
    entry = config.models.get(name)
    if entry is not None:
        path = entry.model_path or ""
        if override and "model_path" in override:  # allowed by _check_override
            path = str(Path(str(override["model_path"])).resolve())
        if override:
            merged = {**entry.model_dump(exclude_unset=True), **override}
            entry = parse(ModelConfig, merged, f"load override for {name!r}")
        return [
            ModelSource(
                name, entry.version or DEFAULT_VERSION, path, entry, str(config.repository.cache_path)
            )
        ]
    if any(char in name for char in "/\\\x00") or name.startswith(".") or not name:
        raise InvalidInput(
            f"{name!r} is not a model name: no '/', '\\' or leading '.' (they would leave the repository)"
        )
    if config.model_store_path is not None:
        root = Path(config.model_store_path)
        model_dir = root / name
        if model_dir.is_dir():
            return scan_model_dir(model_dir, root, override, held)
    raise ModelNotFound(f"no model named {name!r} in the repository or the configuration")


def _check_override(config: Config, override: dict[str, Any] | None) -> None:
    if not override:
        return
    if "version" in override:
        raise ConfigError("a load request may override batching and backend keys, not version")
    code = [key for key in CODE_KEYS if key in override]
    if code and not config.server.auth.allow_code_overrides:
        raise PermissionDenied(
            f"a load request may not override {', '.join(code)}: they choose the code or files that run; "
            "set server.auth.allow_code_overrides: true to let admin keys do it"
        )
