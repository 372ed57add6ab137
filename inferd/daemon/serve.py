"""Running a Daemon: `inferd serve` (config file, signals, uvloop) and `run_daemon` (in-process, by events)."""
from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Callable
from pathlib import Path

from inferd.config import Config, ConfigError, load_config, with_overrides
from inferd.daemon.context import AppFactory
from inferd.daemon.lifecycle import Daemon
from inferd.daemon.runner import run as run_loop
from inferd.observability import configure_logging, get_logger

log = get_logger("inferd.daemon")   # the daemon's own start-up lines, whoever runs it


async def run_daemon(config: Config, *, ready_event: asyncio.Event | None = None,
                     stop_event: asyncio.Event | None = None, app_factory: AppFactory | None = None,
                     install_signals: bool = False) -> int:
    """Run a daemon until `stop_event` is set (or a signal, with install_signals). Returns the exit code."""
    daemon = Daemon(config, app_factory=app_factory)
    relays = []
    if ready_event is not None:
        relays.append(asyncio.ensure_future(_relay(daemon.ready, ready_event.set)))
    if stop_event is not None:
        relays.append(asyncio.ensure_future(_relay(stop_event, daemon.request_stop)))
    try:
        return await daemon.run(install_signals=install_signals)
    finally:
        for task in relays:
            task.cancel()


async def _relay(event: asyncio.Event, action: Callable[[], None]) -> None:
    await event.wait()
    action()


def serve_main(args: argparse.Namespace) -> int:
    """`inferd serve [--config PATH] [--host H] [--port P]`, or `--model X` and vLLM's flags (no config file)."""
    configure_logging("info", fmt=args.log_format or "auto")
    path = None if getattr(args, "model", None) else (args.config or "config.toml")
    try:
        if path is None:
            from inferd.daemon.serve_model import model_config
            config = model_config(args)
        else:
            config = with_overrides(load_config(path), host=args.host, port=args.port)
    except ConfigError as exc:
        log.error("invalid_config", source=exc.source, errors=exc.errors)
        return 1
    configure_logging(config.server.log_level, fmt=args.log_format or config.server.log_format)
    log.info("starting", config=str(Path(path).resolve()) if path else None, pid=os.getpid())
    return run_loop(Daemon(config, config_path=path, tune_collector=True).run(install_signals=True),
                       loop_factory=_loop_factory())


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported platform
        return None
    return uvloop.new_event_loop
