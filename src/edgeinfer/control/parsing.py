"""The documents the admin routes take, checked as the config file's would be: their errors are the
client's (``InvalidInput``), raised before any worker sees them."""

from __future__ import annotations

from typing import Any

import yaml

from edgeinfer.config import Config
from edgeinfer.config_file import parse
from edgeinfer.errors import ConfigError, InvalidInput
from edgeinfer.model_config import RouteVariant, ShadowConfig


def parse_route(name: str, variants: Any) -> tuple[RouteVariant, ...] | None:
    """The variants of a route set at run time (the config's ``routes.<name>`` layout)."""
    if variants is None or variants == []:
        return None
    if not isinstance(variants, list):
        raise InvalidInput("'variants' must be a list of {version or model, weight}")
    return _config_entry("routes", name, variants).routes[name]


def parse_shadow(name: str, config: Any) -> ShadowConfig | None:
    """A shadow set at run time (the config's ``shadows.<name>`` layout)."""
    return None if config is None else _config_entry("shadows", name, config).shadows[name]


def _config_entry(key: str, name: str, value: Any) -> Config:
    """``value`` checked as the config's ``<key>.<name>`` would be."""
    try:
        return parse(Config, {key: {name: value}}, key)
    except ConfigError as error:
        raise InvalidInput(str(error)) from None


def parse_override(text: Any) -> dict[str, Any] | None:
    """The ``config`` parameter of a load request: per-model keys as JSON (Triton's clients) or YAML."""
    if text is None or text == "":
        return None
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        raise InvalidInput("the 'config' parameter of a load request must be a JSON object in a string")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidInput(f"the 'config' parameter is not valid JSON or YAML: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidInput("the 'config' parameter must be a mapping of model keys")
    return value
