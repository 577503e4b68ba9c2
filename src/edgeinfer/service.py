"""The data plane's core: readiness, model metadata, and every inference request, transport-neutral.

HTTP and gRPC adapters (and pipeline steps) call these methods with decoded requests and map the errors
they raise to status codes; nothing in here knows about either transport. Every inference request is
an ``InferenceCall``: the transport gives it the decode and encode functions, and the call times them,
takes the request id, submits through the router to the version's batcher, and records the outcome
(metrics and access log) exactly once, whatever happened. What concerns the whole server (the
repository API, statistics, metrics) is the control plane's (``control/``).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from edgeinfer.afterwards import Afterwards
from edgeinfer.dashboard import ErrorEntry
from edgeinfer.errors import (
    EdgeInferError,
    LimitExceeded,
    ModelEvicted,
    ModelNotFound,
    ModelNotReady,
    RequestTimeout,
    ServerBusy,
)
from edgeinfer.errors import describe as describe_error
from edgeinfer.head import RequestHead
from edgeinfer.logs import AccessLog
from edgeinfer.metrics import UNKNOWN_MODEL, Metrics, status_label
from edgeinfer.model_info import ModelInfo
from edgeinfer.outcome import Outcome
from edgeinfer.protocol.types import InferRequest, InferResponse
from edgeinfer.repository.registry import ModelState, ModelVersion, Registry
from edgeinfer.repository.residency import Residency
from edgeinfer.repository.router import Router
from edgeinfer.runners import Tensors, Work
from edgeinfer.shadow import Shadows
from edgeinfer.turn_refusals import TurnRefusals
from edgeinfer.validation import (
    RequestLimits,
    check_request,
    check_rows,
    check_sizes,
    parse_priority,
    parse_stream,
    parse_timeout_s,
)

if TYPE_CHECKING:
    from edgeinfer.batching.batcher import Batcher
    from edgeinfer.tracing import Tracing

T = TypeVar("T")
A = TypeVar("A")

_READY = ModelState.READY  # Python 3.11 looks enum members up slowly: the request path uses a name
_REQUEST_PREFIX = os.urandom(4).hex()
_request_numbers = itertools.count(1)


def new_request_id() -> str:
    """Unique within this run of the server: a random prefix and a counter (no syscall per request).
    The counter is written in decimal: compiled, ``f"{n:x}"`` goes through ``str.format``, several times
    slower (docs/design/mypyc.md)."""
    return f"{_REQUEST_PREFIX}-{next(_request_numbers)}"


class InferenceService:
    """``errors``: the ring failed requests are recorded in, for the status page (``dashboard.py``)."""

    def __init__(
        self,
        registry: Registry,
        router: Router,
        residency: Residency,
        shadows: Shadows,
        metrics: Metrics,
        access_log: AccessLog,
        errors: deque[ErrorEntry],
        limits: RequestLimits | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.registry = registry
        self.router = router
        self.residency = residency
        self.shadows = shadows
        self.metrics = metrics
        self.access_log = access_log
        self.limits = limits or RequestLimits()
        self.models = ModelInfo(registry, router)  # what clients may ask about the models
        self._recent_errors = errors
        self._ready = False
        self._tracing = tracing
        self._afterwards = Afterwards()
        # tracing is on: transports pass the W3C trace context headers they received to ``call``
        self.traced = tracing is not None
        # by (protocol, model, version asked for): this loop iteration's first refusal before decoding,
        # until it is recorded (``refused_again``)
        self._turn_refusals = TurnRefusals()

    def set_ready(self, ready: bool) -> None:
        """Called by the server once every model is loaded and warmed up (and False on shutdown)."""
        self._ready = ready

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        """Every model given at start-up was loaded and warmed up, and the server is not stopping.

        Models unloaded or failing to reload later do not make the server unready (each has its own
        readiness); that would take a healthy server out of a load balancer.
        """
        return self._ready

    # ---- inference ----

    def call(self, head: RequestHead) -> InferenceCall:
        """Start one inference request from what its transport knows before the body (``head``)."""
        outcome = Outcome(head.protocol, head.model, head.version, head.request_id or "", head.received_at)
        if self._tracing is not None:
            self._tracing.begin(outcome, head.trace_headers)
        return InferenceCall(self, outcome, head)

    async def run_step(
        self,
        model: str,
        version: str | None,
        request: InferRequest,
        step: str = "",
        pipeline_span: object | None = None,
    ) -> Tensors:
        """A pipeline step: an ordinary request to the step's model, through its queue and batcher (in
        the pipeline request's trace, as a child of ``pipeline_span``, when tracing is on)."""
        outcome = Outcome("pipeline", model, version, request.id or "")
        if self._tracing is not None:
            self._tracing.begin_step(outcome, step, pipeline_span)
        call = InferenceCall(self, outcome, RequestHead("pipeline", model, version))
        try:
            await call.submit(request)
            return call.respond(lambda response: response.outputs)
        except BaseException as error:
            call.fail(error)
            raise

    async def load_evicted(self, name: str, timeout_s: float | None) -> None:
        """Load a model evicted for memory (or on demand), waiting at most ``timeout_s``.

        Concurrent callers share one load; a caller that gives up does not cancel it for the others.
        """
        load = self.residency.load_evicted(name)
        try:
            await asyncio.wait_for(asyncio.shield(load), timeout_s)
        except asyncio.TimeoutError:
            raise RequestTimeout(
                f"model {name!r} is still loading after {timeout_s:.3f} s, the request's timeout"
            ) from None

    def shed_unread(self, outcome: Outcome) -> tuple[ModelVersion | None, ServerBusy | None]:
        """Judge a request before its body is decoded: the refusal (counted by the batcher) of one
        that would miss its model's SLO even at its most favourable (``Batcher.refuse_unread``: the
        queue ahead, how long it waited unread), or None. And the version the request goes to when its
        body cannot change that (``Router.settled``), so that it is picked once; a request a route or a
        fallback may send elsewhere is judged only while the loop lags, on its wait alone, and on its
        queue after decoding. Other errors (an unknown model) are left for after decoding, as without
        load. The version judged here counts the request in ``outcome`` until the request reaches its
        own (a refused or undecodable one stays counted there)."""
        router, name, version = self.router, outcome.model, outcome.version
        try:
            entry = judged = router.settled(name, version)
            if entry is None and self.registry.loop_lag_s:
                judged = router.pick(name, version)
        except EdgeInferError:
            return None, None
        if judged is None or judged.serving is None:
            return entry, None
        outcome.metrics = judged.recorder.metrics  # counted under it if refused here or undecodable
        batcher = judged.serving.batcher
        refusal = batcher.refuse_unread(queue_known=entry is not None)
        # the rest of this iteration's requests share a refusal for the wait (not one for the queue, and
        # not while tracing: each request's span is its own)
        if (
            refusal is not None
            and entry is not None
            and self._tracing is None
            and batcher.refuses_turn(refusal)
        ):
            self._turn_refusals.remember(batcher, refusal, outcome)
        return entry, refusal

    def refused_again(self, protocol: str, model: str, version: str | None) -> ServerBusy | None:
        """The refusal of a request whose loop iteration already refused one for its model before
        decoding, for its wait (``turn_refusals.py``), or None: then it goes the usual way (``call``).
        It counts with that first one, every one in the metrics and statistics; the first one's access
        log line gives their number, the recent errors list the first one only. Not while tracing."""
        return self._turn_refusals.again(protocol, model, version)

    def record(self, outcome: Outcome) -> None:
        """Count a finished request and log it, once the loop iteration's answers are written
        (``afterwards.py``); requests for unknown models are counted as one model."""
        outcome.ended = time.perf_counter()
        self._afterwards.call(self._record, outcome)

    def _record(self, outcome: Outcome) -> None:
        total_s = outcome.ended - outcome.started
        status = "success" if outcome.error is None else status_label(outcome.error)
        self._turn_refusals.recorded(outcome)
        times = 1 + outcome.repeats
        metrics = outcome.metrics
        if metrics is None:  # it failed before reaching a model version
            name, version = outcome.model, outcome.version
            try:
                version = self.router.pick(name, version).version
            except ModelNotFound:
                name, version = UNKNOWN_MODEL, ""
            except ModelNotReady:
                version = version or ""
            metrics = self.metrics.model(name, version)
        metrics.request_done(outcome.protocol, status, total_s, outcome.decode_s, outcome.encode_s, times)
        if outcome.error is not None and isinstance(outcome.error, LimitExceeded) and outcome.error.limit:
            self.metrics.limit_refused(outcome.error.limit)
        if status == "success":
            self.router.observe(outcome.model, total_s)
        elif status in ("rejected", "timeout"):  # for load: as if it never finished
            for _ in range(times):
                self.router.observe(outcome.model, math.inf)
        self.access_log.write(outcome, metrics.name, metrics.version, status, total_s)
        if self._tracing is not None:
            self._tracing.end(outcome, metrics.name, metrics.version, status)
        if status != "success":
            message = describe_error(outcome.error) if outcome.error is not None else ""
            self._recent_errors.append(
                (
                    time.time(),
                    outcome.request_id,
                    outcome.protocol,
                    metrics.name,
                    metrics.version,
                    status,
                    message,
                )
            )


