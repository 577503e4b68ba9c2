"""ONNX Runtime's CPU provider against OpenVINO's CPU plugin on the same models, in-process and served.

    python bench/runtimes.py [--duration 5]

In-process: rows/s of each runtime at batch 1 and 8 (`tiny`, `cnn`: bench/models.py), one thread. Served:
edgeinfer with `backend: onnxruntime` and with `backend: openvino` (same batching settings as the main
benchmark's), binary HTTP driven by wrk at concurrency 1 and 8. Needs the openvino extra.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import openvino as ov
import run  # bench/run.py (the same models, bodies, server process and wrk driver)


def inprocess_ort(path: Path, batch: np.ndarray, seconds: float) -> float:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return _rate(lambda: session.run(None, {name: batch}), len(batch), seconds)


def inprocess_openvino(path: Path, batch: np.ndarray, seconds: float) -> float:
    core = ov.Core()
    compiled = core.compile_model(
        core.read_model(str(path)), "CPU", {"INFERENCE_NUM_THREADS": 1, "PERFORMANCE_HINT": "LATENCY"}
    )
    request = compiled.create_infer_request()
    return _rate(lambda: request.infer({0: batch}), len(batch), seconds)


def _rate(call: Any, rows: int, seconds: float) -> float:
    call()
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        call()
        done += rows
    return done / (time.perf_counter() - started)


def served(
    paths: dict[str, Path], backend: str, duration: float, limits: dict[str, dict[int, float]]
) -> list:
    config = json.loads(run.edgeinfer_config(paths, 1).read_text())
    for name in ("tiny", "cnn"):
        config["models"][name]["backend"] = backend
    path = run.WORK / f"openvino-{backend}.yaml"
    path.write_text(json.dumps(config))
    server = run.edgeinfer_process(path, 1)
    rows = []
    try:
        for model in ("tiny", "cnn"):
            for concurrency in (1, 8):
                row = run.measure(
                    server, f"edgeinfer/{backend}", model, "binary", run.binary_body(model), concurrency,
                    duration, False, limits[model],
                )  # fmt: skip
                rows.append(row)
                print(run.table_line(row), flush=True)
    finally:
        server.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=5.0)
    args = parser.parse_args()
    run.WORK.mkdir(parents=True, exist_ok=True)
    paths = run.build_models()
    lines = [
        "| model | batch | ONNX Runtime rows/s | OpenVINO rows/s | OpenVINO / ONNX Runtime |",
        "|---|---|---|---|---|",
    ]
    limits: dict[str, dict[int, float]] = {}
    for model in ("tiny", "cnn"):
        limits[model] = {}
        for size in (1, 8):
            _, sample = run.sample(model, size)
            onnxruntime_rate = inprocess_ort(paths[model], sample, 2.0)
            openvino_rate = inprocess_openvino(paths[model], sample, 2.0)
            limits[model][size] = onnxruntime_rate
            lines.append(
                f"| {model} | {size} | {onnxruntime_rate:,.0f} | {openvino_rate:,.0f} | "
                f"{openvino_rate / onnxruntime_rate:.2f} |"
            )
    print("\n".join(lines), flush=True)
    rows = served(paths, "onnxruntime", args.duration, limits) + served(
        paths, "openvino", args.duration, limits
    )
    print("\n" + "\n".join(lines) + "\n\n" + run.table(rows))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (run.RESULTS / f"openvino-{stamp}.json").write_text(
        json.dumps({"inprocess": lines, "served": [vars(r) for r in rows]}, indent=1)
    )


if __name__ == "__main__":
    main()
