"""The benchmark's pure-Python model: CPU-bound Python code that holds the GIL the whole time.

``BoxBlur`` blurs a 64x64 grayscale image with a 3x3 box filter and returns the blurred image's
histogram, all in Python loops over the pixels (the pre-processing people write in Python). Served
with ``kind: thread`` it competes with request decoding for the GIL; with ``kind: process`` and
``instances: 2`` it runs in two child processes.
"""

from __future__ import annotations

import numpy as np

import edgeinfer

SIZE = 64


class BoxBlur(edgeinfer.Model):
    inputs = [edgeinfer.TensorSpec("image", "UINT8", (-1, SIZE, SIZE))]
    outputs = [edgeinfer.TensorSpec("histogram", "INT64", (-1, 8))]

    def predict(self, requests: list[edgeinfer.Request]) -> list[dict[str, np.ndarray]]:
        return [
            {"histogram": np.array([_blurred_histogram(image.tolist()) for image in request.inputs["image"]])}
            for request in requests
        ]


def _blurred_histogram(pixels: list[list[int]]) -> list[int]:
    counts = [0] * 8
    for y in range(1, SIZE - 1):
        above, row, below = pixels[y - 1], pixels[y], pixels[y + 1]
        for x in range(1, SIZE - 1):
            total = (
                above[x - 1] + above[x] + above[x + 1]
                + row[x - 1] + row[x] + row[x + 1]
                + below[x - 1] + below[x] + below[x + 1]
            )  # fmt: skip
            counts[(total // 9) >> 5] += 1
    return counts
