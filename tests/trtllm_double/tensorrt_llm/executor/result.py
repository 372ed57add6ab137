"""Mirrors tensorrt_llm/executor/result.py: CompletionOutput, GenerationResult, IterationResult.

A result is mutated in place by each response; `async for` yields the same object. Its queue is an
AsyncQueue only when created on a running event loop; otherwise async use fails with the real
AssertionError.
"""
from __future__ import annotations

import asyncio
import json
import weakref
from dataclasses import dataclass, field
from queue import Empty, Queue
from typing import Any, Literal, Optional, Union

from ..llmapi.utils import AsyncQueue
from .utils import ErrorResponse, has_event_loop

_NO_LOOP = ("The asyncio event loop was not present during initialization, so async operations are "
            "not available.")


@dataclass(slots=True)
class Logprob:
    """Holds logprob and vocab rank for a token (as the real one)."""
    logprob: float
    rank: Optional[int] = None


def _fake_logprobs(context: list[int], token: int, k: int, candidates: list[int]) -> dict:
    """A deterministic stand-in for compute_logprobs' per-token dict: top-k (the sampled token first) plus
    the sampled token; values negative and decreasing, ranks from 1."""
    key = len(context) * 7919 + sum(context[-4:])
    value = -0.25 - (key % 50) / 100.0
    out = {token: Logprob(value, 1)}
    i = 0
    while len(out) < k and i < len(candidates):
        other = candidates[(key + i) % len(candidates)]
        i += 1
        if other not in out:
            out[other] = Logprob(value - len(out), len(out) + 1)
    return out


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: Optional[list[int]] = field(default_factory=list)
    cumulative_logprob: Optional[float] = None
    logprobs: Optional[list] = field(default_factory=list)
    prompt_logprobs: Optional[list] = field(default_factory=list)
    finish_reason: Optional[Literal["stop", "length", "timeout", "cancelled"]] = None
    stop_reason: Optional[Union[int, str]] = None
    generation_logits: Optional[Any] = None
    disaggregated_params: Optional[Any] = None
    request_perf_metrics: Optional[Any] = None
    _last_text_len: int = field(default=0, init=False, repr=False)
    _last_token_ids_len: int = field(default=0, init=False, repr=False)
    _last_logprobs_len: int = field(default=0, init=False, repr=False)

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def text_diff(self) -> str:
        return self.text[self._last_text_len:]

    @property
    def token_ids_diff(self) -> list[int]:
        return self.token_ids[self._last_token_ids_len:]

    @property
    def logprobs_diff(self) -> list:
        return self.logprobs[self._last_logprobs_len:]


class GenerationResult:
    def __init__(self, request, executor, background_error_handler, tokenizer=None) -> None:
        self._request = request
        self.sampling_params = request.sampling_params
        self._executor = weakref.ref(executor)
        self._background_error_handler = weakref.WeakMethod(background_error_handler)
        self.tokenizer = tokenizer
        self._streaming = request.streaming
        self._done = False
        self._aborted = False
        self.cached_tokens = 0
        self.decoding_iter = 0
        if has_event_loop():
            self.aqueue = AsyncQueue()
            self.queue = self.aqueue.sync_q
        else:
            self.queue = Queue()
            self.aqueue = None
        self._outputs = [CompletionOutput(i) for i in range(self.sampling_params.best_of)]

    @property
    def request_id(self) -> int:
        return self._request.id

    @property
    def prompt_token_ids(self) -> list[int]:
        return self._request.prompt_token_ids

    @property
    def outputs(self) -> list[CompletionOutput]:
        return self._outputs[: self.sampling_params.n]

    @property
    def finished(self) -> bool:
        return self._done

    def abort(self) -> None:
        assert self._executor is not None, "The executor is not set for this result."
        self._executor().abort_request(self.request_id)
        self._aborted = True

    def aborted(self) -> bool:
        return self._aborted

    def _handle_response(self, response) -> None:
        handler = self._background_error_handler()
        if isinstance(response, ErrorResponse):
            if handler is not None:
                handler(response.error_msg)
            return
        self._done = response.is_final
        self.decoding_iter = response.decoding_iter
        self.cached_tokens = response.cached_tokens
        out = self._outputs[response.sequence_index]
        out._last_token_ids_len = len(out.token_ids)
        k = self.sampling_params.logprobs
        if k:   # the real result replaces the list with the whole of it (out._last_logprobs_len: the old length)
            context = list(self.prompt_token_ids) + list(out.token_ids)
            added = []
            for t in response.output_token_ids:
                added.append(_fake_logprobs(context, t, k, list(range(3, 64))))
                context.append(t)
            out._last_logprobs_len = len(out.logprobs)
            out.logprobs = out.logprobs + added
        out.token_ids.extend(response.output_token_ids)
        if response.finish_reason == "cancelled":
            out.finish_reason = "cancelled"
        if getattr(response, "perf_metrics", None) is not None:
            out.request_perf_metrics = response.perf_metrics
        if self._done and response.finish_reason != "cancelled":
            out.finish_reason = response.finish_reason
            if response.finish_reason == "stop" and response.stop_words_hit:
                for reason, ids in self.sampling_params._get_stop_reasons_and_words():
                    if out.token_ids[-len(ids):] == ids:
                        out.stop_reason = reason
                        if not self.sampling_params.include_stop_str_in_output:
                            out.token_ids = out.token_ids[:-len(ids)]
                        break
        if self.sampling_params.detokenize and self.tokenizer is not None:
            out._last_text_len = len(out.text)
            out.text = self.tokenizer.decode(out.token_ids, skip_special_tokens=self.sampling_params.skip_special_tokens)
        if handler is not None:
            handler()  # surfaces fatal background errors "as soon as possible" as the real code does

    def _result_step(self, timeout: Optional[float] = None) -> None:
        self._handle_response(self.queue.get(timeout=timeout))

    async def _aresult_step(self) -> None:
        assert self.aqueue is not None, _NO_LOOP
        self._handle_response(await self.aqueue.get())

    def result(self, timeout: Optional[float] = None):
        while not self._done:
            self._result_step(timeout)
        return self

    async def aresult(self):
        while not self._done:
            await self._aresult_step()
        return self

    def __await__(self):
        return self.aresult().__await__()

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        self._result_step()
        return self

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._done:
            raise StopAsyncIteration
        await self._aresult_step()
        return self


class IterationResult:
    """The stats stream: a singleton queue of JSON strings; ends after `timeout` idle."""

    def __init__(self) -> None:
        self._done = False
        self._timeout = 2
        if has_event_loop():
            self.aqueue = AsyncQueue()
            self.queue = self.aqueue.sync_q
        else:
            self.queue = Queue()
            self.aqueue = None

    def set_timeout(self, timeout: float) -> None:
        self._timeout = timeout

    def mark_undone(self) -> None:
        self._done = False

    def get_results(self) -> list[dict]:
        results = []
        while not self._done:
            try:
                results.append(json.loads(self.queue.get(timeout=self._timeout)))
            except Empty:
                self._done = True
        return results

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._done:
            raise StopAsyncIteration
        assert self.aqueue is not None, _NO_LOOP
        try:
            data = await self.aqueue.get(timeout=self._timeout)
            return json.loads(data)
        except asyncio.TimeoutError:
            self._done = True
            raise StopAsyncIteration
