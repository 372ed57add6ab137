"""The routing control plane the daemon owns: routes over the loaded versions, rollouts, breakers, shadow stats, audit.

One `ControlPlane` per daemon, hung on `ServerState.control`. It turns a Config into routing
(defaults and aliases), builds the configured rollouts, feeds them completions and a 1 s tick, and
applies reloads in two swaps (see `inferd.daemon.reload`). The audit log opens on its first record, so a
daemon that never changes routing never creates the file. Which versions are loaded it asks the registry.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inferd.config import AUDIT_FILE, DEFAULT_STATE_DIR, Config, Split
from inferd.models.breaker import Breakers
from inferd.models.registry import ModelRegistry
from inferd.models.rollout import Rollout, RolloutError, RolloutManager
from inferd.models.routing import RoutingTable
from inferd.models.version_stats import ShadowRecorder
from inferd.models.specs import routes_from_config
from inferd.observability import SYSTEM_ACTOR, AuditLog, get_logger
from inferd.types import ModelVersion

log = get_logger("inferd.control")

TICK_INTERVAL_S = 1.0


def audit_path(cfg: Config) -> Path:
    """[audit] path: parse_config fills in <server.state_dir>/audit.jsonl when the file names none."""
    # A Config built in code (not parsed from a file) may name no path: the default state directory.
    return Path(cfg.audit.path or Path(cfg.server.state_dir or DEFAULT_STATE_DIR) / AUDIT_FILE)


class LazyAudit:
    """An AuditLog opened on the first append (same `append` signature)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._log: AuditLog | None = None

    def append(self, actor: str, action: str, **fields: Any) -> int:
        if self._log is None:
            self._log = AuditLog(self.path)
        return self._log.append(actor, action, **fields)

    def flush(self) -> None:
        if self._log is not None:
            self._log.flush()

    def close(self) -> None:
        if self._log is not None:
            self._log.close()


class ControlPlane:
    def __init__(self, config: Config, registry: ModelRegistry) -> None:
        self.config = config
        self.registry = registry
        self.rollouts = RolloutManager()
        self.shadows = ShadowRecorder(prices=config.prices)
        self.audit = LazyAudit(audit_path(config))
        self.breakers = Breakers(config.models, audit=self.audit)     # failing versions rest

    # -- routes ------------------------------------------------------------------------------
    def final_table(self, table: RoutingTable, cfg: Config) -> RoutingTable:
        """`cfg`'s routes over the versions loaded now, with every rollout's weights on top."""
        defaults = self.registry.default_versions(cfg)
        return self.rollouts.overlay(table.with_routes(defaults=defaults, aliases=routes_from_config(cfg, defaults)))

    def transitional_table(self, table: RoutingTable, cfg: Config) -> RoutingTable:
        """Routes of `cfg` that can be served now; a route whose new targets are still loading keeps
        its current split (and a model its current default) until they are ready."""
        final_defaults = self.registry.default_versions(cfg)
        defaults = {}
        for name, version in final_defaults.items():
            old = table.defaults.get(name)
            ready_now = table.is_ready(ModelVersion(name, version))
            defaults[name] = version if ready_now or old is None else old
        aliases: dict[str, Split] = {}
        for name, split in routes_from_config(cfg, final_defaults).items():
            targets = [a.target for a in split.arms] + ([split.shadow] if split.shadow else [])
            if name in table.aliases and not all(table.is_ready(t) for t in targets):
                aliases[name] = table.aliases[name]
            else:
                aliases[name] = split
        return self.rollouts.overlay(table.with_routes(defaults=defaults, aliases=aliases))

    # -- rollouts ----------------------------------------------------------------------------
    def configure_rollouts(self, cfg: Config) -> None:
        """Add the config's rollouts that are not running; active ones keep going across reloads."""
        defaults = self.registry.default_versions(cfg)
        for name, rcfg in cfg.rollouts.items():
            with contextlib.suppress(RolloutError):
                current = self.rollouts.get(name)
                if current.active:
                    continue
                if (str(current.stable), str(current.candidate)) == (rcfg.stable, rcfg.candidate):
                    continue  # finished with these versions: a reload does not restart it
            rollout = Rollout.from_config(name, rcfg, self.registry, defaults=defaults, prices=cfg.prices,
                                          audit=self.audit)
            self.rollouts.add(rollout)

    def start_on_load(self, cfg: Config) -> None:
        """Start `start = "on_load"` rollouts whose versions are both ready."""
        for name, rcfg in cfg.rollouts.items():
            if rcfg.start != "on_load":
                continue
            with contextlib.suppress(RolloutError):
                rollout = self.rollouts.get(name)
                if rollout.phase == "idle":
                    rollout.start(SYSTEM_ACTOR, "start = \"on_load\": both versions are ready")
                    log.info("rollout_started", rollout=name, stable=str(rollout.stable),
                             candidate=str(rollout.candidate))

    async def tick_loop(self) -> None:
        """Advance rollouts whose dwell passed even when no candidate request completes."""
        while True:
            await asyncio.sleep(TICK_INTERVAL_S)
            try:
                self.rollouts.tick()
            except Exception as exc:  # noqa: BLE001 - a bad tick must not end the loop
                log.error("rollout_tick_failed", error=str(exc), error_type=type(exc).__name__)

    def summary(self) -> Mapping[str, Any]:
        return {"rollouts": [r for r in self.rollouts.states()], "shadow": self.shadows.summary()}

    def close(self) -> None:
        self.audit.close()
