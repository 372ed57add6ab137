"""The sim's structured output: its synthetic tokens obey the request's grammar, so load tests of
structured output are honest (the same mask work per token as a real engine's sampler, and output that parses).

The vocabulary xgrammar sees is the sim tokenizer's own (each id's bytes, VocabType.RAW; specials are
empty, so no grammar ever allows them inside text). Among the tokens the grammar allows next, the choice
is a deterministic function of (sequence key, position), like the free-running sim's, with a bias a model
would have: it stops as soon as the grammar may end; it writes the sim's words where the grammar allows
them (inside strings); and the longer the output, the more it prefers a token that closes something
(`"`, `}`, `]`), from 5% at the first token to 90% from the 85th, so strings, arrays and objects end
after a few dozen tokens rather than at max_tokens. Every token it picks is one the grammar allows.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np

from inferd.engine.grammar import GrammarError, Grammars, GrammarState
from inferd.engine.grammar_worker import GrammarWorker
from inferd.engine.sim.profiles import SimTokenizer
from inferd.observability import get_logger
from inferd.types import GuidedDecoding

log = get_logger("inferd.engine.sim")

_CLOSERS = ('"', "}", "]")


def sim_grammars(tokenizer: SimTokenizer) -> Grammars:
    """Grammars over the sim tokenizer's vocabulary (xgrammar loads on the first compile)."""
    return Grammars.for_pieces(tokenizer.token_bytes(), tokenizer.eos_token_ids, tokenizer.vocab_size)


class Compiling:
    """Sequences whose grammar was not compiled at submit (a caller that skipped the API's grammar stage, or an
    eviction since): it compiles on a GrammarWorker (inferd.engine.grammar_worker), the same as the reference
    engine's, never on the loop that runs the sim's steps; the sequence is scheduled once it is."""

    def __init__(self, grammars: Grammars) -> None:
        self._grammars = grammars
        self._worker = GrammarWorker(grammars)
        self._tasks: dict[str, asyncio.Task] = {}       # request id -> its compile; bounded by the admitted

    def ready(self, guided: GuidedDecoding) -> GrammarState | None:
        """A matcher when `guided` is compiled already (the API's grammar stage); None: start() it."""
        return self._grammars.cached_matcher(guided)

    def start(self, request_id: str, guided: GuidedDecoding, ready: Callable[[GrammarState], None],
              failed: Callable[[str | None], None]) -> None:
        """Compile `guided`; then `ready(matcher)`, or `failed(reason)` (None: a bug, logged). Neither when the
        request was discarded meanwhile."""
        task = asyncio.get_running_loop().create_task(self._compile(request_id, guided, ready, failed))
        self._tasks[request_id] = task

    async def _compile(self, request_id: str, guided: GuidedDecoding, ready: Callable[[GrammarState], None],
                       failed: Callable[[str | None], None]) -> None:
        # The callbacks run while the request is still listed: one that ends it (discard) finds it here.
        try:
            refused = self._grammars.verdict(guided)      # refused for an earlier request: no compile at all
            if refused:
                raise GrammarError(refused)
            compiled = await asyncio.wrap_future(self._worker.compile(guided))
            grammar = self._grammars.matcher(guided, compiled)
        except GrammarError as exc:
            failed(str(exc))
        except Exception:    # a bug, not the client's grammar: its stream still ends
            log.exception("sim_grammar_compile_failed", request_id=request_id)
            failed(None)
        else:
            ready(grammar)
        finally:
            self._tasks.pop(request_id, None)

    def discard(self, request_id: str) -> bool:
        """Drop the request's compile (it ended: aborted, closed); False when it had none running."""
        task = self._tasks.pop(request_id, None)
        if task is not None:
            task.cancel()
        return task is not None

    def close(self) -> None:
        for request_id in list(self._tasks):
            self.discard(request_id)
        self._worker.close()


class GuidedChooser:
    """Picks the next synthetic token of a sequence with a grammar."""

    def __init__(self, tokenizer: SimTokenizer) -> None:
        size = tokenizer.vocab_size
        self._stops = np.asarray(tokenizer.eos_token_ids, dtype=np.int64)
        self._words = np.zeros(size, dtype=bool)
        self._words[list(tokenizer.generation_ids)] = True
        self._pieces = np.zeros(size, dtype=bool)              # tokens with text of their own (not bytes, specials)
        self._pieces[tokenizer.first_piece:] = True
        self._closers = [tokenizer.token_to_id(c) for c in _CLOSERS]

    def choose(self, grammar: GrammarState, key: int, pos: int) -> int | None:
        """The token at output position `pos` (None: the grammar allows nothing, it cannot go on)."""
        allowed = grammar.allowed()
        if allowed[self._stops].any():
            return int(self._stops[allowed[self._stops]][0])     # the output is complete: end it
        h = hash((key, pos, 3))
        if h % 100 < min(90, 5 + pos):
            for closer in self._closers:
                if allowed[closer]:
                    return closer
        words = np.flatnonzero(allowed & self._words)
        if len(words) and (h >> 8) % 4:
            return int(words[(h >> 10) % len(words)])
        ids = np.flatnonzero(allowed & self._pieces)
        if not len(ids):
            ids = np.flatnonzero(allowed)      # only raw bytes (say, a regex asking for non-ASCII text)
        return int(ids[(h >> 10) % len(ids)]) if len(ids) else None
