"""Which of edgeinfer's modules run compiled, and which compiled ones are older than their source.

The build compiles the request path to native code with mypyc (setup.py). In a source checkout the
editable install puts each compiled module next to its source, and Python imports the compiled one
first: one built before its source last changed runs the old code, silently. ``stale`` finds those;
the tests refuse to run with any (tests/conftest.py) and the server warns (cli.py). ``make test`` and
``make install`` rebuild them when a compiled module's source changes.
"""

from __future__ import annotations

import importlib.machinery
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
# longest first: ".cpython-311-x86_64-linux-gnu.so" before ".so"
_SUFFIXES = sorted(importlib.machinery.EXTENSION_SUFFIXES, key=len, reverse=True)


def _pairs(root: Path) -> list[tuple[Path, Path]]:
    """(source, compiled module) for every compiled module under ``root`` built from a Python source
    (protocol/_jsonscan is C: no source beside it, not listed)."""
    pairs = []
    for path in root.rglob("*.so"):
        for suffix in _SUFFIXES:
            if path.name.endswith(suffix):
                source = path.with_name(path.name[: -len(suffix)] + ".py")
                if source.exists():
                    pairs.append((source, path))
                break
    return sorted(pairs)


def survey(root: Path = PACKAGE) -> tuple[list[str], list[str]]:
    """(the modules that run compiled, those of them whose source changed after they were built), as
    dotted names (``edgeinfer.service``), from one walk of the package."""
    pairs = _pairs(root)
    compiled = [_dotted(root, source) for source, _ in pairs]
    stale = [
        _dotted(root, source) for source, module in pairs if source.stat().st_mtime > module.stat().st_mtime
    ]
    return compiled, stale


def compiled(root: Path = PACKAGE) -> list[str]:
    """The modules that run compiled, as dotted names."""
    return survey(root)[0]


def stale(root: Path = PACKAGE) -> list[str]:
    """The compiled modules whose source changed after they were built, as dotted names."""
    return survey(root)[1]


def _dotted(root: Path, source: Path) -> str:
    return ".".join((root.name, *source.relative_to(root).with_suffix("").parts))
