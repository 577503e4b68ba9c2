"""Residency: LRU eviction within max_loaded_models, loading on demand (once for concurrent requests),
unloading idle on-demand models."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from tests.support import (
    ROOT,
    ServerProcess,
    infer_body,
    matmul_model,
    request,
    slow_model,
    wait_for,
    wait_queue,
)

ONE_ROW = infer_body({"X": np.ones((1, 16), np.float32)})


def states(port: int) -> dict[str, tuple[str, str]]:
    entries = request(port, "POST", "/v2/repository/index").json()
    return {entry["name"]: (entry["state"], entry["reason"]) for entry in entries}


def loads(server: ServerProcess, name: str) -> int:
    return server.log().count(f"loaded model {name} version 1")


def test_lru_eviction_and_loading_on_demand(tmp_path: Path):
    repo = tmp_path / "repo"
    for index, name in enumerate(("a", "b", "c")):
        matmul_model(repo / name / "1" / "model.onnx", seed=index)
        residency = "on_demand" if name == "c" else "lru"
        (repo / name / "config.yaml").write_text(f"residency: {residency}\n")
    config = tmp_path / "config.yaml"
    config.write_text(f"model_store_path: {repo}\nresidency: {{max_loaded_models: 2}}\n")
    server = ServerProcess(["--config", str(config)]).start(tmp_path / "log")
    port = server.port
    try:
        assert states(port)["c"] == ("UNAVAILABLE", "evicted"), "on_demand: not loaded at start-up"
        assert request(port, "POST", "/v2/models/a/infer", ONE_ROW).status == 200
        assert request(port, "POST", "/v2/models/b/infer", ONE_ROW).status == 200
        with ThreadPoolExecutor(max_workers=10) as pool:  # ten first requests for c at once
            replies = list(
                pool.map(lambda _: request(port, "POST", "/v2/models/c/infer", ONE_ROW), range(10))
            )
        assert [reply.status for reply in replies] == [200] * 10
        assert loads(server, "c") == 1, "concurrent first requests share one load"
        now = states(port)
        assert now["a"] == ("UNAVAILABLE", "evicted"), "a was the least recently used"
        assert now["b"][0] == "READY"
        assert now["c"][0] == "READY"
        reply = request(port, "POST", "/v2/models/a/infer", ONE_ROW)  # comes back on demand
        assert reply.status == 200
        assert loads(server, "a") == 2
        assert states(port)["b"] == ("UNAVAILABLE", "evicted"), "now b is the least recently used"
    finally:
        server.stop()


def test_idle_on_demand_models_are_unloaded(tmp_path: Path):
    repo = tmp_path / "repo"
    matmul_model(repo / "m" / "1" / "model.onnx")
    (repo / "m" / "config.yaml").write_text("residency: on_demand\nidle_unload_s: 0.5\n")
    server = ServerProcess(["--model-repository", str(repo)]).start(tmp_path / "log")
    try:
        assert request(server.port, "POST", "/v2/models/m/infer", ONE_ROW).status == 200
        assert states(server.port)["m"][0] == "READY"
        wait_for(lambda: states(server.port)["m"][0] != "READY", what="the idle unload")
        assert states(server.port)["m"] == ("UNAVAILABLE", "evicted")
        assert request(server.port, "POST", "/v2/models/m/infer", ONE_ROW).status == 200
    finally:
        server.stop()


def test_a_memory_budget_counts_model_files(tmp_path: Path):
    repo = tmp_path / "repo"
    for name in ("a", "b"):
        matmul_model(repo / name / "1" / "model.onnx", size=256)  # 256 KiB of weights each
        (repo / name / "config.yaml").write_text("residency: lru\n")
    config = tmp_path / "config.yaml"
    config.write_text(f"model_store_path: {repo}\nresidency: {{memory_budget_mb: 0.75, memory_factor: 2}}\n")
    server = ServerProcess(["--config", str(config)]).start(tmp_path / "log")
    try:
        loaded = [name for name, (state, _) in states(server.port).items() if state == "READY"]
        assert len(loaded) == 1, "two models of 2 x 256 KiB do not fit 0.75 MiB"
        other = "a" if loaded == ["b"] else "b"
        x = infer_body({"X": np.ones((1, 256), np.float32)})
        assert request(server.port, "POST", f"/v2/models/{other}/infer", x).status == 200
        assert states(server.port)[loaded[0]] == ("UNAVAILABLE", "evicted")
    finally:
        server.stop()


def test_a_request_waiting_for_an_on_demand_load_is_bounded_by_its_timeout(tmp_path: Path):
    config = tmp_path / "config.yaml"
    config.write_text(
        "models:\n  slow: {backend: python, model_class: 'tests.python_models.models:SlowToLoad',"
        " residency: on_demand, warmup: {enabled: false}}\n"
    )
    server = ServerProcess(["--config", str(config)], env={"PYTHONPATH": str(ROOT)}).start(tmp_path / "log")
    body = infer_body({"x": np.ones((1, 4), np.float32)})
    try:
        reply = request(
            server.port, "POST", "/v2/models/slow/infer", {**body, "parameters": {"timeout": 100_000}}
        )
        assert reply.status == 504
        assert "model 'slow' is still loading after 0.100 s" in reply.error
        wait_for(lambda: states(server.port)["slow"][0] == "READY", what="the load going on")
        assert request(server.port, "POST", "/v2/models/slow/infer", body).status == 200, "the load went on"
    finally:
        server.stop()


def test_resident_models_are_never_evicted_and_busy_ones_are_skipped(tmp_path: Path):
    """max_loaded_models 2 with a resident model: only lru models make room, and never one that is
    answering a request at the time."""
    repo = tmp_path / "repo"
    matmul_model(repo / "keep" / "1" / "model.onnx", seed=1)
    slow_model(repo / "busy" / "1" / "model.onnx")
    matmul_model(repo / "later" / "1" / "model.onnx", seed=3)
    (repo / "keep" / "config.yaml").write_text("residency: resident\n")
    (repo / "busy" / "config.yaml").write_text(
        "residency: lru\nmax_batch_size: 0\nbackend_config: {intra_op_num_threads: 1}\n"
    )
    (repo / "later" / "config.yaml").write_text("residency: on_demand\n")
    config = tmp_path / "config.yaml"
    config.write_text(f"model_store_path: {repo}\nresidency: {{max_loaded_models: 2}}\n")
    server = ServerProcess(["--config", str(config)]).start(tmp_path / "log")
    port = server.port
    slow = infer_body({"X": np.full((8, 256), 0.01, np.float32)})
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            running = pool.submit(request, port, "POST", "/v2/models/busy/infer", slow)
            wait_queue(port, "busy", 0, 1)
            assert request(port, "POST", "/v2/models/later/infer", ONE_ROW).status == 200
            now = states(port)
            assert now["keep"][0] == "READY", "resident: never evicted"
            assert now["busy"][0] == "READY", "busy: skipped while it answers"
            assert running.result().status == 200
        assert "every loaded model is resident or busy" in server.log()
        assert request(port, "POST", "/v2/models/keep/infer", ONE_ROW).status == 200
        # now nothing is busy: the next load (here through the repository API) makes room with `busy`
        assert request(port, "POST", "/v2/repository/models/later/load").status == 200
        now = states(port)
        assert (now["keep"][0], now["later"][0]) == ("READY", "READY")
        assert now["busy"] == ("UNAVAILABLE", "evicted")
    finally:
        server.stop()
