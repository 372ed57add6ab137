"""Request decoding and validation: every rejection is a 400 that names the field."""
from __future__ import annotations

import msgspec
import pytest

from inferd.api.errors import ApiError
from inferd.api.wire.openai import MAX_PROMPTS, NO_OP_VALUES, ChatCompletionRequest, CompletionRequest, decode, prepare


def completion(**fields) -> bytes:
    return msgspec.json.encode({"model": "m", "prompt": "hi", **fields})


def chat(**fields) -> bytes:
    return msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields})


def rejected(kind: str, body: bytes) -> ApiError:
    with pytest.raises(ApiError) as info:
        prepare(kind, decode(kind, body))
    assert info.value.status == 400
    return info.value


def test_unknown_parameter_is_named():
    err = rejected("completion", completion(typical_p=0.5))
    assert err.param == "typical_p" and "typical_p" in err.message and err.code == "unknown_parameter"


def test_unknown_nested_field_is_named_with_its_path():
    err = rejected("chat", chat(stream_options={"include_usage": True, "bogus": 1}))
    assert err.param == "stream_options.bogus"


def test_wrong_type_names_field_and_expected_type():
    err = rejected("completion", completion(max_tokens="ten"))
    assert err.param == "max_tokens" and "expected int" in err.message and "got str" in err.message


def test_missing_required_field_is_named():
    err = rejected("chat", msgspec.json.encode({"model": "m"}))
    assert err.param == "messages" and err.code == "missing_required_parameter"


@pytest.mark.parametrize("field,value", [("max_tokens", 0), ("temperature", 2.5), ("top_p", 0.0),
                                         ("stop", ["a", "b", "c", "d", "e"]), ("seed", 2**70)])
def test_out_of_range_values_are_rejected(field, value):
    assert rejected("completion", completion(**{field: value})).param == field


def test_malformed_json_and_invalid_utf8_are_400():
    assert rejected("completion", b'{"model": "m", ').code == "invalid_json"
    assert rejected("completion", b'{"model": "\xff", "prompt": "x"}').code == "invalid_encoding"
    assert rejected("completion", b"").code == "invalid_json"
    assert rejected("completion", b"[1, 2]").code == "invalid_type"


@pytest.mark.parametrize("field,value", [
    ("n", 1), ("echo", False),
    ("best_of", 1), ("suffix", None), ("logprobs", None), ("n", None), ("n", 16)])
def test_completion_no_op_values_are_accepted(field, value):
    prepare("completion", decode("completion", completion(**{field: value})))


@pytest.mark.parametrize("field,value", [
    ("best_of", 3), ("suffix", "end")])
def test_completion_values_that_change_output_are_rejected_by_name(field, value):
    err = rejected("completion", completion(**{field: value}))
    assert err.param == field and err.code == "unsupported_parameter"


@pytest.mark.parametrize("fields,logprobs,echo", [
    ({"logprobs": 0}, 0, False), ({"logprobs": 5, "echo": True}, 5, True), ({"echo": True}, None, True)])
def test_completion_logprobs_and_echo_are_prepared(fields, logprobs, echo):
    p = prepare("completion", decode("completion", completion(**fields)))
    assert (p.logprobs, p.echo) == (logprobs, echo)


