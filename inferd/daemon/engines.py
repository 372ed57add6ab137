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
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

from inferd.api import ServerState
from inferd.daemon.context import DaemonContext
from inferd.daemon.progress import StartupProgress
from inferd.daemon.synthetic_build import build_synthetic_artifact
from inferd.engine import startup_loads
from inferd.models import EngineConfigError, missing_synthetic, routes_from_config, run_prewarm_schedule, version_specs

# A forced exit still asks each engine to close, but waits at most this long for it.
FORCED_CLOSE_TIMEOUT_S = 2.0


@contextlib.asynccontextmanager
async def model_versions(ctx: DaemonContext) -> AsyncIterator[None]:
    state = ctx.state
    tasks: list[asyncio.Future] = []
    ctx.progress.queue(ctx.config.models)
    try:
        await _build_missing(ctx)
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


async def _build_missing(ctx: DaemonContext) -> None:
    """Every missing synthetic artifact, built at once (each in its own thread): independent models
    do not wait for each other."""
    root, progress = Path(ctx.config.server.engines_root), ctx.progress
    missing = {name: kind for name, model in ctx.config.models.items()
               if (kind := missing_synthetic(name, model, ctx.config.server)) is not None}

    async def build(name: str, kind: str) -> None:
        progress.set(name, "building")
        try:
            await build_synthetic_artifact(root, name, kind, ctx.notifier,
                                           on_step=lambda n: progress.set(name, "building", done=n))
        except Exception as exc:
            progress.set(name, "failed", error=str(exc))
            raise
        progress.set(name, "built")

    await asyncio.gather(*(build(name, kind) for name, kind in missing.items()))


async def _load_specs(state: ServerState, specs: list, progress: StartupProgress | None) -> None:
    """Every version at once: one model's warmup runs while the next one's weights are read."""
    per_model = Counter(spec.model for spec in specs)

    async def load(spec) -> None:
        name = spec.model if per_model[spec.model] == 1 else spec.label
        if progress is not None:
            progress.set(name, "loading")
        key = await state.versions.load(spec, started=None if progress is None else (
            lambda engine: progress.set(name, "warming")))
        if progress is not None:
            progress.set(name, "ready") if key is not None else progress.set(
                name, "failed", error=state.versions.failures.get(spec.label))

    if progress is None:
        await asyncio.gather(*(load(spec) for spec in specs))
        return
    with startup_loads():       # nothing serves yet: no reason to load at the lowest CPU priority
        await asyncio.gather(*(load(spec) for spec in specs))


async def load_versions(state: ServerState, progress: StartupProgress | None = None) -> None:
    """Every configured version (under a memory budget: the pinned and prewarmed ones), and the routes."""
    cfg, registry, versions, control, lifecycle = (state.config, state.registry, state.versions, state.control,
                                                   state.lifecycle)
    if lifecycle is None:       # every version now, for good
        await _load_specs(state, list(version_specs(cfg)), progress)
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
