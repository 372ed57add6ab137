"""A step engine's step thread (a mixin of StepEngine): take commands -> schedule -> run the model ->
update -> detokenize -> publish a capacity snapshot -> hand the deltas to the loop.

It owns the scheduler, the runner (inferd.engine.runner) and every Sequence; the event loop only
enqueues commands and receives each step's deltas in one `call_soon_threadsafe`.
"""
from __future__ import annotations

import time

from inferd.engine.reference.output import RequestOutput
from inferd.engine.sequence import Sequence
from inferd.engine.stream import RequestStream
from inferd.engine.validation import failure_message
from inferd.observability import get_logger, request_context
from inferd.types import Delta, FinishReason

log = get_logger("inferd.engine.step_engine")
_EMA = 0.1


class StepThread:
    """Step-thread methods; StepEngine provides the state they use (see its __init__ and _load)."""

    # -- step thread -------------------------------------------------------------------
    def _run(self) -> None:
        deltas: list[tuple[RequestStream, Delta]] = []
        commands: list[tuple[str, object]] = []    # this round's, taken off the queue: only here now
        try:
            while True:
                with self._cond:
                    # a held adapter with a free slot is work too: _apply's retry installs it
                    while not (self._commands or self._stop or self._scheduler.has_work()
                               or self._waits.can_retry):
                        self._cond.wait(self._adapters.idle_wait())
                        self._adapters.unload_idle()
                    commands = list(self._commands)
                    self._commands.clear()
                    stop = self._stop
                taken = self._apply(commands, deltas)
                self._adapters.unload_idle()
                if stop:
                    for seq in list(self._seqs.values()):
                        self._end(seq, FinishReason.ABORT, deltas)
                    for seq in self._deferred.values():        # their grammar still compiling
                        self._taken(seq, taken)
                        self._final(seq, FinishReason.ABORT, deltas)
                    self._deferred.clear()
                elif self._scheduler.has_work():
                    self._step(deltas)
                    self._retry_held_adapters()   # sequences that finished may have freed a slot
                self._publish(taken)
                self._hand_over(deltas)
                deltas = []
                if stop:
                    return
        except BaseException:  # the thread must not die silently
            with self._cond:
                self._failed = f"the {self.backend} engine failed; see server logs"
                queued = [seq for kind, seq in self._commands if kind == "submit"]
                self._commands.clear()
            # Every request the thread knew of ends: running ones, this round's commands (taken off
            # the queue, perhaps not applied yet) and those still queued. A stream ignores a second
            # final, so one that ended earlier this round keeps its own.
            taken = [seq for kind, seq in commands if kind == "submit"]
            failed = {id(seq): seq for seq in [*self._seqs.values(), *self._deferred.values(), *taken, *queued]}
            log.exception("engine_thread_failed", request_ids=[s.request_id for s in failed.values()])
            for seq in failed.values():
                out: RequestOutput = seq.engine_state
                deltas.append((out.stream, out.final(seq, FinishReason.ERROR, time.monotonic(),
                                                     failure_message(seq.request_id))))
            self._seqs.clear()
            self._deferred.clear()
            self._hand_over(deltas)

    def _apply(self, commands, deltas) -> list[int]:
        taken = [0, 0, 0, 0]     # requests, blocks, prompt tokens, yields no longer pending (_publish subtracts)
        for kind, arg in commands:
            if kind == "submit":
                if self._begin(arg, deltas):     # else its grammar compiles first: still pending
                    self._taken(arg, taken)  # type: ignore[arg-type]
            elif kind == "compiled":
                seq, compiled = arg  # type: ignore[misc]
                if self._deferred.get(seq.request_id) is seq:     # else aborted while it compiled
                    del self._deferred[seq.request_id]
                    with self._cond:
                        self._compiling.discard(seq.request_id)
                    self._taken(seq, taken)
                    self._compiled(seq, compiled, deltas)
            elif kind == "adapter":
                self._adapter_read(*arg, deltas)  # type: ignore[misc]
            elif kind == "yield":
                taken[3] += 1
                seq = self._seqs.get(arg)  # type: ignore[arg-type]
                if seq is not None and self._scheduler.park(seq):
                    self._counters["parked"] += 1
                else:       # it ended (or never started) meanwhile: nothing was freed, tell admission
                    self._resumed(arg, seq, deltas)  # type: ignore[arg-type]
            elif (parked := self._deferred.pop(arg, None)) is not None:  # type: ignore[arg-type]
                with self._cond:
                    self._compiling.discard(parked.request_id)
                self._taken(parked, taken)
                self._final(parked, FinishReason.ABORT, deltas)     # aborted before it ever started
            else:
                seq = self._seqs.get(arg)  # type: ignore[arg-type]
                if seq is not None:
                    self._end(seq, FinishReason.ABORT, deltas)
        self._retry_held_adapters()
        return taken

    def _resumed(self, request_id: str, seq: Sequence | None, deltas) -> None:
        """`request_id` holds a slot again (or its yield was not applied): yieldable again; its stream is told."""
        with self._cond:
            self._yielded.discard(request_id)
        if seq is not None:
            deltas.append((seq.engine_state.stream, None))

    def _end(self, seq: Sequence, reason: FinishReason, deltas, error: str | None = None) -> None:
        if not self._waits.discard(seq, reason):
            self._scheduler.finish(seq, reason)
        self._waits.release(seq)
        self._seqs.pop(seq.request_id, None)
        out: RequestOutput = seq.engine_state
        deltas.append((out.stream, out.final(seq, reason, time.monotonic(), error)))

    def _step(self, deltas) -> None:
        started = time.monotonic()
        sched = self._scheduler
        if self._speculator is not None:
            self._speculator.draft(sched.running)
        out = sched.schedule()
        for seq in out.resumed:
            self._resumed(seq.request_id, seq, deltas)
        if out.empty:
            # submit() only admits requests that fit an empty pool, so this means a bug; failing
            # the head beats spinning on it forever
            if (sched.waiting or sched.parked) and not sched.running:
                head = (sched.waiting or sched.parked)[0]
                with request_context(head.request_id):
                    log.error("request_cannot_be_scheduled", prompt_tokens=head.num_prompt_tokens,
                              free_blocks=self._blocks.num_free_blocks)
                self._end(head, FinishReason.ERROR, deltas, failure_message(head.request_id))
            return
        for seq in out.seqs:
            if seq.engine_state.first_scheduled is None:
                seq.engine_state.first_scheduled = started
                self._counters["prompt"] += seq.num_prompt_tokens
                self._counters["cached"] += seq.num_cached_tokens
        try:
            result = self._runner.execute(out)
            for seq, start, logits in result.prompt_logits:
                seq.engine_state.prompt_logits(seq, start, logits)
            picked = [out.seqs[r] for r in out.sample_rows]
            for seq, token, logprob in zip(picked, result.tokens, result.logprobs):
                if seq.grammar is not None:
                    seq.grammar.accept(token)
                if logprob is not None:
                    seq.engine_state.pending_logprob = logprob
            sampled = result.tokens
            drafted = sum(len(out.seqs[row].draft) for row in out.draft_rows)
        except Exception as exc:
            if self._runner.fatal(exc):
                raise       # the thread ends: every request fails and the engine turns unhealthy
            log.exception("engine_step_failed", request_ids=[seq.request_id for seq in out.seqs])
            for seq in out.seqs:
                self._end(seq, FinishReason.ERROR, deltas, failure_message(seq.request_id))
            return
        now = time.monotonic()
        generated = 0
        for seq, count in sched.update_from_output(out, sampled, result.kept):
            generated += count
            out_state: RequestOutput = seq.engine_state
            delta, stop_string = out_state.on_token(seq, now, count)
            if stop_string and not seq.finished:
                sched.finish(seq, FinishReason.STOP)
            if seq.finished:
                self._seqs.pop(seq.request_id, None)
                self._waits.release(seq)
            deltas.append((out_state.stream, delta))
        self._counters["steps"] += 1
        self._counters["generated"] += generated
        if out.draft_rows:
            self._speculator.record(drafted, sum(len(kept) for kept in result.kept), len(out.draft_rows))
        elapsed = now - started
        observer = self.step_observer
        if observer is not None:
            try:
                observer(elapsed)
            except Exception:  # metrics must never take the engine down
                log.exception("step_observer_failed")
        first = self._ema_latency == 0.0
        self._ema_latency = elapsed if first else (1 - _EMA) * self._ema_latency + _EMA * elapsed
        self._ema_tokens = out.num_tokens if first else (1 - _EMA) * self._ema_tokens + _EMA * out.num_tokens

    def _publish(self, taken: list[int]) -> None:
        sched, blocks_needed = self._scheduler, self._blocks.blocks_needed
        waiting = [*sched.waiting, *self._waits.waiting()]     # the latter wait for their adapter
        reserved = sum(blocks_needed(s.num_tokens) for s in waiting)
        # Prefill still to compute: waiting contexts (new or preempted) and running sequences with
        # more than a decode's one uncomputed token (chunked prefill, recompute).
        prefill = sum(s.num_tokens - s.num_computed_tokens for s in waiting)
        for s in sched.running:
            left = s.num_tokens - s.num_computed_tokens
            if left > 1 or not s.num_completion_tokens:
                prefill += left
        parked = (len(sched.parked), sum(blocks_needed(s.num_tokens) for s in sched.parked))
        snapshot = (max(0, self._blocks.num_free_blocks - reserved), len(sched.running), len(waiting), prefill, *parked)
        with self._cond:
            self._snapshot = snapshot
            self._used_blocks_snapshot = self._blocks.num_used_blocks
            self._pending_requests -= taken[0]
            self._pending_blocks -= taken[1]
            self._pending_prompt_tokens -= taken[2]
            self._pending_yields -= taken[3]

    def _hand_over(self, deltas) -> None:
        if not deltas or self._loop is None:
            return
        try:
            self._loop.call_soon_threadsafe(self._deliver, deltas)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            log.warning("event_loop_closed", dropped_deltas=len(deltas))
