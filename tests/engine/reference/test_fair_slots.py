"""Fair slots on the reference engine through the admission queue: a tenant owed slots gets each one
from the over-share tenant while that tenant's long streams run, its second request too. The reference
engine delivers one more token for a sequence after it is asked to yield (the step in flight); that
token must not make admission take the parked sequence for running and ask it to yield again."""
from __future__ import annotations

import asyncio

from inferd.admission.fair_queue import AdmissionQueue
from inferd.config.tenants import AdmissionConfig, TenantConfig, TenantRegistry
from tests.admission.harness import far
from tests.engine.reference.test_engine import TEXTS, make_engine, req  # noqa: F401


async def test_a_tenants_second_owed_request_also_starts_while_another_ones_streams_hold_every_slot(make_engine):
    engine = await make_engine(max_batch_size=4)
    q = AdmissionQueue(engine, AdmissionConfig(kv_reserve_fraction=0.0, headroom_fraction=0.0),
                       TenantRegistry({"alpha": TenantConfig(), "beta": TenantConfig()}))
    q.start()
    reading: list[asyncio.Future] = []
    try:
        beta = [await q.admit(req(engine, f"b{i}", TEXTS[3], 200, tenant="beta"), deadline=far()) for i in range(4)]
        for stream in beta:
            await stream.__anext__()                     # all four run: beta holds every slot
        reading = [asyncio.ensure_future(stream.collect()) for stream in beta]   # read on, to their ends
        alpha = await asyncio.wait_for(asyncio.gather(
            *(q.admit(req(engine, f"a{i}", TEXTS[1], 2, tenant="alpha"), deadline=far()) for i in range(2))), 30)
        done = await asyncio.wait_for(asyncio.gather(*(stream.collect() for stream in alpha)), 30)
        ends = await asyncio.wait_for(asyncio.gather(*reading), 60)
        # Both of alpha's ran in slots beta yielded, not one that a finished stream of beta's gave back.
        assert max(d.timing.finished for d in done) < min(e.timing.finished for e in ends)
        assert engine.stats().fairness_preemptions_total == 2
        assert all(e.usage.completion_tokens == 200 for e in ends)   # the yielded ones only paused
    finally:
        for task in reading:
            task.cancel()
        await asyncio.gather(*reading, return_exceptions=True)
        await q.close()
