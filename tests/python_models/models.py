"""Python models used by the tests (imported by the server through model_class)."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import numpy as np

import edgeinfer


class Doubler(edgeinfer.Model):
    """Doubles x; records every batch it saw. A request with parameter fail=true gets its own error;
    x containing 13 raises (fails the batch)."""

    inputs = [edgeinfer.TensorSpec("x", "FP32", (-1, 4))]
    outputs = [edgeinfer.TensorSpec("y", "FP32", (-1, 4))]
    batches: list[int] = []
    lock = threading.Lock()

    def load(self) -> None:
        self.factor = float(self.parameters.get("factor", 2.0))

    def predict(self, requests):
        with self.lock:
            Doubler.batches.append(len(requests))
        if any((request.inputs["x"] == 13).any() for request in requests):
            raise ValueError("thirteen is unlucky")
        responses = []
        for request in requests:
            if request.parameters.get("fail"):
                responses.append(edgeinfer.ModelError("this request asked to fail"))
            else:
                responses.append({"y": request.inputs["x"] * self.factor})
        return responses


class AsyncUpper(edgeinfer.Model):
    inputs = [edgeinfer.TensorSpec("text", "BYTES", (-1,))]
    outputs = [edgeinfer.TensorSpec("upper", "BYTES", (-1,))]

    async def predict(self, requests):
        await asyncio.sleep(0.001)
        return [{"upper": np.array([t.upper() for t in r.inputs["text"]], dtype=object)} for r in requests]


class WrongCount(edgeinfer.Model):
    inputs = [edgeinfer.TensorSpec("x", "FP32", (-1, 4))]
    outputs = [edgeinfer.TensorSpec("y", "FP32", (-1, 4))]

    def predict(self, requests):
        return []


class BatchSum(edgeinfer.Model):
    """Uses predict_batch: gets one concatenated batch."""

    inputs = [edgeinfer.TensorSpec("x", "FP32", (-1, 4))]
    outputs = [edgeinfer.TensorSpec("total", "FP32", (-1, 1))]

    def predict_batch(self, inputs):
        return {"total": inputs["x"].sum(axis=1, keepdims=True)}


class Scale(edgeinfer.Model):
    """y = 2x on [-1, 16]: a pre-processing step."""

    inputs = [edgeinfer.TensorSpec("x", "FP32", (-1, 16))]
    outputs = [edgeinfer.TensorSpec("y", "FP32", (-1, 16))]

    def predict(self, requests):
        if any((request.inputs["x"] == 13).any() for request in requests):
            raise ValueError("thirteen is unlucky")
        return [{"y": request.inputs["x"] * 2} for request in requests]


class Negate(edgeinfer.Model):
    inputs = [edgeinfer.TensorSpec("x", "FP32", (-1, 16))]
    outputs = [edgeinfer.TensorSpec("neg", "FP32", (-1, 16))]

    def predict_batch(self, inputs):
        return {"neg": -inputs["x"]}


class TopK(edgeinfer.Model):
    """Indices of the 3 largest values per row: a post-processing step."""

    inputs = [edgeinfer.TensorSpec("scores", "FP32", (-1, 16))]
    outputs = [edgeinfer.TensorSpec("top", "INT64", (-1, 3))]

    def predict_batch(self, inputs):
        return {"top": np.argsort(-inputs["scores"], axis=1)[:, :3].astype(np.int64)}


class SlowToLoad(edgeinfer.Model):
    """Takes a second to load: for on-demand loading that outlasts a request's timeout."""

    inputs = [edgeinfer.TensorSpec("x", "FP32", (-1, 4))]
    outputs = [edgeinfer.TensorSpec("y", "FP32", (-1, 4))]

    def load(self) -> None:
        time.sleep(1.0)

    def predict_batch(self, inputs):
        return {"y": inputs["x"]}


class DiesWhileLoading(edgeinfer.Model):
    """Loads normally, but ends its process while loading when the file ``parameters['marker']`` exists:
    a worker that crashes every time it is restarted."""

    inputs = [edgeinfer.TensorSpec("x", "FP32", (-1, 4))]
    outputs = [edgeinfer.TensorSpec("y", "FP32", (-1, 4))]

    def load(self) -> None:
        if os.path.exists(self.parameters["marker"]):
            os._exit(7)

    def predict_batch(self, inputs):
        return {"y": inputs["x"]}


