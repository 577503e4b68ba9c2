"""The batch function of array models (ONNX Runtime, ``predict_batch``): concatenate, run, split.

Inputs of the batch's requests are concatenated along the first dimension, the model runs once, and
each output is split back by the rows each request sent. A model whose output rows differ from its
input rows cannot be split: the whole batch fails with an error that says so.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Collection

import numpy as np

from edgeinfer.errors import RowsMismatch
from edgeinfer.runners.base import BatchTimes, Execute, Result, Tensors, Work

Infer = Callable[[Tensors, Collection[str] | None], Tensors]


def concatenating(name: str, infer: Infer, batching: bool) -> Execute:
    """A batch function running ``infer`` once per batch; ``batching`` False: every batch is one request."""

    def execute(batch: list[Work], times: BatchTimes) -> list[Result]:
        started = time.perf_counter_ns()
        if len(batch) == 1:
            inputs, output_names = batch[0].inputs, batch[0].output_names
        else:
            inputs = {key: np.concatenate([work.inputs[key] for work in batch]) for key in batch[0].inputs}
            output_names = _union_outputs(batch)
        prepared = time.perf_counter_ns()
        outputs = infer(inputs, output_names)
        computed = time.perf_counter_ns()
        rows = [batch[0].rows] if len(batch) == 1 else [work.rows for work in batch]
        results = _split(name, outputs, rows, batching)
        times.input_ns = prepared - started
        times.infer_ns = max(1, computed - prepared)
        times.output_ns = time.perf_counter_ns() - computed
        return results

    return execute


def _split(name: str, outputs: Tensors, rows: list[int], batching: bool) -> list[Result]:
    if not batching:
        return [outputs]
    total = rows[0] if len(rows) == 1 else sum(rows)
    for output, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise RowsMismatch(
                f"model {name} returned output {output!r} with shape {list(array.shape)} for "
                f"{total} input rows; with batching on, an output's first dimension must equal the "
                "input rows (set max_batch_size: 0 if the first dimension is not a batch dimension)"
            )
    if len(rows) == 1:
        return [outputs]
    ends = list(itertools.accumulate(rows))
    starts = [0, *ends[:-1]]  # views by slicing: np.split costs ~10 us of Python per output
    return [
        {output: array[start:end] for output, array in outputs.items()}
        for start, end in zip(starts, ends, strict=True)
    ]


def _union_outputs(batch: list[Work]) -> frozenset[str] | None:
    names: set[str] = set()
    for work in batch:
        if work.output_names is None:
            return None
        names |= work.output_names
    return frozenset(names)
