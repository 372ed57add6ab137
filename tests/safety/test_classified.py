"""Output classifiers over a scripted stream: chunks go out only once judged; a flag stops the stream."""
import asyncio

from inferd.safety import ClassifiedStream
from inferd.types import FinishReason
from tests.safety.test_stream import Scripted, tokens


def judge_flagging(word):
    async def judge(text):
        await asyncio.sleep(0)
        return "S1" if word in text else None
    return judge


async def drain(stream, woke):
    out = []
    while True:
        d = stream.take()
        if d is not None:
            out.append(d)
            if d.finish_reason is not None:
                return out
            continue
        await asyncio.wait_for(woke.wait(), 2)     # the verdict wakes the writer, as the SSE flusher is woken
        woke.clear()


async def test_text_goes_out_a_judged_chunk_at_a_time_in_order():
    woke = asyncio.Event()
    stream = ClassifiedStream(Scripted(tokens("aaaa", "bbbb", "cc", final=FinishReason.STOP)), judge_flagging("zz"),
                              5, 1.0, 3, lambda label: None)
    stream.listen(woke.set)
    out = await drain(stream, woke)
    assert [d.text for d in out] == ["aaaabbbb", "cc"] and out[-1].finish_reason is FinishReason.STOP
    assert sum(len(d.token_ids) for d in out) == 3


async def test_a_flagged_chunk_is_never_sent_and_the_engine_request_is_cancelled():
    woke = asyncio.Event()
    inner = Scripted(tokens("fine ", "text ", "bad thing ", "more ", "more", final=FinishReason.STOP))
    flags = []
    stream = ClassifiedStream(inner, judge_flagging("bad"), 10, 1.0, 3, flags.append)
    stream.listen(woke.set)
    out = await drain(stream, woke)
    assert "".join(d.text for d in out) == "fine text "
    assert out[-1].finish_reason is FinishReason.CONTENT_FILTER and flags == ["S1"] and inner.cancelled


async def test_a_classifier_that_fails_or_hangs_ends_the_stream_with_an_error():
    async def hangs(text):
        await asyncio.sleep(60)

    woke = asyncio.Event()
    stream = ClassifiedStream(Scripted(tokens("abc", final=FinishReason.STOP)), hangs, 2, 0.05, 3, lambda label: None)
    stream.listen(woke.set)
    out = await drain(stream, woke)
    assert out[-1].finish_reason is FinishReason.ERROR and out[-1].text == ""


async def test_collect_waits_for_the_verdicts():
    stream = ClassifiedStream(_Async(tokens("one ", "two", final=FinishReason.LENGTH)), judge_flagging("zz"), 3, 1.0,
                              3, lambda label: None)
    whole = await stream.collect()
    assert whole.text == "one two" and whole.finish_reason is FinishReason.LENGTH


class _Async(Scripted):
    def __aiter__(self):
        return self

    async def __anext__(self):
        d = self.take()
        if d is None:
            raise StopAsyncIteration
        return d

