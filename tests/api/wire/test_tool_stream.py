"""Chat chunks and bodies of requests with tools: calls streamed as OpenAI streams them (id and name first,
arguments in pieces), finish_reason tool_calls, content null when all output was calls."""
from __future__ import annotations

import json

from openai.types.chat import ChatCompletionChunk

from inferd.api.wire.responses import Identity, RunningUsage
from inferd.api.wire.tool_calls import HermesParser, NamedParser
from inferd.api.wire.tool_stream import ToolChunkEncoder, finish_with_calls, tool_message

IDENT = Identity("chat", "chatcmpl-1", 1, "m", "fp")
OUTPUT = ('Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
          '<tool_call>\n{"name": "clock", "arguments": {}}\n</tool_call>')


def _chunks(frames: bytes) -> list[dict]:
    out = []
    for frame in frames.split(b"\n\n"):
        if frame.startswith(b"data: "):
            out.append(json.loads(frame[6:]))
    return out


def _stream(encoder: ToolChunkEncoder, pieces: list[str], finish: str = "stop") -> list[dict]:
    frames = b"".join(encoder.content(p) for p in pieces[:-1]) + encoder.final(pieces[-1], finish, 1)
    chunks = _chunks(frames)
    for c in chunks:
        ChatCompletionChunk.model_validate(c)       # every chunk is one the SDK reads
    return chunks


def _assemble(chunks: list[dict]) -> tuple[str, list[dict], str]:
    """What a client builds from the deltas, as the SDK's stream helpers do."""
    content, calls = "", {}
    for c in chunks:
        delta = c["choices"][0]["delta"]
        content += delta.get("content") or ""
        for tc in delta.get("tool_calls") or ():
            call = calls.setdefault(tc["index"], {"id": None, "name": None, "arguments": ""})
            call["id"] = tc.get("id") or call["id"]
            fn = tc.get("function") or {}
            call["name"] = fn.get("name") or call["name"]
            call["arguments"] += fn.get("arguments") or ""
    return content, [calls[i] for i in sorted(calls)], chunks[-1]["choices"][0]["finish_reason"]


def test_streamed_calls_have_index_id_type_and_name_first_then_arguments_in_pieces():
    pieces = [OUTPUT[i:i + 5] for i in range(0, len(OUTPUT), 5)]
    chunks = _stream(ToolChunkEncoder(HermesParser, IDENT, False), pieces)
    content, calls, finish = _assemble(chunks)
    assert content == "Sure." and finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Paris"}),
                                                                        ("clock", {})]
    assert all(c["id"].startswith("call_") for c in calls)
    firsts = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls") or () if "id" in tc]
    assert [(f["type"], f["function"]["name"]) for f in firsts] == [("function", "get_weather"), ("function", "clock")]
    argument_chunks = [c for c in chunks if any("id" not in tc for tc in c["choices"][0]["delta"].get("tool_calls") or ())]
    assert len(argument_chunks) > 2                  # the arguments came in pieces, as they were written
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["delta"] == {}


def test_text_held_back_makes_no_frame():
    encoder = ToolChunkEncoder(HermesParser, IDENT, False)
    assert encoder.content("<tool_") == b""


def test_a_length_cut_says_length():
    chunks = _stream(ToolChunkEncoder(HermesParser, IDENT, False), ['<tool_call>{"name": "f", "arguments": {"a'],
                     finish="length")
    assert _assemble(chunks)[2] == "length"


def test_plain_text_without_calls_streams_as_content_and_stops():
    content, calls, finish = _assemble(_stream(ToolChunkEncoder(HermesParser, IDENT, False), ["Hello", " world"]))
    assert (content, calls, finish) == ("Hello world", [], "stop")


def test_continuous_usage_is_on_every_chunk_and_counts_every_token():
    running = RunningUsage(7)
    encoder = ToolChunkEncoder(lambda: NamedParser("f"), IDENT, True, running=running)
    chunks = _chunks(encoder.content_with_usage('{"a":', 2) + encoder.final(' 1}', "stop", 3))
    assert all(c["usage"] is not None for c in chunks)
    assert chunks[-1]["usage"]["completion_tokens"] == 5


def test_each_choice_gets_its_own_parser():
    encoder = ToolChunkEncoder(lambda: NamedParser("f"), IDENT, False)
    other = encoder.for_choice(1)
    one = _chunks(encoder.final("{}", "stop"))
    two = _chunks(other.final("{}", "stop"))
    assert two[0]["choices"][0]["index"] == 1
    assert one[0]["choices"][0]["delta"]["tool_calls"][0]["id"] != two[0]["choices"][0]["delta"]["tool_calls"][0]["id"]


def test_whole_message_has_content_null_when_all_output_was_calls():
    parser = HermesParser()
    content, calls = tool_message(parser, OUTPUT.removeprefix("Sure. "))
    assert content is None and finish_with_calls("stop", parser) == "tool_calls"
    assert [c["function"]["name"] for c in calls] == ["get_weather", "clock"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"} and calls[0]["type"] == "function"


def test_whole_message_without_calls_is_plain_content():
    parser = HermesParser()
    assert tool_message(parser, "just words") == ("just words", None)
    assert finish_with_calls("stop", parser) == "stop"


def test_a_whole_output_cut_inside_a_call_is_its_text_as_content_and_no_call():
    text = 'Sure. <tool_call>{"name": "clock", "arguments": {"zone": "UT'
    parser = HermesParser()
    assert tool_message(parser, text) == (text, None)
    assert finish_with_calls("stop", parser) == "stop"
