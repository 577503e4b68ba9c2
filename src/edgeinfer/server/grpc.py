"""The gRPC adapter: ``inference.GRPCInferenceService`` on grpc.aio, the only module importing grpc.

Like the HTTP adapter it only converts: protobuf to core types (``protocol.grpc_codec``), core errors to
status codes (``grpc_errors``, with the same messages as HTTP). Handlers are
registered under Triton's service path with our own message classes (see proto/edgeinfer_grpc_v2.proto
for why), and a body that does not parse as the expected message is answered INVALID_ARGUMENT.

Rollout control (routes, shadows, canaries) is a second service, ``edgeinfer.rollouts.v1.RolloutService``
(proto/edgeinfer_rollouts.proto), whose messages carry the HTTP API's JSON documents in a string field.

Every call first passes the API key check (``auth.Guard``, the key in ``authorization: Bearer`` or
``x-api-key`` metadata) and the limit on concurrent calls (``server.limits.max_grpc_streams``, also
given to clients as HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS per connection). A client's deadline
becomes the request's deadline in the queue, and a cancelled call cancels its
queued request, so neither is run for nobody. A request id sent as ``x-request-id`` metadata is used
(else the request's V2 ``id``) and sent back in the trailing metadata, as HTTP echoes the header; a
refusal for load sends ``grpc-retry-pushback-ms`` there too, as HTTP sends Retry-After (``abort``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from edgeinfer.control.parsing import parse_override
from edgeinfer.control.plane import ControlPlane
from edgeinfer.errors import (
    EdgeInferError,
    InvalidInput,
    RequestCancelled,
    ServerBusy,
)
from edgeinfer.errors import describe as describe_error
from edgeinfer.head import RequestHead
from edgeinfer.protocol import grpc_codec, json_codec
from edgeinfer.protocol.grpc_gen import edgeinfer_grpc_v2_pb2 as pb
from edgeinfer.protocol.grpc_gen import edgeinfer_rollouts_pb2 as rollouts_pb
from edgeinfer.server.auth import GRPC_ROUTES, Guard, presented_key
from edgeinfer.server.grpc_errors import abort
from edgeinfer.service import InferenceCall, InferenceService

log = logging.getLogger(__name__)

SERVICE_NAME = "inference.GRPCInferenceService"
ROLLOUT_SERVICE_NAME = "edgeinfer.rollouts.v1.RolloutService"


class _Malformed:
    """Stands in for a request that did not parse, so the handler can answer with a clear status."""

    def __init__(self, message_name: str, detail: str) -> None:
        self.text = f"the request is not a valid {message_name} protobuf message: {detail or 'cannot parse'}"


def _parser(message_class: Any) -> Callable[[bytes], Any]:
    # inference requests keep large tensors where they arrived (grpc_codec.parse_infer_request)
    from_bytes = (
        grpc_codec.parse_infer_request if message_class is pb.ModelInferRequest else message_class.FromString
    )

    def parse(data: bytes) -> Any:
        try:
            return from_bytes(data)
        except (DecodeError, RuntimeError) as exc:
            return _Malformed(message_class.__name__, str(exc))

    return parse


Handler = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]


class GrpcServer:
    def __init__(
        self,
        service: InferenceService,
        control: ControlPlane,
        max_message_bytes: int,
        guard: Guard,
        max_calls: int = 1024,
        credentials: grpc.ServerCredentials | None = None,
    ) -> None:
        self.service = service
        self.control = control
        self._guard = guard
        self._max_calls = max_calls
        self._active = 0  # calls being handled now (each is an HTTP/2 stream)
        self._credentials = credentials
        self._streams = itertools.count(1)  # names each ModelStreamInfer RPC's own stream
        self._server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", max_message_bytes),
                ("grpc.max_send_message_length", -1),
                ("grpc.max_concurrent_streams", max_calls),
            ]
        )
        self._server.add_generic_rpc_handlers((self._handlers(), self._rollout_handlers()))
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            if self._credentials is not None:
                self.port = self._server.add_secure_port(address, self._credentials)
            else:
                self.port = self._server.add_insecure_port(address)
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {address} for gRPC: {exc}") from None
        if self.port == 0:
            raise OSError(f"cannot listen on {address} for gRPC")
        await self._server.start()
        return self.port

    async def stop(self, grace_s: float = 10.0) -> None:
        await self._server.stop(grace_s)

    def _handlers(self) -> grpc.GenericRpcHandler:
        unary = self._unary
        handlers = {
            "ServerLive": unary("ServerLive", self.server_live, pb.ServerLiveRequest, pb.ServerLiveResponse),
            "ServerReady": unary(
                "ServerReady", self.server_ready, pb.ServerReadyRequest, pb.ServerReadyResponse
            ),
            "ModelReady": unary("ModelReady", self.model_ready, pb.ModelReadyRequest, pb.ModelReadyResponse),
            "ServerMetadata": unary(
                "ServerMetadata", self.server_metadata, pb.ServerMetadataRequest, pb.ServerMetadataResponse
            ),
            "ModelMetadata": unary(
                "ModelMetadata", self.model_metadata, pb.ModelMetadataRequest, pb.ModelMetadataResponse
            ),
            "ModelInfer": unary("ModelInfer", self.model_infer, pb.ModelInferRequest, pb.ModelInferResponse),
            "ModelConfig": unary(
                "ModelConfig", self.model_config, pb.ModelConfigRequest, pb.ModelConfigResponse
            ),
            "ModelStatistics": unary(
                "ModelStatistics",
                self.model_statistics,
                pb.ModelStatisticsRequest,
                pb.ModelStatisticsResponse,
            ),
            "RepositoryIndex": unary(
                "RepositoryIndex",
                self.repository_index,
                pb.RepositoryIndexRequest,
                pb.RepositoryIndexResponse,
            ),
            "RepositoryModelLoad": unary(
                "RepositoryModelLoad",
                self.repository_model_load,
                pb.RepositoryModelLoadRequest,
                pb.RepositoryModelLoadResponse,
            ),
            "RepositoryModelUnload": unary(
                "RepositoryModelUnload",
                self.repository_model_unload,
                pb.RepositoryModelUnloadRequest,
                pb.RepositoryModelUnloadResponse,
            ),
            "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(
                self._stream,
                request_deserializer=_parser(pb.ModelInferRequest),
                response_serializer=pb.ModelStreamInferResponse.SerializeToString,
            ),
        }
        return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)

    def _rollout_handlers(self) -> grpc.GenericRpcHandler:
        rpcs = {
            "ListRoutes": self.list_routes,
            "SetRoute": self.set_route,
            "RemoveRoute": self.remove_route,
            "ListShadows": self.list_shadows,
            "SetShadow": self.set_shadow,
            "RemoveShadow": self.remove_shadow,
            "ListCanaries": self.list_canaries,
            "CanaryAction": self.canary_action,
        }
        handlers = {
            method: self._unary(method, handler, rollouts_pb.RolloutRequest, rollouts_pb.RolloutResponse)
            for method, handler in rpcs.items()
        }
        return grpc.method_handlers_generic_handler(ROLLOUT_SERVICE_NAME, handlers)

    def _admit(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> None:
        """The API key and the concurrent call limit, before a call does anything (raises)."""
        guard = self._guard
        if guard.enabled:
            role, path = GRPC_ROUTES[method]
            metadata = dict(context.invocation_metadata() or ())
            guard.check("grpc", path.format(model=_model_of(request) or "*"), role, _key_of(metadata))
        if self._active >= self._max_calls:
            self.service.metrics.limit_refused("grpc_streams")
            raise ServerBusy(
                f"too many concurrent gRPC calls (server.limits.max_grpc_streams: {self._max_calls})"
            )

    def _unary(
        self, method: str, handler: Handler, request_class: Any, response_class: Any
    ) -> grpc.RpcMethodHandler:
        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, _Malformed):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.text)
            try:
                self._admit(method, request, context)
            except EdgeInferError as error:
                await abort(context, error)
            self._active += 1
            try:
                return await handler(request, context)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                if not isinstance(error, EdgeInferError):
                    log.error("unexpected error in a gRPC call", exc_info=error)
                await abort(context, error)
            finally:
                self._active -= 1

        return grpc.unary_unary_rpc_method_handler(
            call,
            request_deserializer=_parser(request_class),
            response_serializer=response_class.SerializeToString,
        )

    async def _stream(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        try:
            self._admit("ModelStreamInfer", None, context)
        except EdgeInferError as error:
            await abort(context, error)
        self._active += 1
        try:
            async for answer in self.model_stream_infer(requests, context):
                yield answer
        finally:
            self._active -= 1

    # ---- the RPCs ----

    async def server_live(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.service.live())

    async def server_ready(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.service.ready())

    async def model_ready(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self.service.models.ready(request.name, request.version or None))

    async def server_metadata(
        self, request: pb.ServerMetadataRequest, context: Any
    ) -> pb.ServerMetadataResponse:
        return grpc_codec.from_dict(self.service.models.server(), pb.ServerMetadataResponse())

    async def model_metadata(
        self, request: pb.ModelMetadataRequest, context: Any
    ) -> pb.ModelMetadataResponse:
        metadata = self.service.models.metadata(request.name, request.version or None)
        return grpc_codec.from_dict(metadata, pb.ModelMetadataResponse())

    async def model_config(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        config = self.service.models.config(request.name, request.version or None)
        return grpc_codec.from_dict({"config": config}, pb.ModelConfigResponse())

    async def model_statistics(
        self, request: pb.ModelStatisticsRequest, context: Any
    ) -> pb.ModelStatisticsResponse:
        statistics = await self.control.model_statistics(request.name or None, request.version or None)
        return grpc_codec.from_dict(statistics, pb.ModelStatisticsResponse())

    async def repository_index(
        self, request: pb.RepositoryIndexRequest, context: Any
    ) -> pb.RepositoryIndexResponse:
        models = await self.control.repository_index(ready_only=request.ready)
        return grpc_codec.from_dict({"models": models}, pb.RepositoryIndexResponse())

    async def repository_model_load(
        self, request: pb.RepositoryModelLoadRequest, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        parameters = grpc_codec.parameters_to_dict(request.parameters)
        await self.control.load_model(request.model_name, parse_override(parameters.get("config")))
        return pb.RepositoryModelLoadResponse()

    async def repository_model_unload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        await self.control.unload_model(request.model_name)
        return pb.RepositoryModelUnloadResponse()

    # ---- rollout control: the HTTP API's JSON documents (docs/rollouts.md) ----

    async def list_routes(
        self, request: rollouts_pb.RolloutRequest, context: Any
    ) -> rollouts_pb.RolloutResponse:
        return _json_reply({"routes": self.control.routes()})

    async def set_route(
        self, request: rollouts_pb.RolloutRequest, context: Any
    ) -> rollouts_pb.RolloutResponse:
        await self.control.set_route(_named(request), _document(request).get("variants"))
        return await self.list_routes(request, context)

    async def remove_route(
        self, request: rollouts_pb.RolloutRequest, context: Any
    ) -> rollouts_pb.RolloutResponse:
        await self.control.set_route(_named(request), None)
        return _json_reply({})

    async def list_shadows(
        self, request: rollouts_pb.RolloutRequest, context: Any
    ) -> rollouts_pb.RolloutResponse:
        return _json_reply({"shadows": self.control.shadow_configs()})

    async def set_shadow(
        self, request: rollouts_pb.RolloutRequest, context: Any
    ) -> rollouts_pb.RolloutResponse:
        await self.control.set_shadow(_named(request), _document(request))
        return await self.list_shadows(request, context)

    async def remove_shadow(
        self, request: rollouts_pb.RolloutRequest, context: Any
    ) -> rollouts_pb.RolloutResponse:
        await self.control.set_shadow(_named(request), None)
        return _json_reply({})

    async def list_canaries(
        self, request: rollouts_pb.RolloutRequest, context: Any
    ) -> rollouts_pb.RolloutResponse:
        return _json_reply({"canaries": await self.control.canary_states()})

    async def canary_action(
        self, request: rollouts_pb.RolloutRequest, context: Any
    ) -> rollouts_pb.RolloutResponse:
        if not request.action:
            raise InvalidInput("CanaryAction needs an 'action': start, pause, resume, promote or abort")
        return _json_reply(await self.control.canary_action(_named(request), request.action))

    def _call(
        self,
        request: pb.ModelInferRequest,
        metadata: _CallMetadata,
        stream_id: str | None = None,
        deadline: float | None = None,
    ) -> InferenceCall:
        head = RequestHead(
            "grpc",
            request.model_name,
            request.model_version or None,
            metadata.request_id,
            metadata.trace_headers,
            metadata.routing_key,
            stream_id,
            deadline,
        )
        return self.service.call(head)

    async def model_infer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        metadata = _CallMetadata.of(context)
        remaining = context.time_remaining()  # the client's deadline, if it set one
        call = self._call(
            request, metadata, None, None if remaining is None else time.monotonic() + remaining
        )
        given_id = metadata.request_id
        if given_id is not None:  # echoed as HTTP echoes X-Request-ID (metadata costs: only when sent)
            context.set_trailing_metadata((("x-request-id", given_id),))
        try:
            decoded = call.decode(grpc_codec.decode_infer_request, request)
            await call.submit(decoded)  # a cancelled call drops the request
            response = call.respond(grpc_codec.encode_infer_response)
        except asyncio.CancelledError:
            call.fail(RequestCancelled("the client cancelled the call before it was answered"))
            raise
        except BaseException as error:
            call.fail(error)
            raise
        return response

    async def model_stream_infer(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Every request on the stream is queued as it arrives (so they batch) and answered in order.

        A message that fails (malformed, invalid, or failing in the model) is answered with its
        ``error_message`` and the stream goes on. The RPC is a stream of its own: a message with
        ``drop_stale: true`` and no ``stream_id`` belongs to this RPC's stream (its queued predecessor
        is answered as superseded).
        """
        own_stream = f"ModelStreamInfer#{next(self._streams)}"
        # one routing key and one trace context for the stream's every message; each has its own id
        metadata = replace(_CallMetadata.of(context), request_id=None)
        answers: asyncio.Queue[tuple[InferenceCall, asyncio.Future[Any] | BaseException] | str | None]
        answers = asyncio.Queue()

        async def read() -> None:
            try:
                async for request in requests:
                    if isinstance(request, _Malformed):
                        answers.put_nowait(request.text)
                        continue
                    call = self._call(request, metadata, own_stream)
                    try:
                        decoded = call.decode(grpc_codec.decode_infer_request, request)
                        answers.put_nowait((call, call.submit(decoded)))
                    except Exception as error:
                        answers.put_nowait((call, error))
            finally:
                answers.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            while (item := await answers.get()) is not None:
                yield await _stream_answer(item)
        finally:
            reader.cancel()


