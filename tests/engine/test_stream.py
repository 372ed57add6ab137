"""RequestStream: what the engine pushes reaches the consumer merged, in order, and ends with one final."""
from __future__ import annotations

import asyncio

from inferd.engine.stream import RequestStream, merge_deltas
from inferd.types import Delta, EngineTiming, FinishReason, Usage

USAGE = Usage(prompt_tokens=3, completion_tokens=2)
TIMING = EngineTiming(submitted=1.0, first_scheduled=1.1, first_token=1.2, finished=1.3)


def final(token_ids=(), text="", reason=FinishReason.STOP, error=None) -> Delta:
    return Delta(token_ids=list(token_ids), text=text, finish_reason=reason, usage=USAGE, timing=TIMING, error=error)


def test_take_merges_everything_pushed_since_the_last_read() -> None:
    stream = RequestStream("r")
    assert stream.take() is None and not stream.ready()
    stream.push(Delta(token_ids=[1], text="a"))
    stream.push_token(2, "b")
    stream.push(Delta(token_ids=[3, 4], text="cd"))
    assert stream.ready()
    merged = stream.take()
    assert (merged.token_ids, merged.text, merged.finish_reason) == ([1, 2, 3, 4], "abcd", None)
    assert stream.take() is None
    stream.push_token(5, "e")
    assert (stream.take().token_ids, stream.take()) == ([5], None)


def test_a_merged_final_keeps_the_last_deltas_final_fields() -> None:
    stream = RequestStream("r")
    stream.push_token(1, "a")
    stream.push(final([2], "b", FinishReason.ERROR, error="safe"))
    merged = stream.take()
    assert (merged.token_ids, merged.text) == ([1, 2], "ab")
    assert (merged.finish_reason, merged.usage, merged.timing, merged.error) == (FinishReason.ERROR, USAGE, TIMING,
                                                                               "safe")
    assert merge_deltas([Delta(token_ids=[1], text="a"), final([2], "b")]) == final([1, 2], "ab")


def test_nothing_is_delivered_after_the_final_delta() -> None:
    stream = RequestStream("r")
    stream.push(final(reason=FinishReason.ABORT))
    stream.push(Delta(token_ids=[9], text="late"))            # e.g. a step racing the abort
    stream.push_token(9, "late")
    stream.push(final(reason=FinishReason.LENGTH))            # a second final never replaces the first
    assert stream.finished
    delta = stream.take()
    assert delta.finish_reason is FinishReason.ABORT and delta.token_ids == [] and delta.text == ""
    assert stream.take() is None


async def test_iteration_yields_in_order_and_stops_after_the_final() -> None:
    stream = RequestStream("r")
    got: list[Delta] = []

    async def consume() -> None:
        async for delta in stream:
            got.append(delta)

    consumer = asyncio.get_running_loop().create_task(consume())
    await asyncio.sleep(0)                                    # the consumer waits: nothing pending
    stream.push_token(1, "a")
    await asyncio.sleep(0)                                    # it wakes and reads one delta
    stream.push_token(2, "b")
    stream.push(final([3], "c"))                              # both pending: read as one
    await asyncio.wait_for(consumer, 5)
    assert [(d.token_ids, d.text, d.finish_reason) for d in got] == [([1], "a", None),
                                                                     ([2, 3], "bc", FinishReason.STOP)]


async def test_collect_returns_the_whole_output_as_one_delta() -> None:
    stream = RequestStream("r")
    loop = asyncio.get_running_loop()
    for i, text in enumerate("xyz"):
        loop.call_soon(stream.push_token, i, text)
    loop.call_soon(stream.push, final(reason=FinishReason.LENGTH))
    whole = await asyncio.wait_for(stream.collect(), 5)
    assert (whole.token_ids, whole.text, whole.finish_reason, whole.usage) == ([0, 1, 2], "xyz",
                                                                              FinishReason.LENGTH, USAGE)


def test_listener_is_called_when_output_arrives_while_nothing_is_pending() -> None:
    stream = RequestStream("r")
    calls: list[int] = []
    stream.listen(lambda: calls.append(1))
    stream.push_token(1, "a")
    stream.push_token(2, "b")                                 # still unread: no second call
    assert len(calls) == 1
    assert stream.take().token_ids == [1, 2]
    stream.push(final())
    assert len(calls) == 2
    stream.listen(None)
    stream.take()
    stream.push_token(3, "c")                                 # after a final nothing arrives anyway
    assert len(calls) == 2


def test_cancel_asks_the_engine_to_abort_once_and_never_after_the_final() -> None:
    aborted: list[str] = []
    stream = RequestStream("r", on_cancel=aborted.append)
    stream.cancel()
    stream.cancel()
    assert aborted == ["r"]
    done = RequestStream("d", on_cancel=aborted.append)
    done.push(final())
    done.cancel()
    assert aborted == ["r"]
    RequestStream("n").cancel()                               # no engine hook: nothing to do


def test_logprobs_merge_in_token_order_and_prompt_ones_come_once() -> None:
    from inferd.types import TokenLogprob

    a, b, c = (TokenLogprob(t, -float(t)) for t in (1, 2, 3))
    prompt = [None, TokenLogprob(9, -0.5)]
    stream = RequestStream("r")
    stream.push(Delta(token_ids=[1], text="a", logprobs=[a], prompt_logprobs=prompt))
    stream.push(Delta(token_ids=[2], text="b", logprobs=[b]))
    merged = stream.take()
    assert merged.logprobs == [a, b] and merged.prompt_logprobs == prompt
    stream.push(Delta(token_ids=[3], text="c", logprobs=[c],
                      finish_reason=FinishReason.STOP, usage=USAGE, timing=TIMING))
    last = stream.take()
    assert last.logprobs == [c] and last.prompt_logprobs is None
    whole = merge_deltas([merged, last])
    assert whole.logprobs == [a, b, c] and whole.prompt_logprobs == prompt
    plain = RequestStream("p")
    plain.push(Delta(token_ids=[1], text="a"))
    plain.push(Delta(token_ids=[2], text="b"))
    assert plain.take().logprobs is None
