from __future__ import annotations

import asyncio
import io
import logging
import threading
import time

import orjson
import pytest

from inferd.observability.log import (
    REDACTED,
    configure_logging,
    dropped_lines,
    flush_logging,
    get_logger,
    request_context,
    shutdown_logging,
)


@pytest.fixture
def restore_logging():
    """Put the root logger back as it was after the test (and stop the writer thread it started)."""
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    yield
    shutdown_logging()
    root.handlers[:] = saved_handlers
    root.setLevel(saved_level)


@pytest.fixture
def log_stream(restore_logging):
    """Route logging to a buffer for one test; lines() waits for the writer thread, then parses."""
    stream = io.StringIO()
    configure_logging("debug", stream=stream)

    def lines() -> list[dict]:
        flush_logging()
        return [orjson.loads(line) for line in stream.getvalue().splitlines()]

    return lines


def test_each_line_is_one_json_object_with_event_and_fields(log_stream):
    log = get_logger("inferd.test")
    log.info("listening", host="127.0.0.1", port=8000)
    (line,) = log_stream()
    assert line["event"] == "listening"
    assert line["level"] == "info"
    assert line["logger"] == "inferd.test"
    assert (line["host"], line["port"]) == ("127.0.0.1", 8000)
    assert "request_id" not in line


def test_request_id_is_on_every_line_inside_the_context(log_stream):
    log = get_logger("inferd.test")
    with request_context("req-1"):
        log.info("a")
        log.warning("b", status=429)
    log.info("c")
    a, b, c = log_stream()
    assert a["request_id"] == b["request_id"] == "req-1"
    assert "request_id" not in c


async def test_request_id_is_per_task(log_stream):
    log = get_logger("inferd.test")
    gate = asyncio.Event()

    async def handler(rid: str) -> None:
        with request_context(rid):
            await gate.wait()
            log.info("done")

    tasks = [asyncio.ensure_future(handler(f"req-{i}")) for i in range(3)]
    await asyncio.sleep(0)  # let every handler enter its context before any logs
    gate.set()
    await asyncio.gather(*tasks)
    done = [line for line in log_stream() if line["event"] == "done"]
    assert sorted(line["request_id"] for line in done) == ["req-0", "req-1", "req-2"]


def test_prompt_and_completion_text_are_never_written(log_stream):
    log = get_logger("inferd.test")
    log.info("request_done", prompt="secret prompt", messages=[{"content": "hi"}], text="secret out",
             completion_tokens=5)
    raw = log_stream()[0]
    assert raw["prompt"] == raw["messages"] == raw["text"] == REDACTED
    assert raw["completion_tokens"] == 5


def test_level_filters_lines(log_stream):
    stream = io.StringIO()
    configure_logging("warning", stream=stream)
    log = get_logger("inferd.test")
    log.info("hidden")
    log.error("shown")
    flush_logging()
    assert [orjson.loads(x)["event"] for x in stream.getvalue().splitlines()] == ["shown"]


def test_exception_fields_carry_type_and_traceback(log_stream):
    log = get_logger("inferd.test")
    try:
        raise ValueError("bad thing")
    except ValueError:
        log.exception("failed")
    line = log_stream()[0]
    assert line["level"] == "error"
    assert (line["exc_type"], line["exc"]) == ("ValueError", "bad thing")
    assert "raise ValueError" in line["traceback"]


def test_reserved_names_do_not_overwrite_line_keys(log_stream):
    get_logger("inferd.test").info("x", event="y", level="z")
    line = log_stream()[0]
    assert (line["event"], line["level"]) == ("x", "info")
    assert (line["field_event"], line["field_level"]) == ("y", "z")


def test_unknown_level_is_rejected():
    with pytest.raises(ValueError, match="log level"):
        configure_logging("loud")


class StalledStream(io.StringIO):
    """stderr under journald backpressure: every write waits until the test lets it through."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.writing = threading.Event()

    def write(self, text: str) -> int:
        self.writing.set()
        self.release.wait(timeout=10)
        return super().write(text)


def test_a_stalled_stderr_never_blocks_the_caller_and_overflow_is_dropped_and_counted(restore_logging):
    stream = StalledStream()
    configure_logging("info", stream=stream, queue_lines=4)
    log = get_logger("inferd.test")
    before = dropped_lines()
    log.info("first")
    assert stream.writing.wait(timeout=5)          # the writer thread is stuck in write()
    t0 = time.monotonic()
    with request_context("req-9"):
        for i in range(10):
            log.info("burst", i=i)
    assert time.monotonic() - t0 < 1.0             # a synchronous write would have waited 10 s per line
    assert dropped_lines() - before == 6           # 4 queued behind the stuck line, 6 dropped
    stream.release.set()
    shutdown_logging()                             # writes out what was queued
    lines = [orjson.loads(x) for x in stream.getvalue().splitlines()]
    # the writer reports the loss before the next line it writes
    assert [x["event"] for x in lines] == ["first", "log_lines_dropped", "burst", "burst", "burst", "burst"]
    assert [x["i"] for x in lines if x["event"] == "burst"] == [0, 1, 2, 3]
    assert all(x["request_id"] == "req-9" for x in lines if x["event"] == "burst")   # formatted in context
    assert next(x for x in lines if x["event"] == "log_lines_dropped")["count"] == 6


def test_shutdown_writes_every_queued_line(restore_logging):
    stream = io.StringIO()
    configure_logging("info", stream=stream)
    log = get_logger("inferd.test")
    for i in range(500):
        log.info("line", i=i)
    shutdown_logging()
    assert [orjson.loads(x)["i"] for x in stream.getvalue().splitlines()] == list(range(500))
