"""First run: build a model's missing synthetic artifact before the daemon loads its versions.

The build runs in a daemon thread (a stop meanwhile must not wait for it) and logs progress every
BUILD_PROGRESS_INTERVAL_S while the loop waits; its lines use the daemon's logger, as part of startup.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections.abc import Callable
from pathlib import Path

from inferd.daemon.sdnotify import Notifier
from inferd.observability import get_logger

log = get_logger("inferd.daemon")

BUILD_PROGRESS_INTERVAL_S = 5.0


async def build_synthetic_artifact(engines_root: Path, name: str, kind: str, notifier: Notifier,
                                   on_step: Callable[[int], None] | None = None) -> Path:
    """First run: build the synthetic artifact in a thread, logging progress while it runs. `on_step(n)`
    is called on the loop after the build's n-th step."""
    from inferd.artifacts.build import build_synthetic

    log.info("building_engine", model=name, kind=kind, engines_root=str(engines_root),
             message=f"engine {kind!r} not built yet; building it once (this takes a little while)")
    notifier.status(f"building engine {kind}")
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Path] = loop.create_future()

    steps = itertools.count(1)

    def step(text: str) -> None:
        log.info("building_engine_step", model=name, kind=kind, step=text)
        if on_step is not None:
            with contextlib.suppress(RuntimeError):     # the loop is gone: the daemon stopped meanwhile
                loop.call_soon_threadsafe(on_step, next(steps))

    def work() -> None:
        result: Path | None = None
        error: BaseException | None = None
        try:
            result = build_synthetic(kind, engines_root, progress=step)
        except BaseException as exc:  # noqa: BLE001 - handed to the loop, re-raised there
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop is gone: the daemon stopped meanwhile
            loop.call_soon_threadsafe(_settle, done, result, error)

    # A daemon thread, not the default executor: a stop during a first-run build must not wait
    # for it (closing the loop joins the default executor: see inferd.daemon.runner).
    t0 = time.monotonic()
    threading.Thread(target=work, name=f"build-{kind}", daemon=True).start()
    while True:
        try:
            path = await asyncio.wait_for(asyncio.shield(done), BUILD_PROGRESS_INTERVAL_S)
            break
        except asyncio.TimeoutError:
            log.info("building_engine_progress", model=name, kind=kind,
                     elapsed_s=round(time.monotonic() - t0, 1))
    log.info("engine_built", model=name, kind=kind, path=str(path),
             seconds=round(time.monotonic() - t0, 3))
    return path


def _settle(future: asyncio.Future[Path], result: Path | None, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
