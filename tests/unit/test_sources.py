"""``discover``, ``discover_model`` and ``scan_model_dir``: which model versions a repository directory
and the config's ``models:`` name, and what a load request may ask for. Held (canary) versions and the
policies' own selection are tests/unit/test_config.py's."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest

from edgeinfer.config import Config
from edgeinfer.config_file import parse
from edgeinfer.errors import ConfigError, InvalidInput, ModelNotFound, PermissionDenied
from edgeinfer.repository.sources import discover, discover_model, scan_model_dir
from tests.support import matmul_model


def repository(root: Path, models: dict[str, tuple[int, ...]], config: dict[str, str] | None = None) -> Path:
    """``root/<model>/<version>/model.onnx`` for each model's versions, and its config.yaml if given."""
    for name, versions in models.items():
        for version in versions:
            matmul_model(root / name / str(version) / "model.onnx", seed=version)
        if config and name in config:
            (root / name / "config.yaml").write_text(config[name])
    return root


def settings(**raw: Any) -> Config:
    return parse(Config, raw, "test")


def found(sources: list[Any]) -> list[tuple[str, str]]:
    return [(source.name, source.version) for source in sources]


def test_versions_come_from_integer_directories_and_the_latest_loads_by_default(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    root = repository(tmp_path, {"m": (2, 10, 9)})
    (root / "m" / "notes").mkdir()
    (root / "m" / "README.txt").write_text("not a version")
    with caplog.at_level(logging.WARNING, logger="edgeinfer.repository.sources"):
        [latest] = scan_model_dir(root / "m", root)
    assert (latest.name, latest.version) == ("m", "10"), "10 is numerically the latest, not 9"
    assert latest.path == str(root / "m" / "10" / "model.onnx")
    assert any("notes" in record.getMessage() for record in caplog.records), "a named directory is logged"


@pytest.mark.parametrize(
    ("policy", "versions"),
    [("{latest: 2}", ["9", "10"]), ("all", ["2", "9", "10"]), ("{specific: [2, 9]}", ["2", "9"])],
)
def test_a_version_policy_in_config_yaml_chooses_the_versions_that_load(
    tmp_path: Path, policy: str, versions: list[str]
):
    root = repository(tmp_path, {"m": (2, 9, 10)}, {"m": f"version_policy: {policy}\n"})
    assert [source.version for source in scan_model_dir(root / "m", root)] == versions


def test_a_specific_policy_naming_absent_versions_is_refused_naming_them(tmp_path: Path):
    root = repository(tmp_path, {"m": (1,)}, {"m": "version_policy: {specific: [1, 4, 5]}\n"})
    with pytest.raises(ConfigError, match=r"names versions \[4, 5\] that do not exist"):
        scan_model_dir(root / "m", root)


def test_a_model_directory_without_versions_or_with_a_version_missing_its_file_is_refused(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="has no version directories"):
        scan_model_dir(tmp_path / "empty", tmp_path)
    (tmp_path / "half" / "3").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"model 'half' version 3: .*model\.onnx is missing"):
        scan_model_dir(tmp_path / "half", tmp_path)


def test_config_yaml_keys_apply_and_an_override_replaces_them(tmp_path: Path):
    root = repository(tmp_path, {"m": (1,)}, {"m": "max_batch_size: 4\nwarmup: {samples: [s.json]}\n"})
    [plain] = scan_model_dir(root / "m", root)
    assert plain.config.max_batch_size == 4
    assert plain.config.warmup.samples == (str((root / "m" / "s.json").resolve()),), (
        "warmup samples are relative to the model directory"
    )
    [overridden] = scan_model_dir(root / "m", root, override={"max_batch_size": 2})
    assert overridden.config.max_batch_size == 2
    assert overridden.config.warmup.samples == plain.config.warmup.samples, "the other keys stay"


