"""Shadow traffic: a share of a model's requests also runs on a candidate; only the primary answers.

``shadows: {resnet: {version: 2, share: 0.2}}`` mirrors a fifth of the requests that ``resnet``
answers (with any other version) to version 2 (or to another model: ``model:``). The candidate's
outputs are compared with the primary's, output by output:

* ``max_abs_diff`` — the largest absolute difference of a numeric output (a histogram per output);
* label agreement — per row, the top-1 index of a float output whose last dimension has classes
  (``[rows, classes]`` or more dimensions), or equality of the whole row for integer and BYTES outputs:
  the rows that agree and the rows compared, per output. A shape that differs is a disagreement of
  every row.

Shadow work never delays the primary and never fails a request: a mirror is only sent while the server
keeps up (nothing but the request itself waits in the primary's queue, nothing in the candidate's, and
the event loop is less than a tick of its lag timer late) and at the lowest priority, so under load it
is dropped first (counted, ``result="dropped"``); the comparison runs after the primary's answer; a
candidate that fails or cannot take the request is counted (``failed``, ``unavailable``) and forgotten.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from edgeinfer.admission.lag import INTERVAL_S
from edgeinfer.errors import EdgeInferError
from edgeinfer.metrics import Metrics
from edgeinfer.model_config import ShadowConfig
from edgeinfer.protocol.types import InferRequest
from edgeinfer.repository.registry import ModelState, ModelVersion, Registry
from edgeinfer.repository.router import Router
from edgeinfer.runners import Tensors, Work
from edgeinfer.validation import check_request

log = logging.getLogger(__name__)

LOWEST_PRIORITY = 2**31  # behind every client request in the candidate's queue
_READY = ModelState.READY


@dataclass(frozen=True, slots=True)
class Comparison:
    """One output of one request, primary against candidate."""

    max_abs_diff: float | None  # None: not numeric
    rows_agreeing: int
    rows: int


def compare(primary: Tensors, candidate: Tensors) -> dict[str, Comparison]:
    """Every output both have, compared (pure)."""
    return {
        name: compare_output(array, candidate[name]) for name, array in primary.items() if name in candidate
    }


def compare_output(primary: np.ndarray, candidate: np.ndarray) -> Comparison:
    rows = primary.shape[0] if primary.ndim else 1
    if primary.shape != candidate.shape:
        return Comparison(float("inf") if primary.dtype.kind in "fiub" else None, 0, rows)
    if primary.dtype.kind == "O" or candidate.dtype.kind == "O":
        same = primary == candidate
        return Comparison(None, _rows_all(same, rows), rows)
    a, b = primary.astype(np.float64, copy=False), candidate.astype(np.float64, copy=False)
    diff = float(np.max(np.abs(a - b))) if primary.size else 0.0
    if primary.dtype.kind == "f" and primary.ndim >= 2 and primary.shape[-1] > 1:
        same = np.argmax(a, axis=-1) == np.argmax(b, axis=-1)
    else:
        same = a == b
    return Comparison(diff, _rows_all(same, rows), rows)


def _rows_all(same: np.ndarray, rows: int) -> int:
    """Rows whose every element agrees."""
    if same.ndim == 0:
        return rows if bool(same) else 0
    if same.ndim == 1:
        return int(np.count_nonzero(same))
    return int(np.count_nonzero(same.all(axis=tuple(range(1, same.ndim)))))


class Shadows:
    def __init__(
        self, registry: Registry, router: Router, metrics: Metrics, configs: Mapping[str, ShadowConfig]
    ) -> None:
        self._registry = registry
        self._router = router
        self._metrics = metrics
        self._configs = dict(configs)
        self.active = bool(self._configs)  # read on every request: False costs nothing more

    def configs(self) -> dict[str, ShadowConfig]:
        return dict(self._configs)

    def set(self, name: str, config: ShadowConfig | None) -> None:
        """Replace (or with None, remove) the shadow of ``name``."""
        if config is None:
            self._configs.pop(name, None)
        else:
            self._configs[name] = config
        self.active = bool(self._configs)

    def mirror(
        self, asked: str, primary: ModelVersion, request: InferRequest, answer: asyncio.Future[Tensors]
    ) -> None:
        """Maybe send ``request`` (answered by ``primary`` into ``answer``) to ``asked``'s candidate too."""
        config = self._configs.get(asked)
        if config is None or random.random() >= config.share:
            return
        candidate = self._candidate(asked, config)
        if candidate is None or candidate is primary:
            return
        stats = self._metrics.shadow(asked, f"{candidate.name}/{candidate.version}")
        serving = candidate.serving
        if candidate.state is not _READY or serving is None:
            stats.result("unavailable")
            return
        if self._busy(primary) or serving.batcher.queue_length > 0:
            stats.result("dropped")
            return
        backend = serving.backend
        try:
            batching = serving.policy.max_batch_size > 0
            checked = check_request(candidate.name, backend.inputs, backend.outputs, batching, request)
            mirrored = serving.batcher.submit(
                Work(request.inputs, checked.rows, None, dict(request.parameters), request.id),
                checked.group,
                priority=LOWEST_PRIORITY,
            )
        except EdgeInferError:
            stats.result("unavailable")
            return

        def both_done(_: object) -> None:
            if not answer.done():
                answer.add_done_callback(both_done)
                return
            if mirrored.cancelled() or mirrored.exception() is not None:
                stats.result("failed")
                return
            if answer.cancelled() or answer.exception() is not None:
                stats.result("primary_failed")
                return
            stats.compared(compare(answer.result(), mirrored.result()))

        # after the primary's own callbacks (its answer goes out first)
        mirrored.add_done_callback(lambda future: asyncio.get_running_loop().call_soon(both_done, future))

    def _busy(self, primary: ModelVersion) -> bool:
        """The box is behind: the primary has requests waiting, or the event loop runs a whole tick of
        its lag timer late (requests then wait unread in the sockets: ``admission/lag.py``)."""
        serving = primary.serving
        if serving is None or serving.batcher.queue_length > 1:  # others than the request just queued
            return True
        return self._registry.loop_lag_s > INTERVAL_S

    def _candidate(self, asked: str, config: ShadowConfig) -> ModelVersion | None:
        model = config.model or asked
        try:
            if config.version is None:
                return self._router.pick(model)
            return self._registry.get(model, config.version)
        except EdgeInferError:
            self._metrics.shadow(asked, f"{model}/{config.version or 'latest'}").result("unavailable")
            return None
