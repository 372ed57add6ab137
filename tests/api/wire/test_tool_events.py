"""The call scanner's parts: where a JSON value ends, and calls in a row streamed as they come."""
from __future__ import annotations

import pytest

from inferd.api.wire import tool_events
from inferd.api.wire.tool_events import ArgumentsPiece, CallScanner, CallStarted, JsonValueEnd, ToolCallParser


@pytest.mark.parametrize(("text", "end"), [('{"a": "}"}, x', 10), ('[1, [2], "\\"]"] tail', 15), ("{}", 2)])
def test_a_json_value_ends_at_its_closing_bracket_not_one_inside_a_string(text, end):
    value = JsonValueEnd()
    assert next(i + 1 for i, c in enumerate(text) if value.step(c)) == end


def test_calls_in_a_row_stream_their_arguments_and_the_rest_waits():
    parser = ToolCallParser()
    scanner = CallScanner(parser, " ;")
    out: list = []
    scanner.feed('{"name": "f", "arguments": {"x": 1}}; {"name": "g", "argu', out)
    assert out == [CallStarted(0, parser.calls[0].id, "f"), ArgumentsPiece(0, '{"x": 1}')]
    assert scanner.end([]) and [c.arguments for c in parser.calls] == ['{"x": 1}']


def test_a_segment_that_never_fit_the_shape_is_parsed_whole_at_its_end():
    parser = ToolCallParser()
    scanner = CallScanner(parser, " ")
    scanner.feed('{"arguments": {"x": 1}, "name": "f"}', [])
    out: list = []
    assert scanner.end(out) and [type(e) for e in out] == [CallStarted, ArgumentsPiece]
    assert not CallScanner(ToolCallParser(), " ").end([])    # nothing at all is no call


class _CountingHeader:
    """Stands in for the header pattern and counts the characters each match is handed."""

    def __init__(self, pattern) -> None:
        self.pattern, self.scanned = pattern, 0

    def match(self, text: str):
        self.scanned += len(text)
        return self.pattern.match(text)


@pytest.mark.parametrize("head", ['{"name": "', "{" + " " * 10, '{"name"'])
def test_a_header_that_runs_on_is_not_rescanned_on_every_feed_and_ends_as_content(monkeypatch, head):
    # A model that writes 100k characters of a name (or of whitespace) must cost linear work, not a rescan of
    # everything so far per token: that is seconds to minutes on the event loop.
    counting = _CountingHeader(tool_events._HEADER)
    monkeypatch.setattr(tool_events, "_HEADER", counting)
    parser = ToolCallParser()
    scanner = CallScanner(parser, " ")
    scanner.feed(head, [])
    for _ in range(25_000):
        scanner.feed("abcd" if head != "{" + " " * 10 else "    ", [])
    assert counting.scanned < tool_events.MAX_HEADER ** 2     # bounded, whatever the output's length
    assert not scanner.end([]) and not parser.calls         # no call: its text is content
