from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from inferd.engine.base import Tokenizer
from inferd.engine.tokenization import (
    ChatTemplateError,
    HFTokenizer,
    IncrementalDetokenizer,
    StopMatcher,
    TokenizerLoadError,
)

MULTIBYTE_TEXTS = [
    "Hello 😀 world 🚀🙂 done",
    "你好世界, 日本語のテキスト and 中文",
    "café — naïve → 10€ 👩‍👩‍👧 ok",
    "🚀",
]


def stream_one_token_at_a_time(tokenizer: HFTokenizer, prompt: list[int], ids: list[int]) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, prompt)
    chunks = [detok.push([tid]) for tid in ids]
    chunks.append(detok.flush())
    return chunks


# --- HFTokenizer ---------------------------------------------------------------------------

def test_hf_tokenizer_implements_the_engine_protocol(tiny_tokenizer: HFTokenizer) -> None:
    assert isinstance(tiny_tokenizer, Tokenizer)
    assert tiny_tokenizer.vocab_size == 512


def test_eos_ids_merge_tokenizer_config_and_generation_config(tiny_tokenizer: HFTokenizer) -> None:
    end_of_text = tiny_tokenizer.token_to_id("<|end_of_text|>")
    im_end = tiny_tokenizer.token_to_id("<|im_end|>")
    assert tiny_tokenizer.eos_token_ids == (end_of_text, im_end)
    assert tiny_tokenizer.bos_token_id == tiny_tokenizer.token_to_id("<|begin_of_text|>")


@pytest.mark.parametrize("text", ["The model answers the question.", "  leading spaces\nand\ttabs ", *MULTIBYTE_TEXTS])
def test_encode_decode_round_trip(tiny_tokenizer: HFTokenizer, text: str) -> None:
    ids = tiny_tokenizer.encode(text)
    assert ids[0] == tiny_tokenizer.bos_token_id
    assert tiny_tokenizer.encode(text, add_special_tokens=False) == ids[1:]
    assert tiny_tokenizer.decode(ids) == text
    assert tiny_tokenizer.decode(ids, skip_special_tokens=False) == "<|begin_of_text|>" + text


def test_chat_template_renders_chatml_with_generation_prompt(tiny_tokenizer: HFTokenizer) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 🙂"}]
    rendered = tiny_tokenizer.apply_chat_template(messages)
    assert rendered == ("<|begin_of_text|><|im_start|>system\nBe brief.<|im_end|>\n"
                        "<|im_start|>user\nHi 🙂<|im_end|>\n<|im_start|>assistant\n")
    without = tiny_tokenizer.apply_chat_template(messages, add_generation_prompt=False)
    assert without == rendered.removesuffix("<|im_start|>assistant\n")


def test_chat_template_renders_tools_calls_and_results_as_qwen_does(tiny_tokenizer: HFTokenizer) -> None:
    tools = [{"type": "function", "function": {"name": "clock", "parameters": {"type": "object"}}}]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Time?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "clock", "arguments": {"zone": "UTC"}}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "12:00"}]
    rendered = tiny_tokenizer.apply_chat_template(messages, tools=tools)
    assert rendered == (
        "<|begin_of_text|><|im_start|>system\nBe brief.\n\n# Tools\n\n<tools>\n"
        '{"type": "function", "function": {"name": "clock", "parameters": {"type": "object"}}}\n</tools>\n\n'
        'Calls: <tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nTime?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "clock", "arguments": {"zone": "UTC"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n12:00\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert tiny_tokenizer.apply_chat_template(messages[:2], tools=None) == tiny_tokenizer.apply_chat_template(messages[:2])


def test_chat_prompt_encodes_with_a_single_bos_and_special_tokens_atomic(tiny_tokenizer: HFTokenizer) -> None:
    rendered = tiny_tokenizer.apply_chat_template([{"role": "user", "content": "hello"}])
    ids = tiny_tokenizer.encode(rendered)
    bos = tiny_tokenizer.bos_token_id
    assert ids[0] == bos and ids.count(bos) == 1
    assert tiny_tokenizer.token_to_id("<|im_start|>") in ids
    assert ids[-1] == tiny_tokenizer.token_to_id("\u010a")  # byte-level "\n"


def test_chat_template_raise_exception_becomes_typed_error(tiny_tokenizer: HFTokenizer) -> None:
    with pytest.raises(ChatTemplateError, match="unsupported role: wizard"):
        tiny_tokenizer.apply_chat_template([{"role": "wizard", "content": "x"}])


@pytest.mark.parametrize("messages, param", [
    ([], "messages"),
    (["just a string"], "messages[0]"),
    ([{"content": "no role"}], "messages[0].role"),
    ([{"role": "user", "content": None}], "messages"),
])
def test_malformed_messages_name_the_field(tiny_tokenizer: HFTokenizer, messages: list, param: str) -> None:
    with pytest.raises(ChatTemplateError) as info:
        tiny_tokenizer.apply_chat_template(messages)
    assert info.value.param == param


def test_hf_template_features_tojson_and_list_of_named_templates(tiny_artifact: Path, tmp_path: Path) -> None:
    shutil.copy(tiny_artifact / "tokenizer.json", tmp_path / "tokenizer.json")
    template = ("{% for m in messages %}{{ m | tojson }}{% if not loop.last %}|{% endif %}{% endfor %}"
                "{% if add_generation_prompt %}{{ eos_token }}{% endif %}")
    config = {"eos_token": {"content": "<|im_end|>"}, "bos_token": None,
              "chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": template}]}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = HFTokenizer.from_dir(tmp_path)
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "é<b>"}])
    assert rendered == '{"role": "user", "content": "é<b>"}<|im_end|>'
    assert tokenizer.eos_token_ids == (tokenizer.token_to_id("<|im_end|>"),)
    assert tokenizer.bos_token_id is None


