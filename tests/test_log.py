from __future__ import annotations

import asyncio
import io
import logging

import orjson
import pytest

from inferd.log import REDACTED, configure_logging, get_logger, request_context


@pytest.fixture
def log_stream():
    """Route logging to a buffer for one test, then restore the root logger as it was."""
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    stream = io.StringIO()
    configure_logging("debug", stream=stream)

    def lines() -> list[dict]:
        return [orjson.loads(line) for line in stream.getvalue().splitlines()]

    yield lines
    root.handlers[:] = saved_handlers
    root.setLevel(saved_level)


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
