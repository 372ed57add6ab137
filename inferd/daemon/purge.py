"""Deleting what has outlived its period, on one schedule: transcripts and stored responses past their
tenant's retention, Idempotency-Key records past [store] idempotency_ttl_s (with the response each kept
for replay), cached responses past [cache] ttl_s, and the chunks of uploads a crash cut short. Whichever node wrote a row, any node's pass deletes it."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from inferd.api import ServerState
from inferd.observability import get_logger
from inferd.store import FileStore, IdempotencyStore, ResponseStore, Transcripts

PURGE_INTERVAL_S = 60.0      # how often (retention periods are hours or days; idempotency TTLs a day)

log = get_logger("inferd.daemon")

Clock = Callable[[], float]


class Purger:
    """One pass now and one every `every_s` seconds, each as of `clock()`."""

    def __init__(self, state: ServerState, every_s: float = PURGE_INTERVAL_S, *, clock: Clock = time.time) -> None:
        self.state = state
        self.every_s = every_s
        self.clock = clock
        self._started = self._finished = 0
        self._finishing = asyncio.Condition()

    async def run(self) -> None:
        while True:
            await self.purge_once()
            await asyncio.sleep(self.every_s)

    async def purge_once(self) -> None:
        self._started += 1
        state, now = self.state, self.clock()
        if state.storage is not None:
            def retention_of(tenant: str) -> float:
                return state.tenancy.tenants.get(tenant).retention_s
            await purge_transcripts_once(state.storage.transcripts, now, retention_of)
            await purge_idempotency_once(state.storage.idempotency, now)
            await purge_responses_once(state.storage.responses, now, retention_of)
            await FileStore(state.storage.database).purge_orphans(now)     # uploads a crash cut short
        state.response_cache.sweep()        # cached text never outlives [cache] ttl_s
        self._finished += 1
        async with self._finishing:
            self._finishing.notify_all()

    async def next_pass(self) -> None:
        """Wait for a whole pass that starts after this call (so it reads `clock` as it is now)."""
        target = self._started + 1
        async with self._finishing:
            await self._finishing.wait_for(lambda: self._finished >= target)


async def purge_transcripts(transcripts: Transcripts, every_s: float = PURGE_INTERVAL_S, *,
                            retention_of: Callable[[str], float] | None = None, clock: Clock = time.time) -> None:
    """Transcripts alone, now and every `every_s` seconds (see purge_transcripts_once)."""
    while True:
        await purge_transcripts_once(transcripts, clock(), retention_of)
        await asyncio.sleep(every_s)


async def purge_transcripts_once(transcripts: Transcripts, now: float,
                                 retention_of: Callable[[str], float] | None = None) -> None:
    """Delete transcripts past their period: by the expiry each was written with, and by each tenant's
    retention now (`retention_of(tenant)`, 0 for "none"), so a shortened period or a tenant back on
    "none" takes effect at the next pass."""
    await _logged("transcripts", transcripts.purge(now, retention_of=retention_of))


async def purge_idempotency_once(idempotency: IdempotencyStore, now: float) -> None:
    """Delete Idempotency-Key records (and the responses they kept) whose TTL has passed."""
    await _logged("idempotency", idempotency.purge_expired(now))


async def purge_responses_once(responses: ResponseStore, now: float, retention_of: Callable[[str], float]) -> None:
    """Delete stored responses (the Responses API's `store`) past their period, as transcripts."""
    await _logged("responses", responses.purge(now, retention_of=retention_of))


async def _logged(what: str, purge: Awaitable[int]) -> None:
    """Await one purge, logging how many rows went, or its failure: the schedule must outlive any one."""
    try:
        gone = await purge
        if gone:
            log.info(f"{what}_purged", rows=gone)
    except Exception as exc:  # noqa: BLE001 - the purge must outlive any one failure
        log.warning(f"{what}_purge_failed", error=str(exc), error_type=type(exc).__name__)