def test_model_without_chat_template_gets_typed_error(tiny_artifact: Path, tmp_path: Path) -> None:
    shutil.copy(tiny_artifact / "tokenizer.json", tmp_path / "tokenizer.json")
    with pytest.raises(ChatTemplateError, match="no chat template"):
        HFTokenizer.from_dir(tmp_path).apply_chat_template([{"role": "user", "content": "x"}])


def test_missing_tokenizer_json_is_a_load_error_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(TokenizerLoadError, match="tokenizer.json"):
        HFTokenizer.from_dir(tmp_path)


# --- IncrementalDetokenizer ----------------------------------------------------------------

@pytest.mark.parametrize("text", MULTIBYTE_TEXTS)
def test_multibyte_characters_split_across_tokens_are_never_emitted_broken(
        tiny_tokenizer: HFTokenizer, text: str) -> None:
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    partial = [tid for tid in ids if "\ufffd" in tiny_tokenizer.decode([tid])]
    assert partial, "the test needs characters that span several tokens"
    prompt = tiny_tokenizer.encode("Say something:")
    chunks = stream_one_token_at_a_time(tiny_tokenizer, prompt, ids)
    assert "".join(chunks) == tiny_tokenizer.decode(ids) == text
    assert not any("\ufffd" in chunk for chunk in chunks)


def test_pushing_several_ids_at_once_matches_one_at_a_time(tiny_tokenizer: HFTokenizer) -> None:
    ids = tiny_tokenizer.encode(MULTIBYTE_TEXTS[2], add_special_tokens=False)
    detok = IncrementalDetokenizer(tiny_tokenizer, [])
    chunks = [detok.push(ids[i:i + 3]) for i in range(0, len(ids), 3)] + [detok.flush()]
    assert "".join(chunks) == MULTIBYTE_TEXTS[2]


def test_special_tokens_are_not_emitted_as_text(tiny_tokenizer: HFTokenizer) -> None:
    ids = tiny_tokenizer.encode("ok", add_special_tokens=False) + [tiny_tokenizer.eos_token_ids[0]]
    assert "".join(stream_one_token_at_a_time(tiny_tokenizer, [], ids)) == "ok"


def test_invalid_bytes_do_not_grow_the_window_forever(tiny_tokenizer: HFTokenizer) -> None:
    # A lone UTF-8 lead byte repeated: never completes. Text must still flow, with U+FFFD.
    lead = tiny_tokenizer.token_to_id("\u00f0")  # byte-level symbol for 0xF0
    detok = IncrementalDetokenizer(tiny_tokenizer, [])
    emitted = "".join(detok.push([lead]) for _ in range(40))
    assert emitted.count("\ufffd") >= 30
    assert len(detok._ids) - detok._read <= IncrementalDetokenizer._MAX_PENDING + 1


def test_window_stays_small_over_a_long_generation(tiny_tokenizer: HFTokenizer) -> None:
    text = " ".join(["the model answers 你好 🙂"] * 60)
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tiny_tokenizer, tiny_tokenizer.encode("prompt " * 50))
    out, widest = [], 0
    for tid in ids:
        out.append(detok.push([tid]))
        widest = max(widest, len(detok._ids))
    assert "".join(out) + detok.flush() == text
    assert widest <= 10


def test_flush_releases_an_incomplete_character(tiny_tokenizer: HFTokenizer) -> None:
    ids = tiny_tokenizer.encode("a🚀", add_special_tokens=False)
    detok = IncrementalDetokenizer(tiny_tokenizer, [])
    streamed = "".join(detok.push([tid]) for tid in ids[:-1])
    assert streamed == "a"
    assert detok.flush() == "\ufffd"
    assert detok.flush() == ""