@pytest.mark.parametrize("kind,fields,param", [
    ("completion", {"logprobs": 6}, "logprobs"), ("completion", {"logprobs": -1}, "logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("chat", {"top_logprobs": 0}, "top_logprobs"), ("chat", {"logprobs": False, "top_logprobs": 3}, "top_logprobs")])
def test_logprobs_settings_out_of_range_or_alone_are_rejected_by_name(kind, fields, param):
    body = completion(**fields) if kind == "completion" else chat(**fields)
    assert rejected(kind, body).param == param


@pytest.mark.parametrize("fields,logprobs", [({"logprobs": True}, 0), ({"logprobs": True, "top_logprobs": 20}, 20),
                                             ({"logprobs": False}, None)])
def test_chat_logprobs_are_prepared_with_their_top_count(fields, logprobs):
    assert prepare("chat", decode("chat", chat(**fields))).logprobs == logprobs


@pytest.mark.parametrize("field,value", [
    ("logprobs", False), ("tools", []), ("tool_choice", "none"),
    ("response_format", {"type": "text"}), ("parallel_tool_calls", True), ("modalities", ["text"]),
    ("store", False), ("service_tier", "auto"), ("metadata", {"k": "v"}), ("user", "u1"),
    ("stream_options", {"include_usage": True, "include_obfuscation": False}), ("stream_options", None)])
def test_chat_no_op_values_are_accepted(field, value):
    prepare("chat", decode("chat", chat(**{field: value, "stream": field == "stream_options" or None})))


@pytest.mark.parametrize("field,value", [
    ("top_logprobs", 2), ("tool_choice", "auto"),
    ("modalities", ["text", "audio"]),
    ("reasoning_effort", "high")])
def test_chat_values_that_change_output_are_rejected_by_name(field, value):
    assert rejected("chat", chat(**{field: value})).param == field


@pytest.mark.parametrize("metadata", [{str(i): "v" for i in range(17)}, {"k" * 65: "v"}, {"k": "v" * 513}, {"k": 1}])
def test_chat_metadata_over_openais_bounds_is_a_400_naming_metadata(metadata):
    # 16 pairs, keys up to 64 characters, values up to 512 strings (OpenAI's); a map's key names the map
    assert rejected("chat", chat(metadata=metadata)).param == "metadata"


def test_bool_does_not_pass_for_a_number():
    assert rejected("completion", completion(n=True)).param == "n"


@pytest.mark.parametrize("value", [0, 17, -1, 2.5])
def test_n_outside_1_to_16_is_rejected_naming_n(value):
    err = rejected("completion", completion(n=value))
    assert err.param == "n" and err.code == "invalid_value"


def test_n_is_choices_per_prompt_with_a_seed_per_choice_derived_from_the_request_seed():
    p = prepare("chat", decode("chat", chat(n=3, seed=7)))
    assert p.n == 3 and [p.choice_seed(j) for j in range(3)] == [7, 8, 9]
    top = prepare("chat", decode("chat", chat(n=2, seed=2**63 - 1)))
    assert top.choice_seed(1) == -(2**63)       # wraps modulo 2**64, as the engines take seeds
    assert prepare("chat", decode("chat", chat(n=2))).choice_seed(1) is None


def test_every_no_op_parameter_is_a_declared_field():
    fields = set(CompletionRequest.__struct_fields__) | set(ChatCompletionRequest.__struct_fields__)
    assert set(NO_OP_VALUES) <= fields


def test_prompt_forms():
    assert prepare("completion", decode("completion", completion(prompt=[1, 2, 3]))).prompt_token_ids == [1, 2, 3]
    assert prepare("completion", decode("completion", completion(prompt=[[4, 5]]))).prompt_token_ids == [4, 5]
    assert prepare("completion", decode("completion", completion(prompt=["one"]))).prompt_text == "one"
    assert rejected("completion", completion(prompt="")).code == "empty_prompt"
    assert rejected("completion", completion(prompt=[])).code == "empty_prompt"


def test_a_list_of_prompts_becomes_one_prepared_prompt_each_in_order():
    p = prepare("completion", decode("completion", completion(prompt=["one", "three"])))
    assert p.batch == ["one", "three"] and p.prompt_chars == 8
    parts = p.prompts()
    assert [(x.prompt_text, x.prompt_token_ids, x.prompt_chars, x.batch) for x in parts] == [
        ("one", None, 3, None), ("three", None, 5, None)]
    tokens = prepare("completion", decode("completion", completion(prompt=[[1, 2], [3]]))).prompts()
    assert [(x.prompt_text, x.prompt_token_ids) for x in tokens] == [(None, [1, 2]), (None, [3])]


def test_a_prompt_list_that_mixes_forms_is_empty_somewhere_or_too_long_is_rejected_naming_prompt():
    assert rejected("completion", completion(prompt=["a", [1]])).code == "invalid_prompt"
    assert rejected("completion", completion(prompt=["a", 5])).code == "invalid_prompt"
    err = rejected("completion", completion(prompt=["a", ""]))
    assert (err.param, err.code) == ("prompt", "empty_prompt") and "prompt[1]" in err.message
    err = rejected("completion", completion(prompt=["a"] * (MAX_PROMPTS + 1)))
    assert (err.param, err.code) == ("prompt", "too_many_prompts")
    assert prepare("completion", decode("completion", completion(prompt=["a"] * MAX_PROMPTS))).batch


def test_ignore_eos_and_continuous_usage_stats_are_known_parameters():
    p = prepare("completion", decode("completion", completion(
        ignore_eos=True, stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True})))
    assert p.ignore_eos and p.continuous_usage and p.include_usage
    assert not prepare("chat", decode("chat", chat())).ignore_eos
    err = rejected("chat", chat(stream_options={"continuous_usage_stats": True}))
    assert err.param == "stream_options"            # stream options without a stream, as OpenAI
    assert rejected("chat", chat(ignore_eos="yes")).param == "ignore_eos"


def test_stop_string_becomes_a_tuple_and_empty_stops_are_rejected():
    assert prepare("completion", decode("completion", completion(stop="\n"))).stop == ("\n",)
    assert rejected("completion", completion(stop=["x", ""])).param == "stop"


def test_chat_max_completion_tokens_and_max_tokens_must_agree():
    assert prepare("chat", decode("chat", chat(max_completion_tokens=7))).max_tokens == 7
    assert rejected("chat", chat(max_tokens=5, max_completion_tokens=7)).param == "max_completion_tokens"


def test_chat_messages_text_parts_are_joined_and_other_parts_rejected():
    body = msgspec.json.encode({"model": "m", "messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]})
    p = prepare("chat", decode("chat", body))
    assert p.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a\nb"}]
    image = msgspec.json.encode({"model": "m", "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]})
    assert rejected("chat", image).param == "messages[0].content[0]"
    legacy = msgspec.json.encode({"model": "m", "messages": [{"role": "function", "content": "x", "name": "f"}]})
    assert rejected("chat", legacy).param == "messages[0].role"
    assert rejected("chat", msgspec.json.encode({"model": "m", "messages": []})).param == "messages"
    bad_role = msgspec.json.encode({"model": "m", "messages": [{"role": "wizard", "content": "x"}]})
    assert rejected("chat", bad_role).param == "messages[0].role"


@pytest.mark.parametrize("stream", [None, False])
def test_stream_options_without_stream_is_rejected_as_openai_does(stream):
    for kind, body in (("chat", chat), ("completion", completion)):
        err = rejected(kind, body(stream=stream, stream_options={"include_usage": True}))
        assert err.param == "stream_options" and "stream" in err.message
    assert prepare("chat", decode("chat", chat(stream=True, stream_options={"include_usage": True}))).include_usage


@pytest.mark.parametrize("extra", [{"image_url": {"url": "http://x"}}, {"input_audio": {"data": "", "format": "wav"}},
                                   {"file": {"file_id": "f"}}, {"refusal": "no"}])
def test_text_content_part_with_another_parts_field_is_rejected_by_name(extra):
    body = msgspec.json.encode({"model": "m", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b", **extra}]}]})
    err = rejected("chat", body)
    (name,) = extra
    assert err.param == f"messages[0].content[1].{name}" and err.code == "unsupported_parameter"
