"""Weighted routes against the real server: sticky keys over HTTP headers, parameters and gRPC metadata,
shares within a stated tolerance, an explicit version always wins, the route in metadata and the index,
and routes changed at run time (also with workers, where every worker follows the change)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.support import ServerProcess, infer_body, matmul_model, request, rollout

ONE_ROW = infer_body({"X": np.ones((1, 16), np.float32)})
CONFIG = """
model_store_path: {repo}
routes:
  m: [{{version: 1, weight: 90}}, {{version: 2, weight: 10}}]
server: {{host: 127.0.0.1, workers: {workers}}}
logging: {{access_log: false}}
"""


def make_repository(root: Path) -> Path:
    repo = root / "repo"
    for version in (1, 2):
        matmul_model(repo / "m" / str(version) / "model.onnx", seed=version)
    (repo / "m" / "config.yaml").write_text("version_policy: {kind: all}\n")
    matmul_model(repo / "other" / "1" / "model.onnx", seed=3)
    return repo


def start(root: Path, workers: int = 1) -> ServerProcess:
    (root / "config.yaml").write_text(CONFIG.format(repo=make_repository(root), workers=workers))
    server = ServerProcess(["--config", str(root / "config.yaml")])
    server.start(root / "log", timeout=60)
    return server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start(tmp_path_factory.mktemp("routes"))
    yield server
    server.stop()


def answered_by(server: ServerProcess, key: str | None = None, path: str = "/v2/models/m/infer") -> str:
    headers = {"X-Routing-Key": key} if key is not None else {}
    reply = request(server.port, "POST", path, ONE_ROW, headers=headers)
    assert reply.status == 200, reply.body
    document = reply.json()
    return f"{document['model_name']}/{document['model_version']}"


def test_one_key_sees_one_variant(server: ServerProcess):
    for key in ("alice", "bob", "carol"):
        assert len({answered_by(server, key) for _ in range(1000 if key == "alice" else 100)}) == 1
    body = {**ONE_ROW, "parameters": {"routing_key": "alice"}}
    by_parameter = request(server.port, "POST", "/v2/models/m/infer", body).json()["model_version"]
    assert f"m/{by_parameter}" == answered_by(server, "alice")
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        data = grpcclient.InferInput("X", [1, 16], "FP32")
        data.set_data_from_numpy(np.ones((1, 16), np.float32))
        versions = {
            client.infer("m", [data], headers={"x-routing-key": "alice"}).get_response().model_version
            for _ in range(50)
        }
    finally:
        client.close()
    assert {f"m/{version}" for version in versions} == {answered_by(server, "alice")}


def test_weights_hold_within_five_standard_deviations(server: ServerProcess):
    n = 2000
    counts = Counter(answered_by(server, f"client-{index}") for index in range(n))
    assert set(counts) == {"m/1", "m/2"}
    share = counts["m/2"] / n
    assert abs(share - 0.10) < 5 * math.sqrt(0.1 * 0.9 / n), counts  # +-0.034


def test_an_explicit_version_always_wins(server: ServerProcess):
    assert {answered_by(server, f"k{index}", "/v2/models/m/versions/2/infer") for index in range(50)} == {
        "m/2"
    }
    assert {answered_by(server, f"k{index}", "/v2/models/m/versions/1/infer") for index in range(50)} == {
        "m/1"
    }


def test_metadata_and_the_index_show_the_route(server: ServerProcess):
    metadata = request(server.port, "GET", "/v2/models/m").json()
    assert metadata["route"] == [
        {"model": "m", "weight": 90.0, "version": "1"},
        {"model": "m", "weight": 10.0, "version": "2"},
    ]
    index = request(server.port, "POST", "/v2/repository/index", {}).json()
    assert {entry["route"] for entry in index if entry["name"] == "m"} == {"v1 90%, v2 10%"}
    assert all("route" not in entry for entry in index if entry["name"] == "other")
    assert request(server.port, "GET", "/v2/routes").json()["routes"]["m"] == metadata["route"]


def test_routes_change_at_run_time(server: ServerProcess):
    try:
        reply = request(server.port, "PUT", "/v2/routes/m", {"variants": [{"version": "1", "weight": 1}]})
        assert reply.status == 200, reply.body
        assert {answered_by(server, f"k{index}") for index in range(100)} == {"m/1"}
        # another model takes a share: it answers, and says for which model
        variants = [{"version": 1, "weight": 1}, {"model": "other", "weight": 1}]
        assert request(server.port, "PUT", "/v2/routes/m", {"variants": variants}).status == 200
        seen = Counter(answered_by(server, f"k{index}") for index in range(200))
        assert set(seen) == {"m/1", "other/1"}
        reply = request(server.port, "POST", "/v2/models/m/infer", ONE_ROW, headers={"X-Routing-Key": "k0"})
        if reply.json()["model_name"] == "other":
            assert reply.json()["parameters"] == {"routed_from": "m"}
        # a variant that cannot serve (no such version) never fails a request: the highest ready answers
        assert (
            request(server.port, "PUT", "/v2/routes/m", {"variants": [{"version": 9, "weight": 1}]}).status
            == 200
        )
        assert {answered_by(server, f"k{index}") for index in range(50)} == {"m/2"}
        # a bad route is refused with what is wrong, and the route in force stays
        bad = request(server.port, "PUT", "/v2/routes/m", {"variants": [{"version": 1, "weight": 0}]})
        assert bad.status == 400
        assert "routes.m.0.weight" in bad.error
        not_a_list = request(server.port, "PUT", "/v2/routes/m", {"variants": "all"})
        assert (not_a_list.status, not_a_list.error) == (
            400,
            "'variants' must be a list of {version or model, weight}",
        )
    finally:
        assert request(server.port, "DELETE", "/v2/routes/m").status == 200
    assert {answered_by(server, f"k{index}") for index in range(50)} == {"m/2"}, "no route: the highest"
    assert "route" not in request(server.port, "GET", "/v2/models/m").json()
    request(
        server.port,
        "PUT",
        "/v2/routes/m",
        {"variants": [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]},
    )


def test_routes_are_steered_over_grpc_with_the_same_documents(server: ServerProcess):
    port = server.grpc_port
    try:
        listed = rollout(
            port, "SetRoute", model_name="m", document={"variants": [{"version": 1, "weight": 1}]}
        )
        assert listed == {"routes": {"m": [{"model": "m", "version": "1", "weight": 1.0}]}}
        assert {answered_by(server, f"k{index}") for index in range(50)} == {"m/1"}
        assert rollout(port, "ListRoutes") == request(server.port, "GET", "/v2/routes").json()
        bad_cases = [
            ({"model_name": "m", "document": "{not json"}, "'json' is not valid JSON"),
            ({"model_name": "m", "document": {"variants": "all"}}, "'variants' must be a list"),
            ({"document": {"variants": []}}, "this call needs a 'model_name'"),
        ]
        for fields, message in bad_cases:
            with pytest.raises(grpc.RpcError) as refused:
                rollout(port, "SetRoute", **fields)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert message in str(refused.value.details()), refused.value.details()
        assert {answered_by(server, f"k{index}") for index in range(20)} == {"m/1"}, (
            "the route in force stays"
        )
    finally:
        assert rollout(port, "RemoveRoute", model_name="m") == {}
    assert {answered_by(server, f"k{index}") for index in range(50)} == {"m/2"}, "no route: the highest"
    variants = [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]
    rollout(port, "SetRoute", model_name="m", document={"variants": variants})


@pytest.mark.workers
def test_every_worker_follows_a_route_set_at_run_time(tmp_path: Path):
    server = start(tmp_path, workers=2)
    try:
        reply = request(server.port, "PUT", "/v2/routes/m", {"variants": [{"version": "1", "weight": 1}]})
        assert reply.status == 200
        # new connections: the kernel spreads them over both workers
        assert {answered_by(server, f"k{index}") for index in range(200)} == {"m/1"}
        assert request(server.port, "DELETE", "/v2/routes/m").status == 200
        assert {answered_by(server, f"k{index}") for index in range(200)} == {"m/2"}
        # over gRPC (the call lands on one worker, which hands it to the supervisor): the same
        rollout(
            server.grpc_port, "SetRoute", model_name="m", document={"variants": [{"version": 1, "weight": 1}]}
        )
        assert {answered_by(server, f"k{index}") for index in range(200)} == {"m/1"}
    finally:
        assert server.stop() == 0
