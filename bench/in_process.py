"""A real Daemon in the bench's own process (config file, engines, app, listener), for benches that
read the daemon's state directly or reload it; stopped on exit. bench/daemon_process.py runs one in
a subprocess instead, for benches that pin it to its own CPU."""
from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from inferd.config import load_config
from inferd.daemon import Daemon


@contextlib.asynccontextmanager
async def daemon_in_process(config: Callable[[Path], str], prefix: str,
                            prepare: Callable[[Path], None] | None = None) -> AsyncIterator[tuple[Daemon, str, Path]]:
    """`config(state_dir)` is the config text; `prepare(state_dir)` runs before it is loaded (keys, say).
    Yields the ready daemon, its base URL and its config file (rewrite it and `await daemon.reload()`)."""
    state = Path(tempfile.mkdtemp(prefix=prefix))
    path = state / "config.toml"
    path.write_text(config(state))
    if prepare is not None:
        prepare(state)
    daemon = Daemon(load_config(path), config_path=path)
    task = asyncio.ensure_future(daemon.run())
    ready = asyncio.ensure_future(daemon.ready.wait())
    await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        ready.cancel()
        raise RuntimeError(f"the daemon exited during startup with {task.result()}")
    try:
        yield daemon, f"http://127.0.0.1:{daemon.port}", path
    finally:
        daemon.request_stop()
        daemon.request_stop()
        await task
