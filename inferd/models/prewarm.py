"""Prewarm schedules: `[models.X] prewarm_at = ["07:45", ...]`, UTC times of day at which a
version is loaded ahead of the traffic they expect, evicting if need be (audited as reason `schedule`).

One task per daemon (`run_schedule`), started beside the lifecycle. It sleeps until the next time any
configured version is due, at most SCHEDULE_RECHECK_S at a time, so a reload's new times apply.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from inferd.models.specs import VersionSpec
from inferd.observability import get_logger

if TYPE_CHECKING:
    from inferd.models.memory_budget import ModelLifecycle, SpecKey

log = get_logger("inferd.lifecycle")

SCHEDULE_RECHECK_S = 60.0
DAY_S = 86400


def next_prewarm(specs: dict[SpecKey, VersionSpec], now: float) -> tuple[float, list[SpecKey]] | None:
    """The next `prewarm_at` time after `now` (a Unix time) and the versions due then; None: none scheduled."""
    day = now - now % DAY_S
    best: float | None = None
    keys: list[SpecKey] = []
    for key, spec in specs.items():
        for at in spec.config.prewarm_at:
            hh, mm = at.split(":")
            t = day + int(hh) * 3600 + int(mm) * 60
            if t <= now:
                t += DAY_S
            if best is None or t < best:
                best, keys = t, [key]
            elif t == best and key not in keys:
                keys.append(key)
    return None if best is None else (best, keys)


async def run_schedule(lifecycle: ModelLifecycle, wall: Callable[[], float] = time.time,
                       sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
    """Forever: load each version at its `prewarm_at` times. A load that fails is logged; the schedule goes on."""
    while True:
        due = next_prewarm(lifecycle.specs, wall())
        wait = SCHEDULE_RECHECK_S if due is None else due[0] - wall()
        if wait > SCHEDULE_RECHECK_S:
            wait = SCHEDULE_RECHECK_S
            due = None
        await sleep(max(0.0, wait))
        for key in due[1] if due is not None else ():
            if key not in lifecycle.specs:
                continue
            deadline = lifecycle.clock() + lifecycle.config.server.request_timeout_s
            try:
                await lifecycle.ensure(key, deadline, reason="schedule")
            except Exception as exc:  # noqa: BLE001 - the schedule outlives any one load
                log.error("prewarm_failed", model=key[0], version=key[1], error=str(exc), reason="schedule")
