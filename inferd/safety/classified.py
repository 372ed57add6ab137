"""Output classifiers: generated text is sent only after the policy's classifiers judged it.

`ClassifiedStream` wraps a stream (usually a FilteredStream, whose patterns and words act first)
and holds its output in chunks of `every_chars`: when a chunk is full, or the generation ends, the
classifiers judge it (with the last sent characters for context) in a task; the chunk goes out when
they pass it. Flagged: the engine request is cancelled, nothing of the chunk is sent, and the stream
ends with finish_reason CONTENT_FILTER. A classifier that fails or runs past `timeout_s` fails closed:
the stream ends with an error. The price is latency: text reaches the client a chunk at a time, each
after a classifier call, which is what checking output with a model costs.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from inferd.engine import StreamWrapper
from inferd.types import Delta, FinishReason, Usage

CONTEXT_CHARS = 512          # already-sent text given to the classifier with each new chunk


class ClassifiedStream(StreamWrapper):
    def __init__(self, inner: Any, classify: Callable[[str], Awaitable[str | None]], every_chars: int,
                 timeout_s: float, prompt_tokens: int, on_flag: Callable[[str], None]) -> None:
        super().__init__(inner)
        self._classify = classify
        self._every = every_chars
        self._timeout = timeout_s
        self._prompt_tokens = prompt_tokens
        self._on_flag = on_flag
        self._ids: list[int] = []
        self._text = ""
        self._final: Delta | None = None
        self._sent = ""
        self._check: asyncio.Task | None = None
        self._listener: Callable[[], None] | None = None
        self._done = False

    # -- the consumer interface -------------------------------------------------------------
    def take(self) -> Delta | None:
        while not self._done:
            if self._check is not None:
                if not self._check.done():
                    return None
                out = self._settle()
                # The inner stream wakes its listener only when output arrives while nothing is pending;
                # what piled up during the check is already pending, so wake the writer ourselves.
                if out is not None and not self._done and self._listener is not None and self._inner.ready():
                    asyncio.get_running_loop().call_soon(self._listener)
                return out
            delta = self._inner.take()
            if delta is None:
                return None
            self._hold(delta)
        return None

    async def __anext__(self) -> Delta:
        while not self._done:
            if self._check is not None:
                await asyncio.wait({self._check})
                out = self._settle()
                if out is not None:
                    return out
                continue
            try:
                self._hold(await self._inner.__anext__())
            except StopAsyncIteration:
                break
        raise StopAsyncIteration

    def listen(self, listener: Callable[[], None] | None) -> None:
        self._listener = listener
        self._inner.listen(listener)

    def ready(self) -> bool:
        if self._check is not None:
            return self._check.done()
        return not self._done and self._inner.ready()

    @property
    def _ended(self) -> bool:
        return self._done

    def cancel(self) -> None:
        if self._check is not None:
            self._check.cancel()
        self._inner.cancel()

    # -- the gate ----------------------------------------------------------------------------
    def _hold(self, delta: Delta) -> None:
        self._ids.extend(delta.token_ids)
        self._text += delta.text
        if delta.finish_reason is not None:
            self._final = delta
        if self._final is not None or len(self._text) >= self._every:
            judged = self._sent[-CONTEXT_CHARS:] + self._text
            self._check = asyncio.ensure_future(asyncio.wait_for(self._classify(judged), self._timeout))
            self._check.add_done_callback(self._wake)

    def _wake(self, _task: asyncio.Task) -> None:
        if self._listener is not None:
            self._listener()           # the writer takes again: the verdict is in

    def _settle(self) -> Delta | None:
        check, self._check = self._check, None
        final = self._final
        try:
            label = check.result()
            failed = None
        except asyncio.CancelledError:
            return None
        except Exception as exc:  # noqa: BLE001 - fail closed, naming only the error's type
            label, failed = None, type(exc).__name__
        if label is not None or failed is not None:
            self._done = True
            if final is None:
                self._inner.cancel()    # abort the engine request: nothing more is wanted of it
            usage = final.usage if final is not None and final.usage is not None else Usage(
                prompt_tokens=self._prompt_tokens, completion_tokens=self._inner.delivered_tokens)
            timing = final.timing if final is not None else None
            if failed is not None:
                return Delta(token_ids=self._ids, text="", finish_reason=FinishReason.ERROR, usage=usage,
                             timing=timing, error=f"the output's content check failed ({failed})")
            self._on_flag(str(label))
            return Delta(token_ids=self._ids, text="", finish_reason=FinishReason.CONTENT_FILTER, usage=usage,
                         timing=timing)
        out = Delta(token_ids=self._ids, text=self._text,
                    finish_reason=final.finish_reason if final is not None else None,
                    usage=final.usage if final is not None else None,
                    timing=final.timing if final is not None else None,
                    error=final.error if final is not None else None)
        self._sent = (self._sent + self._text)[-CONTEXT_CHARS:]
        self._ids, self._text = [], ""
        if final is not None:
            self._done = True
        return out
