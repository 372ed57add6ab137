"""Sequences waiting for their LoRA adapter to load, and the loads they wait on (an engine's step thread).

A sequence naming a loaded adapter gets it at once, pinned (`attach`), and goes to the scheduler.
Otherwise it waits here while a loader thread reads the adapter's files (off the event loop and off the
step thread, so the running batch keeps stepping); the loader hands the result to `post`, which the
engine turns into a step-thread command, and `on_read` installs the adapter pinned for its waiting
sequences, which then go to the scheduler, or fails them when the files were bad. When every adapter
slot holds an adapter in use, the read adapter is kept here until `retry` finds a slot freed by the end
of a sequence. Every method but the loader's callback runs on the step thread.

What an adapter is stays the backend's: `read` (blocking) makes its payload from the files, and `give`
hands a payload to a sequence (the reference engine also salts the sequence's prefix cache with it).
"""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic

from inferd.engine.adapter_slots import AdapterSlots, Payload
from inferd.engine.adapters import AdapterBusy
from inferd.engine.sequence import Sequence, SequenceStatus
from inferd.types import FinishReason

ReadResult = Any    # a payload, or the BaseException its read raised


def hold(seq: Sequence, payload: Any) -> None:
    """The default `give`: seq runs with `payload` (None: without its adapter)."""
    seq.lora = payload


class AdapterWaits(Generic[Payload]):
    def __init__(self, slots: AdapterSlots[Payload], read: Callable[[str], Payload],
                 post: Callable[[str, ReadResult], None],
                 give: Callable[[Sequence, Payload | None], None] = hold) -> None:
        self._registry, self._read, self._post, self._give = slots, read, post, give
        self._waiting: dict[str, list[Sequence]] = {}    # adapter name -> its sequences, in arrival order
        self._held: dict[str, Payload] = {}              # read, waiting for a free slot
        self._reading: set[str] = set()
        self._executor: ThreadPoolExecutor | None = None

    def attach(self, seq: Sequence) -> bool:
        """True when seq can be scheduled now (no adapter, or its adapter is loaded: now pinned for it);
        False when it waits here for its adapter."""
        name = seq.lora_name
        if name is None:
            return True
        weights = self._registry.acquire(name)
        if weights is not None:
            self._give(seq, weights)
            return True
        self._waiting.setdefault(name, []).append(seq)
        if name not in self._reading and name not in self._held:
            self._start_read(name)
        return False

    def on_read(self, name: str, result: ReadResult) -> tuple[list[Sequence], list[Sequence]]:
        """A read ended: (sequences now ready to schedule, sequences to fail because it failed: still
        waiting here until the engine ends them)."""
        self._reading.discard(name)
        if isinstance(result, BaseException):
            return [], list(self._waiting.get(name, ()))
        self._held[name] = result
        return self._install(name), []

    def retry(self) -> list[Sequence]:
        """Sequences whose held adapter found a free slot (a sequence ended, or one was unloaded)."""
        ready: list[Sequence] = []
        for name in list(self._held):
            ready += self._install(name)
        return ready

    def discard(self, seq: Sequence, reason: FinishReason) -> bool:
        """End seq if it is waiting here (True); False when it is not (it is the scheduler's)."""
        seqs = self._waiting.get(seq.lora_name) if seq.lora_name is not None else None
        if not seqs or seq not in seqs:
            return False
        seqs.remove(seq)
        if not seqs:
            del self._waiting[seq.lora_name]
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason
        return True

    def release(self, seq: Sequence) -> None:
        """seq ended: let go of its adapter (once)."""
        if seq.lora is not None:
            self._registry.release(seq.lora_name)   # type: ignore[arg-type]   # what attach acquired
            seq.lora = None

    def waiting(self) -> list[Sequence]:
        return [seq for seqs in self._waiting.values() for seq in seqs]

    @property
    def has_held(self) -> bool:
        return bool(self._held)

    @property
    def can_retry(self) -> bool:
        """An adapter is held for want of a slot and a slot is free now: retry() would install it."""
        return bool(self._held) and self._registry.has_room()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def _install(self, name: str) -> list[Sequence]:
        seqs = self._waiting.get(name, [])
        try:
            weights = self._registry.install(name, self._held[name], pins=len(seqs))
        except AdapterBusy:
            if seqs:
                return []          # keep it: retry() installs it once a slot frees up
            weights = None         # nobody waits for it any more: not worth a slot
        del self._held[name]
        self._waiting.pop(name, None)
        for seq in seqs:
            self._give(seq, weights)
        return seqs

    def _start_read(self, name: str) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inferd-lora-load")
        self._reading.add(name)

        def done(future: Future) -> None:
            if not future.cancelled():
                self._post(name, future.exception() or future.result())

        self._executor.submit(self._read, name).add_done_callback(done)
