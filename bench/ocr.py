"""The OCR pipeline's numbers (issue: models that fit the box): FP16/INT8 accuracy and speed, and the
served pipeline against the same work done by hand in one process.

    python bench/ocr.py [--lines 360] [--seconds 20] [--skip-variants] [--skip-serving]

1. Variants: ``edgeinfer optimize``'s converters make FP16 and INT8 (dynamic; static, calibrated on
   12 other rendered images) copies of the detector and the recogniser, one model converted at a time,
   and an FP16 detector whose DB head (the 10 operators after the feature pyramid's Concat) stays
   FP32 (``--fp16-keep-tail 10``). 360 lines by default: with 120, the 99.5 % FP16 target allowed no
   differing line at all, so one knife-edge line decided it.
   Each variant reads ``--lines`` rendered lines of known text (three to an image, DejaVu Sans 32 px,
   words and numbers from a fixed vocabulary and seed) through the whole OCR chain in-process;
   reported: exact-text agreement with FP32 per line (the variant's text at the line's position
   equals FP32's; spaces are left out of both, as the recogniser drops them at will), the share of
   images read exactly right against the rendered text (the same way), size of det+rec, time per line.
2. Serving: ``edgeinfer serve --config examples/ocr/config.yaml`` over binary HTTP (Triton's binary
   tensor extension, what tritonclient sends) at concurrency 4, against the same three ONNX Runtime
   sessions (same options) and the same Python steps called by hand in one process from 4 threads.
   Images: three rendered lines each.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

ROOT = Path(__file__).resolve().parent.parent
OCR = ROOT / "examples" / "ocr"
sys.path.insert(0, str(OCR))
sys.path.insert(0, str(ROOT / "src"))

import steps  # noqa: E402  (examples/ocr)
from render import render  # noqa: E402

import edgeinfer  # noqa: E402

VOCABULARY = (
    "edge inference server model batch queue latency order invoice serial pressure battery gate sensor "
    "camera frame device update status voltage motor valve pump line station total"
)
WORDS = VOCABULARY.split()


def rendered_lines(count: int, seed: int = 11) -> list[tuple[str, bytes]]:
    """(text, PNG) pairs: two to four words and numbers, at 24, 32 or 40 px."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(2, 4)):
            choice = rng.random()
            if choice < 0.5:
                word = rng.choice(WORDS)
                parts.append(word.capitalize() if rng.random() < 0.4 else word)
            elif choice < 0.8:
                parts.append(str(rng.randint(0, 99999)))
            else:
                parts.append(f"{rng.randint(0, 999)}.{rng.randint(0, 99):02d}")
        text = " ".join(parts)
        out.append((text, render([text], size=rng.choice((24, 32, 40)))))
    return out


def session(path: Path, threads: int = 2) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class ByHand:
    """The OCR chain in one process: the example's own Python steps (examples/ocr/steps.py) called
    directly, and three sessions; no server, no queues."""

    def __init__(self, det: Path, cls: Path, rec: Path) -> None:
        self.det, self.cls, self.rec = session(det), session(cls), session(rec)
        self.pre, self.boxes, self.crops = steps.OcrPreprocess(), steps.OcrBoxes(), steps.OcrCrops()
        self.decode = steps.OcrDecode()
        self.decode.load()

    def read(self, png: bytes) -> list[str]:
        request = edgeinfer.Request({"IMAGE": np.array([png], dtype=object)})
        pre = self.pre.predict([request])[0]
        assert isinstance(pre, dict), pre
        (probability,) = self.det.run(None, {"x": pre["DET_INPUT"]})
        boxes = self.boxes.predict_batch({"MAP": probability, "ORIGINAL": pre["ORIGINAL"]})
        (direction,) = self.cls.run(None, {"x": boxes["CLS_INPUT"]})
        crops = self.crops.predict_batch(
            {"DIRECTION": direction, "BOXES": boxes["BOXES"], "ORIGINAL": pre["ORIGINAL"]}
        )
        (probabilities,) = self.rec.run(None, {"x": crops["REC_INPUT"]})
        decoded = self.decode.predict_batch(
            {"PROBABILITIES": probabilities, "BOXES": boxes["BOXES"], "PADDING": pre["PADDING"]}
        )
        return [text.decode() for text in decoded["TEXT"]]


def fetch_models() -> Path:
    subprocess.run([sys.executable, str(ROOT / "scripts" / "fetch_ocr_models.py")], check=True)
    return OCR / "models"


# ---- 1. variants ----


VARIANTS = (("det", "fp16"), ("det", "fp16 head fp32"), ("rec", "fp16"), ("det", "int8 static"),
            ("rec", "int8 dynamic"), ("rec", "int8 static"))  # fmt: skip
