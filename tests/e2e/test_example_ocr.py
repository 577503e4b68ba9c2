"""The OCR example (examples/ocr): PP-OCRv4 detection -> direction -> recognition behind one pipeline,
called as the README shows (curl with base64 JSON, tritonclient with binary tensors, gRPC) on the
bundled image and on freshly rendered lines whose text is known."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from PIL import Image

from tests.support import ROOT, ServerProcess, needs_tool, request

OCR = ROOT / "examples" / "ocr"
sys.path.insert(0, str(OCR))
from render import render  # noqa: E402  (examples/ocr is not a package)

SAMPLE_TEXT = ["Edge inference 2026", "Order 4417 shipped", "Total: 98.50 EUR"]


def squeezed(lines: list[str]) -> str:
    """The recogniser (trained on Chinese and English) often drops spaces: compare without them."""
    return "".join(lines).replace(" ", "")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    fetched = subprocess.run(
        [sys.executable, "scripts/fetch_ocr_models.py"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert fetched.returncode == 0, fetched.stderr
    server = ServerProcess(["--config", str(OCR / "config.yaml"), "--host", "127.0.0.1"])
    server.start(tmp_path_factory.mktemp("ocr") / "log", timeout=60)
    yield server
    server.stop()


def texts(document: dict) -> list[str]:
    return next(output["data"] for output in document["outputs"] if output["name"] == "TEXT")


@needs_tool("curl")
def test_the_readme_curl_call_reads_the_bundled_image(server: ServerProcess, tmp_path: Path):
    body = {
        "inputs": [
            {
                "name": "IMAGE",
                "datatype": "BYTES",
                "shape": [1],
                "data": [base64.b64encode((OCR / "sample.png").read_bytes()).decode()],
            }
        ]
    }
    (tmp_path / "body.json").write_text(json.dumps(body))
    result = subprocess.run(
        ["curl", "-s", "-H", "Content-Type: application/json", "-d", f"@{tmp_path / 'body.json'}",
         f"http://127.0.0.1:{server.port}/v2/models/ocr/infer"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    document = json.loads(result.stdout)
    assert squeezed(texts(document)) == squeezed(SAMPLE_TEXT)
    boxes = next(output for output in document["outputs"] if output["name"] == "BOXES")
    assert boxes["shape"] == [len(texts(document)), 4]


def test_tritonclient_binary_and_grpc_read_rendered_lines(server: ServerProcess):
    lines = ["Invoice 20931", "Pressure 4.7 bar", "Serial AB-7731", "Battery 88 percent", "Gate 12 open"]
    image = render(lines)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    data = httpclient.InferInput("IMAGE", [1], "BYTES")
    data.set_data_from_numpy(np.array([image], dtype=object), binary_data=True)
    result = client.infer("ocr", [data], outputs=[httpclient.InferRequestedOutput("TEXT", binary_data=True)])
    read = [text.decode() for text in result.as_numpy("TEXT")]
    assert squeezed(read) == squeezed(lines), read
    client.close()
    over_grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    data = grpcclient.InferInput("IMAGE", [1], "BYTES")
    data.set_data_from_numpy(np.array([image], dtype=object))
    read_grpc = [text.decode() for text in over_grpc.infer("ocr", [data]).as_numpy("TEXT")]
    over_grpc.close()
    assert read_grpc == read


def test_an_image_without_text_has_no_lines_and_a_non_image_is_refused(server: ServerProcess, tmp_path: Path):
    blank = tmp_path / "blank.png"
    Image.new("RGB", (300, 100), "white").save(blank)
    body = {"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1],
                        "data": [base64.b64encode(blank.read_bytes()).decode()]}]}  # fmt: skip
    reply = request(server.port, "POST", "/v2/models/ocr/infer", body)
    assert reply.status == 200, reply.body
    assert texts(reply.json()) == []
    body["inputs"][0]["data"] = ["bm90IGFuIGltYWdl"]  # base64 of "not an image"
    refused = request(server.port, "POST", "/v2/models/ocr/infer", body)
    assert refused.status == 400
    assert refused.error.startswith("pipeline 'ocr' step 'pre' (model 'ocr_pre'): IMAGE is not a PNG or JPEG")
