"""Shadow traffic against the real server: the client gets the primary's answer only; the candidate's
outputs are compared and exported; a failing candidate never fails a request."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest

from tests.support import ROOT, ServerProcess, infer_body, matmul_model, request, rollout, scrape, wait_for

CONFIG = """
model_store_path: {repo}
models:
  primary: {{backend: python, model_class: "tests.python_models.models:Sleeper", max_batch_size: 0}}
  doubler: {{backend: python, model_class: "tests.python_models.models:Doubler", max_batch_size: 0}}
routes:
  same: [{{version: 1, weight: 1}}]
  other: [{{version: 1, weight: 1}}]
shadows:
  same: {{version: 2}}
  other: {{version: 2, share: 1.0}}
  primary: {{model: doubler}}
server: {{host: 127.0.0.1}}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("shadow")
    repo = root / "repo"
    for name, seeds in (("same", (1, 1)), ("other", (1, 2))):  # same: identical weights in both versions
        for version, seed in enumerate(seeds, start=1):
            matmul_model(repo / name / str(version) / "model.onnx", seed=seed)
        (repo / name / "config.yaml").write_text("version_policy: {kind: all}\n")
    (root / "config.yaml").write_text(CONFIG.format(repo=repo))
    server = ServerProcess(["--config", str(root / "config.yaml")], env={"PYTHONPATH": str(ROOT)})
    server.start(root / "log")
    yield server
    server.stop()


def shadow_samples(server: ServerProcess, model: str) -> dict[str, dict[tuple, float]]:
    samples = scrape(server.port)
    return {
        name: {labels: value for labels, value in by_labels.items() if ("model", model) in labels}
        for name, by_labels in samples.items()
        if name.startswith("edgeinfer_shadow_")
    }


def value(samples: dict[str, dict[tuple, float]], name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(v for key, v in samples.get(name, {}).items() if wanted <= set(key))


def settled(server: ServerProcess, model: str) -> float:
    """Mirrors of ``model`` whose result is known."""
    return value(shadow_samples(server, model), "edgeinfer_shadow_requests_total")


def send(server: ServerProcess, model: str, rows: np.ndarray, name: str = "X") -> dict:
    reply = request(server.port, "POST", f"/v2/models/{model}/infer", infer_body({name: rows}))
    assert reply.status == 200, reply.body
    return reply.json()


def test_the_client_gets_the_primary_and_the_candidate_is_compared(server: ServerProcess):
    rng = np.random.default_rng(0)
    n = 60
    for model in ("same", "other"):
        for i in range(n):
            answer = send(server, model, rng.standard_normal((2, 16)).astype(np.float32))
            assert answer["model_version"] == "1", "only the primary answers"
            # one request at a time, each mirror settled before the next: the server is idle, as a
            # mirror still queued (or a loop behind) is load, and load drops mirrors by design
            wait_for(
                lambda model=model, i=i: settled(server, model) == i + 1, what=f"{model}'s mirror settled"
            )
    same, other = shadow_samples(server, "same"), shadow_samples(server, "other")
    for samples, candidate in ((same, "same/2"), (other, "other/2")):
        compared = value(samples, "edgeinfer_shadow_requests_total", candidate=candidate, result="compared")
        dropped = value(samples, "edgeinfer_shadow_requests_total", candidate=candidate, result="dropped")
        assert compared + dropped == n
        assert compared >= n / 2, "an idle server compares most requests"
        assert value(samples, "edgeinfer_shadow_max_abs_diff_count", output="Y") == compared
    # identical weights: no difference, every row agrees
    assert value(same, "edgeinfer_shadow_max_abs_diff_sum", output="Y") == 0.0
    rows = value(same, "edgeinfer_shadow_rows_total", output="Y")
    assert value(same, "edgeinfer_shadow_rows_total", output="Y", agree="true") == rows > 0
    # other weights: differences, and top-1 disagreements on random inputs
    assert value(other, "edgeinfer_shadow_max_abs_diff_sum", output="Y") > 0
    assert value(other, "edgeinfer_shadow_rows_total", output="Y", agree="false") > 0


def test_a_failing_candidate_never_fails_a_request(server: ServerProcess):
    before = value(shadow_samples(server, "primary"), "edgeinfer_shadow_requests_total", result="failed")
    settled_before = settled(server, "primary")
    for _ in range(20):
        answer = send(server, "primary", np.full((1, 4), 13, np.float32), name="x")  # Doubler raises on 13
        assert answer["model_name"] == "primary"
        assert answer["outputs"][0]["data"] == [13.0] * 4
    wait_for(lambda: settled(server, "primary") == settled_before + 20, what="the mirrors settled")
    samples = shadow_samples(server, "primary")
    failed = value(samples, "edgeinfer_shadow_requests_total", candidate="doubler/1", result="failed")
    assert value(samples, "edgeinfer_shadow_requests_total", result="compared") == 0
    assert failed > before, "the candidate's failures are counted"


def test_under_load_mirrors_are_dropped_first(server: ServerProcess):
    """Eight clients on a primary that takes 20 ms a request: its queue is never empty, so most mirrors
    are dropped, and every client request is answered."""
    before = value(shadow_samples(server, "primary"), "edgeinfer_shadow_requests_total", result="dropped")
    body = infer_body({"x": np.ones((1, 4), np.float32)}, parameters={"sleep_ms": 20})

    def client(_: int) -> list[int]:
        return [request(server.port, "POST", "/v2/models/primary/infer", body).status for _ in range(10)]

    with ThreadPoolExecutor(max_workers=8) as pool:
        statuses = [status for batch in pool.map(client, range(8)) for status in batch]
    assert statuses == [200] * 80
    dropped = value(shadow_samples(server, "primary"), "edgeinfer_shadow_requests_total", result="dropped")
    assert dropped - before >= 40


def test_shadows_change_at_run_time(server: ServerProcess):
    assert request(server.port, "GET", "/v2/shadows").json()["shadows"]["same"] == {
        "version": "2",
        "share": 1.0,
    }
    reply = request(server.port, "PUT", "/v2/shadows/same", {"version": 2, "share": 0.5})
    assert reply.status == 200, reply.body
    assert reply.json()["shadows"]["same"] == {"version": "2", "share": 0.5}
    bad = request(server.port, "PUT", "/v2/shadows/same", {"version": 2, "share": 2})
    assert bad.status == 400
    assert "shadows.same.share" in bad.error
    assert request(server.port, "DELETE", "/v2/shadows/same").status == 200
    before = settled(server, "same")
    for _ in range(10):
        send(server, "same", np.ones((1, 16), np.float32))
    assert settled(server, "same") == before, "no shadow: nothing mirrored"
    assert request(server.port, "PUT", "/v2/shadows/same", {"version": 2}).status == 200
    # over gRPC, the same documents
    port = server.grpc_port
    changed = rollout(port, "SetShadow", model_name="same", document={"version": 2, "share": 0.25})
    assert changed["shadows"]["same"] == {"version": "2", "share": 0.25}
    assert rollout(port, "ListShadows") == request(server.port, "GET", "/v2/shadows").json()
    with pytest.raises(grpc.RpcError) as refused:
        rollout(port, "SetShadow", model_name="same", document={"version": 2, "share": 2})
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "shadows.same.share" in str(refused.value.details())
    assert rollout(port, "RemoveShadow", model_name="same") == {}
    assert "same" not in rollout(port, "ListShadows")["shadows"]
    assert request(server.port, "PUT", "/v2/shadows/same", {"version": 2}).status == 200
