"""Prompt -> token ids on the request path: a cheap length bound first, then the tokenizer, bounded.

A prompt far longer than the model's context is refused from its length alone, before any
tokenization (`check_length_bound`): a tokenizer never packs more characters into one token than
its longest vocabulary entry, so N characters are at least ceil(N / that) tokens. Prompts that
pass are tokenized inline when short, and otherwise in `POOL`, a fixed number of threads shared by
the process: huge prompts queue for a worker instead of taking every thread, and one still queued
when its client leaves or its deadline passes is dropped without being tokenized.
"""
from __future__ import annotations

import asyncio
import math
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from inferd.api.errors import TIMEOUT, ApiError, invalid
from inferd.api.wire.openai import Prepared
from inferd.api.wire.endpoints import ENDPOINTS
from inferd.engine import Engine

# Tokenize (and template) in the pool when the body or the conversation is big: the text alone
# undercounts the work (thousands of empty messages carry no text yet take tens of ms to template).
OFF_LOOP_BYTES = 2048
OFF_LOOP_MESSAGES = 32
TOKENIZE_WORKERS = 2           # threads for long prompts, process-wide; the rest wait their turn
# Characters per token when a tokenizer cannot list its vocabulary: twice the longest entry of the
# tokenizers measured (Llama 3's 128 bytes: 128 spaces; the synthetic `tiny`/`small` 18, a special
# token; the sim's 17), so a real prompt is never refused from its length. A byte-level entry's
# length is its bytes, and a character is at least one byte.
MAX_CHARS_PER_TOKEN = 256

T = TypeVar("T")


class TokenizerPool:
    """`workers` threads for long tokenizations. Loop-agnostic (a concurrent.futures executor), so
    one pool serves the process; the counters are for tests and operators."""

    def __init__(self, workers: int = TOKENIZE_WORKERS, name: str = "inferd-tokenize") -> None:
        self.workers = workers
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix=name)
        self._lock = threading.Lock()
        self.queued = 0             # waiting for a worker
        self.running = 0

    def submit(self, work: Callable[[], T]) -> Future[T]:
        with self._lock:
            self.queued += 1
        fut = self._executor.submit(self._call, work)
        fut.add_done_callback(self._cancelled)
        return fut

    async def run(self, work: Callable[[], T], deadline: float) -> T:
        """`work()` on a worker, waiting at most until `deadline` (time.monotonic). Cancelled (the
        client left) or out of time while queued: the work never runs. Out of time while running:
        504 at once; the worker finishes and its result is dropped."""
        return await wait(self.submit(work), deadline)

    def _call(self, work: Callable[[], T]) -> T:
        with self._lock:
            self.queued -= 1
            self.running += 1
        try:
            return work()
        finally:
            with self._lock:
                self.running -= 1

    def _cancelled(self, fut: Future) -> None:
        if fut.cancelled():         # dropped before a worker took it: _call never ran
            with self._lock:
                self.queued -= 1

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


async def wait(fut: Future[T], deadline: float, *, shield: bool = False) -> T:
    """The result of `fut`, or 504 once `deadline` (time.monotonic) passes. Leaving (cancelled, or
    out of time) cancels `fut` unless `shield`: queued work nobody waits for never runs."""
    waited = asyncio.wrap_future(fut)
    try:
        return await asyncio.wait_for(asyncio.shield(waited) if shield else waited,
                                      max(0.0, deadline - time.monotonic()))
    except asyncio.TimeoutError:
        raise ApiError(504, "The request's deadline passed while its prompt waited to be tokenized.",
                       type=TIMEOUT, code="deadline") from None


POOL = TokenizerPool()

# tokenizer -> its longest vocabulary entry in characters (a Future: computed once, off the loop)
_CHARS_PER_TOKEN: weakref.WeakKeyDictionary[Any, Future] = weakref.WeakKeyDictionary()


def _longest_entry(tok: Any) -> int:
    """The most characters one token can stand for: its longest vocabulary entry (a byte-level
    entry is written one character per byte; a byte-fallback `<0x41>` or `##ing` only overstates).
    A tokenizer that fails to list it gets MAX_CHARS_PER_TOKEN."""
    id_to_token = tok.id_to_token
    longest = 1
    try:
        for i in range(tok.vocab_size):      # 65 ms for Llama 3's 128k entries, once per tokenizer
            entry = id_to_token(i)
            if entry is not None and len(entry) > longest:
                longest = len(entry)
    except Exception:                        # a tokenizer that cannot say: the documented constant
        return MAX_CHARS_PER_TOKEN
    return longest


