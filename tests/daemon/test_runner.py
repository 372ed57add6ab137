"""inferd.daemon.runner: both ways of running the daemon's loop behave alike on every supported Python."""
from __future__ import annotations

import asyncio
import sys

import pytest

from inferd.daemon import runner

RUNNERS = [pytest.param(runner._run_on_new_loop, id="new-loop")]
if sys.version_info >= (3, 11):
    RUNNERS.append(pytest.param(runner._run_with_runner, id="asyncio-runner"))


@pytest.fixture
def made_loops():
    loops: list[asyncio.AbstractEventLoop] = []

    def factory() -> asyncio.AbstractEventLoop:
        loops.append(asyncio.new_event_loop())
        return loops[-1]

    yield loops, factory
    for loop in loops:
        loop.close()


@pytest.mark.parametrize("run", RUNNERS)
def test_run_drives_main_on_a_loop_from_the_factory_and_closes_it(run, made_loops):
    loops, factory = made_loops

    async def main() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    ran_on = run(main(), loop_factory=factory)

    assert loops == [ran_on] and ran_on.is_closed()


@pytest.mark.parametrize("run", RUNNERS)
def test_run_cancels_leftover_tasks_and_finalizes_async_generators(run, made_loops):
    _, factory = made_loops
    events: list[str] = []

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            events.append("task cancelled")
            raise

    async def numbers():
        try:
            yield 1
            yield 2
        finally:
            events.append("generator closed")

    kept = []   # holds the generator so only the runner's shutdown can close it

    async def main() -> int:
        asyncio.get_running_loop().create_task(forever())
        kept.append(numbers())
        first = await kept[0].__anext__()     # left suspended
        await asyncio.sleep(0)            # let the task start waiting
        return first

    assert run(main(), loop_factory=factory) == 1
    assert sorted(events) == ["generator closed", "task cancelled"]

