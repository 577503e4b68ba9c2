"""The optional extras (``[project.optional-dependencies]`` in pyproject.toml) and the one message a
missing one gives.

Every feature that needs an extra imports it through ``need`` (or turns the ImportError it met into
``missing``): where the package is not installed, the user reads one line naming the feature and the
command that installs it, never a traceback. The CLI then exits 2; a server exits 2 for a feature of
its configuration (s3, tracing) and fails the one model's load for a model's (a backend, a Python
model's import).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from edgeinfer.errors import ConfigError

# a module (or the package it is in) -> (the package that provides it, the extra that installs it); the
# longest name that a missing module starts with decides
EXTRAS: dict[str, tuple[str, str]] = {
    "onnx": ("onnx", "tools"),
    "s3fs": ("s3fs", "s3"),
    "opentelemetry": ("opentelemetry-sdk", "otel"),
    "opentelemetry.exporter": ("opentelemetry-exporter-otlp", "otel"),
    "openvino": ("openvino", "openvino"),
    "PIL": ("pillow", "examples"),
}


class MissingExtra(ConfigError):
    """A feature was asked for whose optional package is not installed; the message says which and
    how to install it."""


def need(module: str, feature: str) -> ModuleType:
    """``module`` imported, or MissingExtra naming ``feature`` (``"edgeinfer optimize --int8"``) and
    the install command when it, or a package it needs, is one of the extras' and is not installed. An
    extra that is installed but does not import (a version that lacks a name, a broken dependency) is
    a ConfigError with Python's own message."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        absent = missing(error, feature)
        if absent is not None:
            raise absent from None
        raise ConfigError(f"{feature} needs {module}, which does not import: {error}") from None


def missing(error: ImportError, feature: str) -> MissingExtra | None:
    """The MissingExtra for a module that is not installed (ModuleNotFoundError) and that an extra
    provides; None for anything else (a module of the user's, an installed package that fails to
    import), which the caller reports as it is."""
    if not isinstance(error, ModuleNotFoundError):
        return None
    name = error.name or ""
    known = [prefix for prefix in EXTRAS if name == prefix or name.startswith(prefix + ".")]
    if not known:
        return None
    package, extra = EXTRAS[max(known, key=len)]
    return MissingExtra(
        f"{feature} needs the optional package {package}, which is not installed: "
        f"pip install 'edgeinfer[{extra}]'"
    )
