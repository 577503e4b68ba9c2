"""Seed 001's image classification service, ported to edgeinfer.

The seed's ``Service`` takes no input tensors: each request names an image by URL in its parameters
(``{"parameters": {"url": "https://..."}}``), the service downloads and preprocesses it, classifies it
and answers the top 5 classes as ``{"label", "score"}`` pairs. The seed runs a torchvision ResNet-18
with weights from the hub; with no hub here, the classifier is the example repository's ONNX colour
classifier (``examples/model_repository/color_classifier``, six colour classes), run with ONNX Runtime
inside the service, so the flow is the seed's: URL -> download -> preprocess -> model -> top 5.

Each top-5 entry is one element of the BYTES output ``top5``: a JSON document, tagged with MLServer's
``content_type: "str"`` (what its StringCodec decodes); a client reads it with ``json.loads``.
"""

from __future__ import annotations

import io
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

import edgeinfer

HERE = Path(__file__).resolve().parent
MODEL = HERE.parent / "model_repository" / "color_classifier" / "1" / "model.onnx"
LABELS = HERE.parent / "image_pipeline" / "labels.txt"
SIZE = 32


class ImageClassificationService(edgeinfer.Model):
    """Input: an image URL in the request parameters. Output: the top 5 classes and their scores."""

    inputs = ()  # no tensors: everything comes from request.parameters
    outputs = [edgeinfer.TensorSpec("top5", "BYTES", (-1,), content_type="str")]

    def load(self) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(str(MODEL), options)
        self.categories = LABELS.read_text().split()

    def predict(self, requests: list[edgeinfer.Request]) -> list[dict | edgeinfer.ModelError]:
        """A batch of requests; each image is fetched and checked alone, then one model run for all."""
        images, answers = [], []
        for request in requests:
            url = request.parameters.get("url")
            if not url:
                answers.append(edgeinfer.ModelError("Missing 'url' in request parameters"))
                continue
            try:
                images.append(self.preprocess(self.download(url)))
                answers.append(None)
            except (OSError, UnidentifiedImageError, ValueError) as exc:
                answers.append(edgeinfer.ModelError(f"cannot use the image at {url}: {exc}"))
        if images:
            scores = self.session.run(None, {"PIXELS": np.stack(images)})[0]
            results = iter(self.top5(row) for row in scores)
            answers = [next(results) if answer is None else answer for answer in answers]
        return answers

    def download(self, url: str) -> bytes:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.read()

    def preprocess(self, data: bytes) -> np.ndarray:
        with Image.open(io.BytesIO(data)) as image:
            rgb = image.convert("RGB").resize((SIZE, SIZE), Image.Resampling.BILINEAR)
        return (np.asarray(rgb, dtype=np.float32) / 255.0).transpose(2, 0, 1)

    def top5(self, scores: np.ndarray) -> dict[str, list[dict[str, object]]]:
        probabilities = np.exp(scores - scores.max())
        probabilities /= probabilities.sum()
        best = np.argsort(-probabilities)[:5]
        return {
            "top5": [
                {"label": self.categories[index], "score": round(float(probabilities[index]), 6)}
                for index in best
            ]
        }


class ImageClassificationServiceV2(ImageClassificationService):
    """Version 2.0 of the seed's A/B example: crops the centre square before resizing, so an image's
    borders weigh less in its colour."""

    def preprocess(self, data: bytes) -> np.ndarray:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            side = min(width, height)
            left, top = (width - side) // 2, (height - side) // 2
            square = image.convert("RGB").crop((left, top, left + side, top + side))
            rgb = square.resize((SIZE, SIZE), Image.Resampling.BILINEAR)
        return (np.asarray(rgb, dtype=np.float32) / 255.0).transpose(2, 0, 1)
