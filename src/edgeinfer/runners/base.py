"""What every runner takes and gives: the work of one batch, its results, and where its time went."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from edgeinfer.runners.cost import CostModel

Tensors = dict[str, np.ndarray]
# One request's answer: its outputs, or the error that fails this request alone.
Result = Tensors | BaseException


class Work:
    """One request as a runner sees it: validated inputs and what the request asked for. (A plain class,
    not a dataclass, like every object made per request: ``setup.py``.)"""

    __slots__ = ("inputs", "output_names", "parameters", "request_id", "rows", "span", "steps")

    def __init__(
        self,
        inputs: Tensors,
        rows: int = 1,
        output_names: frozenset[str] | None = None,
        parameters: dict[str, Any] | None = None,
        request_id: str | None = None,
        steps: dict[str, float] | None = None,  # a pipeline puts each step's seconds here (the caller's)
        span: object | None = None,  # the request's trace span (tracing on): a pipeline's steps continue it
    ) -> None:
        self.inputs = inputs
        self.rows = rows
        self.output_names = output_names
        self.parameters: dict[str, Any] = {} if parameters is None else parameters
        self.request_id = request_id
        self.steps = steps
        self.span = span

    # pickled to a Python model's process (process.py); compiled, the class has no pickling of its own
    def __reduce__(self) -> tuple[type[Work], tuple[Any, ...]]:
        return (
            Work,
            (
                self.inputs,
                self.rows,
                self.output_names,
                self.parameters,
                self.request_id,
                self.steps,
                self.span,
            ),
        )


class BatchTimes:
    """Where one executed batch spent its time (Triton's compute_input / compute_infer / compute_output)."""

    __slots__ = ("handover_ns", "infer_ns", "input_ns", "output_ns")

    def __init__(
        self, input_ns: int = 0, infer_ns: int = 0, output_ns: int = 0, handover_ns: int = 0
    ) -> None:
        self.input_ns = input_ns
        self.infer_ns = infer_ns
        self.output_ns = output_ns
        self.handover_ns = handover_ns  # from hand-over to a worker thread until the thread started it

    @property
    def total_s(self) -> float:
        return (self.input_ns + self.infer_ns + self.output_ns) / 1e9

    # pickled back from a Python model's process, as ``Work`` is to it
    def __reduce__(self) -> tuple[type[BatchTimes], tuple[int, int, int, int]]:
        return (BatchTimes, (self.input_ns, self.infer_ns, self.output_ns, self.handover_ns))


class BatchResult:
    """One result per request of the batch, in order, and the batch's timing."""

    __slots__ = ("results", "times")

    def __init__(self, results: list[Result], times: BatchTimes) -> None:
        self.results = results
        self.times = times


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
