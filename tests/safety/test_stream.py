"""The output filter over a scripted stream: held back, stopped at the match, nothing of it sent."""
from inferd.safety import FilteredStream, RuleSet
from inferd.types import Delta, FinishReason, Usage


class Scripted:
    """Hands out the given deltas one per take(); records cancel()."""

    def __init__(self, deltas):
        self.deltas = list(deltas)
        self.request_id = "r1"
        self.cancelled = False
        self.delivered_tokens = 0
        self.finished = False

    def take(self):
        if not self.deltas:
            return None
        d = self.deltas.pop(0)
        self.delivered_tokens += len(d.token_ids)
        return d

    def cancel(self):
        self.cancelled = True

    def listen(self, listener):
        self.listener = listener

    def ready(self):
        return bool(self.deltas)


def run(stream):
    out = []
    while (d := stream.take()) is not None:
        out.append(d)
    return out


def tokens(*texts, final=None):
    deltas = [Delta(token_ids=[i], text=t) for i, t in enumerate(texts)]
    if final is not None:
        deltas.append(Delta(token_ids=[], text="", finish_reason=final, usage=Usage(prompt_tokens=3,
                                                                                  completion_tokens=len(texts))))
    return deltas


def test_a_match_stops_the_stream_and_no_character_of_it_is_sent():
    inner = Scripted(tokens("Hello ", "there, ", "the pass", "word is ", "hunter2", " ok", final=FinishReason.STOP))
    matches = []
    stream = FilteredStream(inner, RuleSet(words=["password"]), 16, 3, matches.append)
    out = run(stream)
    sent = "".join(d.text for d in out)
    assert sent == "Hello there, the "
    assert out[-1].finish_reason is FinishReason.CONTENT_FILTER
    assert out[-1].usage.completion_tokens == 4     # generated, so billed
    assert inner.cancelled and [m.rule for m in matches] == ["word list"]
    assert stream.take() is None and stream.finished


def test_without_a_match_every_character_arrives_in_order_by_the_end():
    texts = ["a", "bc", "def", " ghij", "k"]
    stream = FilteredStream(Scripted(tokens(*texts, final=FinishReason.LENGTH)), RuleSet(words=["zzz"]), 4, 3,
                            lambda m: None)
    out = run(stream)
    assert "".join(d.text for d in out) == "".join(texts)
    assert sum(len(d.token_ids) for d in out) == len(texts)
    assert out[-1].finish_reason is FinishReason.LENGTH


def test_text_is_held_back_the_configured_number_of_characters():
    stream = FilteredStream(Scripted(tokens("0123456789")), RuleSet(words=["zzz"]), 4, 3, lambda m: None)
    assert stream.take().text == "012345"


def test_a_match_longer_than_the_hold_back_is_still_stopped_and_its_rest_never_sent():
    inner = Scripted(tokens("my pass", "wo", "rd is x", " and more", final=FinishReason.STOP))
    matches = []
    out = run(FilteredStream(inner, RuleSet(words=["password"]), 2, 3, matches.append))
    sent = "".join(d.text for d in out)
    assert out[-1].finish_reason is FinishReason.CONTENT_FILTER and inner.cancelled and matches
    assert "rd" not in sent and "more" not in sent and sent.startswith("my ")
