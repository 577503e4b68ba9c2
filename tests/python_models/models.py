"""Python models used by the tests (imported by the server through model_class)."""

from __future__ import annotations

import asyncio
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