DET_HEAD = (
    10  # PP-OCRv4's detector: Conv, BN, ReLU, ConvTranspose, Add, BN, ReLU, ConvTranspose, Add, Sigmoid
)
# (det int8 dynamic equals FP32: dynamic quantization takes MatMul and Gemm, and the detector has none)


def make_variants(models: Path, work: Path, calibration: list[bytes]) -> dict[str, dict[str, Path]]:
    """FP32, and one model at a time converted: what each conversion costs the text is then its own."""
    from edgeinfer.optimize import Progress, to_fp16, to_int8

    fp32 = {part: models / f"ocr_{part}" / "1" / "model.onnx" for part in ("det", "cls", "rec")}
    variants: dict[str, dict[str, Path]] = {"fp32": fp32}
    progress = Progress()
    for part, precision in VARIANTS:
        target = work / f"{part}-{precision.replace(' ', '-')}.onnx"
        if precision.startswith("fp16"):
            tail = DET_HEAD if precision == "fp16 head fp32" else 0
            to_fp16(fp32[part], target, keep_io_types=True, fp32_tail=tail)
        else:
            mode = precision.split()[1]
            samples = _calibration_inputs(part, calibration, models) if mode == "static" else None
            to_int8(fp32[part], target, mode, samples, progress)
        variants[f"{part} {precision}"] = {**fp32, part: target}
    return variants


def _calibration_inputs(part: str, images: list[bytes], models: Path) -> list[dict[str, np.ndarray]]:
    """What the detector or the recogniser sees for ``images``, as the FP32 chain makes it."""
    fp32 = ByHand(*(models / name / "1" / "model.onnx" for name in ("ocr_det", "ocr_cls", "ocr_rec")))
    samples = []
    for png in images:
        bgr, _ = steps.letterboxed(steps.decode_image(png))
        det_input = steps.det_input(bgr)
        if part == "det":
            samples.append({"x": det_input})
            continue
        (probability,) = fp32.det.run(None, {"x": det_input})
        boxes, _ = steps.db_boxes(probability[0, 0], bgr.shape[:2])
        for box in boxes:
            piece = steps.crop(bgr, box)
            width = int(steps.REC_HEIGHT * max(steps.REC_MIN_RATIO, piece.shape[1] / piece.shape[0]))
            samples.append({"x": steps.fitted(piece, steps.REC_HEIGHT, width)[np.newaxis]})
    return samples


def measure_variants(lines: int) -> tuple[list[dict[str, Any]], str]:
    """Each variant reads ``lines`` rendered lines, three to an image; a line agrees when the variant's
    text at its position equals FP32's (spaces left out of both: the recogniser drops them at will)."""
    models = fetch_models()
    texts = [text for text, _ in rendered_lines(lines)]
    pages = [texts[i : i + 3] for i in range(0, len(texts), 3)]
    images = [render(page) for page in pages]
    calibration = [render([text for text, _ in rendered_lines(3, seed=100 + i)]) for i in range(12)]
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        variants = make_variants(models, Path(folder), calibration)
        reference: list[list[str]] = []
        for label, paths in variants.items():
            reader = ByHand(paths["det"], paths["cls"], paths["rec"])
            reader.read(images[0])  # the first run allocates
            started = time.perf_counter()
            read = [[text.replace(" ", "") for text in reader.read(png)] for png in images]
            seconds = (time.perf_counter() - started) / len(texts)
            if label == "fp32":
                reference = read
            same = sum(
                index < len(mine) and mine[index] == theirs
                for mine, ref in zip(read, reference, strict=True)
                for index, theirs in enumerate(ref)
            )
            compared = sum(len(ref) for ref in reference)
            correct = sum(
                "".join(mine) == "".join(page).replace(" ", "")
                for mine, page in zip(read, pages, strict=True)
            )
            size = paths["det"].stat().st_size + paths["rec"].stat().st_size
            rows.append(
                {"variant": label, "lines": len(texts), "fp32_lines": compared,
                 "agree_with_fp32": same / compared, "pages_correct": correct / len(pages),
                 "det_rec_mb": size / 1e6, "ms_per_line": seconds * 1000}
            )  # fmt: skip
    fp32 = rows[0]
    table = [
        f"{len(texts)} rendered lines, {len(pages)} images; FP32 read {fp32['fp32_lines']} lines",
        "| variant | exact-text agreement with FP32 | images read right | det+rec size | ms per line "
        "| speed-up |",
        "|---|---|---|---|---|---|",
    ]
    table += [
        f"| {row['variant']} | {row['agree_with_fp32']:.1%} | {row['pages_correct']:.1%} | "
        f"{row['det_rec_mb']:.1f} MB (x{row['det_rec_mb'] / fp32['det_rec_mb']:.2f}) | "
        f"{row['ms_per_line']:.0f} | x{fp32['ms_per_line'] / row['ms_per_line']:.2f} |"
        for row in rows
    ]
    return rows, "\n".join(table)


