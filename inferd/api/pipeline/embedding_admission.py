"""Admission of an embedding request's inputs: each one a request to the engine's weighted-fair queue,
at most a batch's worth queued at a time, all admitted or the request withdrawn.
"""
from __future__ import annotations

import asyncio

from inferd.admission import AdmissionRejected
from inferd.api.pipeline.admit import SharedLease
from inferd.api.pipeline.context import RequestContext
from inferd.config import PriorityClass
from inferd.engine import Engine
from inferd.types import Delta, FinishReason, GenerationRequest


class InputFailed(Exception):
    """One input ended without a vector (a deadline, an engine error): the request ends with it."""

    def __init__(self, final: Delta) -> None:
        super().__init__(final.finish_reason)
        self.final = final


def held_places(engine: Engine, inputs: int) -> int:
    """Queue places a request of `inputs` inputs holds beside its first: those in flight with it."""
    return min(inputs, max(1, engine.info.max_batch_size)) - 1


async def admit_and_collect(state, ctx: RequestContext, gens: list[GenerationRequest], quota) -> list[Delta]:
    """Each input through the engine's admission queue, at most a batch's worth queued at once.

    The first input enters holding the places the others will take at once, and with their cost: the
    queue bounds and the early refusal judge the whole request, before anything is computed. The others
    follow it in (admission's `follow_up`), so a request let in is never refused partway for room, and
    only deadlines can end it early. The first failure withdraws the rest (an input that ends without a
    vector raises InputFailed). Returns each input's final delta, in order."""
    try:
        queue = state.tenancy.queue_for(ctx.model, ctx.engine)
    except AdmissionRejected:
        quota.release(None)
        raise
    shares = SharedLease(quota, len(gens)).shares
    window = asyncio.Semaphore(max(1, ctx.engine.info.max_batch_size))
    tickets: list = [None] * len(gens)
    held = held_places(ctx.engine, len(gens))
    priority = PriorityClass.BATCH if ctx.is_batch else None     # Batch API lines: the batch class
    try:
        tickets[0] = queue.enter(gens[0], deadline=ctx.deadline, priority=priority, lease=shares[0], hold=held,
                                 rest_cost=queue.cost_of(gens[1:]))
    except BaseException:
        for share in shares[1:]:
            share.release(None)
        raise

    async def one(i: int) -> Delta:
        nonlocal held
        async with window:
            if tickets[i] is None:
                tickets[i] = queue.enter(gens[i], deadline=ctx.deadline, priority=priority, lease=shares[i],
                                         follow_up=True, from_hold=held > 0)
                held = max(0, held - 1)
            stream = await queue.admitted(tickets[i])
            try:
                final = await stream.collect()
            finally:
                stream.cancel()             # a no-op once finished; aborts when we are cancelled
            if final.finish_reason is not FinishReason.STOP:
                raise InputFailed(final)   # the rest are withdrawn: the request has failed
            return final

    tasks = [asyncio.ensure_future(one(i)) for i in range(len(gens))]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:                            # even if cancelled again while the inputs wind down
            for ticket in tickets:          # e.g. the first, if its task was cancelled before it ran
                if ticket is not None:
                    queue.withdraw(ticket)
            for share in shares:            # inputs that never entered give their share back
                share.release(None)
        raise
    finally:
        queue.release_hold(ctx.tenant, held)
