"""Tool-call parsers: the same events whatever way the output text is split."""
from __future__ import annotations

import json

import pytest

from inferd.api.wire.openai import Prepared
from inferd.api.wire.tool_calls import (
    ArgumentsPiece,
    CallStarted,
    HermesParser,
    Llama3JsonParser,
    NamedParser,
    RequiredParser,
    TextPiece,
    parser_for,
)


def _splits(text: str):
    """The text whole, a character at a time, and cut in two at every position."""
    yield [text]
    yield list(text)
    for i in range(1, len(text)):
        yield [text[:i], text[i:]]


def _run(make, pieces):
    parser = make()
    events = [e for p in pieces for e in parser.feed(p)] + parser.close()
    return parser, events


def _summary(events):
    text = "".join(e.text for e in events if isinstance(e, TextPiece))
    names = [(e.index, e.name) for e in events if isinstance(e, CallStarted)]
    args: dict[int, str] = {}
    for e in events:
        if isinstance(e, ArgumentsPiece):
            args[e.index] = args.get(e.index, "") + e.text
    return text, names, args


def _same_for_every_split(make, text):
    results = []
    for pieces in _splits(text):
        parser, events = _run(make, pieces)
        text_, names, args = _summary(events)
        assert [c.arguments for c in parser.calls] == [args.get(i, "") for i in range(len(parser.calls))]
        results.append((text_, [n for _, n in names], [json.loads(a) for a in args.values()]))
    assert all(r == results[0] for r in results)
    return results[0]


HERMES = ('Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa}ris\\""}}\n</tool_call>\n'
          '<tool_call>\n{"name": "f2", "arguments": {"n": [1, {"a": 2}]}}\n</tool_call>')


def test_hermes_calls_and_text_are_the_same_for_every_split():
    text, names, args = _same_for_every_split(HermesParser, HERMES)
    assert text == "Let me check."
    assert names == ["get_weather", "f2"]
    assert args == [{"city": 'Pa}ris"'}, {"n": [1, {"a": 2}]}]


def test_hermes_plain_text_passes_through_for_every_split():
    assert _same_for_every_split(HermesParser, "a < b <tool and <tool_cal done ") == (
        "a < b <tool and <tool_cal done ", [], [])


def test_hermes_call_with_arguments_first_is_parsed_whole():
    assert _same_for_every_split(HermesParser, '<tool_call>{"arguments": {"x": 1}, "name": "f"}</tool_call>') == (
        "", ["f"], [{"x": 1}])


def test_hermes_block_that_is_not_json_stays_content():
    raw = "<tool_call>not a call</tool_call>"
    assert _same_for_every_split(HermesParser, raw) == (raw, [], [])


def test_hermes_arguments_stream_before_the_call_ends():
    parser = HermesParser()
    events = parser.feed('<tool_call>{"name": "f", "arguments": {"city": "Par')
    assert events[0] == CallStarted(0, parser.calls[0].id, "f")
    assert parser.calls[0].id.startswith("call_")
    assert events[1:] == [ArgumentsPiece(0, '{"city": "Par')]


def test_hermes_cut_short_keeps_the_partial_arguments():
    parser, events = _run(HermesParser, ['<tool_call>{"name": "f", "arguments": {"q": "ab'])
    assert parser.calls[0].arguments == '{"q": "ab'


def test_llama3_json_calls_separated_by_semicolons_for_every_split():
    raw = '<|python_tag|>{"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": {}}'
    assert _same_for_every_split(Llama3JsonParser, raw) == ("", ["f", "g"], [{"x": 1}, {}])


def test_llama3_json_text_output_is_content_for_every_split():
    assert _same_for_every_split(Llama3JsonParser, "Hello there {not a call}") == (
        "Hello there {not a call}", [], [])


def test_llama3_json_object_that_is_not_a_call_is_content():
    assert _same_for_every_split(Llama3JsonParser, '{"answer": 42}') == ('{"answer": 42}', [], [])


def test_required_array_of_calls_for_every_split():
    raw = '[{"name": "f", "parameters": {"x": "]}"}}, {"name": "g", "parameters": {"y": [1]}}]'
    assert _same_for_every_split(RequiredParser, raw) == ("", ["f", "g"], [{"x": "]}"}, {"y": [1]}])


def test_named_function_output_is_its_arguments_for_every_split():
    assert _same_for_every_split(lambda: NamedParser("f"), '{"a": {"b": "}"}}') == ("", ["f"], [{"a": {"b": "}"}}])


@pytest.mark.parametrize(("choice", "name", "fmt", "kind"), [
    ("auto", None, "hermes", HermesParser), ("auto", None, "llama3_json", Llama3JsonParser),
    ("required", None, "llama3_json", RequiredParser), ("function", "f", "hermes", NamedParser)])
def test_parser_for_picks_by_tool_choice_then_the_models_format(choice, name, fmt, kind):
    p = Prepared(kind="chat", tools=[{"type": "function", "function": {"name": "f"}}], tool_choice=choice,
                 tool_name=name)
    assert type(parser_for(p, fmt)) is kind


def test_parser_for_is_none_without_tools_or_with_tool_choice_none():
    assert parser_for(Prepared(kind="chat"), "hermes") is None
    assert parser_for(Prepared(kind="chat", tools=[{"type": "function"}], tool_choice="none"), "hermes") is None


@pytest.mark.parametrize(("fmt", "output"), [
    ("hermes", HERMES),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "f2", "parameters": {}}')])
def test_parallel_tool_calls_false_under_auto_keeps_only_the_first_call_for_every_split(fmt, output):
    p = Prepared(kind="chat", tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="auto",
                 parallel_tool_calls=False)
    text, names, args = _same_for_every_split(lambda: parser_for(p, fmt), output)
    assert names == ["get_weather"] and args == [{"city": "Pa}ris\""} if fmt == "hermes" else {"city": "Paris"}]
    parser, _ = _run(lambda: parser_for(p, fmt), [output])
    assert [c.name for c in parser.calls] == ["get_weather"]
