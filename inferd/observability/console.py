"""Log lines for a person at a terminal: `inferd serve --log-format text` (the default when stderr is one).

    08:41:07  starting  config=/srv/inferd/config.toml
    08:41:07  listening on http://127.0.0.1:8000 (starting: /healthz answers 200, /readyz 503 until the models are ready)
    08:41:08  small  building   [######--------------]  3/10
    08:41:12  small  loading
    08:41:15  serving small, embed on http://127.0.0.1:8000
    08:41:20  POST /v1/chat/completions  200  812 ms  model=small tokens=5+128
    08:41:30  WARNING  store_reserve_missing  where=/var/lib/inferd/inferd.db

One line per event, as the JSON lines have: the same events, the same redaction of text fields (the fields
are filtered by JsonFormatter's rules), only laid out to be read. The events a person waits on at start
(listening, each model's progress, the synthetic build's steps, a pull's files, ready) read as sentences;
every other event is its name and its fields as key=value. Colour only on a terminal, and never when NO_COLOR
is set (https://no-color.org). JSON lines stay the format for journald, files and pipes.
"""
from __future__ import annotations

import logging
import os
import time
import traceback
from typing import Any, Callable

from inferd.observability.log_fields import logged_value, request_id_var

BAR_WIDTH = 20
_LEVEL_COLOUR = {"WARNING": "33", "ERROR": "31", "CRITICAL": "31"}
_QUIET_FIELDS = frozenset({"event", "ts", "logger"})


def colour_wanted(stream: Any) -> bool:
    """Colour for a terminal, unless NO_COLOR is set to anything non-empty."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and not os.environ.get("NO_COLOR")


def progress_bar(done: int, total: int, width: int = BAR_WIDTH) -> str:
    """`[######--------------]  3/10`: a bar a line can carry (each change is its own line in a log)."""
    filled = 0 if total <= 0 else min(width, round(width * done / total))
    return f"[{'#' * filled}{'-' * (width - filled)}]  {done}/{total}"


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ",".join(_value(v) for v in value)
    text = str(value)
    return f'"{text}"' if (" " in text or not text) else text


def _pairs(fields: dict[str, Any], skip: frozenset[str] | set[str] = frozenset()) -> str:
    return " ".join(f"{k}={_value(logged_value(k, v))}" for k, v in fields.items()
                    if k not in skip and k not in _QUIET_FIELDS and v is not None)


class ConsoleFormatter(logging.Formatter):
    """A LogRecord -> one readable line. Remembers the listening URL, so `ready` can say where it serves."""

    def __init__(self, *, colour: bool = False, clock: Callable[[float], time.struct_time] = time.localtime) -> None:
        super().__init__()
        self.colour = colour
        self._clock = clock
        self._url: str | None = None
        self._sentences: dict[str, Callable[[dict[str, Any]], str | None]] = {
            "accepting": self._accepting, "listening": self._listening, "ready": self._ready, "model_progress": self._model_progress,
            "building_engine_step": self._build_step, "pull_progress": self._pull_progress,
            "request": self._request,
        }

    def format(self, record: logging.LogRecord) -> str:
        fields = dict(getattr(record, "fields", {}))
        event = record.getMessage()
        sentence = self._sentences.get(event)
        text = sentence(fields) if sentence is not None else None
        if text is None:
            text = f"{event}  {_pairs(fields)}".rstrip()
        rid = getattr(record, "request_id", None) or request_id_var.get()
        if rid is not None and event != "request":
            text += f"  request_id={rid}"
        level = record.levelname
        if level not in ("INFO", "DEBUG"):
            text = f"{self._paint(level, _LEVEL_COLOUR.get(level, '0'))}  {text}"
        line = f"{self._paint(time.strftime('%H:%M:%S', self._clock(record.created)), '2')}  {text}"
        if record.exc_info and record.exc_info[0] is not None:
            line += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip()
        return line

    def _paint(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.colour else text

    # -- the events a person waits on --------------------------------------------------------------
    def _accepting(self, f: dict[str, Any]) -> str:
        """The port is bound before the models load: probes get answers while they do."""
        self._url = f.get("url") or f"{f.get('scheme', 'http')}://{f.get('host')}:{f.get('port')}"
        return f"listening on {self._url} (starting: /healthz answers 200, /readyz 503 until the models are ready)"

    def _listening(self, f: dict[str, Any]) -> str:
        host = str(f.get("host"))
        host = f"[{host}]" if ":" in host else host          # an IPv6 address, as a URL spells it
        url = f"{f.get('scheme') or ('https' if f.get('tls') else 'http')}://{host}:{f.get('port')}"
        said, self._url = self._url == url, url
        return "every route open" if said else f"listening on {url}"

    def _ready(self, f: dict[str, Any]) -> str:
        models = ", ".join(f.get("models") or []) or "no models"
        where = f" on {self._paint(self._url, '1')}" if self._url else ""
        refused = f"  (refused: {_value(f['refused'])})" if f.get("refused") else ""
        return f"serving {models}{where}{refused}"

    def _model_progress(self, f: dict[str, Any]) -> str:
        head = f"{f.get('model')}  {f.get('phase', ''):<9}"
        if f.get("done") is not None and f.get("total"):
            head += f"  {progress_bar(int(f['done']), int(f['total']))}"
        if f.get("error"):
            head += f"  error={_value(f['error'])}"
        return head.rstrip()

    def _build_step(self, f: dict[str, Any]) -> str:
        return f"{f.get('model')}  building  {f.get('step')}"

    def _pull_progress(self, f: dict[str, Any]) -> str:
        done, total = int(f.get("files_done") or 0), int(f.get("files_total") or 0)
        mb = (f.get("bytes_done") or 0) / 1e6
        return f"pulling {f.get('repo')}  {progress_bar(done, total)} files  {mb:.1f} MB"

    def _request(self, f: dict[str, Any]) -> str | None:
        if "method" not in f or "status" not in f:
            return None
        ms = f.get("duration_ms", f.get("latency_ms"))
        head = f"{f['method']} {f.get('path', '')}  {f['status']}" + (f"  {ms:.0f} ms" if isinstance(ms, (int, float))
                                                                       else "")
        rest = _pairs(f, {"method", "path", "status", "duration_ms", "latency_ms"})
        return f"{head}  {rest}".rstrip()
