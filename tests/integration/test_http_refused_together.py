"""Requests the HTTP server reads in one loop iteration after one of them was refused for its wait get
that refusal, each with its own request id, and each is counted (``InferenceService.refused_again``).
The whole server in this process, a real model, requests pipelined on one connection (so that one
read holds them all)."""

from __future__ import annotations

import asyncio
import gc
import json
from pathlib import Path

import uvloop

from edgeinfer import afterwards
from edgeinfer.app import Server
from edgeinfer.config import Config
from tests.support import matmul_model

BODY = json.dumps({"inputs": [{"name": "X", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]})


def infer(request_id: str | None = None) -> bytes:
    head = f"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(BODY)}\r\n"
    if request_id is not None:
        head += f"X-Request-Id: {request_id}\r\n"
    return (head + "\r\n" + BODY).encode()


async def responses(reader: asyncio.StreamReader, count: int) -> list[tuple[int, dict[str, str], bytes]]:
    read = []
    for _ in range(count):
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:] if line)
        read.append((int(lines[0][9:12]), headers, await reader.readexactly(int(headers["content-length"]))))
    return read


def test_requests_read_with_a_refused_one_share_its_refusal_and_are_each_counted(tmp_path: Path):
    config = Config.model_validate(
        {
            "models": {"m": {"model_path": str(matmul_model(tmp_path / "m.onnx")), "slo": {"p99_ms": 20}}},
            "server": {"host": "127.0.0.1", "http_port": 0, "grpc_port": 0},
        }
    )

    async def main() -> tuple[list, list, dict]:
        server = Server(config)
        await server.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.http_port)
            writer.write(infer())
            answered = await responses(reader, 1)  # the cost model has a batch
            assert server.service is not None
            server.service.registry.lag.lag_s = 10.0  # the loop is far behind: every request misses
            writer.write(infer() + infer("mine") + infer() + infer())
            refused = await responses(reader, 4)
            writer.close()
            afterwards.flush()
            counted = dict(server.service.metrics.model("m", "1").requests)
            assert server.local_scope is not None
            overview = await server.local_scope.overview()
            listed = [e for e in overview["errors"] if e["status"] == "rejected"]
            counted["listed"] = len(listed)
            return answered, refused, counted
        finally:
            await server.stop()
            gc.unfreeze()  # started, the server froze what it had (for its own run; not this test run's)

    answered, refused, counted = uvloop.run(main())
    assert answered[0][0] == 200
    assert [status for status, _, _ in refused] == [429] * 4
    assert len({body for _, _, body in refused}) == 1, "one refusal, its message once for all"
    assert "10000.0 ms behind" in json.loads(refused[0][2])["error"]
    ids = [headers["x-request-id"] for _, headers, _ in refused]
    assert ids[1] == "mine", "the client's id comes back"
    assert len(set(ids)) == 4
    assert all(headers["retry-after-ms"] == refused[0][1]["retry-after-ms"] for _, headers, _ in refused)
    # each counted; the first alone listed in the recent errors: the rest counted with it, not one by one
    assert counted == {("http", "success"): 1, ("http", "rejected"): 4, "listed": 1}
