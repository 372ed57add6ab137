"""Logs: one JSON object per line on stderr, request id on every line logged inside a request.

Usage:
    log = get_logger(__name__)
    log.info("listening", host="127.0.0.1", port=8000)
    with request_context("req-abc"):
        log.info("request_done", status=200)        # carries "request_id": "req-abc"

Lines never carry prompt or completion text: fields whose name says they hold it are replaced
by a marker before the line is written, whoever logged them. The request id lives in a
contextvar, so each aiohttp handler task sees its own and nothing needs passing around.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import time
import traceback
from collections.abc import Iterator
from typing import IO, Any

import orjson

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("inferd_request_id", default=None)

# Field names that could hold user text. Redacted, never written (design: logs never carry
# prompt or completion text unless a tenant's retention setting asks for it).
TEXT_FIELDS = frozenset({
    "prompt", "prompts", "messages", "content", "completion", "text", "output", "input",
    "body", "stop",
})
REDACTED = "[redacted]"

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
_RESERVED = frozenset({"ts", "level", "logger", "event", "request_id"})


@contextlib.contextmanager
def request_context(request_id: str) -> Iterator[None]:
    """Tag every line logged inside the block (in this task) with `request_id`."""
    token = request_id_var.set(request_id)
    try:
        yield
    finally:
        request_id_var.reset(token)


class JsonFormatter(logging.Formatter):
    """A LogRecord -> one JSON line. Fields from EventLogger arrive in `record.fields`."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        rid = getattr(record, "request_id", None) or request_id_var.get()
        if rid is not None:
            line["request_id"] = rid
        for key, value in getattr(record, "fields", {}).items():
            if key in _RESERVED:
                key = f"field_{key}"
            line[key] = REDACTED if key in TEXT_FIELDS else value
        if record.exc_info and record.exc_info[0] is not None:
            exc_type, exc, tb = record.exc_info
            line["exc_type"] = exc_type.__name__
            line["exc"] = str(exc)
            line["traceback"] = "".join(traceback.format_tb(tb))
        return orjson.dumps(line, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


class _LineHandler(logging.StreamHandler):
    """StreamHandler that resolves sys.stderr at emit time (pytest's capsys swaps it)."""

    def __init__(self, stream: IO[str] | None) -> None:
        super().__init__(stream or sys.stderr)
        self._fixed = stream is not None

    def emit(self, record: logging.LogRecord) -> None:
        if not self._fixed:
            self.stream = sys.stderr
        super().emit(record)


_handler: logging.Handler | None = None


def configure_logging(level: str = "info", stream: IO[str] | None = None) -> None:
    """Route inferd's and aiohttp's loggers to JSON lines on `stream` (default stderr). Idempotent."""
    global _handler
    if level not in _LEVELS:
        raise ValueError(f"log level must be one of {', '.join(_LEVELS)}, got {level!r}")
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    _handler = _LineHandler(stream)
    _handler.setFormatter(JsonFormatter())
    root.addHandler(_handler)
    root.setLevel(_LEVELS[level])
    # inferd logs one line per request itself; aiohttp's access log would be a second, text one.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


class EventLogger:
    """A thin wrapper over a stdlib logger: an event name plus keyword fields per line."""

    __slots__ = ("_logger",)

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger

    def _log(self, level: int, event: str, exc_info: bool, fields: dict[str, Any]) -> None:
        if self._logger.isEnabledFor(level):
            self._logger.log(level, event, exc_info=exc_info, extra={"fields": fields}, stacklevel=3)

    def debug(self, event: str, /, **fields: Any) -> None:
        self._log(logging.DEBUG, event, False, fields)

    def info(self, event: str, /, **fields: Any) -> None:
        self._log(logging.INFO, event, False, fields)

    def warning(self, event: str, /, **fields: Any) -> None:
        self._log(logging.WARNING, event, False, fields)

    def error(self, event: str, /, **fields: Any) -> None:
        self._log(logging.ERROR, event, False, fields)

    def exception(self, event: str, /, **fields: Any) -> None:
        """Log at error level with the current exception's type, message and traceback."""
        self._log(logging.ERROR, event, True, fields)

    def is_enabled(self, level: str) -> bool:
        return self._logger.isEnabledFor(_LEVELS[level])


def get_logger(name: str) -> EventLogger:
    return EventLogger(logging.getLogger(name))


def monotonic_ms(since: float) -> float:
    """Milliseconds elapsed since a time.monotonic() stamp, rounded for log lines."""
    return round((time.monotonic() - since) * 1000, 3)
