"""One TensorRT-LLM request: turning its RequestOutput into the client's delta stream.

A `RequestOutput` is mutated in place on every step; we keep our own offset of token ids already sent
and detokenize ourselves (IncrementalDetokenizer + StopMatcher, as the other backends do), so no part of
a stop string is ever streamed and text is identical across backends.

Two ends, kept apart: the client's stream ends (`end_stream`, final delta with usage and timing) and
the executor lets the request go (`release`, it leaves capacity). They coincide except after a cancel,
whose 'cancelled' reply the API contract does not guarantee: the client never waits on it, capacity
does, for at most ABORT_GRACE_S.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from inferd.engine.stream import RequestStream
from inferd.engine.tokenization import IncrementalDetokenizer, StopMatcher
from inferd.engine.validation import failure_message
from inferd.types import Delta, EngineTiming, FinishReason, GenerationRequest, TokenLogprob, Usage

log = logging.getLogger("inferd.engine.trtllm")

ABORT_GRACE_S = 5.0          # how long a cancelled request may take to report 'cancelled'
FINISH_REASONS = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "timeout": FinishReason.DEADLINE,
                  "cancelled": FinishReason.ABORT}


def token_logprobs(entries: Any, ids: list[int], start: int, k: int) -> list[TokenLogprob]:
    """CompletionOutput.logprobs for ids[start:]: TensorRT-LLM's LogprobResults (a {token id: Logprob(logprob,
    rank)} dict per generated token: its top-k plus the sampled one) or, from the C++ path, plain floats
    (tensorrt_llm/executor/result.py). The list is aligned to the end of the tokens, so a whole list and a
    step's tail both work; a token without an entry gets -inf (the API clamps it to -9999)."""
    entries = entries or []
    offset = len(ids) - len(entries)
    out = []
    for i in range(start, len(ids)):
        token, j = ids[i], i - offset
        entry = entries[j] if 0 <= j < len(entries) else None
        if isinstance(entry, dict):
            own = entry.get(token)
            top = sorted(((t, lp.logprob) for t, lp in entry.items()), key=lambda p: (-p[1], p[0]))[:k]
            out.append(TokenLogprob(token, own.logprob if own is not None else float("-inf"), tuple(top)))
        else:
            out.append(TokenLogprob(token, float(entry) if entry is not None else float("-inf")))
    return out


def _seconds(value: Any) -> float:
    """A steady-clock stamp of the executor's perf metrics (timedelta in 1.2/1.3; tolerate a float)."""
    return value.total_seconds() if hasattr(value, "total_seconds") else float(value)


class RequestBook(Protocol):
    """Where a request reports its end and its release (inferd.engine.trtllm.stats.RequestLedger)."""

    def ended(self, r: TrackedRequest, cached_tokens: int) -> None: ...

    def release(self, r: TrackedRequest) -> None: ...