async def chars_per_token(tok: Any, deadline: float) -> int:
    """`_longest_entry(tok)`, computed once in POOL and shared by every request that needs it."""
    if getattr(tok, "id_to_token", None) is None:
        return MAX_CHARS_PER_TOKEN
    try:
        fut = _CHARS_PER_TOKEN.get(tok)
    except TypeError:                        # not weak-referenceable, so not cacheable: the constant
        return MAX_CHARS_PER_TOKEN
    if fut is None or fut.cancelled():      # cancelled: its pool was shut down
        fut = _CHARS_PER_TOKEN[tok] = POOL.submit(lambda: _longest_entry(tok))
    # Shielded: a request that leaves or runs out of time must not cancel the others' answer.
    return fut.result() if fut.done() else await wait(fut, deadline, shield=True)


def _bounded_chars(p: Prepared) -> int:
    """Characters the prompt certainly puts before the model. Chat: the messages' contents without
    surrounding whitespace (Llama 3's template trims it), and not the assistant's (some templates,
    Qwen3's, drop earlier turns' reasoning), so no template can make the bound an overstatement."""
    if p.messages is None:
        return p.prompt_chars
    return sum(len(m["content"].strip()) for m in p.messages if m["role"] != "assistant")


async def check_length_bound(engine: Engine, p: Prepared, max_model_len: int, deadline: float) -> None:
    """400 context_length_exceeded if the prompt cannot fit the context whatever it tokenizes to."""
    field = ENDPOINTS[p.kind].prompt_field
    if p.prompt_token_ids is not None:
        if len(p.prompt_token_ids) >= max_model_len:     # before scanning 100k ids against the vocabulary
            raise _too_long(field, f"{len(p.prompt_token_ids)} tokens", max_model_len)
        return
    chars = _bounded_chars(p)
    if chars < max_model_len:               # at least one character per token: it may well fit
        return
    at_least = math.ceil(chars / await chars_per_token(engine.tokenizer, deadline))
    if at_least >= max_model_len:
        raise _too_long(field, f"{chars} characters, so at least {at_least} tokens (judged from its length)",
                        max_model_len)


def _too_long(field: str, size: str, max_model_len: int) -> ApiError:
    return invalid(f"{field}: {size}; this model's context is {max_model_len} tokens (prompt + completion).",
                   param=field, code="context_length_exceeded")


async def tokenize(engine: Engine, p: Prepared, body_bytes: int, deadline: float) -> list[int]:
    """The prompt's token ids: checked ids as given, else encoded (chat: templated) inline when
    short and in POOL when long."""
    tok = engine.tokenizer
    if p.prompt_token_ids is not None:
        vocab = tok.vocab_size
        for i, t in enumerate(p.prompt_token_ids):
            if not 0 <= t < vocab:
                raise invalid(f"prompt[{i}]: token id {t} is outside this model's vocabulary [0, {vocab}).",
                              param="prompt", code="invalid_token_id")
        return p.prompt_token_ids

    def work() -> list[int]:
        if p.messages is not None:
            try:
                # as transformers: the function tools go to the template, which renders them its own way
                extra = {"tools": p.tools} if p.tools else {}
                text = tok.apply_chat_template(p.messages, add_generation_prompt=True, **extra)
            except ValueError as exc:   # the template refused the messages (inferd.engine.tokenization.ChatTemplateError)
                field = ENDPOINTS[p.kind].prompt_field
                raise invalid(f"{field}: {exc}", param=getattr(exc, "param", None) or field,
                              code="invalid_messages") from None
            return tok.encode(text, add_special_tokens=False)   # the template wrote the special tokens
        return tok.encode(p.prompt_text)

    if body_bytes > OFF_LOOP_BYTES or p.prompt_chars > OFF_LOOP_BYTES or len(p.messages or ()) > OFF_LOOP_MESSAGES:
        return await POOL.run(work, deadline)
    return work()
