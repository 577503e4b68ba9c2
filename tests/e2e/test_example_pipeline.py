"""The image pipeline shipped in examples/ (served by `make serve`), called as the README shows."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import tritonclient.http as httpclient
from PIL import Image

from tests.support import ServerProcess, request


def png(color: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, "PNG")
    return buffer.getvalue()


def jpeg(color: tuple[int, int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (50, 50), color).save(buffer, "JPEG")
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("image", "label"),
    [(png((240, 10, 10)), "red"), (png((10, 200, 20)), "green"), (jpeg((250, 250, 240)), "white")],
)
def test_json_with_base64_images(example_server: ServerProcess, image: bytes, label: str):
    body = {
        "inputs": [
            {"name": "IMAGE", "shape": [1], "datatype": "BYTES", "data": [base64.b64encode(image).decode()]}
        ]
    }
    reply = request(example_server.port, "POST", "/v2/models/image_pipeline/infer", body)
    assert reply.status == 200, reply.body
    outputs = {output["name"]: output for output in reply.json()["outputs"]}
    assert outputs["LABELS"]["shape"] == [1, 3]
    assert outputs["LABELS"]["data"][0] == label
    probabilities = outputs["PROBABILITIES"]["data"]
    assert probabilities == sorted(probabilities, reverse=True)


def test_tritonclient_sends_raw_image_bytes(example_server: ServerProcess):
    client = httpclient.InferenceServerClient(f"127.0.0.1:{example_server.port}")
    try:
        images = np.array([png((20, 20, 240)), jpeg((10, 10, 10))], dtype=object)
        tensor = httpclient.InferInput("IMAGE", [2], "BYTES")
        tensor.set_data_from_numpy(images)  # binary, tritonclient's default
        result = client.infer("image_pipeline", [tensor])
    finally:
        client.close()
    labels = result.as_numpy("LABELS")
    assert labels.shape == (2, 3)
    assert [labels[0, 0], labels[1, 0]] == [b"blue", b"black"]


def test_a_file_that_is_not_an_image_names_the_step(example_server: ServerProcess):
    body = {"inputs": [{"name": "IMAGE", "shape": [1], "datatype": "BYTES", "data": ["bm90IGFuIGltYWdl"]}]}
    reply = request(example_server.port, "POST", "/v2/models/image_pipeline/infer", body)
    assert reply.status == 400
    assert "step 'pre' (model 'decode_image')" in reply.error
    assert "not a PNG or JPEG image" in reply.error
