"""In CI (``CI=true``) a skipped test fails (tests/conftest.py), except one marked ``gpu``: a suite that
passes by skipping would hide a machine without what it needs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT

TESTS = """
import pytest

def test_skipped():
    pytest.skip("no such tool")

@pytest.mark.gpu
def test_needs_a_gpu():
    pytest.skip("no GPU")

def test_passes():
    pass
"""


def run(tmp_path: Path, ci: str, source: str = TESTS) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_sample.py").write_text(source)
    env = {**os.environ, "CI": ci}
    command = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-q", "-p", "no:cacheprovider"]
    command += ["--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "test_sample.py")]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)


def test_in_ci_a_skip_fails_but_a_gpu_test_may_skip(tmp_path: Path):
    result = run(tmp_path, "true")
    assert result.returncode == 1, result.stdout
    assert "1 failed, 1 passed, 1 skipped" in result.stdout
    assert (
        "skipped in CI, which runs every test (make system-packages): Skipped: no such tool" in result.stdout
    )


@pytest.mark.parametrize("ci", ["", "false"])
def test_outside_ci_a_skip_is_a_skip(tmp_path: Path, ci: str):
    result = run(tmp_path, ci)
    assert result.returncode == 0, result.stdout
    assert "1 passed, 2 skipped" in result.stdout


def test_in_ci_a_module_skipped_whole_fails(tmp_path: Path):
    result = run(
        tmp_path, "true", "import pytest\npytest.importorskip('no_such_module')\n\ndef test_x():\n    pass\n"
    )
    assert result.returncode != 0, result.stdout
    assert "skipped in CI" in result.stdout
