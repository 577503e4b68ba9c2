"""docs/architecture.md names every module of the package, and every module it names exists: the map
of the code a newcomer reads first keeps up with the code."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
PACKAGE = ROOT / "src" / "edgeinfer"
DOC = (ROOT / "docs" / "architecture.md").read_text()


def modules() -> list[Path]:
    return [
        path
        for path in sorted(PACKAGE.rglob("*.py"))
        if "grpc_gen" not in path.parts and path.name not in ("__init__.py", "__main__.py")
    ]


def test_every_module_is_on_the_map():
    missing = [str(path.relative_to(PACKAGE)) for path in modules() if path.stem not in DOC]
    assert not missing, f"docs/architecture.md does not name: {', '.join(missing)}"


def test_every_module_path_the_map_names_exists():
    named = set(re.findall(r"`([a-z_/]+\.py)`", DOC))
    names = {path.name for path in modules()}
    gone = [
        name
        for name in named
        if not ((PACKAGE / name).exists() or (ROOT / name).exists() or ("/" not in name and name in names))
    ]
    assert not gone, f"docs/architecture.md names modules that are not there: {', '.join(sorted(gone))}"
