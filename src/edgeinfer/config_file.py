"""Reading the configuration: a YAML file and a few CLI overrides, validated (``ConfigError`` naming
the key and the file, never a traceback), relative paths resolved against the file's directory (a
config moves together with its models)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml

from edgeinfer.config import Config, ServerConfig
from edgeinfer.errors import ConfigError
from edgeinfer.model_config import ModelConfig
from edgeinfer.schema import Settings, ValidationError

ModelT = TypeVar("ModelT", bound=Settings)


def split_model_class(target: str) -> tuple[str, str] | None:
    """``package.module:ClassName`` as (module, class name); None for anything of another form."""
    module, _, class_name = target.partition(":")
    return (module, class_name) if module and class_name else None


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