# ---- 2. serving against by hand ----


def binary_body(png: bytes) -> tuple[bytes, int]:
    """A V2 request with IMAGE as a binary tensor (4-byte length, then the bytes), as tritonclient sends."""
    header = json.dumps(
        {"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1],
                     "parameters": {"binary_data_size": len(png) + 4}}],
         "outputs": [{"name": "TEXT", "parameters": {"binary_data": False}}]}
    ).encode()  # fmt: skip
    return header + len(png).to_bytes(4, "little") + png, len(header)


def closed_loop(work: Callable[[int], None], concurrency: int, seconds: float) -> tuple[float, float]:
    """``work(i)`` from ``concurrency`` threads for ``seconds``; (items per second, p50 seconds)."""
    latencies: list[float] = []
    stop = time.monotonic() + seconds
    lock = threading.Lock()

    def loop(index: int) -> None:
        item = index
        while time.monotonic() < stop:
            started = time.perf_counter()
            work(item)
            with lock:
                latencies.append(time.perf_counter() - started)
            item += concurrency

    started = time.perf_counter()
    threads = [threading.Thread(target=loop, args=(i,)) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    return len(latencies) / elapsed, statistics.median(latencies)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def measure_serving(seconds: float, concurrency: int = 4) -> tuple[dict[str, Any], str]:
    models = fetch_models()
    images = [render(lines) for lines in _three_line_texts(16)]
    by_hand = ByHand(*(models / name / "1" / "model.onnx" for name in ("ocr_det", "ocr_cls", "ocr_rec")))
    by_hand.read(images[0])

    def read(index: int) -> None:
        by_hand.read(images[index % len(images)])

    hand_rate, hand_p50 = closed_loop(read, concurrency, seconds)
    port = free_port()
    log = open(tempfile.mkstemp(suffix=".log")[1], "wb")  # noqa: SIM115
    server = subprocess.Popen(
        [sys.executable, "-m", "edgeinfer", "serve", "--config", str(OCR / "config.yaml"), "--http-port",
         str(port), "--no-grpc", "--metrics-port", str(free_port()), "--host", "127.0.0.1"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )  # fmt: skip
    try:
        _wait_ready(port)
        bodies = [binary_body(png) for png in images]
        local = threading.local()

        def send(index: int) -> None:
            connection = getattr(local, "connection", None)
            if connection is None:
                connection = local.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            body, header_length = bodies[index % len(bodies)]
            headers = {"Inference-Header-Content-Length": str(header_length)}
            connection.request("POST", "/v2/models/ocr/infer", body, headers)
            reply = connection.getresponse()
            data = reply.read()
            if reply.status != 200:
                raise RuntimeError(f"{reply.status}: {data[:300]!r}")

        send(0)
        served_rate, served_p50 = closed_loop(send, concurrency, seconds)
    finally:
        server.terminate()
        server.wait()
        log.close()
    result = {
        "concurrency": concurrency, "by_hand_images_per_s": hand_rate, "by_hand_p50_s": hand_p50,
        "served_images_per_s": served_rate, "served_p50_s": served_p50, "ratio": served_rate / hand_rate,
    }  # fmt: skip
    text = (
        f"OCR pipeline, binary HTTP, concurrency {concurrency}: {served_rate:.2f} images/s (p50 "
        f"{served_p50 * 1000:.0f} ms) served vs {hand_rate:.2f} images/s (p50 {hand_p50 * 1000:.0f} ms) by "
        f"hand in one process: {result['ratio']:.2f}x (target >= 0.8)"
    )
    return result, text


def _three_line_texts(count: int) -> list[list[str]]:
    lines = [text for text, _ in rendered_lines(count * 3, seed=5)]
    return [lines[i : i + 3] for i in range(0, len(lines), 3)]


def _wait_ready(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            connection.request("GET", "/v2/health/ready")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit("the OCR server did not become ready")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=int, default=360)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--skip-variants", action="store_true")
    parser.add_argument("--skip-serving", action="store_true")
    args = parser.parse_args()
    document: dict[str, Any] = {}
    if not args.skip_variants:
        document["variants"], table = measure_variants(args.lines)
        print(table, flush=True)
    if not args.skip_serving:
        document["serving"], text = measure_serving(args.seconds)
        print(text)
    results = ROOT / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / f"ocr-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(document, indent=1))


if __name__ == "__main__":
    main()