class InferenceCall:
    """One inference request from the transport's decoded bytes to its encoded answer.

    Transports use it in four steps: ``decode`` (their decoder, timed; the request id), ``submit`` (a
    future of the outputs; cancelling it drops the queued request), ``respond`` (their encoder, timed) or
    ``fail`` (an error they met, or cancellation). The outcome is recorded exactly once, at ``respond``
    or the first ``fail``. A transport that decodes a body off the event loop calls ``defer`` first.
    """

    __slots__ = (
        "_deadline",
        "_expected",
        "_head",
        "_judged",
        "_model",
        "_output_parameters",
        "_outputs",
        "_recorded",
        "_service",
        "_settled",
        "_version",
        "outcome",
        "request",
    )

    def __init__(self, service: InferenceService, outcome: Outcome, head: RequestHead) -> None:
        self._service = service
        self.outcome = outcome
        self._head = head
        self._deadline: float | None = None  # fixed when first queued (``_timeout_s``)
        self.request: InferRequest | None = None
        self._outputs: asyncio.Future[Tensors] | None = None
        self._model = outcome.model
        self._version = ""
        self._output_parameters: dict[str, dict[str, Any]] = {}
        self._recorded = False
        self._judged = False  # ``shed`` ran
        self._settled: ModelVersion | None = None  # picked before decoding (the body cannot change it)
        self._expected: Batcher | None = None  # counting this request as arriving (``defer``)

    @property
    def request_id(self) -> str:
        return self.outcome.request_id

    def shed(self) -> ServerBusy | None:
        """Judge the request before its body is read (``InferenceService.shed_unread``): its refusal,
        already recorded, or None. A transport may call it first and answer a refusal without decoding
        anything (under overload every microsecond a refusal costs is taken from the requests the
        loop can answer); ``decode`` calls it otherwise."""
        self._judged = True
        outcome = self.outcome
        self._settled, refusal = self._service.shed_unread(outcome)
        if refusal is not None:
            outcome.decode_s = time.perf_counter() - outcome.started
            self._record(refusal)
        return refusal

    def body_arrived(self) -> None:
        """The call was begun and judged while the body arrived (``shed`` from the head): its decode
        time counts from now, not from then."""
        self.outcome.decode_from = time.perf_counter()

    def defer(self) -> None:
        """The transport decodes this request off the event loop (it comes back to ``decode`` later):
        until it is submitted or fails, the queue of the version judged before decoding counts it as
        arriving, so that requests judged meanwhile see it ahead of them (``Batcher.expect``)."""
        entry = self._settled
        if entry is not None and entry.serving is not None and self._expected is None:
            self._expected = entry.serving.batcher
            self._expected.expect()

    def _arrived(self) -> None:
        expected, self._expected = self._expected, None
        if expected is not None:
            expected.expected()

    def decode(self, decoder: Callable[[A], InferRequest], data: A) -> InferRequest:
        """``decoder(data)``, timed. The request id: the transport's, else the body's, else a new one.
        A request that would miss its model's SLO whatever its body says is refused before decoding
        (``shed``)."""
        outcome = self.outcome
        if not self._judged and (refusal := self.shed()) is not None:
            # the refusals of one loop iteration share this error: raised again, it would keep each
            # raise's frames (and their requests) in its traceback
            raise refusal.with_traceback(None)
        try:
            request = decoder(data)
            check_sizes(request, self._service.limits)
        except BaseException:
            outcome.request_id = outcome.request_id or new_request_id()
            raise
        finally:
            outcome.decode_s = time.perf_counter() - outcome.decode_from
        outcome.request_id = outcome.request_id or request.id or new_request_id()
        return request

    def submit(
        self, request: InferRequest, on_done: Callable[[], None] | None = None
    ) -> asyncio.Future[Tensors]:
        """Queue the request on the version the router picks; the future holds its outputs.

        A model evicted to save memory is loaded first (bounded by the request's deadline), so that
        future takes longer. The deadline is the earlier of the head's (the transport's) and the
        request's ``timeout`` parameter. ``on_done``: called in the loop iteration the batch completes
        the future in (``Batcher.submit``), where its callbacks run an iteration later; not for every
        way the future can end, so its callbacks must still answer.
        """
        self.request = request
        if not self.outcome.request_id:
            self.outcome.request_id = request.id or new_request_id()
        self._arrived()
        try:
            self._outputs = self._queue(request, on_done)
        except ModelEvicted:
            self._outputs = asyncio.ensure_future(self._load_then_queue(request))
        return self._outputs

    def _timeout_s(self, given_s: float | None) -> float | None:
        """Seconds left until the request's deadline: the head's or ``given_s`` (its ``timeout``) from
        when it was first queued, whichever is earlier (None: neither)."""
        deadline = self._deadline
        if deadline is None:
            head_deadline = self._head.deadline
            if given_s is None and head_deadline is None:
                return None
            now = time.monotonic()
            own = now + given_s if given_s is not None else None
            if own is None or (head_deadline is not None and head_deadline < own):
                deadline = head_deadline
            else:
                deadline = own
            self._deadline = deadline
            return None if deadline is None else max(0.0, deadline - now)
        return max(0.0, deadline - time.monotonic())

    def _queue(
        self, request: InferRequest, on_done: Callable[[], None] | None = None
    ) -> asyncio.Future[Tensors]:
        service, outcome = self._service, self.outcome
        parameters = request.parameters
        entry = self._settled
        if entry is None or entry.state is not _READY:  # not picked before decoding, or since unloaded
            key = parameters.get("routing_key") if parameters else None  # the body's wins
            entry = service.router.serve(
                outcome.model, outcome.version, self._head.routing_key if key is None else str(key)
            )
        serving = entry.serving
        if entry.state is not _READY or serving is None:
            raise ModelNotReady(f"model {entry.name!r} version {entry.version} is {entry.state.wire.lower()}")
        backend = serving.backend
        checked = check_request(
            entry.name, backend.inputs, backend.outputs, serving.policy.max_batch_size > 0, request
        )
        outcome.rows, outcome.metrics = checked.rows, entry.recorder.metrics
        if checked.rows > service.limits.max_rows:
            check_rows(checked.rows, service.limits)
        self._model, self._version = entry.name, entry.version  # a fallback's, or another routed model's
        self._output_parameters = serving.output_parameters
        work = Work(
            request.inputs,
            checked.rows,
            checked.output_names,
            request.parameters,
            outcome.request_id,
            outcome.trace.steps,
            outcome.trace.span,
        )
        if parameters:
            priority = parse_priority(parameters, entry.config.default_priority_level)
            timeout_s = self._timeout_s(parse_timeout_s(parameters))
            stream = parse_stream(parameters, self._head.stream_id)
        else:  # most requests set none of them
            priority, timeout_s, stream = entry.config.default_priority_level, self._timeout_s(None), None
        answer = serving.batcher.submit(
            work,
            checked.group,
            priority=priority,
            timeout_s=timeout_s,
            trace=outcome.trace,
            stream=stream,
            received_at=outcome.received_at,
            on_done=on_done,
        )
        if service.shadows.active:
            service.shadows.mirror(outcome.model, entry, request, answer)
        return answer

    async def _load_then_queue(self, request: InferRequest) -> Tensors:
        timeout_s = self._timeout_s(parse_timeout_s(request.parameters))  # fixes the deadline
        await self._service.load_evicted(self.outcome.model, timeout_s)
        self._settled = None  # picked again, now that it is loaded
        return await self._queue(request)  # with what is left until the deadline

    def respond(self, encode: Callable[[InferResponse], T]) -> T:
        """Once the outputs are there: the response, encoded by the transport (timed), recorded as a
        success. Raises (after recording it) the inference's error or the encoder's."""
        assert self._outputs is not None
        assert self.request is not None
        try:
            outputs = self._outputs.result()
            request = self.request
            if request.outputs is not None:
                outputs = {wanted.name: outputs[wanted.name] for wanted in request.outputs}
            response = InferResponse(
                model_name=self._model,
                model_version=self._version,
                outputs=outputs,
                id=request.id,
                parameters=self._substitution() if self._model != self.outcome.model else {},
                requested=request.outputs,
                output_parameters=self._output_parameters,
            )
            started = time.perf_counter()
            encoded = encode(response)
            self.outcome.encode_s = time.perf_counter() - started
        except BaseException as error:
            self.fail(error)
            raise
        self._record(None)
        return encoded

    def _substitution(self) -> dict[str, Any]:
        """Another model answered: ``fallback_from`` (the ladder stepped down) or ``routed_from`` (a
        route's variant) names the model the client asked for."""
        asked = self.outcome.model
        why = "fallback_from" if self._service.router.is_fallback(asked, self._model) else "routed_from"
        return {why: asked}

    def fail(self, error: BaseException) -> None:
        """The request ended with ``error``; recorded unless the call was already recorded."""
        if not self._recorded:
            self._record(error)

    def _record(self, error: BaseException | None) -> None:
        self._arrived()
        self._recorded = True
        if not self.outcome.request_id:
            self.outcome.request_id = new_request_id()
        self.outcome.error = error
        self._service.record(self.outcome)
