"""A fake backend for tests that need no model: it records every batch and can be held, slowed or broken."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection

import numpy as np

from edgeinfer.protocol.types import TensorSpec
from edgeinfer.runners import Runner, RunnerSettings
from edgeinfer.runners.arrays import concatenating
from edgeinfer.runners.thread import ThreadRunner


class FakeBackend:
    """Doubles input ``x`` into output ``y``; ``delay_s`` per call; ``fail_when(inputs)`` raises.

    With ``hold=True`` every call waits in the model until ``release()``; ``entered`` counts calls
    that reached the model, so a test can wait for "the batch is running" instead of sleeping.
    """

    platform = "fake"
    config_platform = "fake"
    config_backend = "fake"
    execution_provider = "none"
    warmup_applies = True

    def __init__(
        self,
        delay_s: float = 0.0,
        fail_when: Callable[[dict[str, np.ndarray]], bool] | None = None,
        drop_a_row: bool = False,
        hold: bool = False,
    ) -> None:
        self.inputs = (TensorSpec("x", "FP32", (-1, 2)),)
        self.outputs = (TensorSpec("y", "FP32", (-1, 2)),)
        self.delay_s = delay_s
        self.fail_when = fail_when
        self.drop_a_row = drop_a_row
        self.batches: list[np.ndarray] = []
        self.threads: list[int] = []  # the thread each batch ran in
        self.concurrent = 0
        self.max_concurrent = 0
        self._lock = threading.Condition()
        self._held = hold
        self.entered = 0
        self.closed = False

    def runner(self, settings: RunnerSettings) -> Runner:
        return ThreadRunner(concatenating("fake", self.infer, settings.batching), settings)

    def infer(
        self, inputs: dict[str, np.ndarray], output_names: Collection[str] | None
    ) -> dict[str, np.ndarray]:
        with self._lock:
            self.batches.append(inputs["x"].copy())
            self.threads.append(threading.get_ident())
            self.concurrent += 1
            self.max_concurrent = max(self.max_concurrent, self.concurrent)
            self.entered += 1
            self._lock.notify_all()
            while self._held:
                self._lock.wait()
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

    def wait_entered(self, count: int, timeout: float = 5.0) -> None:
        """Block until ``count`` calls have reached the model."""
        with self._lock:
            if not self._lock.wait_for(lambda: self.entered >= count, timeout):
                raise AssertionError(f"only {self.entered} of {count} calls reached the model")

    def release(self) -> None:
        with self._lock:
            self._held = False
            self._lock.notify_all()

    def hold(self) -> None:
        """Calls from now on wait in the model until ``release()``."""
        with self._lock:
            self._held = True

    def rows_run(self) -> list[float]:
        return [float(value) for batch in self.batches for value in batch[:, 0]]

    def close(self) -> None:
        self.closed = True
