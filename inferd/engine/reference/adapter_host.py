"""The reference engine's LoRA face (engine.adapters.AdapterHost) and its step-thread glue for adapter loads.

A mixin of StepEngine, kept apart so the engine module stays about batching. It owns
`_adapters` (the AdapterRegistry: configured, loaded, pinned; thread-safe) and `_waits` (AdapterWaits:
sequences waiting for a load; step thread only), and uses the engine's `_cond`, `_commands`,
`_thread`, `_scheduler` and `_end`.
"""
from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping
from pathlib import Path

from inferd.engine.base import EngineUnavailable
from inferd.engine.adapter_signing import AdapterSignatureError
from inferd.engine.adapter_waits import AdapterWaits, ReadResult
from inferd.engine.adapters import AdapterInfo, UnknownAdapter, unknown_adapter_request
from inferd.engine.reference.adapter_registry import AdapterRegistry
from inferd.engine.reference.lora import LoraWeights
from inferd.engine.sequence import Sequence
from inferd.observability import get_logger
from inferd.types import FinishReason, GenerationRequest

log = get_logger("inferd.engine.step_engine")   # one logger for the engine's lines


def give_weights(seq: Sequence, weights: LoraWeights | None) -> None:
    """seq runs with `weights`. Its prefix-cache salt (tenant and adapter name) takes in the adapter's
    files too, before the scheduler first hashes its blocks: KV computed under other files of the same
    name (a reload after they changed) is never reused."""
    seq.lora = weights
    if weights is not None:
        seq.salt = hashlib.blake2b(seq.salt + weights.fingerprint, digest_size=16).digest()


class LoraHost:
    def _init_adapters(self, sources: Mapping[str, str | Path] | None, *, max_loaded: int,
                       idle_unload_s: float | None, verify: bool, trusted: Mapping[str, str] | None = None) -> None:
        self._adapters = AdapterRegistry(sources or {}, max_loaded=max_loaded, idle_unload_s=idle_unload_s,
                                         verify=True, trusted=trusted)   # adapters: hashed at every load
        self._waits = AdapterWaits(self._adapters, self._adapters.read, self._post_adapter, give_weights)

    # -- event loop: AdapterHost ---------------------------------------------------------------
    def adapters(self) -> list[AdapterInfo]:
        """Every configured adapter, loaded or not, sorted by name."""
        return self._adapters.infos()

    def adapter(self, name: str) -> AdapterInfo | None:
        try:
            return self._adapters.info(name)
        except UnknownAdapter:
            return None

    async def load_adapter(self, name: str) -> AdapterInfo:
        """Load adapter `name` now (read and checked off the loop); already loaded is fine. Raises
        UnknownAdapter, AdapterLoadError, AdapterBusy (every slot in use), EngineUnavailable (not started)."""
        if name not in self._adapters:
            raise UnknownAdapter(f"no LoRA adapter {name!r} is configured", name)
        if self._thread is None:
            raise EngineUnavailable("the reference engine is not started")
        if not self._adapters.is_loaded(name):
            self._adapters.install(name, await asyncio.to_thread(self._adapters.read, name))
        return self._adapters.info(name)

    async def unload_adapter(self, name: str) -> bool:
        """Unload adapter `name`; False when it was not loaded. Raises UnknownAdapter, AdapterBusy (in use)."""
        return self._adapters.unload(name)

    def _check_adapter(self, request: GenerationRequest) -> None:
        if request.lora is not None and request.lora not in self._adapters:
            raise unknown_adapter_request(request.lora, self._adapters.names())

    # -- loader thread -> step thread ----------------------------------------------------------
    def _post_adapter(self, name: str, result: ReadResult) -> None:
        """A loader thread finished reading adapter `name`: the step thread takes it from here."""
        with self._cond:
            self._commands.append(("adapter", (name, result)))
            self._cond.notify()

    # -- step thread ---------------------------------------------------------------------------
    def _adapter_read(self, name: str, result: ReadResult, deltas) -> None:
        """Schedule the sequences that waited for adapter `name`, or fail them if it did not load."""
        ready, failed = self._waits.on_read(name, result)
        for seq in ready:
            self._scheduler.add(seq)
        if failed:
            log.error("lora_adapter_load_failed", adapter=name, error=str(result),
                      request_ids=[seq.request_id for seq in failed])
        if isinstance(result, AdapterSignatureError):      # the operator's trust list said no: say so
            why = f"was refused: it is not signed by a trusted key (signer: {result.signer or 'none'})"
        else:
            why = "could not be loaded"
        for seq in failed:
            self._end(seq, FinishReason.ERROR, deltas,
                      f"LoRA adapter {name!r} {why}; see server logs for request {seq.request_id}")

    def _retry_held_adapters(self) -> None:
        """Adapters read while every slot was in use: install those that fit now. Called after anything
        that may free a slot (commands, a step's finished sequences); the step thread's wait also wakes
        for `_waits.can_retry`, so a runnable held request never sleeps."""
        if self._waits.has_held:
            for seq in self._waits.retry():
                self._scheduler.add(seq)
