"""inferd.api.routes.batch_input: a file checked in pieces gives what the whole file gives, lines and errors."""
from __future__ import annotations

import pytest

from inferd.api.routes.batch_input import InputError, LineChecker, parse_lines
from tests.api.batch_harness import chat_line, jsonl


def in_pieces(content: bytes, size: int, max_line_bytes: int | None = None) -> list:
    checker = LineChecker(max_line_bytes)
    lines = []
    for at in range(0, len(content), size):
        lines += checker.feed(content[at:at + size])
    return lines + checker.finish()


@pytest.mark.parametrize("size", [1, 7, 100, 10_000])
def test_lines_fed_in_pieces_of_any_size_are_the_lines_of_the_whole_file(size):
    content = jsonl(chat_line("a"), chat_line("b"), chat_line("c")) + b"\n  \n"       # blank lines may end it
    assert in_pieces(content, size) == parse_lines(content)
    assert [line.idx for line in in_pieces(content, size)] == [0, 1, 2]


@pytest.mark.parametrize(("content", "says"), [
    (jsonl(chat_line("a")) + b"\n" + jsonl(chat_line("b")), "line 2: empty line"),
    (jsonl(chat_line("a"), chat_line("a")), "line 2: custom_id 'a' is already used on line 1"),
    (jsonl(chat_line("a")) + b"{broken", "line 2: not valid JSON"),
    (b"\n \n", "no requests"),
])
def test_an_error_in_pieces_names_the_line_the_whole_file_names(content, says):
    for size in (3, 1000):
        with pytest.raises(InputError, match=says):
            in_pieces(content, size)
    with pytest.raises(InputError, match=says):
        parse_lines(content)


def test_a_line_past_the_bound_is_refused_before_it_is_whole():
    checker = LineChecker(max_line_bytes=100)
    checker.feed(jsonl(chat_line("a")))
    with pytest.raises(InputError, match="line 2: longer than 100 bytes"):
        checker.feed(b"x" * 101)            # no newline yet: refused without waiting for the rest