def test_a_model_file_linked_from_outside_the_repository_is_refused(tmp_path: Path):
    root = tmp_path / "repo"
    outside = matmul_model(tmp_path / "elsewhere.onnx")
    (root / "m" / "1").mkdir(parents=True)
    os.symlink(outside, root / "m" / "1" / "model.onnx")
    with pytest.raises(ConfigError, match="outside the model repository"):
        scan_model_dir(root / "m", root)
    os.symlink(tmp_path / "other", root / "linked")
    repository(tmp_path, {"other": (1,)})
    with pytest.raises(ConfigError, match=r"model directory .*linked resolves to"):
        discover_model(settings(model_store_path=str(root)), "linked")


def test_discover_lists_repository_and_config_models_and_refuses_a_version_given_twice(tmp_path: Path):
    root = repository(tmp_path / "repo", {"a": (1, 2), ".hidden": (1,)})
    model = str(matmul_model(tmp_path / "b.onnx"))
    config = settings(model_store_path=str(root), models={"b": {"model_path": model}})
    sources = discover(config)
    assert found(sources) == [("a", "2"), ("b", "1")], "hidden directories are not models"
    assert sources[1].cache_dir == str(config.repository.cache_path)
    twice = settings(model_store_path=str(root), models={"a": {"model_path": model, "version": "2"}})
    with pytest.raises(ConfigError, match="model 'a' version 2 is defined twice"):
        discover(twice)


@pytest.mark.parametrize("name", ["../etc", "a/b", "a\\b", ".hidden", "", "x\x00y"])
def test_a_model_name_that_would_leave_the_repository_is_refused(tmp_path: Path, name: str):
    root = repository(tmp_path / "repo", {"a": (1,)})
    (tmp_path / "etc").mkdir()
    with pytest.raises(InvalidInput, match="is not a model name"):
        discover_model(settings(model_store_path=str(root)), name)


def test_discover_model_finds_a_repository_model_else_says_there_is_none(tmp_path: Path):
    root = repository(tmp_path / "repo", {"a": (1, 2)}, {"a": "version_policy: all\n"})
    config = settings(model_store_path=str(root))
    assert found(discover_model(config, "a")) == [("a", "1"), ("a", "2")]
    with pytest.raises(ModelNotFound, match="no model named 'nope'"):
        discover_model(config, "nope")
    with pytest.raises(ModelNotFound, match="no model named 'a'"):
        discover_model(settings(), "a")


def test_a_load_override_merges_into_a_config_model_but_may_not_change_its_version(tmp_path: Path):
    model = str(matmul_model(tmp_path / "b.onnx"))
    config = settings(models={"b": {"model_path": model, "version": "3", "max_batch_size": 4}})
    [source] = discover_model(config, "b", {"batch_timeout_ms": 1})
    assert (source.version, source.path) == ("3", model)
    assert (source.config.max_batch_size, source.config.batch_timeout_ms) == (4, 1)
    with pytest.raises(ConfigError, match="not version"):
        discover_model(config, "b", {"version": "4"})


@pytest.mark.parametrize("key", ["model_class", "model_path", "python_path"])
def test_an_override_may_not_touch_code_keys_unless_the_server_allows_it(tmp_path: Path, key: str):
    root = repository(tmp_path / "repo", {"a": (1,)})
    config = settings(model_store_path=str(root))
    with pytest.raises(PermissionDenied, match=f"may not override {key}"):
        discover_model(config, "a", {key: "anything"})


def test_an_allowed_model_path_override_is_taken_as_an_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    model = str(matmul_model(tmp_path / "b.onnx"))
    other = matmul_model(tmp_path / "other.onnx")
    allowed = settings(models={"b": {"model_path": model}}, server={"auth": {"allow_code_overrides": True}})
    monkeypatch.chdir(tmp_path)
    [source] = discover_model(allowed, "b", {"model_path": "other.onnx"})
    assert source.path == str(other.resolve())
    assert source.config.model_path == "other.onnx"
