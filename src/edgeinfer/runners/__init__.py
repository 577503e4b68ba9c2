"""Runners execute one batch for a model version and own how many batches run at once.

The batcher decides *what* runs together; a runner decides *where and how*: in worker threads (or
inline on the event loop when that is cheaper than the hop), as coroutines on the loop, or in child
processes. Every runner has the same shape (``base.Runner``): ``run(batch)`` returns a future of one
result per request, and ``cost`` predicts how long a batch of n rows takes from what it measured.

A new way to execute is a new runner here; nothing above needs to change.
"""

from edgeinfer.runners.base import BatchResult, BatchTimes, Result, Runner, RunnerSettings, Tensors, Work
from edgeinfer.runners.cost import CostModel

__all__ = [
    "BatchResult",
    "BatchTimes",
    "CostModel",
    "Result",
    "Runner",
    "RunnerSettings",
    "Tensors",
    "Work",
]
