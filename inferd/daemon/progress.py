"""Startup progress: where each configured model is on its way to serving, for /readyz and the log.

Each model moves through PHASES (a model whose artifact is already built skips building/built):

    queued -> building -> built -> loading -> warming -> ready
                                           any of them -> failed

`done`/`total` are optional counts within a phase (a build's steps). Every change logs one
`model_progress` line (model=, phase=, done=, total=), which the console formatter renders as a
progress line, and /readyz serialises `snapshot()` while the daemon starts.
"""
from __future__ import annotations

import time
from collections.abc import Iterable

import msgspec

from inferd.observability import get_logger

log = get_logger("inferd.daemon")

PHASES = ("queued", "building", "built", "loading", "warming", "ready", "failed")


class ModelProgress(msgspec.Struct, omit_defaults=True):
    phase: str
    done: int | None = None
    total: int | None = None
    error: str | None = None
    seconds: float = 0.0          # since the daemon started, at the last change


class StartupProgress:
    """Per model: its phase (one of PHASES), set from the loop only."""

    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._t0 = clock()
        self.models: dict[str, ModelProgress] = {}

    def queue(self, models: Iterable[str]) -> None:
        for name in models:
            if name not in self.models:
                self.set(name, "queued")

    def set(self, model: str, phase: str, *, done: int | None = None, total: int | None = None,
            error: str | None = None) -> None:
        if phase not in PHASES:
            raise ValueError(f"unknown startup phase {phase!r}")
        entry = ModelProgress(phase=phase, done=done, total=total, error=error,
                              seconds=round(self._clock() - self._t0, 3))
        previous = self.models.get(model)
        if previous is not None and (previous.phase, previous.done, previous.total) == (phase, done, total):
            return
        self.models[model] = entry
        fields = {"model": model, "phase": phase, "done": done, "total": total}
        if error is not None:
            fields["error"] = error
        (log.warning if phase == "failed" else log.info)("model_progress", **fields)

    def phase(self, model: str) -> str | None:
        entry = self.models.get(model)
        return entry.phase if entry is not None else None

    def snapshot(self) -> dict[str, dict]:
        """Model -> {"phase", "done"?, "total"?, "error"?, "seconds"}: what /readyz shows while starting."""
        return {name: msgspec.to_builtins(entry) for name, entry in self.models.items()}
