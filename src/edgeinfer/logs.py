"""Logging setup: JSON lines for machines, readable text for people at a terminal."""

from __future__ import annotations

import logging
import random
import sys
import time
from typing import Any

import orjson

from edgeinfer.outcome import Outcome

_STANDARD_ATTRIBUTES = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line; ``extra={...}`` fields become top-level keys."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        document.update(
            (key, value) for key, value in record.__dict__.items() if key not in _STANDARD_ATTRIBUTES
        )
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(document, default=str).decode()


def setup_logging(level: str, fmt: str = "auto") -> None:
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter()
        if use_json
        else logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


class AccessLog:
    """One line per inference request on the ``edgeinfer.access`` logger.

    Successful requests are logged at INFO, sampled at ``sample_rate`` (at thousands of requests a
    second a line each costs real CPU); failed ones are always logged, WARNING for server-side errors.
    """

    def __init__(self, enabled: bool = True, sample_rate: float = 1.0) -> None:
        self._logger = logging.getLogger("edgeinfer.access")
        self.enabled = enabled
        self.sample_rate = sample_rate

    def write(self, outcome: Outcome, model: str, version: str, status: str, total_s: float) -> None:
        if outcome.error is None:
            if not self.enabled or not self._logger.isEnabledFor(logging.INFO):
                return
            if self.sample_rate < 1.0 and random.random() >= self.sample_rate:
                return
            level = logging.INFO
        else:
            level = logging.WARNING if status == "error" else logging.INFO
            if not self._logger.isEnabledFor(level):
                return
        trace = outcome.trace
        fields = {
            "request_id": outcome.request_id,
            "model": model,
            "version": version,
            "protocol": outcome.protocol,
            "status": status,
            "rows": outcome.rows,
            "batch_size": trace.batch_rows,
            "queue_ms": round(trace.queue_s * 1000, 3),
            "compute_ms": round(trace.compute_s * 1000, 3),
            "total_ms": round(total_s * 1000, 3),
        }
        if trace.span is not None and trace.span.trace_id:
            fields["trace_id"] = trace.span.trace_id
        steps = ""
        if trace.steps:  # a pipeline: each step's own time
            steps_ms = {step: round(seconds * 1000, 3) for step, seconds in trace.steps.items()}
            fields["steps_ms"] = steps_ms
            steps = " steps=" + ",".join(f"{step}:{ms:.2f}ms" for step, ms in steps_ms.items())
        if outcome.error is not None:
            fields["error"] = str(outcome.error)
        repeats = ""
        if outcome.repeats:  # refused with this one in its loop iteration, and logged with it
            fields["repeats"] = outcome.repeats
            repeats = f" repeats={outcome.repeats}"
        self._logger.log(
            level,
            "%s %s/%s %s rows=%d batch=%d queue=%.2fms compute=%.2fms total=%.2fms%s id=%s%s%s",
            outcome.protocol, model, version, status, outcome.rows, trace.batch_rows,
            fields["queue_ms"], fields["compute_ms"], fields["total_ms"], steps, outcome.request_id,
            repeats, f" error={fields['error']}" if outcome.error is not None else "",
            extra=fields,
        )  # fmt: skip


class _WorkerTag(logging.Filter):
    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def filter(self, record: logging.LogRecord) -> bool:
        record.worker = self.index
        return True


def tag_worker(index: int) -> None:
    """In a worker process: every log record carries ``worker`` (a JSON field, a prefix in text)."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(_WorkerTag(index))
        if not isinstance(handler.formatter, JsonFormatter):
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)-7s [worker %(worker)s] %(name)s: %(message)s")
            )
