"""Which modules run compiled, and which compiled ones are older than their source (edgeinfer/native.py)."""

from __future__ import annotations

import ast
import importlib.machinery
import os
import shutil
import sysconfig
from pathlib import Path

import pytest

from edgeinfer import native

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def package(root: Path) -> Path:
    """A package with a compiled module built after its source, one built before, one without a
    source (a C extension) and one source never compiled."""
    pkg = root / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "fresh.py": 100,
        f"fresh{SUFFIX}": 200,
        "sub/old.py": 300,
        f"sub/old{SUFFIX}": 200,
        f"_c_only{SUFFIX}": 100,
        "plain.py": 100,
    }
    for name, mtime in files.items():
        path = pkg / name
        path.write_bytes(b"")
        os.utime(path, (mtime, mtime))
    return pkg


def test_compiled_modules_are_named_and_those_older_than_their_source_are_stale(tmp_path: Path):
    pkg = package(tmp_path)
    assert native.compiled(pkg) == ["pkg.fresh", "pkg.sub.old"]
    assert native.stale(pkg) == ["pkg.sub.old"]
    os.utime(pkg / f"sub/old{SUFFIX}", (400, 400))  # built again
    assert native.stale(pkg) == []


def test_every_module_setup_py_lists_is_built_where_there_is_a_compiler():
    """setup.py's compiled modules are optional extensions (no compiler: Python): a broken build would
    otherwise go unnoticed, and a module listed there but failing to compile would run slower."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler here: the compiled modules are optional")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        pytest.skip("no Python headers here: the compiled modules are optional")
    if os.environ.get("EDGEINFER_COMPILE") == "0":
        pytest.skip("built with EDGEINFER_COMPILE=0")
    setup = ast.parse((Path(__file__).parents[2] / "setup.py").read_text())
    [listed] = [
        ast.literal_eval(node.value)
        for node in setup.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "COMPILED"
    ]
    assert native.compiled() == sorted(path.removesuffix(".py").replace("/", ".") for path in listed)
