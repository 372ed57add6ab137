from __future__ import annotations

import asyncio

from inferd.api import build_state
from inferd.api.state import ServerState
from inferd.config.root import parse_config
from inferd.engine.sim.engine import SimEngine


def make_state(engines=None) -> ServerState:
    return build_state(parse_config({}), engines)


async def test_not_ready_until_started_and_not_ready_while_draining():
    engine = SimEngine("tiny", time_scale=0.01)
    await engine.start()
    try:
        state = make_state({"sim": engine})
        assert not state.ready()
        state.started = True
        assert state.ready()
        state.draining = True
        assert not state.ready()
    finally:
        await engine.close()


def test_not_ready_without_engines():
    state = make_state()
    state.started = True
    assert not state.ready()


async def test_not_ready_when_an_engine_is_unhealthy():
    engine = SimEngine("tiny", time_scale=0.01)
    await engine.start()
    state = make_state({"sim": engine})
    state.started = True
    assert state.ready()
    await engine.close()
    assert not state.ready()


async def test_track_counts_in_flight_and_wait_idle_wakes_on_last_exit():
    state = make_state()
    assert await state.wait_idle(0) is True
    first, second = state.track(), state.track()
    first.__enter__()
    async with second:
        assert state.in_flight == 2
        waiter = asyncio.ensure_future(state.wait_idle())
        first.__exit__(None, None, None)
        await asyncio.sleep(0)
        assert not waiter.done()
    assert state.in_flight == 0
    assert await waiter is True


async def test_wait_idle_times_out_while_a_request_stays_in_flight():
    state = make_state()
    with state.track():
        assert await state.wait_idle(0.01) is False


def test_track_exits_once_even_if_exited_twice():
    state = make_state()
    tracked = state.track()
    with tracked:
        pass
    tracked.__exit__(None, None, None)
    assert state.in_flight == 0


def test_metrics_see_engines_swapped_wholesale():
    state = make_state({"a": SimEngine("tiny", time_scale=0.01, model_name="a")})
    assert state.metrics.labels_for("a")[0] == "a"
    state.engines = {"b": SimEngine("tiny", time_scale=0.01, model_name="b")}
    assert state.metrics.labels_for("a")[0] == "other"
    assert state.metrics.labels_for("b")[2] == "sim"
