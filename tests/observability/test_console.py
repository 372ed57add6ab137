"""inferd.observability.console: the text lines `serve --log-format text` (a terminal, by default) writes."""
from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import time

import pytest

from inferd.observability.console import ConsoleFormatter, colour_wanted, progress_bar
from inferd.observability.log import configure_logging, flush_logging, get_logger, request_context
from tests.observability.test_log import restore_logging  # noqa: F401 - the fixture


def record(event: str, level: int = logging.INFO, **fields) -> logging.LogRecord:
    rec = logging.LogRecord("inferd.daemon", level, __file__, 1, event, None, None)
    rec.fields = fields
    rec.created = time.mktime((2026, 11, 28, 8, 41, 7, 0, 0, -1))
    return rec


def test_listening_then_ready_says_serving_which_models_on_which_url():
    fmt = ConsoleFormatter()
    assert fmt.format(record("listening", host="127.0.0.1", port=8000, tls=False)) == \
        "08:41:07  listening on http://127.0.0.1:8000"
    assert fmt.format(record("ready", models=["small", "embed"], versions=["small@1"], refused=[])) == \
        "08:41:07  serving small, embed on http://127.0.0.1:8000"
    fmt.format(record("listening", host="::1", port=443, tls=True))
    assert fmt.format(record("ready", models=["m"])).endswith("serving m on https://::1:443")


def test_model_progress_shows_a_bar_when_counted_and_a_failure_names_its_error():
    fmt = ConsoleFormatter()
    assert fmt.format(record("model_progress", model="small", phase="building", done=3, total=10)) == \
        "08:41:07  small  building   [######--------------]  3/10"
    assert fmt.format(record("model_progress", model="small", phase="loading", done=None, total=None)) == \
        "08:41:07  small  loading"
    failed = fmt.format(record("model_progress", logging.WARNING, model="x", phase="failed", error="no artifact"))
    assert failed == '08:41:07  WARNING  x  failed     error="no artifact"'


def test_other_events_are_their_name_and_fields_with_text_fields_redacted_and_the_request_id():
    fmt = ConsoleFormatter()
    with request_context("req-1"):
        line = fmt.format(record("odd_event", count=3, prompt="secret words", ratio=0.12345))
    assert line == "08:41:07  odd_event  count=3 prompt=[redacted] ratio=0.1235  request_id=req-1"
    assert "secret" not in line


def test_a_request_line_reads_method_path_status_and_milliseconds():
    line = ConsoleFormatter().format(record("request", method="POST", path="/v1/chat/completions", status=200,
                                            duration_ms=812.4, model="small"))
    assert line == "08:41:07  POST /v1/chat/completions  200  812 ms  model=small"


def test_pull_and_build_steps_read_as_progress():
    fmt = ConsoleFormatter()
    assert fmt.format(record("pull_progress", repo="org/m", files_done=2, files_total=4, bytes_done=3_500_000)) == \
        "08:41:07  pulling org/m  [##########----------]  2/4 files  3.5 MB"
    assert fmt.format(record("building_engine_step", model="small", kind="small", step="tokenizer")) == \
        "08:41:07  small  building  tokenizer"
    assert progress_bar(0, 0) == "[--------------------]  0/0"


def test_colour_only_on_a_terminal_and_never_with_no_color(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert colour_wanted(Tty()) and not colour_wanted(io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not colour_wanted(Tty())
    painted = ConsoleFormatter(colour=True).format(record("x", logging.ERROR))
    assert "\x1b[31mERROR\x1b[0m" in painted


def test_auto_is_text_on_a_terminal_and_json_elsewhere(restore_logging):  # noqa: F811
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True
    for stream, text in ((Tty(), True), (io.StringIO(), False)):
        configure_logging("info", stream=stream, fmt="auto")
        get_logger("inferd.test").info("hello", n=1)
        flush_logging()
        assert ("  hello  n=1" in stream.getvalue()) is text
        assert stream.getvalue().startswith("{") is not text
    with pytest.raises(ValueError, match="log format"):
        configure_logging("info", fmt="yaml")


def test_inferd_serve_with_log_format_text_prints_where_it_serves(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('[server]\nport = 0\ndrain_grace_s = 0\n[models.sim]\nbackend = "sim"\n'
                      '[models.sim.sim]\nprofile = "tiny"\ntime_scale = 0.0\n')
    proc = subprocess.Popen([sys.executable, "-m", "inferd", "serve", "--config", str(config), "--log-format", "text"],
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "NO_COLOR": "1"})
    seen = []
    try:
        for line in proc.stderr:                # ends at the process's exit at the latest
            seen.append(line)
            if " serving sim on http://127.0.0.1:" in line:
                break
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stderr.close()
    assert any(" serving sim on http://127.0.0.1:" in line for line in seen), "".join(seen)
    assert not any(line.startswith("{") for line in seen)
