"""GrammarWorker: an engine compiles the grammars its cache missed here, never on its step.

The API compiles a request's grammar before submit (api.pipeline.guided), so the engine normally finds it in
Grammars' cache. It can miss: a caller that skipped the API's stage, or an LRU eviction while the request
waited in admission (256 entries; tool_choice "required" makes one grammar per tool list). Compiling then on
the step (the reference engine's thread, the sim's loop) would stall every sequence of the batch for the
compile's length, so the engine parks the sequence, compiles here, and schedules it once compiled.

A few threads of the engine's own (not the API's GRAMMAR_POOL: the engine layer sits below the API). Their
queue is bounded by what the engine admits (its pending requests); a grammar another caller is compiling
already is not queued at all: its flight (Grammars.in_flight) is awaited instead, on no thread.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from inferd.engine.grammar import GrammarError, Grammars
from inferd.types import GuidedDecoding

__all__ = ["ENGINE_GRAMMAR_WORKERS", "GrammarWorker"]

ENGINE_GRAMMAR_WORKERS = 2


class GrammarWorker:
    """Off-step compiles for one engine's Grammars."""

    def __init__(self, grammars: Grammars, workers: int = ENGINE_GRAMMAR_WORKERS,
                 name: str = "inferd-engine-grammar") -> None:
        self._grammars = grammars
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix=name)

    def ready(self, guided: GuidedDecoding) -> Any:
        """What a sequence with `guided` can run with now, without compiling: a GrammarState when it is
        compiled, a GrammarError when it was refused already (the verdict outlives the cache), None when it
        must compile first (compile())."""
        state = self._grammars.cached_matcher(guided)
        if state is not None:
            return state
        refused = self._grammars.verdict(guided)
        return GrammarError(refused) if refused else None

    def compile(self, guided: GuidedDecoding) -> Future:
        """The compiled grammar of `guided`, as a Future (GrammarError: refused); build the sequence's matcher
        from it with Grammars.matcher(guided, compiled), which then compiles nothing even if evicted again."""
        flight = self._grammars.in_flight(guided)
        if flight is not None:
            return flight
        return self._pool.submit(self._grammars.compile, guided)

    def close(self) -> None:
        """Drop queued compiles (their sequences end with the engine); running ones finish unobserved."""
        self._pool.shutdown(wait=False, cancel_futures=True)
