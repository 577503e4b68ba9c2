"""grpcio's own cost per call, and a streaming client: helpers of bench/run.py's gRPC section.

    python bench/grpc_floor.py serve unary|stream PORT
    python bench/grpc_floor.py stream PORT BODY_FILE STREAMS MESSAGES_PER_STREAM

``serve``: a grpc.aio server on uvloop (as edgeinfer's) whose ModelInfer (``unary``) answers fixed bytes
without parsing the request, or whose ModelStreamInfer (``stream``) answers each message so: the floor
grpcio's Python layer costs per call or per message before any server code runs. It prints ``ready``.

``stream``: opens STREAMS ModelStreamInfer calls, each keeping WINDOW messages in flight, sends the
gRPC-framed request in BODY_FILE MESSAGES_PER_STREAM times on each (after one warm-up round), and prints
``{"messages": N, "seconds": S}`` as JSON. The server's CPU per message is what bench/run.py reports, so
this Python client's own speed does not matter, only that it keeps the server busy.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

SERVICE = "inference.GRPCInferenceService"
ANSWER = b"\x0a\x04tiny"  # a ModelInferResponse with model_name "tiny"
WINDOW = 16


def _same(data: bytes) -> bytes:
    return data


async def _unary(request: bytes, context: Any) -> bytes:
    return ANSWER


async def _stream(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
    async for _ in requests:
        yield ANSWER


async def serve(kind: str, port: int) -> None:
    server = grpc.aio.server()
    if kind == "unary":
        method = "ModelInfer"
        handler = grpc.unary_unary_rpc_method_handler(_unary, _same, _same)
    else:
        method = "ModelStreamInfer"
        handler = grpc.stream_stream_rpc_method_handler(_stream, _same, _same)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {method: handler}),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


async def _one_stream(channel: grpc.aio.Channel, body: bytes, messages: int) -> int:
    call = channel.stream_stream(
        f"/{SERVICE}/ModelStreamInfer", request_serializer=_same, response_deserializer=_same
    )()
    in_flight = asyncio.Semaphore(WINDOW)

    async def write() -> None:
        for _ in range(messages):
            await in_flight.acquire()
            await call.write(body)
        await call.done_writing()

    writer = asyncio.ensure_future(write())
    answered = 0
    async for _ in call:
        answered += 1
        in_flight.release()
    await writer
    return answered


async def stream(port: int, body: bytes, streams: int, messages: int) -> dict[str, float]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await asyncio.gather(*(_one_stream(channel, body, WINDOW) for _ in range(streams)))  # warm up
        started = time.perf_counter()
        counts = await asyncio.gather(*(_one_stream(channel, body, messages) for _ in range(streams)))
        return {"messages": sum(counts), "seconds": time.perf_counter() - started}


def main() -> None:
    import uvloop

    command = sys.argv[1]
    if command == "serve":
        uvloop.run(serve(sys.argv[2], int(sys.argv[3])))
    elif command == "stream":
        body = Path(sys.argv[3]).read_bytes()[5:]  # the file holds one gRPC frame: 5 bytes of header
        result = uvloop.run(stream(int(sys.argv[2]), body, int(sys.argv[4]), int(sys.argv[5])))
        print(json.dumps(result))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
