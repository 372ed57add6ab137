"""Running the daemon's loop to completion: `asyncio.Runner` on 3.11+, the same steps by hand on 3.10.

GPU nodes may run 3.10 (the TensorRT-LLM images do), which has no `asyncio.Runner`.
"""
from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["run"]

T = TypeVar("T")
LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def _run_with_runner(main: Coroutine[Any, Any, T], *, loop_factory: LoopFactory | None = None) -> T:
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(main)


def _run_on_new_loop(main: Coroutine[Any, Any, T], *, loop_factory: LoopFactory | None = None) -> T:
    """What `asyncio.Runner(loop_factory=...).run(main)` does, for Pythons without asyncio.Runner.

    asyncio.run on 3.10 has no loop_factory, and installing a loop policy instead would leak into
    whatever runs after us in the same process (tests do).
    """
    loop = (loop_factory or asyncio.new_event_loop)()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:
            _cancel_all_tasks(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _cancel_all_tasks(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    if not tasks:
        return
    for task in tasks:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            loop.call_exception_handler({"message": "unhandled exception during shutdown",
                                         "exception": task.exception(), "task": task})


# Run `main` to completion on a fresh loop from `loop_factory`, then cancel leftover tasks, shut down
# async generators and the default executor, and close the loop.
run = _run_with_runner if sys.version_info >= (3, 11) else _run_on_new_loop
