"""RequestOutput: token ids -> text deltas, stop strings held back, final delta with usage and timing."""
from __future__ import annotations

from inferd.engine.reference.output import RequestOutput
from inferd.engine.sequence import Sequence, SequenceStatus
from inferd.engine.stream import RequestStream
from inferd.types import FinishReason, SamplingParams


def started(tokenizer, prompt: str, **sampling) -> tuple[RequestOutput, Sequence]:
    seq = Sequence("r", tokenizer.encode(prompt), SamplingParams(**sampling))
    out = RequestOutput(RequestStream("r"), submitted=1.0)
    out.start(tokenizer, seq)
    return out, seq


def feed(out: RequestOutput, seq: Sequence, token_ids: list[int], now: float = 2.0):
    deltas = []
    for token in token_ids:
        seq.token_ids.append(token)
        delta, hit = out.on_token(seq, now)
        deltas.append(delta)
        if hit:
            break
    return deltas


def test_token_deltas_concatenate_to_the_decoded_completion(tiny_tokenizer) -> None:
    out, seq = started(tiny_tokenizer, "the quick")
    ids = tiny_tokenizer.encode(" brown fox jumps", add_special_tokens=False)
    deltas = feed(out, seq, ids)
    assert [d.token_ids for d in deltas] == [[t] for t in ids]
    assert "".join(d.text for d in deltas) == tiny_tokenizer.decode(ids)
    assert all(d.finish_reason is None for d in deltas)
    assert out.first_token == 2.0


def test_a_stop_string_ends_the_text_before_it_and_is_never_emitted(tiny_tokenizer) -> None:
    out, seq = started(tiny_tokenizer, "the quick", stop=("fox",))
    ids = tiny_tokenizer.encode(" brown fox jumps", add_special_tokens=False)
    deltas = feed(out, seq, ids)
    final = deltas[-1]
    assert final.finish_reason is FinishReason.STOP and seq.finish_reason is FinishReason.STOP
    assert "".join(d.text for d in deltas) == " brown "
    assert final.usage.completion_tokens == len(deltas) < len(ids)


def test_a_stop_token_is_counted_but_never_decoded_into_text(tiny_tokenizer) -> None:
    out, seq = started(tiny_tokenizer, "the quick")
    eos = tiny_tokenizer.eos_token_ids[0]
    ids = tiny_tokenizer.encode(" brown", add_special_tokens=False)
    feed(out, seq, ids)
    seq.token_ids.append(eos)
    seq.status, seq.finish_reason = SequenceStatus.FINISHED, FinishReason.STOP   # as the scheduler ends it
    delta, hit = out.on_token(seq, 3.0)
    assert not hit and delta.token_ids == [eos] and delta.text == ""
    assert delta.finish_reason is FinishReason.STOP and delta.usage.completion_tokens == len(ids) + 1


def test_final_delta_carries_usage_error_and_ordered_timing(tiny_tokenizer) -> None:
    out, seq = started(tiny_tokenizer, "the quick")
    out.first_scheduled = 1.5
    ids = tiny_tokenizer.encode(" brown", add_special_tokens=False)
    feed(out, seq, ids)
    final = out.final(seq, FinishReason.ERROR, 4.0, error="safe message")
    assert final.token_ids == [] and final.error == "safe message" and final.finish_reason is FinishReason.ERROR
    assert (final.usage.prompt_tokens, final.usage.completion_tokens) == (seq.num_prompt_tokens, len(ids))
    t = final.timing
    assert (t.submitted, t.first_scheduled, t.first_token, t.finished) == (1.0, 1.5, 2.0, 4.0)
