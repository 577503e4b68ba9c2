"""Logging setup: JSON lines for machines, readable text for people at a terminal."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

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
    # uvicorn's own loggers carry handlers of their own when it configures logging; we pass log_config=None
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).setLevel(max(logging.getLevelName(level), logging.WARNING))
