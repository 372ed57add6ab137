"""inferd.cluster.probe: helpers of the gossip node's probing."""
import asyncio

from inferd.cluster.probe import cancel_all


async def test_cancel_all_ends_a_task_that_swallowed_its_first_cancel():
    # What asyncio.wait_for (3.10/3.11) does when a cancel races its inner future: the loop goes on.
    swallowed = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            swallowed.set()
        await asyncio.sleep(10)

    async def plain() -> None:
        await asyncio.sleep(10)

    tasks = [asyncio.ensure_future(stubborn()), asyncio.ensure_future(plain())]
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_all(tasks), 5.0)
    assert swallowed.is_set() and all(t.done() for t in tasks)
