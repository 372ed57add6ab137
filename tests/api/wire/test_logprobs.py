"""OpenAI's logprobs objects from TokenLogprobs: shapes, the -9999 floor, echo's null first entry, offsets,
and each token's own bytes where its text is part of a character."""
from __future__ import annotations

from inferd.api.wire.logprobs import LogprobFormat, token_bytes
from inferd.types import Delta, TokenLogprob

NAMES = {1: "a", 2: "bc", 3: "d", 4: "\ufffd"}


def fmt(kind: str, top: int | None, **kw) -> LogprobFormat:
    return LogprobFormat(kind, top, lambda ids: "".join(NAMES[i] for i in ids), **kw)


def test_chat_entries_carry_token_logprob_bytes_and_the_top_k_only():
    f = fmt("chat", 1)
    f.add(Delta(token_ids=[2], logprobs=[TokenLogprob(2, -0.5, ((1, -0.1), (2, -0.5)))]))
    assert f.take() == {"content": [{"token": "bc", "logprob": -0.5, "bytes": [98, 99], "top_logprobs": [
        {"token": "a", "logprob": -0.1, "bytes": [97]}]}], "refusal": None}
    assert f.take() is None and f.take(always=True) == {"content": [], "refusal": None}


def test_completion_echo_puts_the_prompt_first_with_a_null_first_entry_and_running_offsets():
    f = fmt("completion", 1, echo_text="abc", prompt_ids=[1, 2])
    f.add(Delta(token_ids=[3], logprobs=[TokenLogprob(3, float("-inf"), ((1, -0.2),))],
                prompt_logprobs=[None, TokenLogprob(2, -1.0, ((2, -1.0),))]))
    assert f.text("d") == "abcd" and f.text("a") == "a"
    assert f.take() == {"tokens": ["a", "bc", "d"], "token_logprobs": [None, -1.0, -9999.0],
                        "top_logprobs": [None, {"bc": -1.0}, {"a": -0.2, "d": -9999.0}], "text_offset": [0, 1, 3]}
    f.add(Delta(token_ids=[1], logprobs=[TokenLogprob(1, -0.3)]))
    assert f.take()["text_offset"] == [4]


def test_echo_without_logprobs_only_prepends_the_prompt():
    f = fmt("completion", None, echo_text="abc", prompt_ids=[1])
    f.add(Delta(token_ids=[3], prompt_logprobs=[None]))
    assert f.text("d") == "abcd" and f.take(always=True) is None


def test_a_partial_character_reports_its_own_bytes_from_the_vocabulary():
    f = fmt("chat", 0, vocab_entry={4: "<0xE2>"}.get)
    f.add(Delta(token_ids=[4], logprobs=[TokenLogprob(4, -1.0)]))
    assert f.take()["content"][0]["bytes"] == [0xE2]
    assert token_bytes("Ġthere") == b" there" and token_bytes("â") == bytes([0xE2]) and token_bytes("▁x") is None


def test_the_tiny_tokenizers_partial_characters_all_have_bytes(tiny_tokenizer):
    partial = [i for i in range(tiny_tokenizer.vocab_size) if "\ufffd" in tiny_tokenizer.decode([i], False)]
    assert partial and all(token_bytes(tiny_tokenizer.id_to_token(i)) for i in partial)
