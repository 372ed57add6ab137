"""The engines as a service: every configured version verified, started and warmed, the routes over them,
the rollouts' tick and the prewarm schedule; at shutdown, every engine closed (open streams end with
finish_reason "abort").

A version that is refused is logged and the rest serve; startup fails only when nothing loads. Under a
memory budget ([server] model_memory_bytes) versions stay cold until asked for, except pinned and
prewarmed ones (inferd.models.memory_budget). A missing synthetic artifact is built first
(inferd.daemon.synthetic_build).
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from inferd.api import ServerState
from inferd.daemon.context import DaemonContext
from inferd.daemon.synthetic_build import build_synthetic_artifact
from inferd.models import EngineConfigError, missing_synthetic, routes_from_config, run_prewarm_schedule, version_specs

# A forced exit still asks each engine to close, but waits at most this long for it.
FORCED_CLOSE_TIMEOUT_S = 2.0


@contextlib.asynccontextmanager
async def model_versions(ctx: DaemonContext) -> AsyncIterator[None]:
    state = ctx.state
    tasks: list[asyncio.Future] = []
    try:
        for name, model in ctx.config.models.items():
            kind = missing_synthetic(name, model, ctx.config.server)
            if kind is not None:
                await build_synthetic_artifact(Path(ctx.config.server.engines_root), name, kind, ctx.notifier)
        await ctx.load_versions(state)
        tasks.append(asyncio.ensure_future(state.control.tick_loop()))
        if state.lifecycle is not None:     # [models.X] prewarm_at
            tasks.append(asyncio.ensure_future(run_prewarm_schedule(state.lifecycle)))
        yield
    finally:
        for task in tasks:
            task.cancel()
        await state.shadows.close()
        if ctx.forced.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(state.versions.close_all(), FORCED_CLOSE_TIMEOUT_S)
        else:
            await state.versions.close_all()


async def load_versions(state: ServerState) -> None:
    """Every configured version (under a memory budget: the pinned and prewarmed ones), and the routes."""
    cfg, registry, versions, control, lifecycle = (state.config, state.registry, state.versions, state.control,
                                                   state.lifecycle)
    if lifecycle is None:       # every version now, for good
        await versions.load_all(version_specs(cfg))
        if not registry.table.versions:
            first = next(iter(versions.failures.values()), "no models configured")
            raise EngineConfigError(next(iter(cfg.models), "?"), first.partition(": ")[2] or first)
    else:
        await lifecycle.configure(cfg)
    defaults = versions.defaults(cfg)
    registry.configure(defaults=defaults, aliases=routes_from_config(cfg, defaults))
    control.configure_rollouts(cfg)
    control.start_on_load(cfg)
    state.refresh_engines()
    if lifecycle is not None:
        await lifecycle.start()
