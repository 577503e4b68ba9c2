"""Loading, reloading and unloading models at run time (Triton's repository extension), over HTTP and gRPC."""

from __future__ import annotations

import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support import ServerProcess, infer_body, matmul_model, request, slow_model, wait_for, wait_queue


@pytest.fixture
def repo_server(tmp_path: Path):
    repo = tmp_path / "repo"
    matmul_model(repo / "alpha" / "1" / "model.onnx", seed=1)
    matmul_model(repo / "beta" / "1" / "model.onnx", seed=2)
    server = ServerProcess(["--model-repository", str(repo)]).start(tmp_path / "server.log")
    yield server, repo
    server.stop()


def infer(port: int, model: str, version: str | None = None) -> tuple[int, dict]:
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    reply = request(port, "POST", path, infer_body({"X": np.ones((1, 16), np.float32)}))
    return reply.status, reply.json()


def expected(path: Path) -> np.ndarray:
    return ort.InferenceSession(str(path)).run(None, {"X": np.ones((1, 16), np.float32)})[0]


def test_unload_and_load_over_http(repo_server):
    server, repo = repo_server
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    try:
        client.unload_model("alpha")
        assert not client.is_model_ready("alpha")
        status, body = infer(server.port, "alpha")
        assert status == 503
        assert body["error"] == "model 'alpha' has no version ready to serve"
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        tensor = grpcclient.InferInput("X", [1, 16], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
        with pytest.raises(InferenceServerException) as caught:
            grpc.infer("alpha", [tensor])
        grpc.close()
        assert caught.value.status() == "StatusCode.UNAVAILABLE"
        assert caught.value.message() == "model 'alpha' has no version ready to serve"
        index = {(entry["name"], entry["version"]): entry for entry in client.get_model_repository_index()}
        assert index["alpha", "1"]["state"] == "UNAVAILABLE"
        assert index["alpha", "1"]["reason"] == "unloaded"
        assert index["beta", "1"]["state"] == "READY"
        assert infer(server.port, "beta")[0] == 200, "other models keep serving"
        assert client.is_server_ready()
        client.load_model("alpha")
        assert client.is_model_ready("alpha")
        status, body = infer(server.port, "alpha")
        assert status == 200
        np.testing.assert_allclose(
            np.array(body["outputs"][0]["data"], np.float32), expected(repo / "alpha" / "1" / "model.onnx")[0]
        )
    finally:
        client.close()


def test_load_picks_up_a_new_version_and_a_config_override(repo_server):
    server, repo = repo_server
    matmul_model(repo / "alpha" / "2" / "model.onnx", seed=9)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        client.load_model("alpha", config='{"max_batch_size": 4}')
        assert client.is_model_ready("alpha", "2")
        assert client.get_model_config("alpha", as_json=True)["config"]["max_batch_size"] == 4
        index = client.get_model_repository_index(as_json=True)["models"]
        assert {"name": "alpha", "version": "2", "state": "READY"} in index
    finally:
        client.close()
    status, body = infer(server.port, "alpha")
    assert (status, body["model_version"]) == (200, "2")
    np.testing.assert_allclose(
        np.array(body["outputs"][0]["data"], np.float32), expected(repo / "alpha" / "2" / "model.onnx")[0]
    )


def test_a_broken_new_version_leaves_the_old_one_serving(repo_server):
    server, repo = repo_server
    broken = repo / "alpha" / "3" / "model.onnx"
    broken.parent.mkdir()
    broken.write_bytes(b"not an onnx file")
    reply = request(server.port, "POST", "/v2/repository/models/alpha/load")
    assert reply.status == 400
    assert "version 3" in reply.error
    assert str(broken) in reply.error
    status, body = infer(server.port, "alpha")
    assert (status, body["model_version"]) == (200, "1")
    index = request(server.port, "POST", "/v2/repository/index", {}).json()
    failed = next(entry for entry in index if entry["version"] == "3")
    assert failed["state"] == "UNAVAILABLE"
    assert "cannot load" in failed["reason"]
    ready_only = request(server.port, "POST", "/v2/repository/index", {"ready": True}).json()
    assert ready_only == [
        {"name": "alpha", "version": "1", "state": "READY", "reason": ""},
        {"name": "beta", "version": "1", "state": "READY", "reason": ""},
    ]


def test_unknown_models_and_bad_overrides(repo_server):
    server, _ = repo_server
    reply = request(server.port, "POST", "/v2/repository/models/nope/load")
    assert reply.status == 404
    assert "no model named 'nope'" in reply.error
    reply = request(server.port, "POST", "/v2/repository/models/nope/unload")
    assert reply.status == 404
    assert reply.error == "unknown model 'nope'"
    bad = {"parameters": {"config": '{"max_batchsize": 4}'}}
    reply = request(server.port, "POST", "/v2/repository/models/alpha/load", bad)
    assert reply.status == 400
    assert "max_batchsize: unknown key" in reply.error
    reply = request(
        server.port, "POST", "/v2/repository/models/alpha/load", {"parameters": {"config": "[1]"}}
    )
    assert reply.status == 400
    assert "must be a mapping" in reply.error
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        with pytest.raises(InferenceServerException, match=r"NOT_FOUND.*unknown model 'nope'"):
            client.unload_model("nope")
    finally:
        client.close()


def test_replacing_a_version_under_traffic_fails_no_request(repo_server):
    server, repo = repo_server
    old = expected(repo / "beta" / "1" / "model.onnx")
    statuses: list[int] = []
    outputs: list[np.ndarray] = []
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            status, body = infer(server.port, "beta")
            statuses.append(status)
            if status == 200:
                outputs.append(np.array(body["outputs"][0]["data"], np.float32))

    threads = [threading.Thread(target=traffic) for _ in range(4)]
    for thread in threads:
        thread.start()
    replacement = repo / "beta" / "1" / "model.onnx"
    try:
        wait_for(lambda: len(outputs) >= 20, what="answers from the old model")
        staged = repo.parent / "staged.onnx"
        matmul_model(staged, seed=5)
        new = expected(staged)
        shutil.move(staged, replacement)
        reply = request(server.port, "POST", "/v2/repository/models/beta/load")
        assert reply.status == 200, reply.body
        swapped_at = len(outputs)
        wait_for(lambda: len(outputs) >= swapped_at + 20, what="answers after the swap")
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert set(statuses) == {200}, "no request failed during the swap"
    assert np.allclose(outputs[0], old[0])
    assert all(np.allclose(out, new[0]) for out in outputs[-10:]), "the new model answers after the swap"
    assert all(np.allclose(out, old[0]) or np.allclose(out, new[0]) for out in outputs)


def test_upgrade_and_rollback_under_traffic_name_the_serving_version(repo_server):
    server, repo = repo_server
    staged = repo.parent / "staged"
    matmul_model(staged / "2" / "model.onnx", seed=22)
    reference = {
        "1": expected(repo / "beta" / "1" / "model.onnx"),
        "2": expected(staged / "2" / "model.onnx"),
    }
    seen: list[tuple[int, str, np.ndarray]] = []
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            status, body = infer(server.port, "beta")
            output = np.array(body["outputs"][0]["data"], np.float32) if status == 200 else None
            seen.append((status, body.get("model_version", ""), output))

    def answered_by(version: str, count: int) -> bool:
        return len(seen) >= count and {answer[1] for answer in seen[-count:]} == {version}

    threads = [threading.Thread(target=traffic) for _ in range(6)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: answered_by("1", 20), what="version 1 serving")
        shutil.move(staged / "2", repo / "beta" / "2")  # upgrade: version 2 appears (latest: 1)
        assert request(server.port, "POST", "/v2/repository/models/beta/load").status == 200
        wait_for(lambda: answered_by("2", 20), what="version 2 serving")
        shutil.rmtree(repo / "beta" / "2")  # roll back: version 2 goes away, version 1 serves again
        assert request(server.port, "POST", "/v2/repository/models/beta/load").status == 200
        wait_for(lambda: answered_by("1", 20), what="version 1 serving again")
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert {status for status, _, _ in seen} == {200}, "no request failed"
    for _, version, output in seen:
        np.testing.assert_allclose(output, reference[version][0], rtol=1e-6)


def test_unloading_answers_what_is_queued_first(tmp_path: Path):
    repo = tmp_path / "repo"
    slow_model(repo / "slow" / "1" / "model.onnx")
    (repo / "slow" / "config.yaml").write_text(
        "max_batch_size: 0\nbackend_config: {intra_op_num_threads: 1}\n"
    )
    server = ServerProcess(["--model-repository", str(repo)]).start(tmp_path / "log")
    body = infer_body({"X": np.full((3, 256), 0.01, np.float32)})  # ~100 ms each
    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            queued = [
                pool.submit(request, server.port, "POST", "/v2/models/slow/infer", body) for _ in range(4)
            ]
            wait_queue(server.port, "slow", 3, 4)  # one running, three queued
            unloaded = request(server.port, "POST", "/v2/repository/models/slow/unload")
            statuses = [future.result().status for future in queued]
        assert unloaded.status == 200
        assert statuses == [200] * 4, "requests queued before the unload were answered"
        after = request(server.port, "POST", "/v2/models/slow/infer", body)
        assert after.status == 503
        assert after.error == "model 'slow' has no version ready to serve"
        index = request(server.port, "POST", "/v2/repository/index").json()
        assert index == [{"name": "slow", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}]
    finally:
        server.stop()
