"""A fake backend for tests that need no model: it records every batch and can be slowed or broken."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from edgeinfer.protocol.types import TensorSpec


class FakeBackend:
    """Doubles input ``x`` into output ``y``; ``delay_s`` per call; ``fail_when(inputs)`` raises."""

    platform = "fake"
    execution_provider = "none"

    def __init__(
        self,
        delay_s: float = 0.0,
        fail_when: Callable[[dict[str, np.ndarray]], bool] | None = None,
        drop_a_row: bool = False,
    ) -> None:
        self.inputs = (TensorSpec("x", "FP32", (-1, 2)),)
        self.outputs = (TensorSpec("y", "FP32", (-1, 2)),)
        self.delay_s = delay_s
        self.fail_when = fail_when
        self.drop_a_row = drop_a_row
        self.batches: list[np.ndarray] = []
        self.concurrent = 0
        self.max_concurrent = 0
        self._lock = threading.Lock()
        self.closed = False

    def infer(
        self, inputs: dict[str, np.ndarray], output_names: Sequence[str] | None
    ) -> dict[str, np.ndarray]:
        with self._lock:
            self.batches.append(inputs["x"].copy())
            self.concurrent += 1
            self.max_concurrent = max(self.max_concurrent, self.concurrent)
        try:
            if self.delay_s:
                time.sleep(self.delay_s)
            if self.fail_when is not None and self.fail_when(inputs):
                raise ValueError("the fake model was told to fail")
            y = inputs["x"] * 2
            return {"y": y[:-1] if self.drop_a_row else y}
        finally:
            with self._lock:
                self.concurrent -= 1

    def rows_run(self) -> list[float]:
        return [float(value) for batch in self.batches for value in batch[:, 0]]

    def close(self) -> None:
        self.closed = True