async def _stream_answer(
    item: tuple[InferenceCall, asyncio.Future[Any] | BaseException] | str,
) -> pb.ModelStreamInferResponse:
    if isinstance(item, str):
        return pb.ModelStreamInferResponse(error_message=item)
    call, outputs = item
    try:
        if isinstance(outputs, BaseException):
            raise outputs
        await outputs
        return pb.ModelStreamInferResponse(infer_response=call.respond(grpc_codec.encode_infer_response))
    except asyncio.CancelledError:
        call.fail(RequestCancelled("the client cancelled the stream before it was answered"))
        raise
    except Exception as error:
        call.fail(error)
        return pb.ModelStreamInferResponse(error_message=describe_error(error))


def _named(request: rollouts_pb.RolloutRequest) -> str:
    if not request.model_name:
        raise InvalidInput("this call needs a 'model_name'")
    return request.model_name


def _document(request: rollouts_pb.RolloutRequest) -> dict[str, Any]:
    return json_codec.loads_object(request.json.encode(), "'json'")


def _json_reply(document: dict[str, Any]) -> rollouts_pb.RolloutResponse:
    return rollouts_pb.RolloutResponse(json=json_codec.dumps(document).decode())


def _model_of(request: Any) -> str:
    """The model a request names (``name`` or ``model_name``), for the path ``open_paths`` sees."""
    return str(getattr(request, "name", "") or getattr(request, "model_name", ""))


def _key_of(metadata: dict[str, Any]) -> str | None:
    authorization, api_key = metadata.get("authorization"), metadata.get("x-api-key")
    return presented_key(
        authorization if isinstance(authorization, str) else None,
        api_key if isinstance(api_key, str) else None,
    )


@dataclass(slots=True)
class _CallMetadata:
    """The metadata of a call that inference reads: ``x-request-id``, ``x-routing-key`` and the W3C
    trace context (``traceparent``, ``tracestate``)."""

    request_id: str | None = None
    routing_key: str | None = None
    traceparent: str | None = None
    tracestate: str | None = None

    @classmethod
    def of(cls, context: Any) -> _CallMetadata:
        found = cls()
        for key, value in context.invocation_metadata() or ():
            if key == "x-request-id":
                found.request_id = str(value)
            elif key == "x-routing-key":
                found.routing_key = str(value)
            elif key == "traceparent":
                found.traceparent = str(value)
            elif key == "tracestate":
                found.tracestate = str(value)
        return found

    @property
    def trace_headers(self) -> tuple[str, str | None] | None:
        return (self.traceparent, self.tracestate) if self.traceparent is not None else None
