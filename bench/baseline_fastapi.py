"""The baseline users write by hand: FastAPI + uvicorn, orjson, one ONNX Runtime session per model.

No validation, no batching: parse the V2 JSON, run, answer; two ways, as users write it. ``loop``: all
of it in the ``async`` endpoint, on the event loop (one core for everything). ``threadpool``: the body
read on the loop, the rest in Starlette's thread pool (``run_in_threadpool``, what a plain ``def``
endpoint gets), so the loop reads other requests while ONNX Runtime runs. Started by bench/run.py as

    python bench/baseline_fastapi.py PORT THREADS loop|threadpool MODEL=PATH [MODEL=PATH ...]
"""

from __future__ import annotations

import sys

import numpy as np
import onnxruntime as ort
import orjson
import uvicorn
from fastapi import FastAPI, Request, Response
from starlette.concurrency import run_in_threadpool

DTYPES = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32}


def build_app(paths: dict[str, str], threads: int, mode: str = "loop") -> FastAPI:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    sessions = {name: ort.InferenceSession(path, options) for name, path in paths.items()}
    app = FastAPI()

    def answer(model: str, raw: bytes) -> bytes:
        session = sessions[model]
        document = orjson.loads(raw)
        feed = {
            tensor["name"]: np.array(tensor["data"], dtype=DTYPES[tensor["datatype"]]).reshape(
                tensor["shape"]
            )
            for tensor in document["inputs"]
        }
        names = [output.name for output in session.get_outputs()]
        results = session.run(names, feed)
        body = {
            "model_name": model,
            "outputs": [
                {"name": name, "datatype": "FP32", "shape": list(array.shape), "data": array.reshape(-1)}
                for name, array in zip(names, results, strict=True)
            ],
        }
        return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)

    @app.get("/v2/health/ready")
    async def ready() -> dict[str, bool]:
        return {"ready": True}

    @app.post("/v2/models/{model}/infer")
    async def infer(model: str, request: Request) -> Response:
        raw = await request.body()
        body = await run_in_threadpool(answer, model, raw) if mode == "threadpool" else answer(model, raw)
        return Response(body, media_type="application/json")

    return app


if __name__ == "__main__":
    port, threads, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    if mode not in ("loop", "threadpool"):
        raise SystemExit(f"mode {mode!r}: loop or threadpool")
    models = dict(arg.split("=", 1) for arg in sys.argv[4:])
    uvicorn.run(
        build_app(models, threads, mode),
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
    )
