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

# the top-level module -> (the package that provides it, the extra that installs it)
EXTRAS: dict[str, tuple[str, str]] = {
    "onnx": ("onnx", "tools"),
    "s3fs": ("s3fs", "s3"),
    "opentelemetry": ("opentelemetry-sdk", "otel"),
    "openvino": ("openvino", "openvino"),
    "PIL": ("pillow", "examples"),
}


class MissingExtra(ConfigError):
    """A feature was asked for whose optional package is not installed; the message says which and
    how to install it."""


def need(module: str, feature: str) -> ModuleType:
    """``module`` imported, or MissingExtra naming ``feature`` (``"edgeinfer optimize --int8"``) and
    the install command when it, or a package it needs, is one of the extras' and is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise missing(error, feature) or error from None


def missing(error: ImportError, feature: str) -> MissingExtra | None:
    """The MissingExtra for an ImportError whose missing module an extra provides; None for any other
    (a module of the user's, a broken install), which the caller reports as it is."""
    name = getattr(error, "name", None) or ""
    known = EXTRAS.get(name.partition(".")[0])
    if known is None:
        return None
    package, extra = known
    return MissingExtra(
        f"{feature} needs the optional package {package}, which is not installed: "
        f"pip install 'edgeinfer[{extra}]'"
    )