class PixelLoop(edgeinfer.Model):
    """CPU-bound pure Python: loops over every pixel of each 64x64 image (holds the GIL throughout).
    Parameter ``die`` true: the process ends in the middle of the batch; ``crash``: a segfault."""

    inputs = [edgeinfer.TensorSpec("image", "UINT8", (-1, 64, 64))]
    outputs = [
        edgeinfer.TensorSpec("histogram", "INT64", (-1, 4)),
        edgeinfer.TensorSpec("pid", "INT64", (-1,)),
    ]

    def load(self) -> None:
        self.loaded_in = os.getpid()

    def predict(self, requests):
        responses = []
        for request in requests:
            if request.parameters.get("die"):
                os._exit(3)
            if request.parameters.get("crash"):
                import ctypes

                ctypes.string_at(0)
            rows = []
            for image in request.inputs["image"]:
                counts = [0, 0, 0, 0]
                for row in image.tolist():
                    for pixel in row:
                        counts[pixel >> 6] += 1
                rows.append(counts)
            responses.append(
                {"histogram": np.array(rows, np.int64), "pid": np.full(len(rows), self.loaded_in, np.int64)}
            )
        return responses


class PositiveOnly(edgeinfer.Model):
    """Checks its input like a careful user's model: zeros (the synthetic warmup) get a ModelError."""

    inputs = [edgeinfer.TensorSpec("x", "FP32", (-1, 4))]
    outputs = [edgeinfer.TensorSpec("y", "FP32", (-1, 4))]

    def predict(self, requests):
        return [
            {"y": np.sqrt(r.inputs["x"])}
            if (r.inputs["x"] > 0).all()
            else edgeinfer.ModelError("x must be positive")
            for r in requests
        ]


class RaisesOnZeros(edgeinfer.Model):
    inputs = [edgeinfer.TensorSpec("x", "FP32", (-1, 4))]
    outputs = [edgeinfer.TensorSpec("y", "FP32", (-1, 4))]

    def predict(self, requests):
        raise ValueError("a bug, not a bad request")


class ForgetsItsOutput(edgeinfer.Model):
    """Answers without its declared output: a broken model, whatever its input."""

    inputs = [edgeinfer.TensorSpec("x", "FP32", (-1, 4))]
    outputs = [edgeinfer.TensorSpec("y", "FP32", (-1, 4))]

    def predict(self, requests):
        return [{} for _ in requests]


class DiesOnPredict(edgeinfer.Model):
    """Ends its own process when asked to predict: with ``kind: process``, an instance that dies."""

    inputs = [edgeinfer.TensorSpec("x", "FP32", (-1, 4))]
    outputs = [edgeinfer.TensorSpec("y", "FP32", (-1, 4))]

    def predict(self, requests):
        os._exit(3)


class Greeter(edgeinfer.Model):
    """No input tensors: reads ``parameters.name`` and answers structured values (JSON documents)."""

    outputs = [
        edgeinfer.TensorSpec("greeting", "BYTES", (-1,), content_type="str"),
        edgeinfer.TensorSpec("length", "INT64", (-1,)),
    ]

    def predict(self, requests):
        answers = []
        for request in requests:
            name = request.parameters.get("name")
            if not isinstance(name, str):
                answers.append(edgeinfer.ModelError("parameter 'name' (a string) is required"))
                continue
            answers.append(
                {
                    "greeting": [{"hello": name, "letters": list(name)}, ["a", "list"], 3, "plain text"],
                    "length": [len(name)],
                }
            )
        return answers


class FailsToLoad(edgeinfer.Model):
    inputs = [edgeinfer.TensorSpec("x", "FP32", (-1, 4))]
    outputs = [edgeinfer.TensorSpec("y", "FP32", (-1, 4))]

    def load(self) -> None:
        raise FileNotFoundError("weights.bin is missing")

    def predict_batch(self, inputs):
        return {"y": inputs["x"]}


class NotAModel:
    """Has the methods but not the base class."""

    def predict(self, requests):
        return []


class ComplexOutput(edgeinfer.Model):
    """A model with a bug: its output holds complex numbers where it declares FP32."""

    inputs = [edgeinfer.TensorSpec("x", "FP32", (-1, 4))]
    outputs = [edgeinfer.TensorSpec("y", "FP32", (-1, 4))]

    def predict(self, requests):
        return [{"y": request.inputs["x"] * 1j} for request in requests]


class Sleeper(edgeinfer.Model):
    """y = x, answered after the request's ``sleep_ms`` parameter: a latency the test chooses."""

    inputs = [edgeinfer.TensorSpec("x", "FP32", (-1, 4))]
    outputs = [edgeinfer.TensorSpec("y", "FP32", (-1, 4))]

    async def predict(self, requests):
        await asyncio.sleep(max(float(request.parameters.get("sleep_ms", 0)) for request in requests) / 1000)
        return [{"y": request.inputs["x"]} for request in requests]
