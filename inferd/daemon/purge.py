"""Deleting what has outlived its period, on one schedule: transcripts and stored responses past their
tenant's retention, Idempotency-Key records past [store] idempotency_ttl_s (with the response each kept
for replay), and cached responses past [cache] ttl_s. Whichever node wrote a row, any node's pass deletes it."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from inferd.api import ServerState
from inferd.observability import get_logger
from inferd.store import IdempotencyStore, ResponseStore, Transcripts

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
            await purge_transcripts_once(state.storage.transcripts, now,
                                         lambda tenant: state.tenancy.tenants.get(tenant).retention_s)
            await purge_idempotency_once(state.storage.idempotency, now)
            await purge_responses_once(state.storage.responses, now,
                                       lambda tenant: state.tenancy.tenants.get(tenant).retention_s)
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
    try:
        gone = await transcripts.purge(now, retention_of=retention_of)
        if gone:
            log.info("transcripts_purged", rows=gone)
    except Exception as exc:  # noqa: BLE001 - the purge must outlive any one failure
        log.warning("transcripts_purge_failed", error=str(exc), error_type=type(exc).__name__)


async def purge_idempotency_once(idempotency: IdempotencyStore, now: float) -> None:
    """Delete Idempotency-Key records (and the responses they kept) whose TTL has passed."""
    try:
        gone = await idempotency.purge_expired(now)
        if gone:
            log.info("idempotency_purged", rows=gone)
    except Exception as exc:  # noqa: BLE001 - the purge must outlive any one failure
        log.warning("idempotency_purge_failed", error=str(exc), error_type=type(exc).__name__)


async def purge_responses_once(responses: ResponseStore, now: float, retention_of: Callable[[str], float]) -> None:
    """Delete stored responses (the Responses API's `store`) past their period, as transcripts."""
    try:
        gone = await responses.purge(now, retention_of=retention_of)
        if gone:
            log.info("responses_purged", rows=gone)
    except Exception as exc:  # noqa: BLE001 - the purge must outlive any one failure
        log.warning("responses_purge_failed", error=str(exc), error_type=type(exc).__name__)
