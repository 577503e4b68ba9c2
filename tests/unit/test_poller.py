"""``RepositoryPoller``: a model directory added or changed is loaded, one removed is unloaded. Each
test drives ``poll_once`` itself, the poller's own timer never firing (an hour's interval), so the
order of events is the test's and nothing waits for a clock."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from edgeinfer.config import Config
from edgeinfer.config_file import parse
from edgeinfer.errors import ConfigError, ModelLoadError
from edgeinfer.repository.poller import RepositoryPoller, fingerprint
from edgeinfer.repository.registry import ModelState
from edgeinfer.repository.sources import discover_model
from tests.core import build_core
from tests.support import matmul_model

T = TypeVar("T")
HOUR_S = 3600.0


class Calls:
    """The load and unload calls the poller makes, in order; ``failing``: names whose load fails."""

    def __init__(self) -> None:
        self.made: list[tuple[str, str]] = []
        self.failing: set[str] = set()

    async def load(self, name: str) -> None:
        self.made.append(("load", name))
        if name in self.failing:
            raise ModelLoadError(f"cannot load model {name!r}")

    async def unload(self, name: str) -> None:
        self.made.append(("unload", name))


def run(test: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(test())


def add(root: Path, name: str, version: int = 1) -> Path:
    return matmul_model(root / name / str(version) / "model.onnx", seed=version)


async def started(poller: RepositoryPoller) -> RepositoryPoller:
    """Started (what is there now counts as loaded), its timer stopped: the test polls."""
    poller.start()
    await poller.stop()
    return poller


def test_what_is_there_at_start_counts_as_loaded_and_an_unchanged_repository_calls_nothing(tmp_path: Path):
    add(tmp_path, "a")
    calls = Calls()

    async def main() -> None:
        poller = await started(RepositoryPoller(tmp_path, HOUR_S, calls.load, calls.unload, in_thread=False))
        await poller.poll_once()
        await poller.poll_once()

    run(main)
    assert calls.made == []


def test_a_model_added_changed_and_removed_is_loaded_reloaded_and_unloaded(tmp_path: Path):
    model = add(tmp_path, "a")
    calls = Calls()

    async def main() -> None:
        poller = await started(RepositoryPoller(tmp_path, HOUR_S, calls.load, calls.unload, in_thread=False))
        add(tmp_path, "b")
        await poller.poll_once()
        assert calls.made == [("load", "b")]
        (tmp_path / "a" / "config.yaml").write_text("max_batch_size: 4\n")
        await poller.poll_once()
        stat = model.stat()
        os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # the same size, later
        await poller.poll_once()
        add(tmp_path, "a", version=2)
        await poller.poll_once()
        assert calls.made[1:] == [("load", "a")] * 3, "a config, a model file rewritten, a new version"
        del calls.made[:]
        for path in sorted((tmp_path / "b").rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        (tmp_path / "b").rmdir()
        await poller.poll_once()
        await poller.poll_once()
        assert calls.made == [("unload", "b")], "once"

    run(main)


def test_a_hidden_directory_and_files_at_the_top_are_not_models(tmp_path: Path):
    calls = Calls()

    async def main() -> None:
        poller = await started(RepositoryPoller(tmp_path, HOUR_S, calls.load, calls.unload, in_thread=False))
        add(tmp_path, ".staging")
        (tmp_path / "notes.txt").write_text("not a model")
        await poller.poll_once()

    run(main)
    assert calls.made == []


def test_a_failed_load_is_logged_and_retried_only_when_the_directory_changes_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    calls = Calls()
    calls.failing.add("a")

    async def main() -> None:
        poller = await started(RepositoryPoller(tmp_path, HOUR_S, calls.load, calls.unload, in_thread=False))
        add(tmp_path, "a")
        add(tmp_path, "b")
        with caplog.at_level(logging.ERROR, logger="edgeinfer.repository.poller"):
            await poller.poll_once()
        assert calls.made == [("load", "a"), ("load", "b")], "one failure does not stop the others"
        assert "cannot load model 'a'" in caplog.text
        await poller.poll_once()
        assert len(calls.made) == 2, "not retried while nothing changed"
        calls.failing.clear()
        (tmp_path / "a" / "config.yaml").write_text("max_batch_size: 2\n")
        await poller.poll_once()
        assert calls.made[2:] == [("load", "a")]

    run(main)


def test_a_failed_refresh_of_a_remote_mirror_skips_the_scan_until_the_next_poll(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    calls = Calls()
    refreshed: list[bool] = []

    def refresh() -> None:
        refreshed.append(True)
        if len(refreshed) == 1:
            raise ConfigError("the remote repository cannot be reached")
        add(tmp_path, "fetched")

    async def main() -> None:
        poller = await started(
            RepositoryPoller(tmp_path, HOUR_S, calls.load, calls.unload, refresh, in_thread=False)
        )
        add(tmp_path, "local")
        with caplog.at_level(logging.WARNING, logger="edgeinfer.repository.poller"):
            await poller.poll_once()
        assert calls.made == [], "no scan after a failed refresh"
        assert "cannot be reached" in caplog.text
        await poller.poll_once()
        assert calls.made == [("load", "fetched"), ("load", "local")], "the mirror is brought up first"

    run(main)


@pytest.mark.parametrize("in_thread", [False, True])
def test_in_thread_chooses_whether_the_repository_is_read_on_the_event_loop(tmp_path: Path, in_thread: bool):
    calls = Calls()
    readers: list[threading.Thread] = []

    async def main() -> threading.Thread:
        poller = await started(
            RepositoryPoller(
                tmp_path,
                HOUR_S,
                calls.load,
                calls.unload,
                lambda: readers.append(threading.current_thread()),
                in_thread=in_thread,
            )
        )
        add(tmp_path, "a")
        await poller.poll_once()
        return threading.current_thread()

    loop_thread = run(main)
    assert calls.made == [("load", "a")]
    assert (readers == [loop_thread]) is not in_thread, readers


def test_a_fingerprint_changes_with_a_files_size_and_time_and_not_otherwise(tmp_path: Path):
    model = add(tmp_path, "a")
    before = fingerprint(tmp_path / "a")
    assert [entry[0] for entry in before] == [os.path.join("1", "model.onnx")]
    assert fingerprint(tmp_path / "a") == before
    with model.open("ab") as file:
        file.write(b"\0")
    assert fingerprint(tmp_path / "a") != before


def test_polling_into_the_real_core_serves_a_new_model_and_unloads_a_removed_one(tmp_path: Path):
    config: Config = parse(Config, {"model_store_path": str(tmp_path)}, "test")

    def discover(name: str, override: dict[str, Any] | None) -> Any:
        return discover_model(config, name, override)

    async def main() -> list[tuple[str, ModelState, str]]:
        core = build_core(discover)
        poller = await started(
            RepositoryPoller(tmp_path, HOUR_S, core.scope.load, core.scope.unload, in_thread=False)
        )
        model = add(tmp_path, "a")
        await poller.poll_once()
        assert core.service.router.pick("a").state is ModelState.READY
        model.unlink()
        model.parent.rmdir()
        (tmp_path / "a").rmdir()
        await poller.poll_once()
        return [(e.name, e.state, e.reason) for e in core.service.registry.index()]

    assert run(main) == [("a", ModelState.UNAVAILABLE, "unloaded")]