# --- StopMatcher ---------------------------------------------------------------------------

def feed(matcher: StopMatcher, pieces: list[str]) -> tuple[str, bool]:
    out = []
    for piece in pieces:
        text, stopped = matcher.push(piece)
        out.append(text)
        if stopped:
            return "".join(out), True
    return "".join(out) + matcher.flush(), False


def test_stop_string_split_across_pushes_is_never_emitted() -> None:
    matcher = StopMatcher(["###"])
    emitted = [matcher.push(p) for p in ["Hello #", "#", " no", " more #", "#", "#tail"]]
    assert emitted == [("Hello ", False), ("", False), ("## no", False), (" more ", False), ("", False),
                       ("", True)]
    assert matcher.push("after") == ("", True)
    assert matcher.flush() == ""


def test_held_back_text_is_released_when_it_stops_matching() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.push("a ST") == ("a ", False)
    assert matcher.push("O") == ("", False)
    assert matcher.push("P!") == ("", True)
    assert feed(StopMatcher(["STOP"]), ["a ST", "OX"]) == ("a STOX", False)
    assert feed(StopMatcher(["STOP"]), ["end ST"]) == ("end ST", False)


def test_overlapping_stops_cut_at_the_earliest_match() -> None:
    assert feed(StopMatcher(["abc", "bcd"]), ["xab", "cd"]) == ("x", True)
    # Both stops are in the buffer: the earlier one wins. Arriving one char at a time, "y" completes first.
    assert feed(StopMatcher(["xyz", "y"]), ["ax", "yz"]) == ("a", True)
    assert feed(StopMatcher(["xyz", "y"]), ["ax", "y", "z"]) == ("ax", True)
    assert feed(StopMatcher(["aab"]), ["aa", "aab"]) == ("aa", True)


def test_longest_possible_prefix_is_held_across_several_stops() -> None:
    matcher = StopMatcher(["\n\nUser:", "</s>"])
    assert matcher.push("Answer.\n\nUs") == ("Answer.", False)
    assert matcher.push("e") == ("", False)
    assert matcher.push("d <") == ("\n\nUsed ", False)
    assert matcher.push("/s>") == ("", True)


def test_no_stops_passes_text_through() -> None:
    matcher = StopMatcher([])
    assert matcher.push("anything") == ("anything", False)
    assert matcher.flush() == ""


def test_empty_stop_string_is_rejected_naming_it() -> None:
    with pytest.raises(ValueError, match=r"stop\[1\]"):
        StopMatcher(["ok", ""])


LLAMA3_LIKE_TEMPLATE = """
{%- set ns = namespace(system='') -%}
{%- if messages[0]['role'] == 'system' -%}
    {%- set ns.system = messages[0]['content'] | trim -%}
    {%- set messages = messages[1:] -%}
{%- endif -%}
{{- bos_token }}
{%- if tools is defined and tools %}
<tools>{{ tools | tojson(indent=2) }}</tools>
{% endif %}
{%- for message in messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {{- '<|im_start|>' + message['role'] + '\n' }}
    {%- if loop.first and ns.system %}{{ ns.system + '\n\n' }}{% endif %}
    {{- message['content'] | trim + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""


@pytest.mark.parametrize("messages, kwargs", [
    ([{"role": "user", "content": "  hi  "}], {}),
    ([{"role": "system", "content": "Sys é"}, {"role": "user", "content": "a"},
      {"role": "assistant", "content": "b"}, {"role": "user", "content": "c <tag> \"q\""}], {}),
    ([{"role": "user", "content": "weather?"}],
     {"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"city": "Zürich"}}}]}),
])
def test_chat_template_rendering_matches_transformers(tiny_artifact: Path, tmp_path: Path,
                                                      messages: list, kwargs: dict) -> None:
    transformers = pytest.importorskip("transformers")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_artifact / name, tmp_path / name)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": LLAMA3_LIKE_TEMPLATE}))
    ours = HFTokenizer.from_dir(tmp_path)
    theirs = transformers.PreTrainedTokenizerFast.from_pretrained(tmp_path)
    for add_generation_prompt in (True, False):
        expected = theirs.apply_chat_template(messages, tokenize=False,
                                              add_generation_prompt=add_generation_prompt, **kwargs)
        assert ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **kwargs) == expected
    assert ours.encode("Zürich <|im_end|>") == theirs.encode("Zürich <|im_end|>")
    not_alternating = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(ChatTemplateError, match="must alternate"):
        ours.apply_chat_template(not_alternating)
