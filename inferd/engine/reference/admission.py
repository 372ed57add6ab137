"""How the reference engine's step thread admits a submitted sequence (a mixin of StepEngine).

Everything one request alone needs is set up here (its output state, its rng, its grammar's matcher); a
failure ends that request only. A grammar missing from Grammars' cache (evicted while the request waited in
admission, or a caller that skipped the API's compile) is compiled on the engine's GrammarWorker
(inferd.engine.grammar_worker), never on the step thread, where the compile would stall every sequence of
the batch: the sequence waits in `_deferred` (still pending: capacity() counts it as waiting, its blocks as
reserved) and comes back as a "compiled" command; an abort or close meanwhile ends it before it starts.
"""
from __future__ import annotations

import time
from concurrent.futures import CancelledError, Future

from inferd.engine.grammar import GrammarError
from inferd.engine.reference.output import RequestOutput
from inferd.engine.reference.sampler import make_rng
from inferd.engine.sequence import Sequence
from inferd.engine.validation import failure_message
from inferd.observability import get_logger, request_context
from inferd.types import FinishReason

log = get_logger("inferd.engine.step_engine")


class Admission:
    """Step-thread methods; the engine provides tokenizer, grammars, _grammar_worker, _deferred, _seqs,
    _waits, _scheduler, _blocks, _cond and _commands."""

    def _taken(self, seq: Sequence, taken: list[int]) -> None:
        taken[0] += 1
        taken[1] += self._blocks.blocks_needed(seq.num_prompt_tokens)
        taken[2] += seq.num_prompt_tokens

    def _begin(self, seq: Sequence, deltas) -> bool:
        """Set a submitted sequence up and schedule it (or end it with its error); False when its grammar is
        not compiled (evicted while it waited, or a caller that skipped the API's compile): it compiles on
        the GrammarWorker, never on this thread, and comes back as a "compiled" command."""
        try:  # everything this request alone needs: if it fails, it fails this request only
            seq.engine_state.start(self.tokenizer, seq)
            if not seq.sampling.greedy:
                seq.rng = make_rng(seq.sampling.seed)
            if seq.sampling.guided is not None:
                ready = self._grammar_worker.ready(seq.sampling.guided)
                if isinstance(ready, GrammarError):
                    raise ready
                if ready is None:
                    self._deferred[seq.request_id] = seq
                    with self._cond:
                        self._compiling.add(seq.request_id)
                    self._grammar_worker.compile(seq.sampling.guided).add_done_callback(
                        lambda fut: self._command("compiled", (seq, fut)))
                    return False
                seq.grammar = ready
        except GrammarError as exc:    # the client's grammar: its message is for the client
            self._final(seq, FinishReason.ERROR, deltas, str(exc))
            return True
        except Exception:  # e.g. the tokenizer rejects the prompt ids
            with request_context(seq.request_id):
                log.exception("request_setup_failed")
            self._final(seq, FinishReason.ERROR, deltas, failure_message(seq.request_id))
            return True
        self._install(seq)
        return True

    def _compiled(self, seq: Sequence, compiled: Future, deltas) -> None:
        """A deferred sequence's grammar compiled (or was refused): schedule it with its matcher."""
        try:
            seq.grammar = self.grammars.matcher(seq.sampling.guided, compiled.result())
        except GrammarError as exc:
            self._final(seq, FinishReason.ERROR, deltas, str(exc))
            return
        except (Exception, CancelledError):   # a bug, not the client's grammar: its stream still ends
            with request_context(seq.request_id):
                log.exception("grammar_compile_failed")
            self._final(seq, FinishReason.ERROR, deltas, failure_message(seq.request_id))
            return
        self._install(seq)

    def _install(self, seq: Sequence) -> None:
        self._seqs[seq.request_id] = seq
        if self._waits.attach(seq):      # else it waits for its adapter to load
            self._scheduler.add(seq)

    def _command(self, kind: str, arg: object) -> None:
        """A command from another thread (a compile's end), for the step thread's next round."""
        with self._cond:
            self._commands.append((kind, arg))
            self._cond.notify()

    def _final(self, seq: Sequence, reason: FinishReason, deltas, error: str | None = None) -> None:
        """The final delta of a sequence the scheduler never held."""
        out: RequestOutput = seq.engine_state
        deltas.append((out.stream, out.final(seq, reason, time.monotonic(), error)))
