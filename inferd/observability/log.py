"""Logs: one JSON object per line on stderr, request id on every line logged inside a request.

Usage:
    log = get_logger(__name__)
    log.info("listening", host="127.0.0.1", port=8000)
    with request_context("req-abc"):
        log.info("request_done", status=200)        # carries "request_id": "req-abc"

Lines never carry prompt or completion text: fields whose name says they hold it are replaced
by a marker before the line is written, whoever logged them. The request id lives in a
contextvar, so each aiohttp handler task sees its own and nothing needs passing around.

Logging never blocks the caller (the event loop above all): a line is formatted where it is
logged (that is where the request id's context is) and put on a bounded queue; one thread
writes the queue to stderr. When stderr stalls (journald backpressure) and the queue is full,
new lines are dropped and counted (`dropped_lines()`, inferd_log_lines_dropped_total), and the
writer says how many it lost once it catches up. `shutdown_logging()` (also run at exit)
writes whatever is queued.
"""
from __future__ import annotations

import atexit
import contextlib
import contextvars
import logging
import logging.handlers
import queue
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from typing import IO, Any

import orjson

from inferd.observability.log_fields import REDACTED, logged_value, request_id_var  # REDACTED: its callers import it here

LOGGED_PATH_CHARS = 256     # a client picks the path's length: beyond this, a log line says only how much was cut

QUEUE_LINES = 10_000         # lines waiting for the writer thread; beyond that, new ones are dropped
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
_RESERVED = frozenset({"ts", "level", "logger", "event", "request_id"})


def truncated_path(path: str) -> str:
    """A request path as logs and trace spans carry it: its first LOGGED_PATH_CHARS characters, and how many
    more there were."""
    if len(path) <= LOGGED_PATH_CHARS:
        return path
    return f"{path[:LOGGED_PATH_CHARS]}...(+{len(path) - LOGGED_PATH_CHARS} chars)"


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
            line[key] = logged_value(key, value)
        if record.exc_info and record.exc_info[0] is not None:
            exc_type, exc, tb = record.exc_info
            line["exc_type"] = exc_type.__name__
            line["exc"] = str(exc)
            line["traceback"] = "".join(traceback.format_tb(tb))
        return orjson.dumps(line, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


class _LineHandler(logging.StreamHandler):
    """The writer thread's handler: writes lines formatted at the call site, first saying how many
    were dropped since the last line. Resolves sys.stderr at emit time (pytest's capsys swaps it)."""

    def __init__(self, stream: IO[str] | None, source: _QueueHandler) -> None:
        super().__init__(stream or sys.stderr)
        self._fixed = stream is not None
        self._source = source
        self._reported = 0
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if not self._fixed:
            self.stream = sys.stderr
        dropped = self._source.dropped
        if dropped != self._reported:
            line = {"ts": round(time.time(), 6), "level": "warning", "logger": "inferd.observability.log",
                    "event": "log_lines_dropped", "count": dropped - self._reported,
                    "reason": "the log writer fell behind (stderr stalled)"}
            self._reported = dropped
            super().emit(logging.makeLogRecord({"msg": orjson.dumps(line).decode()}))
        super().emit(record)


class _QueueHandler(logging.handlers.QueueHandler):
    """Formats on the caller's thread (the request id's context is there) and never blocks: a full
    queue drops the line and counts it."""

    def __init__(self, q: queue.Queue) -> None:
        super().__init__(q)
        self.dropped = 0
        self._lock = threading.Lock()

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            with self._lock:
                self.dropped += 1


class _Listener(logging.handlers.QueueListener):
    def enqueue_sentinel(self) -> None:
        self.queue.put(self._sentinel)      # blocking: the writer is draining the queue, so room comes


_queue_handler: _QueueHandler | None = None
_listener: _Listener | None = None
_dropped_before = 0                          # lines dropped by handlers replaced since


LOG_FORMATS = ("auto", "text", "json")


def configure_logging(level: str = "info", stream: IO[str] | None = None, *, queue_lines: int = QUEUE_LINES,
                      fmt: str = "json") -> None:
    """Route inferd's and aiohttp's loggers to `stream` (default stderr), written by a thread from a queue
    of at most `queue_lines`: JSON lines, or with `fmt` "text" lines for a person (inferd.observability.console),
    "auto" choosing text when the stream is a terminal. Idempotent: a second call replaces the first
    (writing out what the first had queued)."""
    global _queue_handler, _listener
    if level not in _LEVELS:
        raise ValueError(f"log level must be one of {', '.join(_LEVELS)}, got {level!r}")
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    shutdown_logging()
    root = logging.getLogger()
    handler = _QueueHandler(queue.Queue(maxsize=queue_lines))
    handler.setFormatter(_formatter(fmt, stream or sys.stderr))
    listener = _Listener(handler.queue, _LineHandler(stream, handler))
    listener.start()
    _queue_handler, _listener = handler, listener
    root.addHandler(handler)
    root.setLevel(_LEVELS[level])
    # inferd logs one line per request itself; aiohttp's access log would be a second, text one.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def _formatter(fmt: str, stream: IO[str]) -> logging.Formatter:
    from inferd.observability.console import ConsoleFormatter, colour_wanted

    isatty = getattr(stream, "isatty", None)
    if fmt == "text" or (fmt == "auto" and isatty is not None and isatty()):
        return ConsoleFormatter(colour=colour_wanted(stream))
    return JsonFormatter()


def shutdown_logging() -> None:
    """Write every queued line, stop the writer thread and detach the handler. Safe to call twice."""
    global _queue_handler, _listener, _dropped_before
    handler, listener = _queue_handler, _listener
    _queue_handler = _listener = None
    if handler is not None:
        logging.getLogger().removeHandler(handler)
        _dropped_before += handler.dropped
    if listener is not None:
        listener.stop()                      # writes what is queued, then joins the thread
        for h in listener.handlers:
            h.flush()


def flush_logging() -> None:
    """Wait until every line logged so far is written (tests, and before exiting)."""
    listener = _listener
    if listener is not None:
        listener.stop()
        listener.start()


def dropped_lines() -> int:
    """Lines dropped since the process started because the writer could not keep up."""
    handler = _queue_handler
    return _dropped_before + (handler.dropped if handler is not None else 0)


atexit.register(shutdown_logging)


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
