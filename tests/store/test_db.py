"""The Database interface's bounds and health, on every backend: a call inside a request waits at most
what is left of the request's deadline (less a margin), a store known to be down fails its callers fast,
and health turns unavailable on a failed ping and back on a successful one."""
from __future__ import annotations

import asyncio
import time

from inferd.store import REQUEST_DEADLINE, StoreUnavailable
from inferd.store.db import DEADLINE_MARGIN_S, MIN_CALL_S, StoreHealth
from inferd.store.health import ping_once
from tests.store.conftest import db  # noqa: F401  (fixture)


async def test_a_call_outside_a_request_waits_the_stores_timeout(db):  # noqa: F811
    assert db.call_timeout() == db.timeout_s


async def test_a_call_inside_a_request_gives_up_before_its_deadline(db):  # noqa: F811
    token = REQUEST_DEADLINE.set(time.monotonic() + 3.0)
    try:
        assert MIN_CALL_S <= db.call_timeout() <= 3.0 - DEADLINE_MARGIN_S
        REQUEST_DEADLINE.set(time.monotonic() - 10)         # past its deadline: still time to record its row
        assert db.call_timeout() == MIN_CALL_S
        REQUEST_DEADLINE.set(time.monotonic() + 3600)       # a far deadline: the store's own timeout
        assert db.call_timeout() == db.timeout_s
    finally:
        REQUEST_DEADLINE.reset(token)


async def test_a_store_known_to_be_down_fails_its_callers_fast_until_a_ping_succeeds(db):  # noqa: F811
    db.health.failed("the server stopped answering")
    assert db.call_timeout() == min(db.timeout_s, MIN_CALL_S)
    await ping_once(db, 2.0)                                # it answers: healthy again
    assert db.health.ok and db.call_timeout() == db.timeout_s


async def test_a_ping_of_a_closed_store_marks_it_unavailable(db):  # noqa: F811
    await db.close()
    await ping_once(db, 1.0)
    assert not db.health.ok and db.where in db.health.failure


async def test_waiters_learn_of_a_failure_and_a_recovery_rearms_them():
    health = StoreHealth()
    waiter = asyncio.ensure_future(health.wait_failed())
    await asyncio.sleep(0)
    health.recovered()                                      # a successful ping while healthy changes nothing
    assert not waiter.done()
    health.failed(StoreUnavailable("disk full"))
    await asyncio.wait_for(waiter, 1)
    assert health.failure == "disk full" and health.since > 0
    await asyncio.wait_for(health.wait_failed(), 1)         # already down: at once
    health.recovered()
    again = asyncio.ensure_future(health.wait_failed())
    await asyncio.sleep(0)
    assert health.ok and not again.done()
    again.cancel()


async def test_a_call_that_times_out_does_not_mark_the_store_down(db):  # noqa: F811
    error = db.timed_out("read", db.timeout_s)      # a slow statement is not a dead server: the ping tells
    assert isinstance(error, StoreUnavailable) and db.health.ok
