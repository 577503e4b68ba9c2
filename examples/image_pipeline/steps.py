"""The Python steps of the example image pipeline (see examples/config.yaml).

IMAGE (PNG/JPEG bytes) -> decode: resize to 32x32, RGB, scale to [0, 1], NCHW
                       -> color_classifier (ONNX): scores for 6 colour classes
                       -> top_labels: the k best classes with their names and probabilities
"""

from __future__ import annotations

import base64
import binascii
import io
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

import edgeinfer

SIZE = 32


class DecodeImage(edgeinfer.Model):
    """PNG/JPEG bytes (raw or base64) -> float32 [N, 3, 32, 32] in [0, 1]. A request whose IMAGE is not
    an image fails alone (400); the others in its batch are answered."""

    inputs = [edgeinfer.TensorSpec("IMAGE", "BYTES", (-1,))]
    outputs = [edgeinfer.TensorSpec("PIXELS", "FP32", (-1, 3, SIZE, SIZE))]

    def predict(
        self, requests: list[edgeinfer.Request]
    ) -> list[dict[str, np.ndarray] | edgeinfer.ModelError]:
        responses: list[dict[str, np.ndarray] | edgeinfer.ModelError] = []
        for request in requests:
            try:
                pixels = np.stack([_decode(blob) for blob in request.inputs["IMAGE"]])
            except (UnidentifiedImageError, OSError, ValueError, binascii.Error) as exc:
                responses.append(edgeinfer.ModelError(f"IMAGE is not a PNG or JPEG image: {exc}"))
                continue
            responses.append({"PIXELS": pixels})
        return responses


def _decode(blob: bytes) -> np.ndarray:
    """Raw PNG/JPEG bytes (binary clients), or the same base64-encoded (JSON clients such as curl)."""
    if not blob.startswith((b"\x89PNG", b"\xff\xd8")):
        blob = base64.b64decode(blob, validate=True)
    with Image.open(io.BytesIO(blob)) as image:
        rgb = image.convert("RGB").resize((SIZE, SIZE), Image.Resampling.BILINEAR)
    return (np.asarray(rgb, dtype=np.float32) / 255.0).transpose(2, 0, 1)


class TopLabels(edgeinfer.Model):
    """Scores -> the k most likely label names (BYTES) and their probabilities, per image."""

    inputs = [edgeinfer.TensorSpec("SCORES", "FP32", (-1, 6))]
    outputs = [
        edgeinfer.TensorSpec("LABELS", "BYTES", (-1, -1)),
        edgeinfer.TensorSpec("PROBABILITIES", "FP32", (-1, -1)),
    ]

    def load(self) -> None:
        labels_file = Path(self.parameters.get("labels", Path(__file__).with_name("labels.txt")))
        self.labels = np.array(
            [line.strip().encode() for line in labels_file.read_text().splitlines()], object
        )
        self.k = int(self.parameters.get("k", 3))

    def predict_batch(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        scores = inputs["SCORES"]
        exp = np.exp(scores - scores.max(axis=1, keepdims=True))
        probabilities = exp / exp.sum(axis=1, keepdims=True)
        best = np.argsort(-probabilities, axis=1)[:, : self.k]
        return {
            "LABELS": self.labels[best],
            "PROBABILITIES": np.take_along_axis(probabilities, best, axis=1).astype(np.float32),
        }
