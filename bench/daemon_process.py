"""The daemon side of the benchmarks that start one in a subprocess: the real Daemon (config file,
engines, app, listener, drain on SIGTERM) as `inferd serve` runs it, printing one JSON line with its
port and the inferd it imported once it is ready."""
from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path


def run_daemon(config_path: Path) -> None:
    import uvloop

    import inferd
    from inferd.config import load_config
    from inferd.daemon import Daemon
    from inferd.observability import configure_logging

    config = load_config(config_path)
    configure_logging(config.server.log_level)

    async def main() -> int:
        daemon = Daemon(config)
        run = asyncio.ensure_future(daemon.run(install_signals=True))
        ready = asyncio.ensure_future(daemon.ready.wait())
        await asyncio.wait({run, ready}, return_when=asyncio.FIRST_COMPLETED)
        if daemon.ready.is_set():
            print(json.dumps({"port": daemon.port, "inferd": inferd.__file__}), flush=True)
        return await run

    sys.exit(uvloop.run(main()))


def stop(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM (the daemon drains), then SIGKILL if it has not exited within `timeout` seconds."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
