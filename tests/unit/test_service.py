"""``InferenceService.call`` and ``InferenceCall`` at their own boundary, on the core wired as the
composition root wires it (``build_core``) with real ONNX Runtime models: every call recorded exactly
once, the deadline from the head or the ``timeout`` parameter (the earlier wins), the head's routing key
only where the body names none, and a request's parameters never written to. What
tests/integration/test_service.py asserts already (a success and an invalid input counted, ids,
requested outputs, deferring) is not asserted again here."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from edgeinfer import afterwards
from edgeinfer.errors import InferenceFailed, InvalidInput, RequestTimeout
from edgeinfer.head import RequestHead
from edgeinfer.model_config import ModelConfig, RouteVariant
from edgeinfer.protocol.types import InferRequest, InferResponse
from edgeinfer.repository.routes import Route
from edgeinfer.repository.sources import ModelSource
from edgeinfer.service import InferenceService
from tests.core import build_core
from tests.support import failing_model, matmul_model

T = TypeVar("T")


def run(test: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(test())


def source(path: Path, name: str = "m", version: str = "1", **config: Any) -> ModelSource:
    return ModelSource(name, version, str(path), ModelConfig(**config))


def rows(parameters: dict[str, Any] | None = None, value: float = 1.0) -> InferRequest:
    return InferRequest({"X": np.full((1, 16), value, np.float32)}, parameters=parameters)


def counted(service: InferenceService, name: str, version: str) -> dict[tuple[str, str], int]:
    afterwards.flush()
    return dict(service.metrics.model(name, version).requests)


def key_for(route: Route, model: str, version: str | None) -> str:
    for index in range(10_000):
        chosen = route.choose(f"key-{index}")
        if (chosen.model, chosen.version) == (model, version):
            return f"key-{index}"
    raise AssertionError(f"no key chooses {model} version {version}")


async def answered(service: InferenceService, head: RequestHead, request: InferRequest) -> InferResponse:
    call = service.call(head)
    await call.submit(request)
    return call.respond(lambda response: response)


def test_a_body_that_cannot_be_decoded_is_recorded_once_under_an_id_of_its_own(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    path = matmul_model(tmp_path / "m.onnx")

    def undecodable(data: bytes) -> InferRequest:
        raise InvalidInput(f"not JSON: {data!r}")

    async def main() -> tuple[InferenceService, str]:
        service = build_core().service
        await service.registry.load([source(path)])
        call = service.call(RequestHead("test", "m", None))
        with pytest.raises(InvalidInput) as raised:
            call.decode(undecodable, b"{")
        assert call.request_id, "an id for the access log though the body named none"
        call.fail(raised.value)
        call.fail(RuntimeError("recorded already"))
        return service, call.request_id

    with caplog.at_level(logging.INFO, logger="edgeinfer.access"):
        service, request_id = run(main)
    assert counted(service, "m", "1") == {("test", "client_error"): 1}
    [line] = [record for record in caplog.records if record.name == "edgeinfer.access"]
    assert getattr(line, "request_id", None) == request_id


def test_a_failed_inference_is_raised_by_respond_and_recorded_once_as_an_error(tmp_path: Path):
    path = failing_model(tmp_path / "failing.onnx")  # an index out of range fails in ONNX Runtime

    async def main() -> InferenceService:
        service = build_core().service
        await service.registry.load([source(path, max_batch_size=0)])
        out_of_range = {"X": np.ones((1, 4), np.float32), "I": np.array([9], np.int64)}
        call = service.call(RequestHead("test", "m", None, "the-id"))
        outputs = call.submit(InferRequest(out_of_range))
        with pytest.raises(InferenceFailed) as raised:
            await outputs
        with pytest.raises(type(raised.value)):
            call.respond(lambda response: response)
        call.fail(raised.value)
        unnamed = service.call(RequestHead("test", "m", None))
        in_range = {"X": np.ones((1, 4), np.float32), "I": np.array([3], np.int64)}
        await unnamed.submit(InferRequest(in_range, id="from-the-body"))
        assert unnamed.request_id == "from-the-body", "no id in the head: the body's"
        unnamed.respond(lambda response: response)
        return service

    service = run(main)
    assert counted(service, "m", "1") == {("test", "error"): 1, ("test", "success"): 1}


class Stalled:
    """``discover`` for the core: it blocks (in the worker thread loads read the repository from) until
    ``release``; so an evicted model stays loading for as long as the test wants."""

    def __init__(self, sources: list[ModelSource]) -> None:
        self.sources = sources
        self.go = threading.Event()

    def __call__(self, name: str, override: dict | None) -> list[ModelSource]:
        self.go.wait(10)
        return self.sources


def test_the_earlier_of_the_heads_deadline_and_the_timeout_parameter_bounds_the_wait(tmp_path: Path):
    """An evicted model loads on its first request, bounded by the request's deadline: a load that
    cannot finish shows which deadline the call took (the error says how long it waited)."""
    path = matmul_model(tmp_path / "m.onnx")
    stalled = Stalled([source(path, residency="lru")])

    async def main() -> InferResponse:
        service = build_core(stalled).service
        await service.registry.load(stalled.sources)
        await service.registry.evict("m")
        try:
            now = time.monotonic()
            cases = [  # (the head's deadline, the body's timeout in microseconds)
                (now - 1.0, 1_000_000),  # the head's is past: no wait, not the body's second
                (now + 1.0, 1),  # the body's microsecond, not the head's second
                (now - 1.0, None),
            ]
            for deadline, timeout_us in cases:
                call = service.call(RequestHead("test", "m", None, deadline=deadline))
                parameters = {"timeout": timeout_us} if timeout_us is not None else None
                with pytest.raises(RequestTimeout, match=r"still loading after 0\.000 s") as raised:
                    await call.submit(rows(parameters))
                call.fail(raised.value)
            waiting = service.call(RequestHead("test", "m", None))  # no deadline: waits for the load
            outputs = waiting.submit(rows())
            assert not outputs.done()
        finally:
            stalled.go.set()
        await outputs
        assert counted(service, "m", "") == {("test", "timeout"): 3}, "no version had it yet"
        return waiting.respond(lambda response: response)

    assert run(main).outputs["Y"].shape == (1, 16)


def test_the_heads_routing_key_is_used_only_when_the_body_names_none(tmp_path: Path):
    first, second = matmul_model(tmp_path / "1.onnx", seed=1), matmul_model(tmp_path / "2.onnx", seed=2)
    halves = (RouteVariant(version="1", weight=1), RouteVariant(version="2", weight=1))

    async def main() -> list[str]:
        service = build_core().service
        await service.registry.load([source(first, version="1"), source(second, version="2")])
        service.router.set_route("m", halves)
        route = service.router.route("m")
        assert route is not None
        to_one, to_two = key_for(route, "m", "1"), key_for(route, "m", "2")
        served = []
        for head_key, body_key in [(to_one, None), (to_two, None), (to_one, to_two), (to_two, to_one)]:
            head = RequestHead("test", "m", None, routing_key=head_key)
            parameters = {"routing_key": body_key} if body_key is not None else None
            served.append((await answered(service, head, rows(parameters))).model_version)
        return served

    assert run(main) == ["1", "2", "2", "1"]


def test_a_requests_parameters_are_never_written_to_even_when_another_model_answers(tmp_path: Path):
    path = matmul_model(tmp_path / "m.onnx")

    async def main() -> list[tuple[InferRequest, dict[str, Any], InferResponse]]:
        service = build_core().service
        await service.registry.load([source(path, name="m"), source(path, name="other", version="3")])
        service.router.set_route("m", (RouteVariant(weight=1), RouteVariant(model="other", weight=1)))
        route = service.router.route("m")
        assert route is not None
        elsewhere = key_for(route, "other", None)
        seen = []
        for parameters, head in [
            (
                {"routing_key": elsewhere, "timeout": 30_000_000, "tag": "mine"},
                RequestHead("test", "m", None),
            ),
            (None, RequestHead("test", "m", None, routing_key=elsewhere, deadline=time.monotonic() + 30)),
            ({"tag": "mine"}, RequestHead("test", "m", "1", request_id="given")),
        ]:
            request = rows(parameters)
            before = dict(request.parameters)
            held = request.parameters
            response = await answered(service, head, request)
            assert request.parameters is held
            seen.append((request, before, response))
        return seen

    for request, before, _ in (seen := run(main)):
        assert request.parameters == before, "nothing added, changed or removed"
    routed, keyed, named = (response for _, _, response in seen)
    assert (routed.model_name, routed.model_version, routed.parameters) == (
        "other",
        "3",
        {"routed_from": "m"},
    )
    assert (keyed.model_name, keyed.parameters) == ("other", {"routed_from": "m"})
    assert seen[1][0].parameters == {}, "the head's key is not copied into the body"
    assert (named.model_name, named.parameters) == ("m", {})


def test_a_pipeline_step_that_fails_is_raised_and_recorded_once(tmp_path: Path):
    path = matmul_model(tmp_path / "m.onnx")

    async def main() -> InferenceService:
        service = build_core().service
        await service.registry.load([source(path)])
        with pytest.raises(InvalidInput, match=r"expects \[-1, 16\]"):
            await service.run_step("m", None, InferRequest({"X": np.ones((1, 3), np.float32)}, id="p/s"))
        return service

    service = run(main)
    assert counted(service, "m", "1") == {("pipeline", "client_error"): 1}
