"""The process: startup -> serve -> drain -> cleanup, SIGHUP reload, sd_notify, and `inferd serve`."""
from __future__ import annotations

from inferd.daemon.lifecycle import Daemon
from inferd.daemon.preflight import preflight_errors
from inferd.daemon.serve import serve_main

__all__ = ["Daemon", "preflight_errors", "serve_main"]