class TrackedRequest:
    """A request from submit until the executor lets it go. Loop-thread only."""

    __slots__ = ("id", "stream", "output", "ledger", "task", "prompt_len", "blocks", "seq", "sent", "emitted",
                 "detok", "matcher", "stopped", "aborting", "overdue", "submitted", "first_token", "cached",
                 "ended", "released", "logprobs", "pending_logprobs")

    def __init__(self, request: GenerationRequest, stream: RequestStream, output: Any, ledger: RequestBook,
                 blocks: int, detok: IncrementalDetokenizer, matcher: StopMatcher | None) -> None:
        self.id = request.request_id
        self.stream = stream
        self.output = output              # the RequestOutput
        self.ledger = ledger
        self.task: asyncio.Task | None = None
        self.prompt_len = len(request.prompt_token_ids)
        self.blocks = blocks              # GUARANTEED_NO_EVICT reservation: prompt + max_tokens
        self.seq = 0                      # submission order (set by the ledger), to compare with stats samples
        self.sent = 0                     # len(output.token_ids) already read
        self.emitted = 0                  # tokens handed to the client
        self.detok = detok
        self.matcher = matcher
        self.stopped = False              # a stop string matched: drop whatever comes after
        self.aborting = False             # cancelled in the executor; waiting for its 'cancelled'
        self.overdue: asyncio.TimerHandle | None = None
        self.submitted = time.monotonic()
        self.first_token: float | None = None
        self.cached = 0
        self.ended = False                # the client's stream has its final delta
        self.released = False             # no longer counted in capacity (the executor let it go)
        self.logprobs = request.sampling.logprobs   # alternatives per token the client asked for (None: none)
        self.pending_logprobs: list[TokenLogprob] | None = None

    # -- cancelling ----------------------------------------------------------------------------------------
    def cancel_in_executor(self) -> None:
        """Ask the executor to drop the request. Its 'cancelled' reply is not guaranteed (API contract):
        if none comes within ABORT_GRACE_S the request is given up on, so nothing waits forever."""
        self.aborting = True
        self.abort_output()
        self.overdue = asyncio.get_running_loop().call_later(ABORT_GRACE_S, self._abort_overdue)

    def abort_output(self) -> None:
        if self.output is not None and not self.output.finished:
            try:
                self.output.abort()
            except Exception as exc:   # executor gone; the request ends anyway
                log.warning("abort of %s failed: %s", self.id, exc)

    def _abort_overdue(self) -> None:
        if not self.released:
            log.warning("request %s: no 'cancelled' from TensorRT-LLM %.0fs after abort", self.id, ABORT_GRACE_S)
            if self.task is not None:
                self.task.cancel()

    # -- consuming the RequestOutput -----------------------------------------------------------------------
    async def consume(self, request_error: type[Exception], on_executor_failure: Callable[[str], None]) -> None:
        try:
            async for out in self.output:
                self.on_step(out)
                if self.released:
                    return
            self.finish(FinishReason.ERROR, error="TensorRT-LLM ended the request without a result")
        except asyncio.CancelledError:
            self.abort_output()
            self.finish(FinishReason.ABORT)
            raise
        except request_error as exc:
            # The executor's text can name internals; the client gets a pointer to the log instead.
            log.error("TensorRT-LLM failed request %s: %s", self.id, exc)
            self.finish(FinishReason.ERROR, error=failure_message(self.id))
        except Exception as exc:   # the executor died (worker gone, CppExecutorError): nothing will finish
            on_executor_failure(f"TensorRT-LLM executor failed: {exc!r}")

    def on_step(self, out: Any) -> None:
        if self.ended:       # stopped by a stop string: only the executor's final reply is still awaited
            if out.finished:
                self.release()
            return
        c = out.outputs[0]
        ids = c.token_ids
        new = list(ids[self.sent:]) if len(ids) > self.sent else []
        if new and self.logprobs is not None:
            found = token_logprobs(c.logprobs, ids, self.sent, self.logprobs)
            self.pending_logprobs = (self.pending_logprobs or []) + found
        self.sent = max(self.sent, len(ids))
        self.cached = getattr(out, "cached_tokens", 0) or 0
        if new and self.first_token is None:
            self.first_token = time.monotonic()
        final = out.finished
        text = ""
        if self.stopped:
            new = []
        elif new:
            # A matched stop token id ends the output without text (as EOS does).
            textual = new[:-1] if final and c.finish_reason == "stop" and isinstance(c.stop_reason, int) else new
            text = self.detok.push(textual)
        if final and not self.stopped:
            text += self.detok.flush()
        if self.matcher is not None and not self.stopped:
            text, self.stopped = self.matcher.push(text)
            if self.stopped and not final:
                # The client gets its final delta now, not after TensorRT-LLM's 'cancelled' (which may
                # never come); the request stays counted in capacity until the executor lets it go.
                self.emitted += len(new)
                self.end_stream(FinishReason.STOP, new, text)
                self.cancel_in_executor()
                return
            if final and not self.stopped:
                text += self.matcher.flush()
        self.emitted += len(new)
        if not final:
            if new or text:
                self.stream.push(Delta(token_ids=new, text=text, logprobs=self._take_logprobs(len(new))))
            return
        reason = FinishReason.STOP if self.stopped else FINISH_REASONS.get(c.finish_reason, FinishReason.ABORT)
        if self.aborting and not self.stopped:
            reason = FinishReason.ABORT
        self.finish(reason, new, text)

    # -- ending ---------------------------------------------------------------------------------------------
    def finish(self, reason: FinishReason, token_ids: list[int] | None = None, text: str = "",
               error: str | None = None) -> None:
        self.end_stream(reason, token_ids, text, error)
        self.release()

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self.ledger.release(self)
        if self.overdue is not None:
            self.overdue.cancel()

    def end_stream(self, reason: FinishReason, token_ids: list[int] | None = None, text: str = "",
                   error: str | None = None) -> None:
        if self.ended:
            return
        self.ended = True
        cached = min(self.cached, max(self.prompt_len - 1, 0))
        self.ledger.ended(self, cached)
        now = time.monotonic()
        first = self.first_token if self.first_token is not None else now
        self.stream.push(Delta(token_ids=token_ids or [], text=text, finish_reason=reason, error=error,
                               logprobs=self._take_logprobs(len(token_ids or [])),
                               usage=Usage(prompt_tokens=self.prompt_len, completion_tokens=self.emitted,
                                           cached_tokens=cached),
                               timing=EngineTiming(submitted=self.submitted, first_scheduled=self._scheduled_at(first),
                                                   first_token=first, finished=now)))

    def _take_logprobs(self, count: int) -> list[TokenLogprob] | None:
        """The entries of the `count` tokens a delta delivers (requests that asked for logprobs only)."""
        if self.logprobs is None:
            return None
        pending = self.pending_logprobs or []
        self.pending_logprobs = pending[count:]
        return pending[:count]

    def _scheduled_at(self, first_token: float) -> float:
        """When the request's prefill started, on our clock.

        The executor measures it (perf metrics, final response only) on its own steady clock, which may
        be another process's, so only its prefill duration (first token - first scheduled) is used, set
        back from our first-token stamp. Without metrics (not supported, not final yet, renamed
        attributes) prefill cannot be told from queueing: the stamp is the first token's.
        """
        try:
            timing = self.output.outputs[0].request_perf_metrics.timing_metrics
            scheduled, token = _seconds(timing.first_scheduled_time), _seconds(timing.first_token_time)
        except (AttributeError, IndexError, TypeError, ValueError):
            return first_token
        if not (scheduled > 0.0 and token >= scheduled):     # unset (zero) stamps, NaN
            return first_token
        return max(self.submitted, first_token - (token - scheduled))
