"""What every runner takes and gives: the work of one batch, its results, and where its time went."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from edgeinfer.runners.cost import CostModel

Tensors = dict[str, np.ndarray]
# One request's answer: its outputs, or the error that fails this request alone.
Result = Tensors | BaseException


@dataclass(slots=True, eq=False)
class Work:
    """One request as a runner sees it: validated inputs and what the request asked for."""

    inputs: Tensors
    rows: int = 1
    output_names: frozenset[str] | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    request_id: str | None = None
    steps: dict[str, float] | None = None  # a pipeline puts each step's seconds here (the caller's trace)
    span: object | None = None  # the request's trace span (tracing on): a pipeline's steps continue it


@dataclass(slots=True)
class BatchTimes:
    """Where one executed batch spent its time (Triton's compute_input / compute_infer / compute_output)."""

    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0
    handover_ns: int = 0  # from hand-over to a worker thread until the thread started it (not compute)

    @property
    def total_s(self) -> float:
        return (self.input_ns + self.infer_ns + self.output_ns) / 1e9


@dataclass(slots=True)
class BatchResult:
    """One result per request of the batch, in order, and the batch's timing."""

    results: list[Result]
    times: BatchTimes


@dataclass(frozen=True, slots=True)
class RunnerSettings:
    """How a model version may execute, from its config.

    ``concurrency`` batches compute at once; ``prefetch`` more may be handed over early and wait for a
    compute slot. ``inline_max_s``: a batch predicted to take at most this long runs on the event loop
    (runners that allow it); None: as long as the measured hop to a worker thread (``inline.py``); 0:
    never. ``batching``: requests are merged along the first dimension, so outputs
    are split back by rows (off when the model's first dimension is not a batch dimension).
    """

    name: str
    concurrency: int = 1
    prefetch: int = 0
    inline_max_s: float | None = 0.0
    batching: bool = True


class Runner(Protocol):
    """Executes batches of one model version.

    ``run`` is called on the event loop and returns a future (awaitable) of the batch's results; a runner
    that executed the batch inline returns its results themselves (and raises its failure): no future
    to make, complete and read for a batch that is done already. A whole-batch failure is the future's
    exception; a per-request failure is an exception in that request's place. At most ``capacity``
    batches are handed to a runner at once (those beyond its ``concurrency`` wait inside it, ready to start).
    ``close`` is awaited once, after the last batch finished.
    """

    capacity: int
    concurrency: int
    cost: CostModel

    def run(self, batch: list[Work]) -> asyncio.Future[BatchResult] | BatchResult: ...

    async def close(self) -> None: ...


# A synchronous batch function: runs one batch and fills in ``times``.
Execute = Callable[[list[Work], BatchTimes], list[Result]]
