"""OpenTelemetry spans of real requests through the core (ONNX Runtime and Python models, a pipeline), read
back from the SDK's in-memory exporter: the span tree of a batched request and of a pipeline request."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from edgeinfer.config import TracingConfig
from edgeinfer.errors import InvalidInput
from edgeinfer.head import RequestHead
from edgeinfer.model_config import ModelConfig
from edgeinfer.protocol.types import InferRequest
from edgeinfer.repository.sources import ModelSource
from edgeinfer.service import InferenceService
from edgeinfer.tracing import setup
from tests.core import Core, build_core
from tests.python_models.models import Doubler
from tests.support import matmul_model

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
SAMPLED = f"00-{TRACE_ID}-{PARENT_ID}-01"


def traced_core(ratio: float = 1.0) -> tuple[Core, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing = setup(TracingConfig(enabled=True, sampling_ratio=ratio), exporter)
    return build_core(tracing=tracing), exporter


def traced_service(ratio: float = 1.0) -> tuple[InferenceService, InMemorySpanExporter]:
    core, exporter = traced_core(ratio)
    return core.service, exporter


async def infer(
    service: InferenceService,
    model: str,
    request: InferRequest,
    headers: tuple[str, str | None] | None = None,
) -> Any:
    """What a transport does: decode (here: the request as is), submit, respond; a failure is recorded."""
    call = service.call(RequestHead("test", model, None, None, headers))
    try:
        decoded = call.decode(lambda data: data, request)
        await call.submit(decoded)
        return call.respond(lambda response: response)
    except Exception as error:
        call.fail(error)
        raise


def rows(value: float, count: int = 1) -> InferRequest:
    return InferRequest({"X": np.full((count, 16), value, np.float32)})


def by_parent(spans: list[ReadableSpan], parent: ReadableSpan) -> dict[str, ReadableSpan]:
    found = [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]
    assert len({s.name for s in found}) == len(found), [s.name for s in found]
    return {s.name: s for s in found}


def test_a_batched_request_has_decode_queue_compute_encode_and_a_batch_linked_to_every_request(
    tmp_path: Path,
):
    path = matmul_model(tmp_path / "m.onnx")

    async def main() -> None:
        await service.registry.load(
            [ModelSource("m", "3", str(path), ModelConfig(max_batch_size=4, batch_timeout_ms=5000))]
        )
        # four requests queued in one loop iteration fill a batch of 4 (no waiting for the timeout)
        await asyncio.gather(
            infer(service, "m", rows(1.0), (SAMPLED, "vendor=opaque")),
            *(infer(service, "m", rows(value)) for value in (2.0, 3.0, 4.0)),
        )

    service, exporter = traced_service()
    asyncio.run(main())
    spans = list(exporter.get_finished_spans())
    requests = [s for s in spans if s.name == "infer m"]
    [batch] = [s for s in spans if s.name == "batch m"]
    assert len(requests) == 4
    assert batch.attributes["edgeinfer.batch.rows"] == 4
    assert batch.attributes["edgeinfer.batch.requests"] == 4
    assert (batch.attributes["edgeinfer.model.name"], batch.attributes["edgeinfer.model.version"]) == (
        "m",
        "3",
    )
    assert batch.attributes["edgeinfer.batch.compute_infer_ns"] > 0
    assert batch.parent is None, "a batch is a trace of its own, linked to its requests"
    assert {link.context.span_id for link in batch.links} == {r.context.span_id for r in requests}

    continued = [r for r in requests if format(r.context.trace_id, "032x") == TRACE_ID]
    assert len(continued) == 1, "the traceparent's trace is continued"
    assert format(continued[0].parent.span_id, "016x") == PARENT_ID
    assert continued[0].parent.is_remote
    assert continued[0].context.trace_state.to_header() == "vendor=opaque"
    assert len({r.context.trace_id for r in requests}) == 4, "the others start traces of their own"

    for request in requests:
        assert request.kind is SpanKind.SERVER
        attributes = request.attributes
        assert attributes["edgeinfer.model.name"] == "m"
        assert attributes["edgeinfer.model.version"] == "3"
        assert attributes["edgeinfer.request.id"], "the V2 request id"
        assert attributes["edgeinfer.status"] == "success"
        assert attributes["edgeinfer.batch.rows"] == 4
        assert request.status.status_code is StatusCode.UNSET
        children = by_parent(spans, request)
        assert set(children) == {"decode", "queue", "compute", "encode"}
        decode, queue, compute, encode = (children[n] for n in ("decode", "queue", "compute", "encode"))
        assert [link.context.span_id for link in compute.links] == [batch.context.span_id]
        assert request.start_time == decode.start_time <= decode.end_time <= queue.start_time
        assert queue.end_time == batch.start_time <= compute.start_time <= compute.end_time <= batch.end_time
        assert batch.end_time <= encode.start_time
        assert encode.end_time <= request.end_time
        assert all(child.context.trace_id == request.context.trace_id for child in children.values())


def test_a_pipeline_request_has_a_span_per_step_each_with_its_own_queue_and_compute(tmp_path: Path):
    path = matmul_model(tmp_path / "m.onnx")
    pipeline = ModelConfig(
        backend="pipeline",
        pipeline={
            "inputs": [{"name": "X", "datatype": "FP32", "shape": [-1, 16]}],
            "outputs": [{"name": "Y", "datatype": "FP32", "shape": [-1, 16], "from": "second.Y"}],
            "steps": [
                {"name": "first", "model": "m", "inputs": {"X": "X"}},
                {"name": "second", "model": "m", "inputs": {"X": "first.Y"}},
            ],
        },
    )

    async def main() -> Any:
        await service.registry.load([ModelSource("m", "1", str(path), ModelConfig(max_batch_size=4))])
        await service.registry.load([ModelSource("p", "1", "", pipeline)])
        return await infer(service, "p", InferRequest({"X": np.ones((2, 16), np.float32)}, id="pipe-1"))

    service, exporter = traced_service()
    response = asyncio.run(main())
    assert response.outputs["Y"].shape == (2, 16)
    spans = list(exporter.get_finished_spans())
    [root] = [s for s in spans if s.name == "infer p"]
    assert root.attributes["edgeinfer.request.id"] == "pipe-1"
    children = by_parent(spans, root)
    assert set(children) == {"decode", "queue", "compute", "encode", "step first", "step second"}
    first, second = children["step first"], children["step second"]
    assert first.end_time <= second.start_time, "the second step needs the first one's output"
    for step, name in ((first, "first"), (second, "second")):
        assert step.kind is SpanKind.INTERNAL
        assert step.context.trace_id == root.context.trace_id
        assert step.attributes["edgeinfer.pipeline.step"] == name
        assert step.attributes["edgeinfer.model.name"] == "m"
        assert step.attributes["edgeinfer.request.id"] == f"pipe-1/{name}"
        assert step.attributes["edgeinfer.protocol"] == "pipeline"
        assert set(by_parent(spans, step)) == {"queue", "compute", "encode"}, "a step has no body to decode"
        assert root.start_time <= step.start_time <= step.end_time <= root.end_time
    steps_batches = [s for s in spans if s.name == "batch m"]
    assert len(steps_batches) == 2
    assert sorted(link.context.span_id for b in steps_batches for link in b.links) == sorted(
        [first.context.span_id, second.context.span_id]
    )
    [pipeline_batch] = [s for s in spans if s.name == "batch p"]
    assert [link.context.span_id for link in pipeline_batch.links] == [root.context.span_id]


def test_sampling_follows_the_ratio_and_the_traceparent_and_a_batch_follows_its_requests(tmp_path: Path):
    path = matmul_model(tmp_path / "m.onnx")
    not_sampled = f"00-{TRACE_ID}-{PARENT_ID}-00"

    async def main() -> None:
        await service.registry.load(
            [ModelSource("m", "1", str(path), ModelConfig(max_batch_size=3, batch_timeout_ms=5000))]
        )
        await asyncio.gather(
            infer(service, "m", rows(1.0), (SAMPLED, None)),
            infer(service, "m", rows(2.0), (not_sampled, None)),
            infer(service, "m", rows(3.0)),
        )

    service, exporter = traced_service(ratio=0.0)
    asyncio.run(main())
    spans = list(exporter.get_finished_spans())
    [request] = [s for s in spans if s.name == "infer m"]
    assert format(request.context.trace_id, "032x") == TRACE_ID
    assert request.context.trace_flags.sampled
    [batch] = [s for s in spans if s.name == "batch m"]
    assert batch.attributes["edgeinfer.batch.requests"] == 3
    assert [link.context.span_id for link in batch.links] == [request.context.span_id], (
        "only recorded requests are linked; the batch is recorded because one of them is"
    )
    assert len(spans) == 6, [s.name for s in spans]  # the request, its four children, the batch


def test_a_failed_request_is_an_error_span_and_a_malformed_traceparent_starts_a_new_trace(tmp_path: Path):
    async def main() -> None:
        await service.registry.load(
            [ModelSource("d", "1", "", ModelConfig(backend="python", model_class="x:y"), instance=Doubler())]
        )
        with pytest.raises(InvalidInput):
            await infer(service, "d", InferRequest({"x": np.ones((1, 5), np.float32)}), ("00-zz-bad", None))
        failing = InferRequest({"x": np.full((1, 4), 13, np.float32)})  # the model raises
        with pytest.raises(Exception, match="thirteen is unlucky"):
            await infer(service, "d", failing)

    service, exporter = traced_service()
    asyncio.run(main())
    spans = list(exporter.get_finished_spans())
    invalid, failed = (s for s in spans if s.name == "infer d")
    assert invalid.parent is None, "an unreadable traceparent is ignored, as the W3C spec says"
    assert invalid.status.status_code is StatusCode.ERROR
    assert "expects [-1, 4]" in invalid.status.description
    assert invalid.attributes["error.type"] == "client_error"
    assert set(by_parent(spans, invalid)) == {"decode"}, "refused before it was queued"
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes["error.type"] == "error"
    assert set(by_parent(spans, failed)) == {"decode", "queue", "compute"}, "failed in the model: no encode"
    [batch] = [s for s in spans if s.name == "batch d"]
    assert batch.status.status_code is StatusCode.ERROR
    assert "thirteen is unlucky" in batch.status.description


def test_a_routed_request_names_the_model_that_answered_and_the_one_asked_for(tmp_path: Path):
    path = matmul_model(tmp_path / "m.onnx")

    async def main() -> Any:
        await service.registry.load([ModelSource("a", "1", str(path), ModelConfig())])
        await service.registry.load([ModelSource("b", "2", str(path), ModelConfig())])
        await core.control.set_route("a", [{"model": "b", "weight": 1}])  # all of a's traffic to b
        return await infer(service, "a", rows(1.0))

    core, exporter = traced_core()
    service = core.service
    response = asyncio.run(main())
    assert (response.model_name, response.model_version) == ("b", "2")
    [span] = [s for s in exporter.get_finished_spans() if s.name == "infer a"]
    attributes = span.attributes
    assert (attributes["edgeinfer.model.name"], attributes["edgeinfer.model.version"]) == ("b", "2")
    assert attributes["edgeinfer.model.requested"] == "a"
