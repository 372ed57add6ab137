"""Several choices (a list of prompts in /v1/completions, or `n` > 1): engine streams answered as one
response with one choice each, prompt-major (prompt i's choice j is index i*n + j).

Each choice is its own engine request (they batch in flight anyway; on an engine with prefix caching
a prompt's n choices fork from the first one's computed prompt, inferd.engine.scheduler). Usage counts every
choice's output and each prompt once, as OpenAI's does for `n`. A streamed response interleaves
their chunks, each with its choice `index`, as OpenAI's API does, and ends (usage summed, `[DONE]`)
once every choice has its finish_reason. One choice ending abnormally (deadline, abort, engine error)
ends the whole response with that error and cancels the others: a partial batch never looks complete.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from inferd.api.wire.responses import OPENAI_FINISH, ChunkEncoder
from inferd.api.streaming.inflight import Tracked
from inferd.api.streaming.sse import Sender, final_frames
from inferd.engine import RequestStream
from inferd.observability import RequestObservation
from inferd.types import Delta, Usage


class Choices:
    """The n admitted streams of one request, shaped like one RequestStream where the SSE writer and
    the watchdog use it (`listen`, `cancel`, `request_id`)."""

    def __init__(self, streams: list[RequestStream], per_prompt: int = 1) -> None:
        self.streams = streams
        self.per_prompt = per_prompt            # n: consecutive streams share one prompt
        self.request_id = streams[0].request_id

    def listen(self, listener: Callable[[], None] | None) -> None:
        for stream in self.streams:
            stream.listen(listener)

    def cancel(self) -> None:
        for stream in self.streams:
            stream.cancel()

    @property
    def delivered_tokens(self) -> int:
        return sum(stream.delivered_tokens for stream in self.streams)

    async def collect(self) -> list[Delta]:
        """Every choice's whole output, in index order."""
        return list(await asyncio.gather(*(stream.collect() for stream in self.streams)))


def merged_final(finals: list[Delta | None], per_prompt: int = 1) -> Delta:
    """The request-level end of several choices (None: one that has not ended), for status, metrics,
    rollouts and the log line: the first abnormal end if any (else the first choice's), the first
    choice's timing, and usage summed: every choice's output, each prompt's tokens once (from the first
    ended of its `per_prompt` consecutive choices)."""
    done = [d for d in finals if d is not None]
    end = next((d for d in done if d.finish_reason not in OPENAI_FINISH), done[0])
    usage = Usage.summed([d.usage for d in done if d.usage is not None])
    if usage is not None and per_prompt > 1:
        groups = (finals[i:i + per_prompt] for i in range(0, len(finals), per_prompt))
        firsts = [u for u in (next((d.usage for d in g if d is not None and d.usage is not None), None)
                              for g in groups) if u is not None]
        usage = Usage(prompt_tokens=sum(u.prompt_tokens for u in firsts), completion_tokens=usage.completion_tokens,
                      cached_tokens=sum(u.cached_tokens for u in firsts))
    return Delta(token_ids=[], finish_reason=end.finish_reason, usage=usage, timing=done[0].timing,
                 error=end.error)


class ChoicesSender(Sender):
    """Sender for a Choices stream: each flush writes every choice's pending output with its own index."""

    __slots__ = ("_encoders", "_finals")

    def __init__(self, entry: Tracked, writer, encoder: ChunkEncoder, include_usage: bool,
                 obs: RequestObservation) -> None:
        super().__init__(entry, writer, encoder, include_usage, obs)
        streams = entry.stream.streams
        self._encoders = [encoder] + [encoder.for_choice(i) for i in range(1, len(streams))]
        self._finals: list[Delta | None] = [None] * len(streams)

    def flush(self) -> None:
        if not self.writable():
            return
        frames: list[bytes] = []
        tokens = 0
        for i, stream in enumerate(self.entry.stream.streams):
            if self._finals[i] is not None:
                continue
            delta = stream.take()
            if delta is None:
                continue
            tokens += len(delta.token_ids)
            self.accepted.took(len(delta.token_ids))
            encoder = self._encoders[i]
            if delta.finish_reason is None:
                if encoder.running is None:
                    if delta.text:
                        frames.append(encoder.content(delta.text))
                elif delta.text:
                    frames.append(encoder.content_with_usage(delta.text, len(delta.token_ids)))
                else:
                    encoder.running.count(len(delta.token_ids))
                continue
            self._finals[i] = delta
            finish = OPENAI_FINISH.get(delta.finish_reason)
            if finish is None:           # an abnormal end ends the response: its error, then [DONE]
                self._end_with(frames, final_frames(delta, encoder, self._include_usage, self.entry.timed_out),
                               tokens)
                return
            frames.append(encoder.final(delta.text, finish, len(delta.token_ids)))
        if all(final is not None for final in self._finals):
            last = merged_final(self._finals, self.entry.stream.per_prompt)
            if self._include_usage and last.usage is not None:
                frames.append(self._encoders[0].usage(last.usage))
            self._end_with(frames, [self._encoders[0].done(last.usage, last.timing)], tokens)
            return
        if frames:
            self.entry.last_write = now = time.monotonic()
            self.send(b"".join(frames))
            self._on_tokens(tokens, now, self.pushed_at)

    def _end_with(self, frames: list[bytes], closing: list[bytes], tokens: int) -> None:
        entry = self.entry
        entry.closing = True
        entry.final = merged_final(self._finals, entry.stream.per_prompt)
        self.send(b"".join(frames + closing))
        self._on_tokens(tokens)
        entry.stream.cancel()            # no-op for choices that ended; aborts the rest
        self.end()
