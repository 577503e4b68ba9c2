"""The core in one process, no transport: registry states, routing, and the inference call that records
every request exactly once. Models are real (ONNX Runtime sessions from the onnx helper, Python models)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edgeinfer.errors import (
    InvalidInput,
    ModelEvicted,
    ModelLoadError,
    ModelNotFound,
    ModelNotReady,
    RequestCancelled,
)
from edgeinfer.head import RequestHead
from edgeinfer.model_config import ModelConfig, RouteVariant
from edgeinfer.protocol.types import InferRequest, RequestedOutput
from edgeinfer.repository.registry import ModelState
from edgeinfer.repository.sources import ModelSource
from edgeinfer.service import InferenceService
from tests.core import Core, build_core
from tests.python_models.models import Doubler
from tests.support import matmul_model


def onnx_source(path: Path, name: str = "m", version: str = "1", **config) -> ModelSource:
    return ModelSource(name, version, str(path), ModelConfig(**config))


def python_source(model, name: str, version: str = "1", **config) -> ModelSource:
    config = ModelConfig(backend="python", model_class="tests.python_models.models:Doubler", **config)
    return ModelSource(name, version, "", config, instance=model)


def build(discover: Callable[[str, dict | None], list[ModelSource]] = lambda name, override: []):
    return build_core(discover).service


def run(test: Callable[[], Awaitable[object]]) -> object:
    return asyncio.run(test())


def x(rows: int = 1) -> InferRequest:
    return InferRequest({"X": np.ones((rows, 16), np.float32)})


def requests_counted(service: InferenceService, name: str, version: str) -> dict[tuple[str, str], int]:
    return dict(service.metrics.model(name, version).requests)


def test_registry_states_through_load_reload_failure_unload_and_eviction(tmp_path: Path):
    good = matmul_model(tmp_path / "good.onnx")
    (tmp_path / "broken.onnx").write_bytes(b"not a model")

    async def main():
        core = build_core()
        registry = core.service.registry
        await registry.load([onnx_source(good, version="1")])
        assert [(e.version, e.state) for e in registry.index()] == [("1", ModelState.READY)]
        with pytest.raises(ModelLoadError, match="version 2"):
            await registry.reload(
                "m", [onnx_source(good, version="1"), onnx_source(tmp_path / "broken.onnx", version="2")]
            )
        states = {e.version: (e.state, e.reason) for e in registry.index()}
        assert states["1"] == (ModelState.READY, ""), "the serving version is untouched"
        assert states["2"][0] is ModelState.UNAVAILABLE
        assert "broken.onnx" in states["2"][1]
        await registry.evict("m")
        assert registry.index()[0].state is ModelState.EVICTED
        assert (await core.scope.index())[0] == {
            "name": "m",
            "version": "1",
            "state": "UNAVAILABLE",
            "reason": "evicted",
        }
        await registry.reload("m", [onnx_source(good, version="1")])
        await registry.unload("m")
        assert (registry.index()[0].state, registry.index()[0].reason) == (ModelState.UNAVAILABLE, "unloaded")
        with pytest.raises(ModelNotFound, match="unknown model 'nope'"):
            await registry.unload("nope")

    run(main)


def test_the_router_picks_the_named_version_else_the_highest_ready_one(tmp_path: Path):
    paths = {v: matmul_model(tmp_path / f"{v}.onnx", seed=int(v)) for v in ("1", "2", "10")}

    async def main():
        service = build()
        registry, router = service.registry, service.router
        await registry.load(onnx_source(path, version=v) for v, path in paths.items())
        assert router.pick("m").version == "10", "numeric order, not text order"
        assert router.pick("m", "2").version == "2"
        with pytest.raises(ModelNotFound, match="has no version '3'; its versions are: 1, 2, 10"):
            router.pick("m", "3")
        with pytest.raises(ModelNotFound, match="unknown model 'other'"):
            router.pick("other")
        await registry.evict("m")
        with pytest.raises(ModelEvicted, match="evicted to save memory"):
            router.pick("m")
        registry.defer([onnx_source(paths["1"], name="later")])
        with pytest.raises(ModelEvicted, match="loaded on demand and not loaded yet"):
            router.pick("later")
        await registry.reload("m", [onnx_source(paths["1"], version="1")])
        await registry.unload("m")
        with pytest.raises(ModelNotReady, match="no version ready"):
            router.pick("m")

    run(main)


def test_a_request_is_settled_before_decoding_only_when_its_body_cannot_move_it(tmp_path: Path):
    """``Router.settled``: what admission may judge before decoding. A route (the body's routing key) or
    a fallback (the ladder) can send a request elsewhere; a named version cannot."""
    path = matmul_model(tmp_path / "m.onnx")

    async def main():
        service = build()
        registry, router = service.registry, service.router
        ladder = {"model": "m", "enter_p95_ms": 50, "exit_p95_ms": 20}
        await registry.load(
            [
                onnx_source(path, version="1"),
                onnx_source(path, version="2"),
                onnx_source(path, name="laddered", fallback=ladder),
            ]
        )
        assert router.settled("m") is router.pick("m")
        assert router.settled("m").version == "2"
        assert router.settled("laddered") is None
        assert router.settled("laddered", "1") is router.pick("laddered", "1")
        router.set_route("m", (RouteVariant(version="1", weight=9), RouteVariant(version="2", weight=1)))
        assert router.settled("m") is None
        assert router.settled("m", "2").version == "2"
        with pytest.raises(ModelNotFound, match="unknown model 'other'"):
            router.settled("other")

    run(main)


def test_a_call_records_success_and_each_failure_exactly_once(tmp_path: Path, caplog):
    path = matmul_model(tmp_path / "m.onnx")
    expected = ort.InferenceSession(str(path)).run(None, {"X": np.ones((2, 16), np.float32)})[0]

    async def main():
        service = build()
        await service.registry.load([onnx_source(path, max_batch_size=8)])
        ok = service.call(RequestHead("test", "m", None, "given-id"))
        request = ok.decode(lambda _: InferRequest({"X": np.ones((2, 16), np.float32)}, id="body-id"), None)
        await ok.submit(request)
        response = ok.respond(lambda response: response)
        ok.fail(RuntimeError("recorded already: ignored"))
        bad = service.call(RequestHead("test", "m", None))
        wrong = bad.decode(lambda _: InferRequest({"X": np.ones((2, 3), np.float32)}), None)
        with pytest.raises(InvalidInput, match=r"expects \[-1, 16\]") as caught:
            bad.submit(wrong)
        bad.fail(caught.value)
        failing_encoder = service.call(RequestHead("test", "m", None))
        await failing_encoder.submit(x())
        with pytest.raises(TypeError):
            failing_encoder.respond(lambda response: (_ for _ in ()).throw(TypeError("cannot encode")))
        gone = service.call(RequestHead("test", "m", None))
        gone.fail(RequestCancelled("the client went away"))
        unknown = service.call(RequestHead("test", "nope", None))
        with pytest.raises(ModelNotFound) as caught:
            unknown.submit(x())
        unknown.fail(caught.value)
        return service, ok, response

    with caplog.at_level(logging.INFO, logger="edgeinfer.access"):
        service, ok, response = run(main)
    np.testing.assert_allclose(response.outputs["Y"], expected, rtol=1e-6)
    assert (response.model_version, response.id) == ("1", "body-id")
    assert ok.request_id == "given-id", "the transport's id wins over the body's"
    counted = requests_counted(service, "m", "1")
    assert counted == {("test", "success"): 1, ("test", "client_error"): 2, ("test", "error"): 1}
    assert requests_counted(service, "_unknown", "") == {("test", "client_error"): 1}
    lines = [record for record in caplog.records if record.name == "edgeinfer.access"]
    assert len(lines) == 5, "one access line per call"
    assert lines[0].request_id == "given-id"


def _refused_in_one_iteration(path: Path) -> tuple[Core, list]:
    """Four requests for an SLO model read in one loop iteration that is 50 ms behind: the first goes
    the usual way (``call``, ``shed``), the rest are offered to ``refused_again`` first (and one for the
    model over another protocol); then one more in the next iteration, after the records were made."""

    async def main():
        core = build_core()
        service = core.service
        await service.registry.load([onnx_source(path, max_batch_size=8, slo={"p99_ms": 20})])
        warm = service.call(RequestHead("test", "m", None))
        await warm.submit(x())  # the cost model has a batch
        warm.respond(lambda response: response)
        lag = service.registry.lag
        await asyncio.sleep(0)  # a new iteration
        lag.lag_s, lag.turn_s = 0.050, 0.001
        first = service.call(RequestHead("test", "m", None, "first-id"))
        refused = [first.shed()]
        refused += [service.refused_again("test", "m", None) for _ in range(3)]
        refused.append(service.refused_again("other protocol", "m", None))
        await asyncio.sleep(0)  # the next iteration: the records are made, and the refusal is past
        await asyncio.sleep(0)
        refused.append(service.refused_again("test", "m", None))
        lag.stop()
        return core, refused

    return run(main)


def test_the_refusals_of_one_loop_iteration_are_counted_together_with_the_first(tmp_path: Path, caplog):
    """``refused_again``: once a request was refused before decoding for its wait, the others of its
    loop iteration (same protocol, model and version asked for) get the same refusal without a call of
    their own, and count with the first: every one in the metrics and statistics; the first alone in
    the recent errors, and in the access log with their number. Not in the next iteration."""
    with caplog.at_level(logging.INFO, logger="edgeinfer.access"):
        core, refused = _refused_in_one_iteration(matmul_model(tmp_path / "m.onnx"))
    service = core.service
    first = refused[0]
    assert first is not None
    assert "behind" in first.message
    assert refused[1:4] == [first] * 3
    assert refused[4:] == [None, None], (
        "another protocol's requests, and the next iteration's, go the usual way"
    )
    metrics = service.metrics.model("m", "1")
    assert metrics.requests == {("test", "success"): 1, ("test", "rejected"): 4}
    assert metrics.duration["test"].count == 5
    assert metrics.refused == {"slo": 4}
    assert service.router.pick("m").recorder.stats.fail.count == 4
    overview = asyncio.run(core.scope.overview())
    errors = [error for error in overview["errors"] if error["status"] == "rejected"]
    assert [error["request_id"] for error in errors] == ["first-id"]
    lines = [record for record in caplog.records if record.name == "edgeinfer.access"]
    assert [(line.status, line.request_id, getattr(line, "repeats", 0)) for line in lines] == [
        ("success", lines[0].request_id, 0),
        ("rejected", "first-id", 3),
    ]
    assert "id=first-id repeats=3 error=" in lines[1].getMessage()


def test_a_call_decoded_off_the_loop_counts_as_arriving_until_submitted_or_failed(tmp_path: Path):
    """``defer``: the version judged before decoding counts the request as arriving (admission before
    decoding sees it ahead) until it is submitted or fails, once, however often either is called."""
    path = matmul_model(tmp_path / "m.onnx")

    async def main():
        service = build()
        await service.registry.load([onnx_source(path, max_batch_size=8)])
        batcher = service.router.pick("m").serving.batcher
        arriving = []
        submitted = service.call(RequestHead("test", "m", None))
        assert submitted.shed() is None
        submitted.defer()
        submitted.defer()  # once only
        failed = service.call(RequestHead("test", "m", None))
        assert failed.shed() is None
        failed.defer()
        arriving.append(batcher.admission.view.arriving)
        outputs = submitted.submit(x())
        arriving.append(batcher.admission.view.arriving)
        failed.fail(InvalidInput("the body was not JSON"))
        failed.fail(InvalidInput("recorded already"))
        arriving.append(batcher.admission.view.arriving)
        await outputs
        submitted.respond(lambda response: response)
        arriving.append(batcher.admission.view.arriving)
        unjudged = service.call(RequestHead("test", "m", None))
        unjudged.defer()  # nothing judged before decoding: nothing to count in
        arriving.append(batcher.admission.view.arriving)
        return arriving

    assert run(main) == [2, 1, 0, 0, 0]


def test_requested_outputs_and_output_parameters_reach_the_response(tmp_path: Path):
    async def main():
        service = build()
        await service.registry.load([python_source(Doubler(factor=3), "d")])
        call = service.call(RequestHead("test", "d", None))
        request = InferRequest({"x": np.ones((1, 4), np.float32)}, outputs=[RequestedOutput("y")])
        await call.submit(request)
        return call.respond(lambda response: response)

    response = run(main)
    assert list(response.outputs) == ["y"]
    np.testing.assert_array_equal(response.outputs["y"], np.full((1, 4), 3.0, np.float32))


def test_statistics_and_metrics_snapshot_count_what_ran(tmp_path: Path):
    path = matmul_model(tmp_path / "m.onnx")

    async def main():
        core = build_core()
        await core.service.registry.load([onnx_source(path, max_batch_size=8)])
        for _ in range(3):
            call = core.service.call(RequestHead("test", "m", None))
            await call.submit(x(2))
            call.respond(lambda response: None)
        return core

    core = run(main)
    [stats] = asyncio.run(core.scope.statistics("m", None))["model_stats"]
    assert (stats["inference_count"], stats["execution_count"]) == (6, 3)
    assert stats["inference_stats"]["success"]["count"] == 3
    snapshot = asyncio.run(core.scope.snapshot())["metrics"]["models"]["m\x001"]
    assert sum(snapshot["batch_size"]["counts"]) == 3
    assert snapshot["gauges"]["ready"] is True
    assert snapshot["requests"] == [["test", "success", 3]]
    with pytest.raises(ModelNotFound):
        asyncio.run(core.scope.statistics("nope", None))


def test_a_pipeline_step_is_an_ordinary_recorded_request(tmp_path: Path):
    async def main():
        service = build()
        await service.registry.load([python_source(Doubler(), "d")])
        outputs = await service.run_step(
            "d", None, InferRequest({"x": np.ones((1, 4), np.float32)}, id="p/step")
        )
        return service, outputs

    service, outputs = run(main)
    np.testing.assert_array_equal(outputs["y"], np.full((1, 4), 2.0, np.float32))
    assert requests_counted(service, "d", "1") == {("pipeline", "success"): 1}


def test_load_and_unload_through_the_service_use_the_discovered_sources(tmp_path: Path):
    first = matmul_model(tmp_path / "1.onnx", seed=1)
    second = matmul_model(tmp_path / "2.onnx", seed=2)
    available = {"m": [onnx_source(first, version="1")]}

    async def main():
        control = build_core(lambda name, override: available[name]).control
        await control.load_model("m")
        available["m"] = [onnx_source(second, version="2")]
        await control.load_model("m")
        index = await control.repository_index()
        await control.unload_model("m")
        return index, await control.repository_index(ready_only=True)

    index, ready = run(main)
    assert [(e["version"], e["state"], e["reason"]) for e in index] == [
        ("1", "UNAVAILABLE", "unloaded"),
        ("2", "READY", ""),
    ]
    assert ready == []
